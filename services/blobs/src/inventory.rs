//! What garbage collection sees of a store, and how it removes what it decided may go: every
//! object under `blobs/`, `staging/` and `packs/`, with its size and when it was last written.
//! Which objects may go is decided elsewhere (the source service's `gc`); this module only
//! lists, names and removes.
//!
//! A directory store (`file://`) is walked on disk rather than listed through `object_store`,
//! whose listing hides the names writers use before a blob is complete (`<blob>#<n>`, left
//! by a writer killed mid-write): those are found here too, as partial copies of the blob
//! they were becoming, so a collection can take them with it.

use std::path::{Path, PathBuf};

use futures::{StreamExt, TryStreamExt};

use crate::{BlobError, BlobStore, Digest};

/// What an object is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ObjectKind {
    /// A blob under its final name.
    Blob(Digest),
    /// A partial copy of a blob, under the name its writer used before the final one: it goes
    /// with the blob's fate (a writer holds the blob before writing it).
    Partial(Digest),
    /// A staging object of a large upload (named by the upload, not the content).
    Staging,
    /// The pack of the version with this layer tree (see [`crate::pack`]): it goes when the
    /// tree does.
    Pack(Digest),
    /// Anything else: never removed.
    Foreign,
}

/// One object in the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredObject {
    /// Its path in the store (`blobs/sha256/ab/ab…`).
    pub key: String,
    /// What it is.
    pub kind: ObjectKind,
    /// Its size in bytes.
    pub size: u64,
    /// When it was last written, in milliseconds since the epoch.
    pub modified_ms: i64,
}

impl BlobStore {
    /// Every object under `blobs/`, `staging/` and `packs/`.
    pub async fn inventory(&self) -> Result<Vec<StoredObject>, BlobError> {
        if let Some(root) = self.local_root() {
            let root = root.to_owned();
            return tokio::task::spawn_blocking(move || walk_local(&root))
                .await
                .map_err(|join| BlobError::Io(std::io::Error::other(join.to_string())))?;
        }
        let mut objects = Vec::new();
        for prefix in ["blobs", "staging", "packs"] {
            let prefix = object_store::path::Path::from(prefix);
            let mut listing = self.object_store().list(Some(&prefix));
            while let Some(meta) = listing.try_next().await? {
                let key = meta.location.to_string();
                objects.push(StoredObject {
                    kind: kind_of(&key),
                    key,
                    size: meta.size,
                    modified_ms: meta.last_modified.timestamp_millis(),
                });
            }
        }
        Ok(objects)
    }

    /// Removes these objects (foreign ones are passed over); one already gone counts as
    /// removed. Answers how many were removed.
    pub async fn remove(&self, objects: &[StoredObject]) -> Result<u64, BlobError> {
        let doomed: Vec<&StoredObject> = objects
            .iter()
            .filter(|object| object.kind != ObjectKind::Foreign)
            .collect();
        if let Some(root) = self.local_root() {
            let paths: Vec<PathBuf> = doomed.iter().map(|object| root.join(&object.key)).collect();
            return tokio::task::spawn_blocking(move || {
                let mut removed = 0;
                for path in paths {
                    match std::fs::remove_file(&path) {
                        Ok(()) => removed += 1,
                        Err(error) if error.kind() == std::io::ErrorKind::NotFound => removed += 1,
                        Err(error) => return Err(BlobError::Io(error)),
                    }
                }
                Ok(removed)
            })
            .await
            .map_err(|join| BlobError::Io(std::io::Error::other(join.to_string())))?;
        }
        let locations = futures::stream::iter(
            doomed
                .iter()
                .map(|object| Ok(object_store::path::Path::from(object.key.as_str())))
                .collect::<Vec<_>>(),
        )
        .boxed();
        let mut results = self.object_store().delete_stream(locations);
        let mut removed = 0;
        while let Some(result) = results.next().await {
            match result {
                Ok(_) | Err(object_store::Error::NotFound { .. }) => removed += 1,
                Err(error) => return Err(error.into()),
            }
        }
        Ok(removed)
    }
}

/// What the object at `key` is, by its name.
pub fn kind_of(key: &str) -> ObjectKind {
    if key.starts_with("staging/") {
        return ObjectKind::Staging;
    }
    if let Some(rest) = key.strip_prefix("packs/sha256/") {
        return match rest.split_once('/') {
            Some((fanout, hex))
                if hex.len() == 64 && fanout.len() == 2 && hex.starts_with(fanout) =>
            {
                hex.parse().map_or(ObjectKind::Foreign, ObjectKind::Pack)
            }
            _ => ObjectKind::Foreign,
        };
    }
    let Some(rest) = key.strip_prefix("blobs/sha256/") else {
        return ObjectKind::Foreign;
    };
    let Some((fanout, name)) = rest.split_once('/') else {
        return ObjectKind::Foreign;
    };
    let (hex, partial) = match name.split_once('#') {
        Some((hex, _)) => (hex, true),
        None => (name, false),
    };
    match hex.parse::<Digest>() {
        Ok(digest) if hex.len() == 64 && hex.starts_with(fanout) && fanout.len() == 2 => {
            if partial {
                ObjectKind::Partial(digest)
            } else {
                ObjectKind::Blob(digest)
            }
        }
        _ => ObjectKind::Foreign,
    }
}

/// Walks `root/blobs`, `root/staging` and `root/packs` on disk, partial names included.
fn walk_local(root: &Path) -> Result<Vec<StoredObject>, BlobError> {
    let mut objects = Vec::new();
    let mut pending: Vec<PathBuf> = ["blobs", "staging", "packs"]
        .into_iter()
        .map(|top| root.join(top))
        .collect();
    while let Some(directory) = pending.pop() {
        let entries = match std::fs::read_dir(&directory) {
            Ok(entries) => entries,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => continue,
            Err(error) => return Err(BlobError::Io(error)),
        };
        for entry in entries {
            let entry = entry?;
            // A file removed since the directory was read is simply not there.
            let Ok(metadata) = entry.metadata() else {
                continue;
            };
            let path = entry.path();
            if metadata.is_dir() {
                pending.push(path);
                continue;
            }
            if !metadata.is_file() {
                continue;
            }
            let Some(key) = path
                .strip_prefix(root)
                .ok()
                .and_then(|relative| relative.to_str())
                .map(str::to_owned)
            else {
                continue;
            };
            let modified_ms = metadata
                .modified()
                .ok()
                .and_then(|time| time.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0, |since| {
                    i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
                });
            objects.push(StoredObject {
                kind: kind_of(&key),
                key,
                size: metadata.len(),
                modified_ms,
            });
        }
    }
    Ok(objects)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_are_known_by_their_names() {
        let digest = Digest::of(b"content");
        let hex = digest.to_hex();
        let blob = format!("blobs/sha256/{}/{hex}", &hex[..2]);
        assert_eq!(kind_of(&blob), ObjectKind::Blob(digest));
        assert_eq!(kind_of(&format!("{blob}#3")), ObjectKind::Partial(digest));
        assert_eq!(kind_of("staging/0123abcd"), ObjectKind::Staging);
        assert_eq!(kind_of("staging/0123abcd#1"), ObjectKind::Staging);
        let pack = format!("packs/sha256/{}/{hex}", &hex[..2]);
        assert_eq!(kind_of(&pack), ObjectKind::Pack(digest));
        assert_eq!(
            BlobStore::pack_location(&digest).to_string(),
            pack,
            "found where it is written"
        );
        for foreign in [
            format!("packs/sha256/zz/{hex}"),
            format!("packs/sha256/{hex}"),
            format!("{pack}#1"),
            format!("blobs/sha256/zz/{hex}"),
            format!("blobs/sha256/{hex}"),
            format!("blobs/sha512/{}/{hex}", &hex[..2]),
            format!("blobs/sha256/{}/{}", &hex[..2], &hex[..63]),
            "other/thing".to_owned(),
            "blobs".to_owned(),
        ] {
            assert_eq!(kind_of(&foreign), ObjectKind::Foreign, "{foreign}");
        }
    }
}
