//! Writing files for a session so the write can be undone and told apart from anybody
//! else's: before a set of files is written, what was there is saved in one file,
//! `snapshots/<token>` (restore puts it back, and removes files the write made); after, the
//! digest of what this service wrote is recorded in `expected.json` (with the content itself
//! when it is small), so `changes` can report files changed by anything else, with a diff.
//! Both live beside the working directory, hidden from the session's commands.
//!
//! What this costs is bounded whatever the session's files are: a file is copied into a
//! snapshot by streaming, never read whole, and one past [`MAX_FILE_BYTES`] is refused
//! (`file_too_large`) before a byte of it is read; snapshots are kept up to the workspace's
//! budget (`node.workspace_snapshot_max_bytes`), the oldest removed past it (the newest is
//! always kept, so the last write can be undone); kept contents no record names any more
//! are removed.

use std::collections::BTreeMap;
use std::io::{Read, Write as _};
use std::path::{Path, PathBuf};

use plinth_kit::{ErrorCode, PlinthError};
use rustix::fs::FileType;
use serde::{Deserialize, Serialize};
use sha2::Digest as _;

use super::fsx::{self, Previous, Step};
use super::{Base, MAX_FILE_BYTES, Workspace};

/// Largest earlier content kept to diff against, and largest file diffed.
const MAX_KEPT_BYTES: usize = 1024 * 1024;
/// What a snapshot costs beyond the bytes it keeps (its file and manifest), so a flood
/// of writes of new files, each a snapshot of nothing, is bounded by the budget too.
const SNAPSHOT_OVERHEAD_BYTES: u64 = 4096;
/// Most bytes of diffs one `changes` answer carries; past it, changes are listed without one
/// (`snippet-too-large`).
const MAX_SNIPPETS_BYTES: usize = 4 * 1024 * 1024;
/// Most changes one `changes` answer lists.
pub const MAX_CHANGES: usize = 10_000;

/// One file of a write: its path beneath the root and its new content (`None`: delete it).
#[derive(Debug, Clone)]
pub struct Change {
    /// Components beneath the root.
    pub parts: Vec<String>,
    /// As answered.
    pub display: String,
    /// The new content, or `None` to remove the file.
    pub content: Option<Vec<u8>>,
}

#[derive(Debug, Serialize, Deserialize)]
struct SnapshotEntry {
    path: Vec<String>,
    /// The file's mode when it existed; `None`: the write made it.
    mode: Option<u32>,
    /// Where its content starts in the snapshot file, and how long it is (absent in a
    /// snapshot directory an earlier release wrote, which holds it as file `<index>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    at: Option<(u64, u64)>,
}

/// How a snapshot keeps what a write replaced. A snapshot is one file (a file creation is
/// the dearest step of a write on many disks): the contents one after another, then the
/// manifest (JSON), then the manifest's length as 8 bytes, little-endian. Snapshots an
/// earlier release wrote are directories (`manifest.json` and a file per index) and are
/// read and removed as such.
enum Stored {
    File(std::fs::File),
    Directory(PathBuf),
}

impl Stored {
    /// The snapshot `token` of `snapshots` and its manifest; `None` when there is none.
    fn open(snapshots: &Path, token: &str) -> Option<(Stored, Vec<SnapshotEntry>)> {
        let path = snapshots.join(token);
        if path.is_dir() {
            let manifest = std::fs::read(path.join("manifest.json")).ok()?;
            let entries = serde_json::from_slice(&manifest).ok()?;
            return Some((Stored::Directory(path), entries));
        }
        let file = std::fs::File::open(&path).ok()?;
        let size = file.metadata().ok()?.len();
        let mut length = [0u8; 8];
        std::os::unix::fs::FileExt::read_exact_at(&file, &mut length, size.checked_sub(8)?).ok()?;
        let length = u64::from_le_bytes(length);
        let start = size.checked_sub(8)?.checked_sub(length)?;
        let mut manifest = vec![0u8; usize::try_from(length).ok()?];
        std::os::unix::fs::FileExt::read_exact_at(&file, &mut manifest, start).ok()?;
        let entries = serde_json::from_slice(&manifest).ok()?;
        Some((Stored::File(file), entries))
    }

    /// The content entry `index` saved.
    fn content(&self, index: usize, entry: &SnapshotEntry) -> Result<Vec<u8>, PlinthError> {
        match (self, entry.at) {
            (Stored::File(file), Some((start, length))) => {
                let mut content = vec![0u8; usize::try_from(length).map_err(internal)?];
                std::os::unix::fs::FileExt::read_exact_at(file, &mut content, start)
                    .map_err(internal)?;
                Ok(content)
            }
            (Stored::Directory(dir), _) => {
                std::fs::read(dir.join(index.to_string())).map_err(internal)
            }
            (Stored::File(_), None) => Err(internal("a snapshot entry without its place")),
        }
    }
}

/// Removes a snapshot, a file or (written by an earlier release) a directory.
fn remove_snapshot(path: &Path) {
    if std::fs::remove_file(path).is_err() {
        let _ = std::fs::remove_dir_all(path);
    }
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Expected {
    /// Path → digest (hex) of what this service last wrote; absent: it removed the file.
    files: BTreeMap<String, Option<String>>,
}

fn digest(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    sha2::Sha256::digest(bytes)
        .iter()
        .fold(String::with_capacity(64), |mut out, b| {
            let _ = write!(out, "{b:02x}");
            out
        })
}

fn internal(error: impl std::fmt::Display) -> PlinthError {
    PlinthError::internal(&std::io::Error::other(error.to_string()))
}

/// The file at `parts` now, opened for reading (`None`: nothing there); see
/// [`fsx::open_previous`]. A file past [`MAX_FILE_BYTES`] is refused before it is read.
fn open_current(
    ws: &Workspace,
    parts: &[String],
    display: &str,
) -> Result<Option<(std::fs::File, rustix::fs::Stat)>, PlinthError> {
    let root = ws.open_base(Base::Root)?;
    let parent = parts[..parts.len().saturating_sub(1)].join("/");
    let dir = match fsx::open_beneath_dir(&root, &parent, display) {
        Ok(dir) => dir,
        Err(error) if error.code == ErrorCode::WorkspaceNotFound => return Ok(None),
        Err(error) => return Err(error),
    };
    let name = parts.last().map(String::as_str).unwrap_or_default();
    fsx::open_previous(&dir, name, display, Some(ws.uid), MAX_FILE_BYTES)
}

/// Whether a file is at `parts` now (checked as a write would replace it, whatever its size;
/// never read).
pub fn exists(ws: &Workspace, parts: &[String], display: &str) -> Result<bool, PlinthError> {
    let root = ws.open_base(Base::Root)?;
    let parent = parts[..parts.len().saturating_sub(1)].join("/");
    let dir = match fsx::open_beneath_dir(&root, &parent, display) {
        Ok(dir) => dir,
        Err(error) if error.code == ErrorCode::WorkspaceNotFound => return Ok(false),
        Err(error) => return Err(error),
    };
    let name = parts.last().map(String::as_str).unwrap_or_default();
    Ok(fsx::open_previous(&dir, name, display, Some(ws.uid), u64::MAX)?.is_some())
}

/// What a file holds now, whole (edits work on its text); at most [`MAX_FILE_BYTES`].
pub fn current(ws: &Workspace, parts: &[String], display: &str) -> Result<Previous, PlinthError> {
    let Some((file, stat)) = open_current(ws, parts, display)? else {
        return Ok(Previous::Missing);
    };
    let mut content = Vec::with_capacity(usize::try_from(stat.st_size).unwrap_or(0));
    file.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut content)
        .map_err(internal)?;
    if content.len() as u64 > MAX_FILE_BYTES {
        return Err(PlinthError::new(
            ErrorCode::FileTooLarge,
            format!("{display} is larger than {MAX_FILE_BYTES} bytes"),
        )
        .with_detail(serde_json::json!({ "max_bytes": MAX_FILE_BYTES })));
    }
    Ok(Previous::File {
        content,
        mode: stat.st_mode & 0o777,
    })
}

/// Writes every change, or none: what was there is saved first (copied, never read whole),
/// and if a write fails the ones before it are undone. Answers the rollback token; the
/// oldest snapshots past the workspace's budget are removed.
pub fn write(ws: &Workspace, changes: &[Change]) -> Result<String, PlinthError> {
    let token = plinth_kit::ids::RollbackToken::generate().to_string();
    let snapshots = ws.state.join("snapshots");
    std::fs::create_dir_all(&snapshots).map_err(internal)?;
    let snapshot = snapshots.join(&token);
    let (entries, kept) = match save(ws, changes, &snapshot) {
        Ok(saved) => saved,
        Err(error) => {
            remove_snapshot(&snapshot);
            return Err(error);
        }
    };
    for (done, change) in changes.iter().enumerate() {
        let mode = entries[done].mode.unwrap_or(0o644);
        if let Err(error) = put(
            ws,
            &change.parts,
            &change.display,
            change.content.as_deref(),
            mode,
        ) {
            if let Some((stored, _)) = Stored::open(&snapshots, &token) {
                let _ = undo(ws, &stored, &entries[..done]);
            }
            remove_snapshot(&snapshot);
            return Err(error);
        }
    }
    record(
        ws,
        changes
            .iter()
            .map(|c| (c.parts.join("/"), c.content.as_deref())),
    )?;
    admit(
        &snapshots,
        &token,
        kept + SNAPSHOT_OVERHEAD_BYTES,
        ws.snapshot_budget,
    )?;
    Ok(token)
}

/// Saves what each change replaces, and the manifest, as the snapshot file `snapshot`;
/// answers the manifest's entries and the bytes kept.
fn save(
    ws: &Workspace,
    changes: &[Change],
    snapshot: &Path,
) -> Result<(Vec<SnapshotEntry>, u64), PlinthError> {
    let mut out = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(snapshot)
        .map_err(internal)?;
    let mut entries = Vec::new();
    let mut kept = 0u64;
    for change in changes {
        let (mode, at) = match open_current(ws, &change.parts, &change.display)? {
            None => (None, None),
            Some((file, stat)) => {
                let copied = std::io::copy(&mut file.take(MAX_FILE_BYTES + 1), &mut out)
                    .map_err(internal)?;
                if copied > MAX_FILE_BYTES {
                    return Err(PlinthError::new(
                        ErrorCode::FileTooLarge,
                        format!(
                            "{} grew past {MAX_FILE_BYTES} bytes while it was saved",
                            change.display
                        ),
                    )
                    .with_detail(serde_json::json!({ "max_bytes": MAX_FILE_BYTES })));
                }
                let start = kept;
                kept += copied;
                (Some(stat.st_mode & 0o777), Some((start, copied)))
            }
        };
        entries.push(SnapshotEntry {
            path: change.parts.clone(),
            mode,
            at,
        });
    }
    let manifest = serde_json::to_vec(&entries).map_err(internal)?;
    kept += manifest.len() as u64 + 8;
    out.write_all(&manifest)
        .and_then(|()| out.write_all(&(manifest.len() as u64).to_le_bytes()))
        .map_err(internal)?;
    Ok((entries, kept))
}

/// The snapshots kept, oldest first, each with what it costs, and how many lines the file
/// holds: `snapshots/ledger`, a `<token> <bytes>` line when a snapshot is made and a
/// `- <token>` line when it is removed, applied in order (a line a crash cut short is left
/// out). Rebuilt from the directories when missing.
fn ledger(snapshots: &Path) -> (Vec<(String, u64)>, usize) {
    if let Ok(text) = std::fs::read_to_string(snapshots.join("ledger")) {
        let mut kept: Vec<(String, u64)> = Vec::new();
        let mut lines = 0;
        for line in text.lines() {
            lines += 1;
            match line.split_once(' ') {
                Some(("-", token)) => kept.retain(|(known, _)| known != token),
                Some((token, bytes)) => {
                    if let Ok(bytes) = bytes.parse() {
                        kept.retain(|(known, _)| known != token);
                        kept.push((token.to_owned(), bytes));
                    }
                }
                None => {}
            }
        }
        return (kept, lines);
    }
    // Written before snapshots had a budget: measured once, ordered by age.
    let mut found: Vec<(std::time::SystemTime, String, u64)> = Vec::new();
    for entry in std::fs::read_dir(snapshots).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !valid_token(&name) {
            continue;
        }
        let made = entry
            .metadata()
            .and_then(|metadata| metadata.modified())
            .unwrap_or(std::time::UNIX_EPOCH);
        let bytes: u64 = match entry.metadata() {
            Ok(metadata) if metadata.is_file() => metadata.len(),
            _ => std::fs::read_dir(entry.path())
                .into_iter()
                .flatten()
                .flatten()
                .filter_map(|file| file.metadata().ok())
                .map(|metadata| metadata.len())
                .sum(),
        };
        found.push((made, name, bytes + SNAPSHOT_OVERHEAD_BYTES));
    }
    found.sort();
    let kept = found
        .into_iter()
        .map(|(_, token, bytes)| (token, bytes))
        .collect();
    (kept, 0)
}

/// A workspace's snapshots as its ledger file lists them, oldest first, and their total.
#[derive(Debug, Default)]
struct Ledger {
    kept: std::collections::VecDeque<(String, u64)>,
    total: u64,
    /// Lines in the file: it is rewritten with only the kept snapshots once it holds twice
    /// as many as they need, so a write past the budget appends too.
    lines: usize,
}

/// The ledgers of the workspaces this node wrote for lately, by snapshots directory, so a
/// write appends one line to its ledger file instead of reading and rewriting all of it.
/// The file stays the truth: an entry is read from it on first use (after a restart, or
/// once the map was emptied past [`LEDGERS_KEPT`]), and every change is written to it
/// before the write answers. Writes to one workspace are serialised by the node, and the
/// map's lock covers the rest.
static LEDGERS: std::sync::LazyLock<std::sync::Mutex<std::collections::HashMap<PathBuf, Ledger>>> =
    std::sync::LazyLock::new(Default::default);

/// Workspaces whose ledgers are kept in memory at most (a few bytes per snapshot each).
const LEDGERS_KEPT: usize = 4096;

/// Adds a snapshot to the ledger and removes the oldest until the rest fit in `budget`
/// (never the one just added).
fn admit(snapshots: &Path, token: &str, bytes: u64, budget: u64) -> Result<(), PlinthError> {
    let mut ledgers = LEDGERS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if ledgers.len() >= LEDGERS_KEPT && !ledgers.contains_key(snapshots) {
        ledgers.clear();
    }
    let file = snapshots.join("ledger");
    // Read from the file on first use, which is then rewritten whole: a line a crash cut
    // short is never appended to.
    let mut loaded = false;
    let ledger = ledgers.entry(snapshots.to_path_buf()).or_insert_with(|| {
        loaded = true;
        let (kept, lines) = ledger(snapshots);
        let kept: std::collections::VecDeque<_> = kept.into();
        let total = kept.iter().map(|(_, bytes)| bytes).sum();
        Ledger { kept, total, lines }
    });
    ledger.kept.retain(|(known, _)| known != token);
    ledger.kept.push_back((token.to_owned(), bytes));
    ledger.total = ledger.kept.iter().map(|(_, bytes)| bytes).sum();
    let mut appended = format!("{token} {bytes}\n");
    let mut pruned = 0;
    while ledger.total > budget && ledger.kept.len() > 1 {
        let Some((oldest, bytes)) = ledger.kept.pop_front() else {
            break;
        };
        remove_snapshot(&snapshots.join(&oldest));
        ledger.total = ledger.total.saturating_sub(bytes);
        appended.push_str(&format!("- {oldest}\n"));
        pruned += 1;
    }
    let added = 1 + pruned;
    let written = if !loaded && file.exists() && ledger.lines + added <= 2 * ledger.kept.len() + 64
    {
        // The usual case, past the budget too: a line or two more.
        std::fs::OpenOptions::new()
            .append(true)
            .open(&file)
            .and_then(|mut opened| opened.write_all(appended.as_bytes()))
            .map(|()| ledger.lines += added)
    } else {
        let text: String = ledger
            .kept
            .iter()
            .map(|(token, bytes)| format!("{token} {bytes}\n"))
            .collect();
        let temporary = snapshots.join(".ledger.tmp");
        std::fs::File::create(&temporary)
            .and_then(|mut opened| opened.write_all(text.as_bytes()))
            .and_then(|()| std::fs::rename(&temporary, &file))
            .map(|()| ledger.lines = ledger.kept.len())
    };
    if let Err(error) = written {
        // What the file says is what a later write reads: it is read again.
        ledgers.remove(snapshots);
        return Err(internal(error));
    }
    if pruned > 0 {
        tracing::debug!(
            pruned,
            kept_bytes = ledger.total,
            budget,
            "removed the oldest workspace snapshots past the budget"
        );
    }
    Ok(())
}

fn valid_token(token: &str) -> bool {
    plinth_kit::ids::RollbackToken::is_valid(token)
}

fn put(
    ws: &Workspace,
    parts: &[String],
    display: &str,
    content: Option<&[u8]>,
    mode: u32,
) -> Result<(), PlinthError> {
    let root = ws.open_base(Base::Root)?;
    match content {
        Some(content) => {
            let (dir, name) = fsx::parent(&root, parts, display, ws.uid, true)?;
            fsx::replace(&dir, name, content, mode, ws.uid, display)
        }
        None => match fsx::parent(&root, parts, display, ws.uid, false) {
            Ok((dir, name)) => fsx::remove(&dir, name, display),
            Err(error) if error.code == ErrorCode::WorkspaceNotFound => Ok(()),
            Err(error) => Err(error),
        },
    }
}

fn undo(
    ws: &Workspace,
    stored: &Stored,
    entries: &[SnapshotEntry],
) -> Result<Vec<String>, PlinthError> {
    let mut restored = Vec::new();
    let mut recorded = Vec::new();
    for (index, entry) in entries.iter().enumerate() {
        let display = entry.path.join("/");
        let content = match entry.mode {
            Some(_) => Some(stored.content(index, entry)?),
            None => None,
        };
        put(
            ws,
            &entry.path,
            &display,
            content.as_deref(),
            entry.mode.unwrap_or(0o644),
        )?;
        recorded.push((display.clone(), content));
        restored.push(display);
    }
    record(ws, recorded.iter().map(|(p, c)| (p.clone(), c.as_deref())))?;
    Ok(restored)
}

/// Puts back what a write's token saved; answers the paths.
pub fn restore(ws: &Workspace, token: &str) -> Result<Vec<String>, PlinthError> {
    let (stored, entries) = valid_token(token)
        .then(|| Stored::open(&ws.state.join("snapshots"), token))
        .flatten()
        .ok_or_else(|| {
            PlinthError::new(
                ErrorCode::WorkspaceNotFound,
                format!(
                    "rollback token {token:?} is not one of this workspace's, or its snapshot \
                     was removed (the oldest are, once a workspace's snapshots pass \
                     node.workspace_snapshot_max_bytes)"
                ),
            )
        })?;
    undo(ws, &stored, &entries)
}

fn expected_path(ws: &Workspace) -> std::path::PathBuf {
    ws.state.join("expected.json")
}

/// What was recorded since `expected.json` was last written: one JSON line per path,
/// `["path", "digest"]` or `["path", null]` (removed), applied over it in order.
fn expected_log(ws: &Workspace) -> std::path::PathBuf {
    ws.state.join("expected.log")
}

/// Lines the log takes before they are folded into `expected.json`.
const EXPECTED_LOG_LINES: usize = 512;

/// What this service wrote, as `expected.json` and its log say.
fn load_expected(ws: &Workspace) -> Result<Expected, PlinthError> {
    let mut expected = match std::fs::read(expected_path(ws)) {
        Ok(bytes) => serde_json::from_slice(&bytes).map_err(internal)?,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Expected::default(),
        Err(error) => return Err(internal(error)),
    };
    match std::fs::read_to_string(expected_log(ws)) {
        Ok(text) => {
            // A line cut short by a crash is the last one, and is not applied.
            for line in text.lines() {
                if let Ok((path, digest)) = serde_json::from_str::<(String, Option<String>)>(line) {
                    expected.files.insert(path, digest);
                }
            }
        }
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => return Err(internal(error)),
    }
    Ok(expected)
}

/// Writes `expected` as `expected.json` and empties the log it folds in.
fn fold_expected(ws: &Workspace, expected: &Expected) -> Result<(), PlinthError> {
    let temporary = ws.state.join(".expected.json.tmp");
    std::fs::write(&temporary, serde_json::to_vec(expected).map_err(internal)?)
        .map_err(internal)?;
    std::fs::rename(&temporary, expected_path(ws)).map_err(internal)?;
    match std::fs::remove_file(expected_log(ws)) {
        Ok(()) => Ok(()),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(error) => Err(internal(error)),
    }
}

/// The records of the workspaces this node wrote for lately, by state directory, with the
/// lines their logs hold, so a write appends its lines to the log instead of reading and
/// rewriting `expected.json`. The files stay the truth: an entry is read from them on first
/// use (and folded at once, so a line a crash cut short is never appended to), and every
/// change is written to them before the write answers. Writes to one workspace are
/// serialised by the node.
static RECORDS: std::sync::LazyLock<
    std::sync::Mutex<std::collections::HashMap<PathBuf, (Expected, usize)>>,
> = std::sync::LazyLock::new(Default::default);

/// Records what this service wrote (content kept when small, to diff against later). A kept
/// content no path names any more is removed.
fn record<'a>(
    ws: &Workspace,
    written: impl Iterator<Item = (String, Option<&'a [u8]>)>,
) -> Result<(), PlinthError> {
    let mut records = RECORDS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if records.len() >= LEDGERS_KEPT && !records.contains_key(&ws.state) {
        records.clear();
    }
    if !records.contains_key(&ws.state) {
        let expected = load_expected(ws)?;
        fold_expected(ws, &expected)?;
        records.insert(ws.state.clone(), (expected, 0));
    }
    let Some((expected, lines)) = records.get_mut(&ws.state) else {
        return Err(internal("the workspace's record was not loaded"));
    };
    let kept = ws.state.join("expected");
    std::fs::create_dir_all(&kept).map_err(internal)?;
    let mut replaced = Vec::new();
    let mut log = String::new();
    for (path, content) in written {
        let entry = content.map(|content| {
            let hex = digest(content);
            // Named by its digest: one already there holds these bytes.
            if content.len() <= MAX_KEPT_BYTES && !kept.join(&hex).exists() {
                let _ = std::fs::write(kept.join(&hex), content);
            }
            hex
        });
        log.push_str(&serde_json::to_string(&(&path, &entry)).map_err(internal)?);
        log.push('\n');
        *lines += 1;
        if let Some(Some(old)) = expected.files.insert(path, entry) {
            replaced.push(old);
        }
    }
    let written = if *lines > EXPECTED_LOG_LINES {
        *lines = 0;
        fold_expected(ws, expected)
    } else {
        std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(expected_log(ws))
            .and_then(|mut file| file.write_all(log.as_bytes()))
            .map_err(internal)
    };
    if let Err(error) = written {
        // Read again from the files by the next write.
        records.remove(&ws.state);
        return Err(error);
    }
    let named: std::collections::HashSet<&str> = expected
        .files
        .values()
        .flatten()
        .map(String::as_str)
        .collect();
    for old in replaced {
        if !named.contains(old.as_str()) {
            let _ = std::fs::remove_file(kept.join(old));
        }
    }
    Ok(())
}

/// A changed file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileChange {
    /// Relative to the root.
    pub path: String,
    /// What happened to it.
    pub change: ChangeKind,
    /// Size now.
    pub size: u64,
    /// A unified diff, or empty.
    pub snippet: String,
    /// Why there is no snippet; `None` when there is one, or when none was asked for.
    pub reason: Option<NoSnippet>,
}

/// What happened to a changed file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeKind {
    /// It was not there before.
    Created,
    /// Its content differs from before.
    Modified,
    /// It is gone.
    Deleted,
}

/// Why a changed file has no diff snippet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoSnippet {
    /// Its content, before or now, is not text.
    Binary,
    /// The earlier content was not kept whole.
    PartialPriorRead,
    /// The diff is past the caller's limit, or the answer's room for snippets is used up.
    TooLarge,
    /// The file is gone.
    Deleted,
}

/// Files changed since the session started (its working directory started empty). With
/// `external_only`, only those that differ from what this service last wrote, each with a
/// diff from that where one can be made. Files are hashed as they stream; only a file small
/// enough to diff is held, one at a time. At most [`MAX_CHANGES`] are listed, and diffs stop
/// at [`MAX_SNIPPETS_BYTES`] in all.
pub fn changes(
    ws: &Workspace,
    external_only: bool,
    exclude: &[String],
    max_snippet: usize,
) -> Result<Vec<FileChange>, PlinthError> {
    let expected = if external_only {
        load_expected(ws)?
    } else {
        Expected::default()
    };
    let excluded = |rel: &str| {
        let top = rel.split('/').next().unwrap_or(rel);
        exclude.iter().any(|e| e == top)
    };
    let root = ws.open_base(Base::Root)?;
    let mut present: std::collections::BTreeSet<String> = std::collections::BTreeSet::new();
    let mut out = Vec::new();
    let mut snippets = 0usize;
    fsx::walk(
        &root,
        "",
        ".",
        |_, _| {},
        |walked, dir| {
            if out.len() >= MAX_CHANGES {
                return Step::Stop;
            }
            if excluded(&walked.rel) {
                return Step::Skip;
            }
            if fsx::kind(&walked.stat) != FileType::RegularFile {
                return Step::Descend;
            }
            let name = walked.rel.rsplit('/').next().unwrap_or(&walked.rel);
            let Some((size, hex, small, binary)) = hash_entry(dir, name, Some(ws.uid)) else {
                return Step::Descend;
            };
            present.insert(walked.rel.clone());
            let before = expected.files.get(&walked.rel);
            if external_only && before.is_some_and(|b| b.as_deref() == Some(hex.as_str())) {
                return Step::Descend;
            }
            let change = match before {
                Some(Some(_)) => ChangeKind::Modified,
                _ => ChangeKind::Created,
            };
            let (snippet, reason) = if external_only {
                let earlier = match before {
                    Some(Some(old)) => std::fs::read(ws.state.join("expected").join(old)).ok(),
                    _ => Some(Vec::new()),
                };
                match (small, earlier) {
                    (_, None) => (String::new(), Some(NoSnippet::PartialPriorRead)),
                    (Some(content), Some(earlier)) if snippets < MAX_SNIPPETS_BYTES => {
                        let room = max_snippet.min(MAX_SNIPPETS_BYTES - snippets);
                        snippet_of(&walked.rel, Some(&earlier), &content, room)
                    }
                    _ if binary => (String::new(), Some(NoSnippet::Binary)),
                    _ => (String::new(), Some(NoSnippet::TooLarge)),
                }
            } else {
                (String::new(), None)
            };
            snippets += snippet.len();
            out.push(FileChange {
                path: walked.rel.clone(),
                change,
                size,
                snippet,
                reason,
            });
            Step::Descend
        },
    )?;
    if external_only {
        for (path, entry) in &expected.files {
            if out.len() >= MAX_CHANGES {
                break;
            }
            if entry.is_some() && !present.contains(path) && !excluded(path) {
                out.push(FileChange {
                    path: path.clone(),
                    change: ChangeKind::Deleted,
                    size: 0,
                    snippet: String::new(),
                    reason: Some(NoSnippet::Deleted),
                });
            }
        }
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(out)
}

/// A regular file met by a walk: its size, its digest (hashed as it streams), its content
/// when small enough to diff, and whether its start is binary; `None` for anything that is
/// not a readable regular file of at most [`MAX_FILE_BYTES`].
fn hash_entry(
    dir: &std::os::fd::OwnedFd,
    name: &str,
    owner: Option<u32>,
) -> Option<(u64, String, Option<Vec<u8>>, bool)> {
    use std::fmt::Write as _;
    let (mut file, _) = fsx::open_previous(dir, name, name, owner, MAX_FILE_BYTES).ok()??;
    let mut hasher = sha2::Sha256::new();
    let mut small = Some(Vec::new());
    let mut buffer = vec![0u8; 64 * 1024];
    let mut size = 0u64;
    let mut binary = false;
    loop {
        let read = match file.read(&mut buffer) {
            Ok(0) => break,
            Ok(read) => read,
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return None,
        };
        let chunk = &buffer[..read];
        if size == 0 {
            binary = super::text::is_binary(chunk);
        }
        hasher.update(chunk);
        size += read as u64;
        if size > MAX_FILE_BYTES {
            return None;
        }
        small = small
            .filter(|_| size as usize <= MAX_KEPT_BYTES)
            .map(|mut kept| {
                kept.extend_from_slice(chunk);
                kept
            });
    }
    let hex = hasher
        .finalize()
        .iter()
        .fold(String::with_capacity(64), |mut out, b| {
            let _ = write!(out, "{b:02x}");
            out
        });
    Some((size, hex, small, binary))
}

fn snippet_of(
    path: &str,
    before: Option<&[u8]>,
    after: &[u8],
    max: usize,
) -> (String, Option<NoSnippet>) {
    let Some(before) = before else {
        return (String::new(), Some(NoSnippet::PartialPriorRead));
    };
    let (Ok(old), Ok(new)) = (std::str::from_utf8(before), std::str::from_utf8(after)) else {
        return (String::new(), Some(NoSnippet::Binary));
    };
    if old.contains('\0') || new.contains('\0') {
        return (String::new(), Some(NoSnippet::Binary));
    }
    let diff = similar::TextDiff::from_lines(old, new)
        .unified_diff()
        .context_radius(3)
        .header(&format!("a/{path}"), &format!("b/{path}"))
        .to_string();
    if diff.len() > max {
        return (String::new(), Some(NoSnippet::TooLarge));
    }
    (diff, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A workspace on real directories, written as the test's own user.
    fn change(path: &str, content: &[u8]) -> Change {
        Change {
            parts: path.split('/').map(str::to_owned).collect(),
            display: path.to_owned(),
            content: Some(content.to_vec()),
        }
    }

    fn snapshot_dirs(ws: &Workspace) -> Vec<String> {
        let mut found: Vec<String> = std::fs::read_dir(ws.state.join("snapshots"))
            .into_iter()
            .flatten()
            .flatten()
            .map(|entry| entry.file_name().to_string_lossy().into_owned())
            .filter(|name| valid_token(name))
            .collect();
        found.sort();
        found
    }

    /// Writing over a file past the file limit (a sparse 1 GiB file) is refused with
    /// `file_too_large` before any of it is read: the file is unchanged, and no snapshot of
    /// it is left.
    /// What a write records is in the files before it answers: read back from them alone
    /// (as after a restart), with a line a crash cut short left out.
    #[test]
    fn records_are_read_back_from_the_files_alone() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ws = crate::workspace::on_disk(dir.path(), 1024 * 1024);
        for round in 0..(EXPECTED_LOG_LINES + 10) {
            let text = format!("round {round}\n");
            write(
                &ws,
                &[Change {
                    parts: vec!["a.txt".into()],
                    display: "a.txt".into(),
                    content: Some(text.into_bytes()),
                }],
            )
            .expect("write");
        }
        let last = digest(format!("round {}\n", EXPECTED_LOG_LINES + 9).as_bytes());
        let loaded = load_expected(&ws).expect("load");
        assert_eq!(loaded.files.get("a.txt"), Some(&Some(last.clone())));
        // Only the last content is kept to diff against.
        let kept: Vec<_> = std::fs::read_dir(ws.state.join("expected"))
            .expect("kept")
            .flatten()
            .map(|entry| entry.file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(kept, std::slice::from_ref(&last));
        std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(expected_log(&ws))
            .and_then(|mut file| file.write_all(b"[\"a.txt\", \"cut sh"))
            .expect("append");
        assert_eq!(
            load_expected(&ws).expect("load").files.get("a.txt"),
            Some(&Some(last))
        );
    }

    #[test]
    fn a_write_over_a_file_past_the_limit_is_refused_before_it_is_read() {
        let dir = tempfile::tempdir().expect("dir");
        let ws = crate::workspace::on_disk(dir.path(), 1 << 30);
        let big = ws.root.join("big.bin");
        std::fs::File::create(&big)
            .and_then(|file| file.set_len(1 << 30))
            .expect("sparse file");
        let error = write(&ws, &[change("big.bin", b"small")]).expect_err("refused");
        assert_eq!(error.code, ErrorCode::FileTooLarge, "{}", error.message);
        assert_eq!(
            error.detail,
            Some(serde_json::json!({ "max_bytes": MAX_FILE_BYTES }))
        );
        assert!(error.message.contains("big.bin"), "{}", error.message);
        assert_eq!(std::fs::metadata(&big).expect("still there").len(), 1 << 30);
        assert_eq!(snapshot_dirs(&ws), Vec::<String>::new());
        let error = current(&ws, &["big.bin".to_owned()], "big.bin").expect_err("edit refused");
        assert_eq!(error.code, ErrorCode::FileTooLarge);
        assert!(exists(&ws, &["big.bin".to_owned()], "big.bin").expect("exists"));
    }

    /// Past the budget the oldest snapshots are removed (their tokens no longer restore, and
    /// say why), the newest always stays and restores, and what is kept on disk fits the
    /// budget beside the newest.
    #[test]
    fn snapshots_past_the_budget_are_pruned_oldest_first() {
        let dir = tempfile::tempdir().expect("dir");
        let budget = 300 * 1024;
        let ws = crate::workspace::on_disk(dir.path(), budget);
        let mut tokens = Vec::new();
        for round in 0..8u8 {
            let content = vec![b'a' + round; 100 * 1024];
            tokens.push(write(&ws, &[change("notes/a.txt", &content)]).expect("write"));
        }
        let kept = snapshot_dirs(&ws);
        assert!(kept.len() >= 2 && kept.len() <= 3, "{kept:?}");
        let on_disk: u64 = kept
            .iter()
            .map(|token| {
                let path = ws.state.join("snapshots").join(token);
                std::fs::metadata(path).expect("a snapshot file").len()
            })
            .sum();
        assert!(on_disk <= budget, "{on_disk} bytes kept");
        let error = restore(&ws, &tokens[0]).expect_err("pruned");
        assert_eq!(error.code, ErrorCode::WorkspaceNotFound);
        assert!(
            error.message.contains("node.workspace_snapshot_max_bytes"),
            "{}",
            error.message
        );
        let newest = tokens.last().expect("a token");
        assert!(kept.contains(newest));
        restore(&ws, newest).expect("the newest restores");
        assert_eq!(
            std::fs::read(ws.root.join("notes/a.txt")).expect("restored"),
            vec![b'a' + 6; 100 * 1024],
            "what the last write replaced"
        );

        // Even a snapshot larger than the whole budget is kept while it is the newest.
        let tiny = crate::workspace::on_disk(&dir.path().join("tiny"), 1);
        write(&tiny, &[change("a", b"first")]).expect("write");
        let token = write(&tiny, &[change("a", b"second")]).expect("write");
        assert_eq!(snapshot_dirs(&tiny), std::slice::from_ref(&token));
        restore(&tiny, &token).expect("restores");
        assert_eq!(std::fs::read(tiny.root.join("a")).expect("read"), b"first");
    }

    /// Past the budget a write still appends to the ledger (a removal is a line of its own),
    /// the file is rewritten once it holds twice the lines it needs, and what it says after
    /// any number of writes is exactly the snapshots kept, read back from the file alone.
    #[test]
    fn the_ledger_past_the_budget_grows_by_lines_and_reads_back_exactly() {
        let dir = tempfile::tempdir().expect("dir");
        let budget = 10 * (SNAPSHOT_OVERHEAD_BYTES + 200);
        let ws = crate::workspace::on_disk(dir.path(), budget);
        let file = ws.state.join("snapshots").join("ledger");
        let mut longest = 0;
        for round in 0..400u32 {
            write(&ws, &[change("a.txt", format!("{round}").as_bytes())]).expect("write");
            let lines = std::fs::read_to_string(&file)
                .expect("ledger")
                .lines()
                .count();
            longest = longest.max(lines);
        }
        let kept = snapshot_dirs(&ws);
        assert!((8..=12).contains(&kept.len()), "{} kept", kept.len());
        assert!(
            longest <= 2 * kept.len() + 64 + 2,
            "{longest} lines at most"
        );
        let (listed, _) = ledger(&ws.state.join("snapshots"));
        let mut listed: Vec<String> = listed.into_iter().map(|(token, _)| token).collect();
        listed.sort();
        let mut on_disk = kept.clone();
        on_disk.sort();
        assert_eq!(listed, on_disk);
    }

    /// A write's snapshot is one file, and a snapshot directory an earlier release wrote
    /// (`manifest.json` and a file per index) still restores, and is pruned whole.
    #[test]
    fn snapshots_are_one_file_and_earlier_directories_still_restore() {
        let dir = tempfile::tempdir().expect("dir");
        let ws = crate::workspace::on_disk(dir.path(), 1 << 30);
        write(&ws, &[change("a.txt", b"one")]).expect("write");
        write(&ws, &[change("b.txt", b"bee")]).expect("write");
        let token =
            write(&ws, &[change("a.txt", b"two"), change("b.txt", b"bee two")]).expect("write");
        let snapshots = ws.state.join("snapshots");
        assert!(snapshots.join(&token).is_file());
        restore(&ws, &token).expect("restores");
        assert_eq!(std::fs::read(ws.root.join("a.txt")).expect("a"), b"one");
        assert_eq!(std::fs::read(ws.root.join("b.txt")).expect("b"), b"bee");

        // As an earlier release left it: a.txt held "old", c.txt did not exist.
        let earlier = plinth_kit::ids::RollbackToken::generate().to_string();
        let saved = snapshots.join(&earlier);
        std::fs::create_dir(&saved).expect("dir");
        std::fs::write(saved.join("0"), b"old").expect("content");
        std::fs::write(
            saved.join("manifest.json"),
            br#"[{"path":["a.txt"],"mode":420},{"path":["c.txt"],"mode":null}]"#,
        )
        .expect("manifest");
        std::fs::write(ws.root.join("c.txt"), b"made later").expect("c");
        assert_eq!(
            restore(&ws, &earlier).expect("an earlier snapshot restores"),
            ["a.txt", "c.txt"]
        );
        assert_eq!(std::fs::read(ws.root.join("a.txt")).expect("a"), b"old");
        assert!(!ws.root.join("c.txt").exists());
        remove_snapshot(&saved);
        assert!(!saved.exists());
    }

    /// What `changes` diffs against is kept only while a record names it.
    #[test]
    fn kept_contents_no_record_names_are_removed() {
        let dir = tempfile::tempdir().expect("dir");
        let ws = crate::workspace::on_disk(dir.path(), 1 << 30);
        for round in 0..5u8 {
            write(&ws, &[change("a.txt", &[b'0' + round; 10])]).expect("write");
        }
        let kept: Vec<_> = std::fs::read_dir(ws.state.join("expected"))
            .expect("kept")
            .flatten()
            .collect();
        assert_eq!(kept.len(), 1, "only the last write's content");
        std::fs::write(ws.root.join("a.txt"), b"changed by a command\n").expect("write");
        let changed = changes(&ws, true, &[], 8 * 1024).expect("changes");
        assert_eq!(changed.len(), 1);
        assert!(
            changed[0].snippet.contains("+changed by a command"),
            "{:?}",
            changed[0]
        );
    }
}
