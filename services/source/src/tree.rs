//! Source snapshots as trees (see `plinth_blobs::tree`): the index, frozen.

use plinth_blobs::tree::{Tree, TreeEntry};

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
