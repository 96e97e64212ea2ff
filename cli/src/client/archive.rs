//! `plinth push`'s archive: a directory as one tar.gz, made while the directory is walked and
//! sent as it is made. Nothing holds the whole archive, in memory or on disk: a blocking
//! thread walks and compresses into a bounded channel that the request body drains, so a
//! slow server slows the walk instead of growing a buffer.
//!
//! Left out: what `.gitignore`, `.ignore` and `.plinthignore` files name (gitignore syntax),
//! `.git`, and unless asked for, the directories a build makes again from the manifests:
//! virtualenvs (`.venv`, or any directory holding a `pyvenv.cfg`), `node_modules` and
//! `__pycache__`. What was left out is counted by reason, so `push` can say so.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

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

/// Directories a build makes again from the project's manifests, left out by default.
pub const DEFAULT_IGNORED: [&str; 3] = [".venv", "node_modules", "__pycache__"];

/// The ignore file of Plinth's own, read beside `.gitignore` and `.ignore`.
pub const IGNORE_FILE: &str = ".plinthignore";

/// What the walk left out of the archive.
#[derive(Debug, Default)]
pub struct Walked {
    /// Members that are neither files, directories nor symlinks (sockets, FIFOs, devices):
    /// their paths, relative to the directory.
    pub skipped: Vec<PathBuf>,
    /// Files (and symlinks) inside default-ignored directories, by reason (`in .venv
    /// (default)`).
    pub by_default: BTreeMap<String, u64>,
    /// Files (and symlinks) an ignore file named (`.gitignore`, `.ignore`, `.plinthignore`,
    /// `.git/info/exclude`).
    pub by_ignore_files: u64,
}

impl Walked {
    /// Files left out, every reason together.
    pub fn total(&self) -> u64 {
        self.skipped.len() as u64 + self.by_default.values().sum::<u64>() + self.by_ignore_files
    }
}

/// Whether `path`, a directory named `name`, is one a build makes again: the reason its files
/// are counted under (`in .venv (default)`) when it is.
fn default_ignored(name: &str, path: &Path) -> Option<String> {
    if DEFAULT_IGNORED.contains(&name) {
        return Some(format!("in {name} (default)"));
    }
    // A virtualenv under another name (`venv`, `env`, `.tox/py312`).
    path.join("pyvenv.cfg")
        .is_file()
        .then(|| format!("in {name} (a virtualenv, default)"))
}

/// Files and symlinks under `dir`, never following a link.
fn count_files(dir: &Path) -> u64 {
    let mut count = 0;
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            match entry.file_type() {
                Ok(kind) if kind.is_dir() => pending.push(entry.path()),
                Ok(_) => count += 1,
                Err(_) => {}
            }
        }
    }
    count
}

/// Starts archiving `dir`: the request body to send, and the walk, which answers once the
/// archive is complete (or why it could not be made).
pub fn stream(
    dir: PathBuf,
    default_ignores: bool,
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
        let result = write_archive(&dir, default_ignores, writer, &walk_counters);
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

/// A walk of `dir` that never enters `.git` nor (with `default_ignores`) the directories a
/// build makes again, which it counts into `by_default`; `standard` turns the ignore files on.
fn walker(
    dir: &Path,
    standard: bool,
    default_ignores: bool,
    by_default: Option<Arc<Mutex<BTreeMap<String, u64>>>>,
) -> ignore::Walk {
    let mut builder = ignore::WalkBuilder::new(dir);
    builder.standard_filters(standard);
    if standard {
        builder.add_custom_ignore_filename(IGNORE_FILE);
    }
    builder
        .hidden(false)
        .git_global(false)
        .require_git(false)
        .follow_links(false)
        .sort_by_file_name(|a, b| a.cmp(b))
        .filter_entry(move |entry| {
            if entry.file_name() == ".git" {
                return false;
            }
            if !default_ignores || !entry.file_type().is_some_and(|kind| kind.is_dir()) {
                return true;
            }
            let name = entry.file_name().to_string_lossy();
            let Some(reason) = default_ignored(&name, entry.path()) else {
                return true;
            };
            if let Some(by_default) = &by_default {
                let files = count_files(entry.path());
                if let Ok(mut by_default) = by_default.lock() {
                    *by_default.entry(reason).or_default() += files;
                }
            }
            false
        })
        .build()
}

/// Walks `dir` (honouring `.gitignore`, `.ignore`, `.plinthignore` and `.git/info/exclude`,
/// never entering `.git`, and leaving out the default-ignored directories unless
/// `default_ignores` is off) and writes every member, in name order, as a tar.gz to `writer`.
fn write_archive(
    dir: &Path,
    default_ignores: bool,
    writer: ChannelWriter,
    counters: &Counters,
) -> anyhow::Result<Walked> {
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
    let by_default = Arc::new(Mutex::new(BTreeMap::new()));
    let walk = walker(dir, true, default_ignores, Some(by_default.clone()));
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
    walked.by_default = by_default
        .lock()
        .map(|counted| counted.clone())
        .unwrap_or_default();
    // What the ignore files left out: every member a walk without them finds, less those the
    // archive holds or the walk skipped for their kind.
    let everything = walker(dir, false, default_ignores, None)
        .flatten()
        .filter(|entry| entry.depth() > 0)
        .filter(|entry| !entry.file_type().is_some_and(|kind| kind.is_dir()))
        .count() as u64;
    walked.by_ignore_files = everything
        .saturating_sub(counters.files.load(Ordering::Relaxed))
        .saturating_sub(walked.skipped.len() as u64);
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
