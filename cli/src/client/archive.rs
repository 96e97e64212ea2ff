//! `plinth push`'s archive: a directory as one tar.gz, made while the directory is walked and
//! sent as it is made. Nothing holds the whole archive, in memory or on disk: a blocking
//! thread walks and compresses into a bounded channel that the request body drains, so a
//! slow server slows the walk instead of growing a buffer.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::Context as _;
use bytes::Bytes;
use tokio::sync::mpsc;

/// The one directory every member is put under. The server strips a single directory that
/// wraps an archive (the shape of a repository archive); wrapping always means exactly this
/// one is stripped, so a project whose only top-level entry is, say, `src/` keeps it.
const WRAPPER: &str = "project";

/// Compressed bytes per chunk handed to the request body.
const CHUNK_BYTES: usize = 64 * 1024;

/// Chunks in flight between the walker and the request body: with `CHUNK_BYTES`, at most
/// half a MiB of the archive is ever held.
const CHUNKS_IN_FLIGHT: usize = 8;

/// What the walk has put into the archive so far; read by the progress display while the
/// walk runs.
#[derive(Debug, Default)]
pub struct Counters {
    /// Regular files and symlinks.
    pub files: AtomicU64,
    /// Directories below the root.
    pub directories: AtomicU64,
    /// Bytes of the files' contents, before compression.
    pub bytes: AtomicU64,
    /// Compressed bytes handed to the request.
    pub sent: AtomicU64,
}

/// Members the walk left out because they are neither files, directories nor symlinks
/// (sockets, FIFOs, devices).
#[derive(Debug, Default)]
pub struct Walked {
    /// Their paths, relative to the directory.
    pub skipped: Vec<PathBuf>,
}

/// Starts archiving `dir`: the request body to send, and the walk, which answers once the
/// archive is complete (or why it could not be made).
pub fn stream(
    dir: PathBuf,
    counters: Arc<Counters>,
) -> (
    reqwest::Body,
    tokio::task::JoinHandle<anyhow::Result<Walked>>,
) {
    let (sender, receiver) = mpsc::channel::<std::io::Result<Bytes>>(CHUNKS_IN_FLIGHT);
    let walk_counters = counters.clone();
    let walker = tokio::task::spawn_blocking(move || {
        let writer = ChannelWriter {
            sender: sender.clone(),
            buffer: Vec::with_capacity(CHUNK_BYTES),
            counters: walk_counters.clone(),
        };
        let result = write_archive(&dir, writer, &walk_counters);
        if let Err(error) = &result {
            // Cut the upload off, so the server imports nothing of a partial archive.
            let _ = sender.blocking_send(Err(std::io::Error::other(format!("{error:#}"))));
        }
        result
    });
    let chunks = futures::stream::unfold(receiver, |mut receiver| async move {
        receiver.recv().await.map(|chunk| (chunk, receiver))
    });
    (reqwest::Body::wrap_stream(chunks), walker)
}

/// Walks `dir` (honouring `.gitignore`, `.ignore` and `.git/info/exclude`, never entering
/// `.git`) and writes every member, in name order, as a tar.gz to `writer`.
fn write_archive(dir: &Path, writer: ChannelWriter, counters: &Counters) -> anyhow::Result<Walked> {
    let metadata = std::fs::metadata(dir)
        .with_context(|| format!("cannot read the directory {}", dir.display()))?;
    if !metadata.is_dir() {
        anyhow::bail!(
            "{} is not a directory; push takes a project directory",
            dir.display()
        );
    }
    // Fast compression: on the loopback or a LAN, the CPU is the bottleneck, not the wire,
    // and the server inflates whatever level it is sent.
    let encoder = flate2::write::GzEncoder::new(writer, flate2::Compression::fast());
    let mut archive = tar::Builder::new(encoder);
    // Modes are kept as they matter to a build (the executable bit); owners and times are not.
    archive.mode(tar::HeaderMode::Deterministic);
    archive.follow_symlinks(false);
    let mut walked = Walked::default();
    let walk = ignore::WalkBuilder::new(dir)
        .hidden(false)
        .git_global(false)
        .require_git(false)
        .follow_links(false)
        .sort_by_file_name(|a, b| a.cmp(b))
        .filter_entry(|entry| entry.file_name() != ".git")
        .build();
    for entry in walk {
        let entry = entry.map_err(|error| {
            anyhow::anyhow!("{error}; fix its permissions or list it in .gitignore")
        })?;
        let Ok(relative) = entry.path().strip_prefix(dir) else {
            continue;
        };
        if relative.as_os_str().is_empty() {
            continue;
        }
        let Some(kind) = entry.file_type() else {
            continue;
        };
        let name = Path::new(WRAPPER).join(relative);
        if kind.is_dir() {
            counters.directories.fetch_add(1, Ordering::Relaxed);
        } else if kind.is_file() || kind.is_symlink() {
            counters.files.fetch_add(1, Ordering::Relaxed);
        } else {
            walked.skipped.push(relative.to_path_buf());
            continue;
        }
        archive
            .append_path_with_name(entry.path(), &name)
            .with_context(|| format!("cannot add {} to the archive", entry.path().display()))?;
        if kind.is_file() {
            let size = entry.metadata().map(|m| m.len()).unwrap_or(0);
            counters.bytes.fetch_add(size, Ordering::Relaxed);
        }
    }
    let encoder = archive.into_inner().context("cannot finish the archive")?;
    let mut writer = encoder.finish().context("cannot finish the archive")?;
    writer.flush().context("cannot send the archive")?;
    Ok(walked)
}

/// A `Write` that hands full chunks to the request body, waiting while it is behind.
struct ChannelWriter {
    sender: mpsc::Sender<std::io::Result<Bytes>>,
    buffer: Vec<u8>,
    counters: Arc<Counters>,
}

impl ChannelWriter {
    fn send_buffer(&mut self) -> std::io::Result<()> {
        if self.buffer.is_empty() {
            return Ok(());
        }
        let chunk = std::mem::replace(&mut self.buffer, Vec::with_capacity(CHUNK_BYTES));
        let size = chunk.len() as u64;
        self.sender
            .blocking_send(Ok(Bytes::from(chunk)))
            .map_err(|_| {
                std::io::Error::new(
                    std::io::ErrorKind::BrokenPipe,
                    "the upload stopped before the archive was complete",
                )
            })?;
        self.counters.sent.fetch_add(size, Ordering::Relaxed);
        Ok(())
    }
}

impl Write for ChannelWriter {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let room = CHUNK_BYTES - self.buffer.len();
        let taken = bytes.len().min(room);
        self.buffer.extend_from_slice(&bytes[..taken]);
        if self.buffer.len() >= CHUNK_BYTES {
            self.send_buffer()?;
        }
        Ok(taken)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.send_buffer()
    }
}
