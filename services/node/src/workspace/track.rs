//! Writing files for a session so the write can be undone and told apart from anybody
//! else's: before a set of files is written, what was there is saved as a snapshot appended
//! to a pack (restore puts it back, and removes files the write made); after, the
//! digest of what this service wrote is recorded in `expected.json` (with the content itself
//! when it is small), so `changes` can report files changed by anything else, with a diff.
//! Both live beside the working directory, hidden from the session's commands.
//!
//! What this costs is bounded whatever the session's files are: a file is copied into a
//! snapshot by streaming, never read whole, and one past [`MAX_FILE_BYTES`] is refused
//! (`file_too_large`) before a byte of it is read; snapshots are kept up to the workspace's
//! budget (`node.workspace_snapshot_max_bytes`), the oldest removed past it (the newest is
//! always kept, so the last write can be undone), and a pack is removed with its last
//! snapshot; kept contents no record names any more are removed.

use std::collections::BTreeMap;
use std::io::{Read, Write as _};
use std::path::{Path, PathBuf};

use plinth_kit::{ErrorCode, PlinthError};
use rustix::fs::FileType;
use serde::{Deserialize, Serialize};
use sha2::Digest as _;

use super::beneath::{self, Previous, Step};
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

/// Where a snapshot is. Snapshots are appended to packs, `snapshots/pack-<n>`, each record
/// the contents one after another, then the manifest (JSON), then the manifest's length as 8
/// bytes, little-endian: a write creates no file for its snapshot (creating a file is the
/// dearest step of a write on many disks), and a pack is removed once every snapshot in it
/// is. Snapshots an earlier release wrote are directories (`<token>/`, holding
/// `manifest.json` and a file per index), read and removed as such.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    /// In `pack-<segment>`, the bytes `start..start + length`.
    Pack {
        segment: u64,
        start: u64,
        length: u64,
    },
    /// `snapshots/<token>/`.
    Directory,
}

/// One snapshot the ledger lists: its token, what it costs against the budget, and where it
/// is.
#[derive(Debug, Clone)]
struct Kept {
    token: String,
    bytes: u64,
    place: Place,
}

impl Kept {
    /// Its ledger line.
    fn line(&self) -> String {
        match self.place {
            Place::Pack {
                segment,
                start,
                length,
            } => format!("{} {} {segment} {start} {length}\n", self.token, self.bytes),
            Place::Directory => format!("{} {}\n", self.token, self.bytes),
        }
    }
}

fn pack_path(snapshots: &Path, segment: u64) -> PathBuf {
    snapshots.join(format!("pack-{segment}"))
}

/// A snapshot opened to read what it saved.
enum Stored {
    Pack(std::fs::File),
    Directory(PathBuf),
}

impl Stored {
    /// The snapshot at `place` and its manifest; `None` when it is not there whole.
    fn open(snapshots: &Path, token: &str, place: Place) -> Option<(Stored, Vec<SnapshotEntry>)> {
        match place {
            Place::Directory => {
                let path = snapshots.join(token);
                let manifest = std::fs::read(path.join("manifest.json")).ok()?;
                let entries = serde_json::from_slice(&manifest).ok()?;
                Some((Stored::Directory(path), entries))
            }
            Place::Pack {
                segment,
                start,
                length,
            } => {
                let file = std::fs::File::open(pack_path(snapshots, segment)).ok()?;
                let end = start.checked_add(length)?;
                let mut size = [0u8; 8];
                std::os::unix::fs::FileExt::read_exact_at(&file, &mut size, end.checked_sub(8)?)
                    .ok()?;
                let size = u64::from_le_bytes(size);
                let from = end.checked_sub(8)?.checked_sub(size)?;
                if from < start {
                    return None;
                }
                let mut manifest = vec![0u8; usize::try_from(size).ok()?];
                std::os::unix::fs::FileExt::read_exact_at(&file, &mut manifest, from).ok()?;
                let entries = serde_json::from_slice(&manifest).ok()?;
                Some((Stored::Pack(file), entries))
            }
        }
    }

    /// The content entry `index` saved.
    fn content(&self, index: usize, entry: &SnapshotEntry) -> Result<Vec<u8>, PlinthError> {
        match (self, entry.at) {
            (Stored::Pack(file), Some((start, length))) => {
                let mut content = vec![0u8; usize::try_from(length).map_err(internal)?];
                std::os::unix::fs::FileExt::read_exact_at(file, &mut content, start)
                    .map_err(internal)?;
                Ok(content)
            }
            (Stored::Directory(dir), _) => {
                std::fs::read(dir.join(index.to_string())).map_err(internal)
            }
            (Stored::Pack(_), None) => Err(internal("a snapshot entry without its place")),
        }
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
/// [`beneath::open_previous`]. A file past [`MAX_FILE_BYTES`] is refused before it is read.
fn open_current(
    ws: &Workspace,
    parts: &[String],
    display: &str,
) -> Result<Option<(std::fs::File, rustix::fs::Stat)>, PlinthError> {
    let root = ws.open_base(Base::Root)?;
    let parent = parts[..parts.len().saturating_sub(1)].join("/");
    let dir = match beneath::open_beneath_dir(&root, &parent, display) {
        Ok(dir) => dir,
        Err(error) if error.code == ErrorCode::WorkspaceNotFound => return Ok(None),
        Err(error) => return Err(error),
    };
    let name = parts.last().map(String::as_str).unwrap_or_default();
    beneath::open_previous(&dir, name, display, Some(ws.uid), MAX_FILE_BYTES)
}

/// Whether a file is at `parts` now (checked as a write would replace it, whatever its size;
/// never read).
pub fn exists(ws: &Workspace, parts: &[String], display: &str) -> Result<bool, PlinthError> {
    let root = ws.open_base(Base::Root)?;
    let parent = parts[..parts.len().saturating_sub(1)].join("/");
    let dir = match beneath::open_beneath_dir(&root, &parent, display) {
        Ok(dir) => dir,
        Err(error) if error.code == ErrorCode::WorkspaceNotFound => return Ok(false),
        Err(error) => return Err(error),
    };
    let name = parts.last().map(String::as_str).unwrap_or_default();
    Ok(beneath::open_previous(&dir, name, display, Some(ws.uid), u64::MAX)?.is_some())
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
    let segment = next_segment(&snapshots, ws.snapshot_budget)?;
    let pack = pack_path(&snapshots, segment);
    let (entries, start, length) = save(ws, changes, &pack)?;
    let place = Place::Pack {
        segment,
        start,
        length,
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
            if let Some((stored, _)) = Stored::open(&snapshots, &token, place) {
                let _ = undo(ws, &stored, &entries[..done]);
            }
            // Writes to a workspace are serialised: nothing was appended after this one.
            let _ = std::fs::OpenOptions::new()
                .write(true)
                .open(&pack)
                .and_then(|file| file.set_len(start));
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
        Kept {
            token: token.clone(),
            bytes: length + SNAPSHOT_OVERHEAD_BYTES,
            place,
        },
        ws.snapshot_budget,
    )?;
    Ok(token)
}

/// Appends what each change replaces, and the manifest, to the pack `pack`; answers the
/// manifest's entries and where the snapshot starts in the pack and its length. What it
/// appended is cut off again when it fails.
fn save(
    ws: &Workspace,
    changes: &[Change],
    pack: &Path,
) -> Result<(Vec<SnapshotEntry>, u64, u64), PlinthError> {
    let mut out = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(pack)
        .map_err(internal)?;
    let start = out.metadata().map_err(internal)?.len();
    let saved = (|| {
        let mut entries = Vec::new();
        let mut at = start;
        for change in changes {
            let (mode, place) = match open_current(ws, &change.parts, &change.display)? {
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
                    let place = (at, copied);
                    at += copied;
                    (Some(stat.st_mode & 0o777), Some(place))
                }
            };
            entries.push(SnapshotEntry {
                path: change.parts.clone(),
                mode,
                at: place,
            });
        }
        let manifest = serde_json::to_vec(&entries).map_err(internal)?;
        out.write_all(&manifest)
            .and_then(|()| out.write_all(&(manifest.len() as u64).to_le_bytes()))
            .map_err(internal)?;
        Ok((entries, start, at + manifest.len() as u64 + 8 - start))
    })();
    if saved.is_err() {
        let _ = out.set_len(start);
    }
    saved
}

/// Parses the ledger file's text: a `<token> <bytes> <pack> <start> <length>` line when a
/// snapshot is made (`<token> <bytes>` for a directory an earlier release wrote), a
/// `- <token>` line when it is removed, applied in order; a line a crash cut short is left
/// out. Answers the snapshots kept, oldest first, and the lines read.
fn parse_ledger(text: &str) -> (Vec<Kept>, usize) {
    let mut kept: Vec<Kept> = Vec::new();
    let mut lines = 0;
    for line in text.lines() {
        lines += 1;
        let fields: Vec<&str> = line.split(' ').collect();
        let number = |index: usize| fields.get(index).and_then(|field| field.parse().ok());
        let made = match fields.as_slice() {
            ["-", token] => {
                kept.retain(|known| known.token != *token);
                continue;
            }
            [token, _] => number(1).map(|bytes| (token, bytes, Place::Directory)),
            [token, _, _, _, _] => match (number(1), number(2), number(3), number(4)) {
                (Some(bytes), Some(segment), Some(start), Some(length)) => Some((
                    token,
                    bytes,
                    Place::Pack {
                        segment,
                        start,
                        length,
                    },
                )),
                _ => None,
            },
            _ => None,
        };
        if let Some((token, bytes, place)) = made.filter(|(token, ..)| valid_token(token)) {
            kept.retain(|known| known.token != *token);
            kept.push(Kept {
                token: (*token).to_owned(),
                bytes,
                place,
            });
        }
    }
    (kept, lines)
}

/// The snapshots kept, oldest first, as `snapshots/ledger` lists them; rebuilt from the
/// directories when it is missing (written before snapshots had a budget).
fn ledger(snapshots: &Path) -> Vec<Kept> {
    if let Ok(text) = std::fs::read_to_string(snapshots.join("ledger")) {
        return parse_ledger(&text).0;
    }
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
        let bytes: u64 = std::fs::read_dir(entry.path())
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|file| file.metadata().ok())
            .map(|metadata| metadata.len())
            .sum();
        found.push((made, name, bytes + SNAPSHOT_OVERHEAD_BYTES));
    }
    found.sort();
    found
        .into_iter()
        .map(|(_, token, bytes)| Kept {
            token,
            bytes,
            place: Place::Directory,
        })
        .collect()
}

/// A workspace's snapshots as its ledger file lists them, oldest first, and their total.
#[derive(Debug, Default)]
struct Ledger {
    kept: std::collections::VecDeque<Kept>,
    total: u64,
    /// Lines in the file: it is rewritten with only the kept snapshots once it holds twice
    /// as many as they need, so a write past the budget appends too.
    lines: usize,
    /// The pack new snapshots go to.
    segment: u64,
}

/// The ledgers of the workspaces this node wrote for lately, by snapshots directory, so a
/// write appends one line to its ledger file instead of reading and rewriting all of it.
/// The file stays the truth: an entry is read from it on first use (after a restart, or
/// once the map was emptied past [`LEDGERS_KEPT`]), and every change is written to it
/// before the write answers. Writes to one workspace are serialised by the node, and the
/// map's lock covers the rest.
static LEDGERS: std::sync::LazyLock<std::sync::Mutex<std::collections::HashMap<PathBuf, Ledger>>> =
    std::sync::LazyLock::new(Default::default);

/// Workspaces whose ledgers, and whose records, are kept in memory at most (a few bytes
/// per snapshot or path each).
const LEDGERS_KEPT: usize = 4096;

/// The entry of `map` for `key`, read with `load` on first use; the map is emptied first
/// when it holds [`LEDGERS_KEPT`] other workspaces.
fn cached<'a, V>(
    map: &'a mut std::collections::HashMap<PathBuf, V>,
    key: &Path,
    load: impl FnOnce() -> Result<V, PlinthError>,
) -> Result<&'a mut V, PlinthError> {
    if map.len() >= LEDGERS_KEPT && !map.contains_key(key) {
        map.clear();
    }
    if !map.contains_key(key) {
        let value = load()?;
        map.insert(key.to_path_buf(), value);
    }
    map.get_mut(key)
        .ok_or_else(|| internal("a workspace's entry was not loaded"))
}

/// Largest pack new snapshots are still appended to: a quarter of the budget, at most
/// 4 MiB, so what pruned snapshots leave on disk until their pack goes stays small beside
/// the budget.
fn pack_bytes(budget: u64) -> u64 {
    (budget / 4).clamp(1, 4 * 1024 * 1024)
}

/// Rewrites the ledger file with only the kept snapshots.
fn rewrite(snapshots: &Path, ledger: &mut Ledger) -> std::io::Result<()> {
    let text: String = ledger.kept.iter().map(Kept::line).collect();
    let temporary = snapshots.join(".ledger.tmp");
    std::fs::File::create(&temporary)
        .and_then(|mut opened| opened.write_all(text.as_bytes()))
        .and_then(|()| std::fs::rename(&temporary, snapshots.join("ledger")))?;
    ledger.lines = ledger.kept.len();
    Ok(())
}

/// The workspace's ledger, read from its files on first use: the file is then rewritten
/// whole (a line a crash cut short is never appended to), and packs no kept snapshot is in
/// (left by a crash between a pack and its ledger line) are removed, but the newest.
fn loaded<'a>(
    ledgers: &'a mut std::collections::HashMap<PathBuf, Ledger>,
    snapshots: &Path,
) -> Result<&'a mut Ledger, PlinthError> {
    cached(ledgers, snapshots, || {
        let kept: std::collections::VecDeque<Kept> = ledger(snapshots).into();
        let total = kept.iter().map(|kept| kept.bytes).sum();
        let packs: Vec<u64> = std::fs::read_dir(snapshots)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|entry| {
                entry
                    .file_name()
                    .to_str()
                    .and_then(|name| name.strip_prefix("pack-"))
                    .and_then(|number| number.parse().ok())
            })
            .collect();
        let segment = packs.iter().copied().max().unwrap_or(0);
        for pack in packs {
            let used = kept
                .iter()
                .any(|kept| matches!(kept.place, Place::Pack { segment, .. } if segment == pack));
            if !used && pack != segment {
                let _ = std::fs::remove_file(pack_path(snapshots, pack));
            }
        }
        let mut ledger = Ledger {
            kept,
            total,
            lines: 0,
            segment,
        };
        rewrite(snapshots, &mut ledger).map_err(internal)?;
        Ok(ledger)
    })
}

/// The pack the next snapshot goes to: the newest, or a new one once it is full.
fn next_segment(snapshots: &Path, budget: u64) -> Result<u64, PlinthError> {
    let mut ledgers = LEDGERS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let ledger = loaded(&mut ledgers, snapshots)?;
    let length = std::fs::metadata(pack_path(snapshots, ledger.segment)).map_or(0, |m| m.len());
    if length >= pack_bytes(budget) {
        ledger.segment += 1;
    }
    Ok(ledger.segment)
}

/// Where the snapshot `token` is, when the ledger lists it.
fn place_of(snapshots: &Path, token: &str) -> Option<Place> {
    let mut ledgers = LEDGERS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let ledger = loaded(&mut ledgers, snapshots).ok()?;
    ledger
        .kept
        .iter()
        .find(|kept| kept.token == token)
        .map(|kept| kept.place)
}

/// Adds a snapshot to the ledger and removes the oldest until the rest fit in `budget`
/// (never the one just added); a pack goes once no kept snapshot is in it.
fn admit(snapshots: &Path, made: Kept, budget: u64) -> Result<(), PlinthError> {
    let mut ledgers = LEDGERS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let ledger = loaded(&mut ledgers, snapshots)?;
    // A token is new with its write: it is added, never replaced.
    let mut appended = made.line();
    ledger.total += made.bytes;
    ledger.kept.push_back(made);
    let mut pruned = 0;
    while ledger.total > budget && ledger.kept.len() > 1 {
        let Some(oldest) = ledger.kept.pop_front() else {
            break;
        };
        match oldest.place {
            Place::Directory => {
                let _ = std::fs::remove_dir_all(snapshots.join(&oldest.token));
            }
            Place::Pack { segment, .. } => {
                let still = ledger.kept.front().is_some_and(|next| {
                    matches!(next.place, Place::Pack { segment: other, .. } if other == segment)
                });
                if !still && segment != ledger.segment {
                    let _ = std::fs::remove_file(pack_path(snapshots, segment));
                }
            }
        }
        ledger.total = ledger.total.saturating_sub(oldest.bytes);
        appended.push_str(&format!("- {}\n", oldest.token));
        pruned += 1;
    }
    let added = 1 + pruned;
    let written = if ledger.lines + added <= 2 * ledger.kept.len() + 64 {
        // The usual case, past the budget too: a line or two more.
        std::fs::OpenOptions::new()
            .append(true)
            .open(snapshots.join("ledger"))
            .and_then(|mut opened| opened.write_all(appended.as_bytes()))
            .map(|()| ledger.lines += added)
    } else {
        rewrite(snapshots, ledger)
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
            let (dir, name) = beneath::parent(&root, parts, display, ws.uid, true)?;
            beneath::replace(&dir, name, content, mode, ws.uid, display)
        }
        None => match beneath::parent(&root, parts, display, ws.uid, false) {
            Ok((dir, name)) => beneath::remove(&dir, name, display),
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
    let snapshots = ws.state.join("snapshots");
    let (stored, entries) = valid_token(token)
        .then(|| place_of(&snapshots, token))
        .flatten()
        .and_then(|place| Stored::open(&snapshots, token, place))
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
    let (expected, lines) = cached(&mut records, &ws.state, || {
        let expected = load_expected(ws)?;
        fold_expected(ws, &expected)?;
        Ok((expected, 0))
    })?;
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
/// at `MAX_SNIPPETS_BYTES` in all.
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
    beneath::walk(
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
            if beneath::kind(&walked.stat) != FileType::RegularFile {
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
    let (mut file, _) = beneath::open_previous(dir, name, name, owner, MAX_FILE_BYTES).ok()??;
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

    /// The snapshots kept, as the ledger file alone says, sorted.
    fn snapshots_kept(ws: &Workspace) -> Vec<String> {
        let text =
            std::fs::read_to_string(ws.state.join("snapshots").join("ledger")).unwrap_or_default();
        let mut found: Vec<String> = parse_ledger(&text)
            .0
            .into_iter()
            .map(|kept| kept.token)
            .collect();
        found.sort();
        found
    }

    /// The packs on disk and their sizes.
    fn packs(ws: &Workspace) -> Vec<(String, u64)> {
        let mut found: Vec<(String, u64)> = std::fs::read_dir(ws.state.join("snapshots"))
            .into_iter()
            .flatten()
            .flatten()
            .filter(|entry| entry.file_name().to_string_lossy().starts_with("pack-"))
            .map(|entry| {
                let size = entry.metadata().expect("metadata").len();
                (entry.file_name().to_string_lossy().into_owned(), size)
            })
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
        assert_eq!(snapshots_kept(&ws), Vec::<String>::new());
        assert!(
            packs(&ws).iter().all(|(_, size)| *size == 0),
            "nothing of the refused write is kept: {:?}",
            packs(&ws)
        );
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
        let kept = snapshots_kept(&ws);
        assert!(kept.len() >= 2 && kept.len() <= 3, "{kept:?}");
        let on_disk: u64 = packs(&ws).iter().map(|(_, size)| size).sum();
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
        assert_eq!(snapshots_kept(&tiny), std::slice::from_ref(&token));
        assert_eq!(packs(&tiny).len(), 1, "the first write's pack is gone");
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
        let kept = snapshots_kept(&ws);
        assert!((8..=12).contains(&kept.len()), "{} kept", kept.len());
        assert!(
            longest <= 2 * kept.len() + 64 + 2,
            "{longest} lines at most"
        );
        let mut in_memory: Vec<String> = LEDGERS
            .lock()
            .expect("ledgers")
            .get(&ws.state.join("snapshots"))
            .expect("this workspace's ledger")
            .kept
            .iter()
            .map(|kept| kept.token.clone())
            .collect();
        in_memory.sort();
        assert_eq!(kept, in_memory);
        // Packs whose snapshots were all pruned are gone.
        assert!(packs(&ws).len() <= 2, "{:?}", packs(&ws));
        for token in &kept {
            let place = place_of(&ws.state.join("snapshots"), token).expect("listed");
            assert!(Stored::open(&ws.state.join("snapshots"), token, place).is_some());
        }
    }

    /// A write makes no file for its snapshot (they are appended to a pack), and a snapshot
    /// directory an earlier release wrote and listed (`manifest.json` and a file per index)
    /// still restores, and is removed whole once it is the oldest past the budget.
    #[test]
    fn snapshots_are_packed_and_earlier_directories_still_restore() {
        let dir = tempfile::tempdir().expect("dir");
        let ws = crate::workspace::on_disk(dir.path(), 1 << 30);
        write(&ws, &[change("a.txt", b"one")]).expect("write");
        write(&ws, &[change("b.txt", b"bee")]).expect("write");
        let token =
            write(&ws, &[change("a.txt", b"two"), change("b.txt", b"bee two")]).expect("write");
        let snapshots = ws.state.join("snapshots");
        let names: Vec<String> = std::fs::read_dir(&snapshots)
            .expect("snapshots")
            .flatten()
            .map(|entry| entry.file_name().to_string_lossy().into_owned())
            .collect();
        assert!(!names.iter().any(|name| valid_token(name)), "{names:?}");
        assert_eq!(packs(&ws).len(), 1, "{names:?}");
        restore(&ws, &token).expect("restores");
        assert_eq!(std::fs::read(ws.root.join("a.txt")).expect("a"), b"one");
        assert_eq!(std::fs::read(ws.root.join("b.txt")).expect("b"), b"bee");

        // As an earlier release left it: a.txt held "old", c.txt did not exist; read by a
        // node started after it.
        let earlier = plinth_kit::ids::RollbackToken::generate().to_string();
        let saved = snapshots.join(&earlier);
        std::fs::create_dir(&saved).expect("dir");
        std::fs::write(saved.join("0"), b"old").expect("content");
        std::fs::write(
            saved.join("manifest.json"),
            br#"[{"path":["a.txt"],"mode":420},{"path":["c.txt"],"mode":null}]"#,
        )
        .expect("manifest");
        let mut ledger = std::fs::read_to_string(snapshots.join("ledger")).expect("ledger");
        ledger.insert_str(0, &format!("{earlier} 4200\n"));
        std::fs::write(snapshots.join("ledger"), ledger).expect("ledger");
        LEDGERS.lock().expect("ledgers").remove(&snapshots);
        std::fs::write(ws.root.join("c.txt"), b"made later").expect("c");
        assert_eq!(
            restore(&ws, &earlier).expect("an earlier snapshot restores"),
            ["a.txt", "c.txt"]
        );
        assert_eq!(std::fs::read(ws.root.join("a.txt")).expect("a"), b"old");
        assert!(!ws.root.join("c.txt").exists());

        let small = crate::workspace::on_disk(dir.path(), 1);
        let newest = write(&small, &[change("a.txt", b"three")]).expect("write");
        assert!(!saved.exists(), "the earlier directory was pruned");
        assert_eq!(snapshots_kept(&small), [newest]);
        assert_eq!(packs(&small).len(), 1, "{:?}", packs(&small));
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
