//! Trees: a set of files, directories and symlinks, canonically encoded and stored as a blob
//! whose digest names it (ARCHITECTURE §2). Source snapshots and build layers are trees, and
//! node agents materialize them. The encoding is JSON with a fixed field order and entries
//! sorted by path, so the same set always yields the same digest.

use serde::{Deserialize, Serialize};

use crate::Digest;

/// The tree format's version, inside the encoding.
pub const TREE_FORMAT: u32 = 1;

/// What a tree entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TreeEntryKind {
    /// A regular file: `size` and `digest` are set.
    File,
    /// A directory.
    Dir,
    /// A symbolic link: `target` is set; it is recorded, never followed.
    Symlink,
}

/// One entry of a tree.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TreeEntry {
    /// Relative, `/`-separated.
    pub path: String,
    /// File, directory or symlink.
    pub kind: TreeEntryKind,
    /// Permission bits as materialized: 0o755 for directories and executables, 0o644 for
    /// other files, 0o777 for symlinks.
    pub mode: u32,
    /// A file's bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    /// A file's content digest, `sha256:<hex>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// A symlink's target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
}

impl TreeEntry {
    /// A directory.
    pub fn dir(path: impl Into<String>) -> Self {
        TreeEntry {
            path: path.into(),
            kind: TreeEntryKind::Dir,
            mode: 0o755,
            size: None,
            digest: None,
            target: None,
        }
    }

    /// A regular file.
    pub fn file(path: impl Into<String>, digest: Digest, size: u64, executable: bool) -> Self {
        TreeEntry {
            path: path.into(),
            kind: TreeEntryKind::File,
            mode: if executable { 0o755 } else { 0o644 },
            size: Some(size),
            digest: Some(digest.to_string()),
            target: None,
        }
    }

    /// A symbolic link.
    pub fn symlink(path: impl Into<String>, target: impl Into<String>) -> Self {
        TreeEntry {
            path: path.into(),
            kind: TreeEntryKind::Symlink,
            mode: 0o777,
            size: None,
            digest: None,
            target: Some(target.into()),
        }
    }

    /// A file's digest, parsed.
    pub fn file_digest(&self) -> Option<Digest> {
        self.digest
            .as_deref()
            .and_then(|digest| digest.parse().ok())
    }
}

/// A whole tree.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tree {
    /// [`TREE_FORMAT`].
    pub format: u32,
    /// Sorted by path.
    pub entries: Vec<TreeEntry>,
}

impl Tree {
    /// A tree of `entries`, sorted by path.
    pub fn new(mut entries: Vec<TreeEntry>) -> Self {
        entries.sort_by(|a, b| a.path.cmp(&b.path));
        Tree {
            format: TREE_FORMAT,
            entries,
        }
    }

    /// The canonical bytes.
    pub fn encode(&self) -> Result<Vec<u8>, serde_json::Error> {
        serde_json::to_vec(self)
    }

    /// Reads a tree back; refuses other formats.
    pub fn decode(bytes: &[u8]) -> Result<Self, TreeError> {
        let tree: Tree = serde_json::from_slice(bytes).map_err(|e| TreeError(e.to_string()))?;
        if tree.format != TREE_FORMAT {
            return Err(TreeError(format!("unknown tree format {}", tree.format)));
        }
        Ok(tree)
    }
}

/// A blob that is not a tree this build can read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a tree: {0}")]
pub struct TreeError(pub String);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trees_encode_canonically_and_round_trip() {
        let a = Tree::new(vec![
            TreeEntry::file("b.txt", Digest::of(b"b"), 1, false),
            TreeEntry::dir("a"),
            TreeEntry::symlink("a/link", "../b.txt"),
        ]);
        let b = Tree::new(vec![
            TreeEntry::symlink("a/link", "../b.txt"),
            TreeEntry::dir("a"),
            TreeEntry::file("b.txt", Digest::of(b"b"), 1, false),
        ]);
        let encoded = a.encode().expect("encode");
        assert_eq!(
            encoded,
            b.encode().expect("encode"),
            "order of input does not matter"
        );
        assert_eq!(Tree::decode(&encoded).expect("decode"), a);
        assert!(Tree::decode(br#"{"format":2,"entries":[]}"#).is_err());
    }
}
