//! Packs: the files a version's first sessions read, in the order they read them, kept as one
//! object beside the blobs, so a node that lacks the version fetches them with one request
//! instead of one each (an object store answers a few hundred requests a second per client,
//! and a cold `import` opens a thousand files).
//!
//! A pack is named by its version's layer tree (`packs/sha256/<2 hex>/<tree's 64 hex>`), not by
//! its content, so a node finds it knowing only the version; any node may write it, and a later
//! write replaces it. Nothing in it is taken on trust: its reader checks every file against
//! the digest and size its head declares before handing the file out ([`PackReader`]), and the
//! node uses only files its tree names. A bad pack costs a fetch, never a wrong byte.
//!
//! The format: `PLPACK01`, the count of files (u32, little-endian), a head per file (its
//! SHA-256, a flags byte, 1 for executable, and its size as u64, little-endian), then the
//! files' bytes in the heads' order. Bounded by [`MAX_FILES`], [`MAX_FILE_BYTES`] and
//! [`MAX_BYTES`], writer and reader alike.

use std::io::Write;

use bytes::{Buf, Bytes, BytesMut};
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use object_store::ObjectStoreExt as _;
use object_store::path::Path;
use sha2::Digest as _;
use tokio::io::AsyncWriteExt;

use crate::{BlobError, BlobStore, Digest};

const MAGIC: &[u8; 8] = b"PLPACK01";

const HEAD_BYTES: usize = 32 + 1 + 8;

/// The most files one pack holds (as many as a read order's paths).
pub const MAX_FILES: usize = 4096;

/// The largest file a pack holds: larger ones are fetched on their own, which costs one
/// request among many bytes.
pub const MAX_FILE_BYTES: u64 = 8 << 20;

/// The most bytes of files one pack holds.
pub const MAX_BYTES: u64 = 128 << 20;

/// One file of a pack.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PackHead {
    /// Its content's digest.
    pub digest: Digest,
    /// Whether it is executable.
    pub executable: bool,
    /// Its size in bytes.
    pub size: u64,
}

/// Why a pack cannot be read (the files already handed out were whole and verified).
#[derive(Debug, thiserror::Error)]
pub enum PackError {
    /// The store failed.
    #[error("blob store: {0}")]
    Store(#[from] BlobError),
    /// The object is not a pack within its bounds, or a file in it is not what its head says.
    #[error("the pack of tree {tree} is not valid: {reason}")]
    Invalid {
        /// The tree it is the pack of.
        tree: Digest,
        /// What is wrong.
        reason: String,
    },
}

impl BlobStore {
    /// Where the pack of the version with this layer tree is kept.
    pub fn pack_location(tree: &Digest) -> Path {
        let hex = tree.to_hex();
        Path::from(format!("packs/sha256/{}/{hex}", &hex[..2]))
    }

    /// Whether the store holds a pack for this tree.
    pub async fn has_pack(&self, tree: &Digest) -> Result<bool, BlobError> {
        match self.object_store().head(&Self::pack_location(tree)).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(error) => Err(error.into()),
        }
    }

    /// Stores the pack written at `file` (by [`write_pack`]) as this tree's.
    pub async fn put_pack(&self, tree: &Digest, file: std::fs::File) -> Result<(), BlobError> {
        let mut file = tokio::fs::File::from_std(file);
        let mut upload = object_store::buffered::BufWriter::new(
            self.object_store().clone(),
            Self::pack_location(tree),
        );
        match tokio::io::copy(&mut file, &mut upload).await {
            Ok(_) => {
                upload.shutdown().await?;
                Ok(())
            }
            Err(error) => {
                // Nothing is left under the pack's name.
                let _ = upload.abort().await;
                Err(error.into())
            }
        }
    }

    /// Opens this tree's pack, reading its heads; `None` when there is none.
    pub async fn open_pack(&self, tree: &Digest) -> Result<Option<PackReader>, PackError> {
        let result = match self.object_store().get(&Self::pack_location(tree)).await {
            Ok(result) => result,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(error) => return Err(PackError::Store(error.into())),
        };
        let mut reader = PackReader {
            tree: *tree,
            stream: result.into_stream().map_err(BlobError::from).boxed(),
            buffer: BytesMut::new(),
            heads: Vec::new(),
            next: 0,
        };
        reader.fill(MAGIC.len() + 4).await?;
        if &reader.buffer[..MAGIC.len()] != MAGIC {
            return Err(reader.invalid("it does not start as a pack"));
        }
        reader.buffer.advance(MAGIC.len());
        let count = reader.buffer.get_u32_le() as usize;
        if count > MAX_FILES {
            return Err(reader.invalid(format!("{count} files, past {MAX_FILES}")));
        }
        reader.fill(count * HEAD_BYTES).await?;
        let mut total: u64 = 0;
        for _ in 0..count {
            let mut digest = [0u8; 32];
            reader.buffer.copy_to_slice(&mut digest);
            let flags = reader.buffer.get_u8();
            let size = reader.buffer.get_u64_le();
            if size > MAX_FILE_BYTES || flags > 1 {
                return Err(reader.invalid("a head past the bounds"));
            }
            total += size;
            reader.heads.push(PackHead {
                digest: Digest::from_bytes(digest),
                executable: flags == 1,
                size,
            });
        }
        if total > MAX_BYTES {
            return Err(reader.invalid(format!("{total} bytes of files, past {MAX_BYTES}")));
        }
        Ok(Some(reader))
    }
}

/// A pack being read: its heads at once, then its files one at a time as they arrive, each
/// verified.
pub struct PackReader {
    tree: Digest,
    stream: BoxStream<'static, Result<Bytes, BlobError>>,
    buffer: BytesMut,
    heads: Vec<PackHead>,
    next: usize,
}

impl PackReader {
    /// Its files, in order.
    pub fn heads(&self) -> &[PackHead] {
        &self.heads
    }

    /// The next file and its bytes, verified against its head; `None` after the last.
    pub async fn next_file(&mut self) -> Result<Option<(PackHead, Bytes)>, PackError> {
        let Some(head) = self.heads.get(self.next).copied() else {
            return Ok(None);
        };
        self.next += 1;
        // Bounded by `MAX_FILE_BYTES`, checked when the heads were read.
        let size = head.size as usize;
        self.fill(size).await?;
        let bytes = self.buffer.split_to(size).freeze();
        if Digest::from_bytes(sha2::Sha256::digest(&bytes).into()) != head.digest {
            return Err(self.invalid(format!("a file is not {}", head.digest)));
        }
        Ok(Some((head, bytes)))
    }

    /// Reads until at least `wanted` bytes are buffered.
    async fn fill(&mut self, wanted: usize) -> Result<(), PackError> {
        while self.buffer.len() < wanted {
            match self.stream.try_next().await? {
                Some(chunk) => self.buffer.extend_from_slice(&chunk),
                None => return Err(self.invalid("it ends early")),
            }
        }
        Ok(())
    }

    fn invalid(&self, reason: impl Into<String>) -> PackError {
        PackError::Invalid {
            tree: self.tree,
            reason: reason.into(),
        }
    }
}

/// Writes a pack of `files` (each head with where its bytes are read from) to `out`, keeping
/// those within the bounds, in order, until [`MAX_FILES`] or [`MAX_BYTES`]. Answers the heads
/// written.
pub fn write_pack<R: std::io::Read>(
    files: Vec<(PackHead, R)>,
    out: &mut impl Write,
) -> std::io::Result<Vec<PackHead>> {
    let mut total = 0;
    let kept: Vec<(PackHead, R)> = files
        .into_iter()
        .filter(|(head, _)| head.size <= MAX_FILE_BYTES)
        .take_while(|(head, _)| {
            total += head.size;
            total <= MAX_BYTES
        })
        .take(MAX_FILES)
        .collect();
    out.write_all(MAGIC)?;
    out.write_all(&(kept.len() as u32).to_le_bytes())?;
    for (head, _) in &kept {
        out.write_all(head.digest.as_bytes())?;
        out.write_all(&[u8::from(head.executable)])?;
        out.write_all(&head.size.to_le_bytes())?;
    }
    let mut heads = Vec::with_capacity(kept.len());
    for (head, reader) in kept {
        // Exactly the size its head declares, or the pack is not written.
        let copied = std::io::copy(&mut reader.take(head.size), out)?;
        if copied != head.size {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!("{} is shorter than its size", head.digest),
            ));
        }
        heads.push(head);
    }
    Ok(heads)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(content: &[u8], executable: bool) -> PackHead {
        PackHead {
            digest: Digest::of(content),
            executable,
            size: content.len() as u64,
        }
    }

    async fn stored(files: Vec<(PackHead, &[u8])>) -> (BlobStore, Digest) {
        let store = BlobStore::open("memory://", std::env::temp_dir()).expect("a store in memory");
        let tree = Digest::of(b"a tree");
        let mut file = tempfile::tempfile().expect("a file");
        write_pack(files, &mut file).expect("written");
        std::io::Seek::rewind(&mut file).expect("rewound");
        store.put_pack(&tree, file).await.expect("stored");
        (store, tree)
    }

    #[tokio::test]
    async fn a_pack_gives_back_its_files_in_order_each_verified() {
        let files: Vec<(PackHead, &[u8])> = vec![
            (head(b"first", false), b"first"),
            (head(b"", false), b""),
            (head(b"#!/bin/sh\n", true), b"#!/bin/sh\n"),
        ];
        let (store, tree) = stored(files.clone()).await;
        assert!(store.has_pack(&tree).await.expect("asked"));
        assert!(!store.has_pack(&Digest::of(b"other")).await.expect("asked"));
        assert!(
            store
                .open_pack(&Digest::of(b"other"))
                .await
                .expect("asked")
                .is_none()
        );
        let mut reader = store.open_pack(&tree).await.expect("read").expect("there");
        let heads: Vec<PackHead> = files.iter().map(|(head, _)| *head).collect();
        assert_eq!(reader.heads(), heads.as_slice());
        for (head, content) in files {
            let (got, bytes) = reader.next_file().await.expect("a file").expect("there");
            assert_eq!((got, bytes.as_ref()), (head, content));
        }
        assert!(reader.next_file().await.expect("the end").is_none());
    }

    #[tokio::test]
    async fn a_file_that_is_not_what_its_head_says_is_refused() {
        // A head that names other bytes than follow it.
        let (store, tree) = stored(vec![
            (head(b"genuine", false), b"genuine"),
            (head(b"wanted", false), b"forged"),
        ])
        .await;
        let mut reader = store.open_pack(&tree).await.expect("read").expect("there");
        assert_eq!(
            reader
                .next_file()
                .await
                .expect("the first is whole")
                .map(|(_, bytes)| bytes),
            Some(Bytes::from_static(b"genuine"))
        );
        let refused = reader.next_file().await;
        assert!(
            matches!(refused, Err(PackError::Invalid { .. })),
            "{:?}",
            refused.map(|file| file.map(|(head, _)| head))
        );
    }

    #[tokio::test]
    async fn what_is_not_a_pack_or_ends_early_is_refused() {
        let store = BlobStore::open("memory://", std::env::temp_dir()).expect("a store in memory");
        let tree = Digest::of(b"a tree");
        let location = BlobStore::pack_location(&tree);
        for bytes in [
            b"not a pack at all".to_vec(),
            [MAGIC.as_slice(), &u32::MAX.to_le_bytes()].concat(),
            [MAGIC.as_slice(), &1u32.to_le_bytes(), &[0u8; 10]].concat(),
        ] {
            store
                .object_store()
                .put(&location, bytes.into())
                .await
                .expect("stored");
            assert!(matches!(
                store.open_pack(&tree).await,
                Err(PackError::Invalid { .. })
            ));
        }
        // Whole heads, a file cut short.
        let mut bytes = Vec::new();
        write_pack(vec![(head(b"content", false), &b"content"[..])], &mut bytes).expect("written");
        bytes.truncate(bytes.len() - 2);
        store
            .object_store()
            .put(&location, bytes.into())
            .await
            .expect("stored");
        let mut reader = store.open_pack(&tree).await.expect("heads").expect("there");
        assert!(matches!(
            reader.next_file().await,
            Err(PackError::Invalid { .. })
        ));
    }

    #[test]
    fn a_writer_keeps_to_the_bounds() {
        let big = PackHead {
            digest: Digest::of(b"big"),
            executable: false,
            size: MAX_FILE_BYTES + 1,
        };
        let mut out = Vec::new();
        let written = write_pack(
            vec![
                (big, std::io::repeat(0)),
                (head(b"small", false), std::io::repeat(b's')),
            ],
            &mut out,
        );
        // The big one is left out; the small one's reader gives more than its size, and only
        // its size is taken.
        assert_eq!(written.expect("written"), vec![head(b"small", false)]);
        assert_eq!(out.len(), MAGIC.len() + 4 + HEAD_BYTES + 5);
    }
}
