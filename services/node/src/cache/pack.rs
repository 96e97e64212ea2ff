//! A version's pack (see [`plinth_blobs::pack`]): written by the node whose sessions' read order
//! is told, from the blobs those sessions fetched; read by a node that lacks the version before
//! it fetches anything else of it, so the files its next session will read arrive in one
//! request, in the order that session will want them.
//!
//! While a pack streams in, the blobs it brings are *coming*: a fetch of one of them (a
//! session's open, a materialization) waits for the pack to bring it instead of asking the
//! store again, and goes to the store itself if the pack ends without it or brings nothing for
//! [`STALL`]. A fetch that starts while a pack's heads are being read waits for them (at most
//! [`OPEN_WAIT`]). Background fetches make way while a pack is read (see
//! [`super::YIELD_AT_MOST`]).

use std::collections::{HashMap, HashSet};
use std::os::fd::AsRawFd as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use plinth_blobs::Digest;
use plinth_blobs::pack::{PackHead, PackReader};
use plinth_blobs::tree::{Tree, TreeEntryKind};

use super::{CacheError, Counted, VersionCache, blob_name, io};

/// The longest a fetch waits for a pack's heads before going to the store itself.
const OPEN_WAIT: Duration = Duration::from_secs(2);

/// The longest a fetch waits on a pack that brings nothing: a stalled stream is given up on
/// by its waiters, who ask the store for their blobs themselves.
const STALL: Duration = Duration::from_secs(5);

/// Blobs a pack brings, by name: each with its pack's progress, which changes as the pack
/// delivers and closes when it ends.
pub(super) type Coming = HashMap<String, tokio::sync::watch::Receiver<u64>>;

/// A pack's blobs still coming, taken out of [`VersionCache::coming`] when it goes (they are
/// fetched from the store from then on).
struct Expected<'a> {
    cache: &'a VersionCache,
    names: HashSet<String>,
}

impl Drop for Expected<'_> {
    fn drop(&mut self) {
        let mut coming = self.cache.lock_coming();
        for name in &self.names {
            coming.remove(name);
        }
    }
}

impl VersionCache {
    pub(super) fn lock_coming(&self) -> std::sync::MutexGuard<'_, Coming> {
        self.coming
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Waits while a pack may bring `name`: its heads being read (at most [`OPEN_WAIT`]), then
    /// until it brought it or ended.
    pub(super) async fn await_pack(&self, name: &str) {
        let mut opening = self.opening.subscribe();
        if *opening.borrow_and_update() > 0 {
            let _ = tokio::time::timeout(OPEN_WAIT, opening.wait_for(|count| *count == 0)).await;
        }
        let Some(mut progress) = self.lock_coming().get(name).cloned() else {
            return;
        };
        loop {
            if !self.lock_coming().contains_key(name) {
                return;
            }
            // Closed (the pack ended), or stalled: the store is asked instead.
            match tokio::time::timeout(STALL, progress.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) | Err(_) => return,
            }
        }
    }

    /// Reads the version's pack, if the store has one, into the cache: the blobs it holds that
    /// the tree names and the cache lacks, each verified, written as a session's fetch writes
    /// it (pending, settled soon). Answers how many it brought. A pack that fails midway keeps
    /// what it brought; the rest is fetched blob by blob.
    pub(super) async fn unpack(
        self: &Arc<Self>,
        layer_tree: &str,
        tree: &Tree,
    ) -> Result<u64, CacheError> {
        let Ok(digest) = layer_tree.parse::<Digest>() else {
            return Ok(0);
        };
        let begun = Instant::now();
        let opening = Counted::new(&self.opening);
        // Sessions wait on what it brings: background fetches make way.
        let _urgent = self.urgent();
        let Some(mut reader) = self
            .blobs
            .open_pack(&digest)
            .await
            .map_err(|error| CacheError::Blobs(error.to_string()))?
        else {
            metrics::counter!("plinth_node_packs_total", "outcome" => "none").increment(1);
            return Ok(0);
        };
        let (progress, listening) = tokio::sync::watch::channel(0u64);
        let expected = self.expect(tree, &reader, listening);
        drop(opening);
        tracing::debug!(tree = %layer_tree, took_ms = begun.elapsed().as_millis() as u64, "a version's pack heads are read");
        let result = self.bring(&mut reader, expected, &progress).await;
        let outcome = if result.is_ok() { "read" } else { "failed" };
        metrics::counter!("plinth_node_packs_total", "outcome" => outcome).increment(1);
        let brought = result?;
        metrics::counter!("plinth_node_pack_blobs_total").increment(brought);
        tracing::info!(tree = %layer_tree, blobs = brought, took_ms = begun.elapsed().as_millis() as u64, "read a version's pack");
        Ok(brought)
    }

    /// Marks the pack's blobs the tree names and nobody has or fetches as coming.
    fn expect(
        &self,
        tree: &Tree,
        reader: &PackReader,
        listening: tokio::sync::watch::Receiver<u64>,
    ) -> Expected<'_> {
        let named: HashSet<(Digest, bool)> = tree
            .entries
            .iter()
            .filter(|entry| entry.kind == TreeEntryKind::File && entry.size.unwrap_or(0) > 0)
            .filter_map(|entry| Some((entry.file_digest()?, entry.mode & 0o111 != 0)))
            .collect();
        let (present, pending) = (self.lock_present(), self.lock_pending());
        let mut coming = self.lock_coming();
        let mut names = HashSet::new();
        for head in reader.heads() {
            let name = blob_name(&head.digest, head.executable);
            if named.contains(&(head.digest, head.executable))
                && !present.contains(&name)
                && !pending.contains_key(&name)
                && !coming.contains_key(&name)
            {
                coming.insert(name.clone(), listening.clone());
                names.insert(name);
            }
        }
        Expected { cache: self, names }
    }

    /// Writes each expected blob as it arrives; answers how many.
    async fn bring(
        self: &Arc<Self>,
        reader: &mut PackReader,
        mut expected: Expected<'_>,
        progress: &tokio::sync::watch::Sender<u64>,
    ) -> Result<u64, CacheError> {
        let mut brought = 0;
        while let Some((head, bytes)) = reader
            .next_file()
            .await
            .map_err(|error| CacheError::Blobs(error.to_string()))?
        {
            let name = blob_name(&head.digest, head.executable);
            if !expected.names.contains(&name) {
                continue;
            }
            // In turn with a fetch of the same blob that began before it was coming.
            let gate = self.gate(&name);
            let turn = gate.lock().await;
            let there =
                self.lock_present().contains(&name) || self.lock_pending().contains_key(&name);
            if !there {
                self.write_brought(head, bytes).await?;
                brought += 1;
            }
            drop(turn);
            self.release(&name, gate);
            // There before it is no longer coming: a waiter finds one or the other.
            self.lock_coming().remove(&name);
            expected.names.remove(&name);
            progress.send_modify(|count| *count += 1);
        }
        Ok(brought)
    }

    /// Writes a blob a pack brought as a session's fetch does.
    async fn write_brought(
        self: &Arc<Self>,
        head: PackHead,
        bytes: bytes::Bytes,
    ) -> Result<(), CacheError> {
        let source = Box::new(std::io::Cursor::new(bytes));
        let kept = self
            .keep(head.digest, head.executable, source, head.size, true)
            .await?;
        if kept.is_some() {
            self.settle_soon(head.digest, head.executable);
        }
        Ok(())
    }

    /// Writes and stores the version's pack from what its sessions read (`paths`, in order),
    /// unless the store has one: the files among them the cache holds, within the pack's
    /// bounds. Answers how many files it holds (0: none written).
    pub(super) async fn write_pack(
        &self,
        layer_tree: &str,
        tree: &Tree,
        paths: &[String],
    ) -> Result<usize, CacheError> {
        let Ok(digest) = layer_tree.parse::<Digest>() else {
            return Ok(0);
        };
        let blobs_error = |error: plinth_blobs::BlobError| CacheError::Blobs(error.to_string());
        if self.blobs.has_pack(&digest).await.map_err(blobs_error)? {
            return Ok(0);
        }
        let by_path: HashMap<&str, &plinth_blobs::tree::TreeEntry> = tree
            .entries
            .iter()
            .filter(|entry| entry.kind == TreeEntryKind::File && entry.size.unwrap_or(0) > 0)
            .map(|entry| (entry.path.as_str(), entry))
            .collect();
        let mut seen = HashSet::new();
        let mut files: Vec<(PackHead, std::path::PathBuf)> = Vec::new();
        {
            let (present, pending) = (self.lock_present(), self.lock_pending());
            for path in paths {
                let Some(entry) = by_path.get(path.as_str()) else {
                    continue;
                };
                let Some(digest) = entry.file_digest() else {
                    continue;
                };
                let executable = entry.mode & 0o111 != 0;
                let name = blob_name(&digest, executable);
                if !seen.insert(name.clone()) {
                    continue;
                }
                // A pending blob is read through a descriptor of its own.
                let source = if present.contains(&name) {
                    self.blob_path(&digest, executable)
                } else if let Some(file) = pending.get(&name) {
                    format!("/proc/self/fd/{}", file.as_raw_fd()).into()
                } else {
                    continue;
                };
                let head = PackHead {
                    digest,
                    executable,
                    size: entry.size.unwrap_or(0),
                };
                files.push((head, source));
            }
        }
        if files.is_empty() {
            return Ok(0);
        }
        // Pending blobs' descriptors stay open while the pack is written.
        let held: Vec<Arc<std::fs::File>> = self.lock_pending().values().cloned().collect();
        let staging = self.root.join("staging");
        let written = tokio::task::spawn_blocking(move || -> std::io::Result<_> {
            // One evicted since it was looked up is left out.
            let sources: Vec<(PackHead, std::fs::File)> = files
                .into_iter()
                .filter_map(|(head, path)| Some((head, std::fs::File::open(path).ok()?)))
                .collect();
            // Unnamed once open: nothing is left of it if the node stops.
            let path = staging.join(format!("pack-{}", uuid::Uuid::new_v4().simple()));
            let mut out = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .open(&path)?;
            std::fs::remove_file(&path)?;
            let mut buffered = std::io::BufWriter::new(&mut out);
            let heads = plinth_blobs::pack::write_pack(sources, &mut buffered)?;
            std::io::Write::flush(&mut buffered)?;
            drop(buffered);
            drop(held);
            std::io::Seek::rewind(&mut out)?;
            Ok((heads.len(), out))
        })
        .await
        .map_err(|error| io("writing a pack")(std::io::Error::other(error)))?
        .map_err(io("writing a pack"))?;
        let (count, file) = written;
        self.blobs
            .put_pack(&digest, file)
            .await
            .map_err(blobs_error)?;
        metrics::counter!("plinth_node_packs_written_total").increment(1);
        Ok(count)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use plinth_blobs::BlobStore;
    use plinth_blobs::tree::{Tree, TreeEntry, TreeEntryKind};

    use super::*;

    fn file(path: &str, content: &str, executable: bool) -> TreeEntry {
        TreeEntry {
            path: path.to_owned(),
            kind: TreeEntryKind::File,
            mode: if executable { 0o755 } else { 0o644 },
            size: Some(content.len() as u64),
            digest: Some(Digest::of(content.as_bytes()).to_string()),
            target: None,
        }
    }

    /// Two nodes' caches over one store holding a version of `files`.
    async fn two_nodes(
        files: &[(&str, &str, bool)],
    ) -> (
        tempfile::TempDir,
        Arc<VersionCache>,
        Arc<VersionCache>,
        Arc<Tree>,
        String,
    ) {
        let dir = tempfile::tempdir().expect("dir");
        let store = BlobStore::open(
            &format!("file://{}", dir.path().join("store").display()),
            dir.path().join("spool"),
        )
        .expect("store");
        let mut entries = Vec::new();
        for (path, content, executable) in files {
            store
                .put_bytes(bytes::Bytes::copy_from_slice(content.as_bytes()))
                .await
                .expect("put");
            entries.push(file(path, content, *executable));
        }
        let tree = Tree::new(entries);
        let layer = store
            .put_bytes(tree.encode().expect("encode").into())
            .await
            .expect("tree")
            .digest;
        let open = |name: &str| {
            Arc::new(VersionCache::open(&dir.path().join(name), store.clone(), 0).expect("open"))
        };
        let (first, second) = (open("first"), open("second"));
        (dir, first, second, Arc::new(tree), layer.to_string())
    }

    async fn read(cache: &Arc<VersionCache>, content: &str, executable: bool) -> String {
        let digest = Digest::of(content.as_bytes());
        let mut read = String::new();
        match cache
            .fetch_for_session(digest, executable)
            .await
            .expect("fetched")
        {
            Some(file) => {
                let mut reader =
                    crate::lazy::reader(&file, content.len() as u64).expect("a reader");
                std::io::Read::read_to_string(&mut reader, &mut read).expect("read");
            }
            None => {
                read =
                    std::fs::read_to_string(cache.blob_path(&digest, executable)).expect("named");
            }
        }
        read
    }

    /// Removes the blob of `content` from the store: from then on only a pack brings it.
    fn forget(dir: &tempfile::TempDir, content: &str) {
        let location = BlobStore::location(&Digest::of(content.as_bytes()));
        std::fs::remove_file(dir.path().join("store").join(location.to_string())).expect("removed");
    }

    #[tokio::test]
    async fn a_node_that_lacks_a_version_gets_what_the_first_node_read_from_its_pack() {
        let files = [
            ("lib/a.py", "import b\n", false),
            ("lib/b.py", "x = 1\n", false),
            ("bin/tool", "#!/bin/sh\necho tool\n", true),
            ("lib/unread.py", "never opened\n", false),
            ("lib/same.py", "x = 1\n", false),
        ];
        let (dir, first, second, tree, layer) = two_nodes(&files).await;
        // The first node's sessions read three files (and one twice, under two names).
        for (_, content, executable) in &files[..3] {
            read(&first, content, *executable).await;
        }
        let order: Vec<String> = ["lib/a.py", "bin/tool", "lib/b.py", "lib/same.py", "nowhere"]
            .map(str::to_owned)
            .to_vec();
        let packed = first
            .write_pack(&layer, &tree, &order)
            .await
            .expect("written");
        assert_eq!(packed, 3, "each content once, only what the tree names");
        assert_eq!(
            first
                .write_pack(&layer, &tree, &order)
                .await
                .expect("asked"),
            0,
            "a pack the store holds is not written again"
        );
        // Only the pack holds what was read from here on.
        for (_, content, _) in &files[..3] {
            forget(&dir, content);
        }

        // The second node starts reading while the pack is opened; it waits for the pack.
        let (brought, early) = tokio::join!(
            second.unpack(&layer, &tree),
            read(&second, "#!/bin/sh\necho tool\n", true)
        );
        assert_eq!(brought.expect("unpacked"), 3);
        assert_eq!(early, "#!/bin/sh\necho tool\n");
        assert_eq!(read(&second, "import b\n", false).await, "import b\n");
        assert_eq!(read(&second, "x = 1\n", false).await, "x = 1\n");
        // What was not read came from the store as before.
        assert_eq!(
            read(&second, "never opened\n", false).await,
            "never opened\n"
        );
        // And a materialization links it all, modes as the tree says.
        second
            .materialize("env_1", 1, &layer)
            .await
            .expect("materialized");
        let root = second.version_dir("env_1", 1);
        assert_eq!(
            std::fs::read_to_string(root.join("bin/tool")).expect("read"),
            "#!/bin/sh\necho tool\n"
        );
        use std::os::unix::fs::PermissionsExt as _;
        let mode = |path: &str| {
            std::fs::metadata(root.join(path))
                .expect("stat")
                .permissions()
                .mode()
                & 0o777
        };
        assert_eq!((mode("bin/tool"), mode("lib/a.py")), (0o555, 0o444));
        assert!(second.lock_coming().is_empty());
    }

    /// A pack that ends early (a store that fails mid-stream, an upload cut short): what came
    /// before the cut stays, a session waiting on a file past it gets it from the store, and
    /// nothing is left coming.
    #[tokio::test]
    async fn a_pack_cut_short_keeps_what_came_and_the_rest_comes_from_the_store() {
        let files = [
            ("a.txt", "first file\n", false),
            ("b.txt", "second file, cut\n", false),
            ("c.txt", "third file\n", false),
        ];
        let (dir, first, second, tree, layer) = two_nodes(&files).await;
        for (_, content, executable) in &files {
            read(&first, content, *executable).await;
        }
        let order: Vec<String> = ["a.txt", "b.txt", "c.txt"].map(str::to_owned).to_vec();
        let packed = first
            .write_pack(&layer, &tree, &order)
            .await
            .expect("written");
        assert_eq!(packed, 3);
        // Cut inside the second file's bytes.
        let digest: Digest = layer.parse().expect("digest");
        let stored = dir
            .path()
            .join("store")
            .join(BlobStore::pack_location(&digest).to_string());
        let whole = std::fs::metadata(&stored).expect("the pack").len();
        let cut = whole - "third file\n".len() as u64 - 8;
        std::fs::OpenOptions::new()
            .write(true)
            .open(&stored)
            .expect("opened")
            .set_len(cut)
            .expect("cut");
        // The first file is in the pack only: read, it came from there.
        forget(&dir, "first file\n");

        let (brought, late) = tokio::join!(
            second.unpack(&layer, &tree),
            read(&second, "third file\n", false)
        );
        assert!(brought.is_err(), "a pack cut short is not read as whole");
        assert_eq!(late, "third file\n");
        assert_eq!(read(&second, "first file\n", false).await, "first file\n");
        assert_eq!(
            read(&second, "second file, cut\n", false).await,
            "second file, cut\n"
        );
        assert!(second.lock_coming().is_empty(), "nothing is left coming");
    }

    #[tokio::test]
    async fn a_forged_pack_brings_nothing_false_and_the_files_come_from_the_store() {
        let files = [
            ("a.txt", "genuine a\n", false),
            ("b.txt", "genuine b\n", false),
        ];
        let (_dir, _first, second, tree, layer) = two_nodes(&files).await;
        let digest: Digest = layer.parse().expect("digest");
        // Heads that name the version's files, bytes that are not theirs; and a file the
        // tree does not name at all.
        let head = |content: &str, size: u64| PackHead {
            digest: Digest::of(content.as_bytes()),
            executable: false,
            size,
        };
        let mut forged = tempfile::tempfile().expect("a file");
        plinth_blobs::pack::write_pack(
            vec![
                (head("planted\n", 8), &b"planted\n"[..]),
                (head("genuine a\n", 10), &b"genuine a\n"[..]),
                (head("genuine b\n", 10), &b"forged b!\n"[..]),
            ],
            &mut forged,
        )
        .expect("written");
        std::io::Seek::rewind(&mut forged).expect("rewound");
        second
            .blobs
            .put_pack(&digest, forged)
            .await
            .expect("stored");
        let brought = second.unpack(&layer, &tree).await;
        assert!(brought.is_err(), "a file that is not its head's is refused");
        assert!(second.lock_coming().is_empty(), "nothing is left coming");
        assert!(
            !second
                .lock_pending()
                .contains_key(&blob_name(&Digest::of(b"planted\n"), false)),
            "what the tree does not name is not kept"
        );
        assert_eq!(read(&second, "genuine a\n", false).await, "genuine a\n");
        assert_eq!(read(&second, "genuine b\n", false).await, "genuine b\n");
    }
}
