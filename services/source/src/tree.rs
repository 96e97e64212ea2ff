//! Source snapshots as trees (see `plinth_blobs::tree`): the index, frozen.

use plinth_blobs::tree::{Tree, TreeEntry};

use crate::paths::SourcePath;
use crate::persistence::{IndexEntry, Kind};

/// The canonical bytes of the tree of `entries`.
pub fn encode(entries: &[IndexEntry]) -> Result<Vec<u8>, serde_json::Error> {
    let entries = entries
        .iter()
        .filter_map(|entry| match entry.kind {
            Kind::Directory => Some(TreeEntry::dir(entry.path.as_str())),
            Kind::File => entry.digest.map(|digest| {
                TreeEntry::file(entry.path.as_str(), digest, entry.size, entry.executable)
            }),
            // Only links that cannot leave the root ever enter the index (see `links`).
            Kind::Symlink => entry
                .target
                .as_deref()
                .map(|target| TreeEntry::symlink(entry.path.as_str(), target)),
        })
        .collect();
    Tree::new(entries).encode()
}

/// Why a snapshot's bytes are no source tree.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// Not a tree at all.
    #[error("{0}")]
    Tree(#[from] plinth_blobs::tree::TreeError),
    /// A path no source holds.
    #[error("{path:?}: {reason}")]
    Path {
        /// The path as stored.
        path: String,
        /// What is wrong with it.
        reason: String,
    },
}

/// The entries of a snapshot's tree (the bytes [`encode`] made), as the index holds them.
pub fn decode(bytes: &[u8]) -> Result<Vec<IndexEntry>, DecodeError> {
    let tree = Tree::decode(bytes)?;
    tree.entries
        .into_iter()
        .map(|entry| {
            let path = SourcePath::parse(&entry.path).map_err(|error| DecodeError::Path {
                reason: error.to_string(),
                path: entry.path.clone(),
            })?;
            let kind = match entry.kind {
                plinth_blobs::tree::TreeEntryKind::Dir => Kind::Directory,
                plinth_blobs::tree::TreeEntryKind::File => Kind::File,
                plinth_blobs::tree::TreeEntryKind::Symlink => Kind::Symlink,
            };
            Ok(IndexEntry {
                digest: entry.file_digest(),
                size: entry.size.unwrap_or(0),
                executable: kind == Kind::File && entry.mode & 0o111 != 0,
                target: entry.target,
                kind,
                path,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_decodes_to_the_entries_it_froze() {
        let digest = plinth_blobs::Digest::of(b"print(1)\n");
        let entries = vec![
            IndexEntry::directory(SourcePath::parse("app").expect("path")),
            IndexEntry {
                path: SourcePath::parse("app/main.py").expect("path"),
                kind: Kind::File,
                digest: Some(digest),
                size: 9,
                executable: true,
                target: None,
            },
        ];
        let decoded = decode(&encode(&entries).expect("encoded")).expect("decoded");
        assert_eq!(decoded.len(), 2);
        assert_eq!(decoded[1].path.as_str(), "app/main.py");
        assert_eq!(decoded[1].digest, Some(digest));
        assert!(decoded[1].executable && decoded[1].size == 9);
        assert_eq!(decoded[0].kind, Kind::Directory);
        assert!(decode(b"not a tree").is_err());
    }
}
