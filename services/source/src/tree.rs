//! Trees: a frozen source, canonically encoded and stored as a blob whose digest names it
//! (ARCHITECTURE §2). The encoding is JSON with fixed field order and entries sorted by path,
//! so the same source always yields the same digest.

use serde::Serialize;

use crate::persistence::{IndexEntry, Kind};

/// The tree format's version, inside the encoding.
const TREE_FORMAT: u32 = 1;

#[derive(Serialize)]
struct Tree<'a> {
    format: u32,
    entries: Vec<TreeEntry<'a>>,
}

#[derive(Serialize)]
struct TreeEntry<'a> {
    path: &'a str,
    kind: &'static str,
    /// Permission bits as a session will see them: 0o755 for directories and executables,
    /// 0o644 for other files.
    mode: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    size: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    digest: Option<String>,
}

/// The canonical bytes of the tree of `entries` (which must be sorted by path).
pub fn encode(entries: &[IndexEntry]) -> Result<Vec<u8>, serde_json::Error> {
    let tree = Tree {
        format: TREE_FORMAT,
        entries: entries
            .iter()
            .map(|entry| match entry.kind {
                Kind::Directory => TreeEntry {
                    path: entry.path.as_str(),
                    kind: "dir",
                    mode: 0o755,
                    size: None,
                    digest: None,
                },
                Kind::File => TreeEntry {
                    path: entry.path.as_str(),
                    kind: "file",
                    mode: if entry.executable { 0o755 } else { 0o644 },
                    size: Some(entry.size),
                    digest: entry.digest.map(|digest| digest.to_string()),
                },
            })
            .collect(),
    };
    serde_json::to_vec(&tree)
}
