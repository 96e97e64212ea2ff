//! Writing files for a session so the write can be undone and told apart from anybody
//! else's: before a set of files is written, what was there is saved under
//! `snapshots/<token>/` (restore puts it back, and removes files the write made); after, the
//! digest of what this service wrote is recorded in `expected.json` (with the content itself
//! when it is small), so `changes` can report files changed by anything else, with a diff.
//! Both live beside the working directory, hidden from the session's commands.

use std::collections::BTreeMap;
use std::path::Path;

use plinth_kit::{ErrorCode, PlinthError};
use rustix::fs::FileType;
use serde::{Deserialize, Serialize};
use sha2::Digest as _;

use super::fsx::{self, Previous, Step};
use super::{Base, Workspace};

/// Largest earlier content kept to diff against.
const MAX_KEPT_BYTES: usize = 1024 * 1024;

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

/// What a file held before a write.
pub fn current(ws: &Workspace, parts: &[String], display: &str) -> Result<Previous, PlinthError> {
    let root = ws.open_base(Base::Root)?;
    let parent = parts[..parts.len().saturating_sub(1)].join("/");
    let dir = match fsx::open_beneath_dir(&root, &parent, display) {
        Ok(dir) => dir,
        Err(error) if error.code == ErrorCode::WorkspaceNotFound => return Ok(Previous::Missing),
        Err(error) => return Err(error),
    };
    let name = parts.last().map(String::as_str).unwrap_or_default();
    fsx::previous(&dir, name, display)
}

/// Writes every change, or none: what was there is saved first, and if a write fails the
/// ones before it are undone. Answers the rollback token.
pub fn write(ws: &Workspace, changes: &[Change]) -> Result<String, PlinthError> {
    let token = format!("rb_{}", uuid::Uuid::new_v4().simple());
    let snapshot = ws.state.join("snapshots").join(&token);
    std::fs::create_dir_all(&snapshot).map_err(internal)?;
    let mut entries = Vec::new();
    for (index, change) in changes.iter().enumerate() {
        let before = current(ws, &change.parts, &change.display)?;
        let mode = match before {
            Previous::Missing => None,
            Previous::File { content, mode } => {
                std::fs::write(snapshot.join(index.to_string()), content).map_err(internal)?;
                Some(mode)
            }
        };
        entries.push(SnapshotEntry {
            path: change.parts.clone(),
            mode,
        });
    }
    let manifest = serde_json::to_vec(&entries).map_err(internal)?;
    std::fs::write(snapshot.join("manifest.json"), manifest).map_err(internal)?;
    for (done, change) in changes.iter().enumerate() {
        let mode = entries[done].mode.unwrap_or(0o644);
        if let Err(error) = put(
            ws,
            &change.parts,
            &change.display,
            change.content.as_deref(),
            mode,
        ) {
            let _ = undo(ws, &snapshot, &entries[..done]);
            return Err(error);
        }
    }
    record(
        ws,
        changes
            .iter()
            .map(|c| (c.parts.join("/"), c.content.as_deref())),
    )?;
    Ok(token)
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
    snapshot: &Path,
    entries: &[SnapshotEntry],
) -> Result<Vec<String>, PlinthError> {
    let mut restored = Vec::new();
    let mut recorded = Vec::new();
    for (index, entry) in entries.iter().enumerate() {
        let display = entry.path.join("/");
        let content = match entry.mode {
            Some(_) => Some(std::fs::read(snapshot.join(index.to_string())).map_err(internal)?),
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
    let valid = token
        .strip_prefix("rb_")
        .is_some_and(|hex| hex.len() == 32 && hex.bytes().all(|b| b.is_ascii_hexdigit()));
    let snapshot = ws.state.join("snapshots").join(token);
    let manifest = valid
        .then(|| std::fs::read(snapshot.join("manifest.json")).ok())
        .flatten()
        .ok_or_else(|| {
            PlinthError::new(
                ErrorCode::WorkspaceNotFound,
                format!("rollback token {token:?} is not one of this workspace's"),
            )
        })?;
    let entries: Vec<SnapshotEntry> = serde_json::from_slice(&manifest).map_err(internal)?;
    undo(ws, &snapshot, &entries)
}

fn expected_path(ws: &Workspace) -> std::path::PathBuf {
    ws.state.join("expected.json")
}

fn load_expected(ws: &Workspace) -> Result<Expected, PlinthError> {
    match std::fs::read(expected_path(ws)) {
        Ok(bytes) => serde_json::from_slice(&bytes).map_err(internal),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(Expected::default()),
        Err(error) => Err(internal(error)),
    }
}

/// Records what this service wrote (content kept when small, to diff against later).
fn record<'a>(
    ws: &Workspace,
    written: impl Iterator<Item = (String, Option<&'a [u8]>)>,
) -> Result<(), PlinthError> {
    let mut expected = load_expected(ws)?;
    let kept = ws.state.join("expected");
    std::fs::create_dir_all(&kept).map_err(internal)?;
    for (path, content) in written {
        let entry = content.map(|content| {
            let hex = digest(content);
            if content.len() <= MAX_KEPT_BYTES {
                let _ = std::fs::write(kept.join(&hex), content);
            }
            hex
        });
        expected.files.insert(path, entry);
    }
    let temporary = ws.state.join(".expected.json.tmp");
    std::fs::write(&temporary, serde_json::to_vec(&expected).map_err(internal)?)
        .map_err(internal)?;
    std::fs::rename(&temporary, expected_path(ws)).map_err(internal)
}

/// A changed file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileChange {
    /// Relative to the root.
    pub path: String,
    /// `created`, `modified`, `deleted`.
    pub change: &'static str,
    /// Size now.
    pub size: u64,
    /// A unified diff, or empty.
    pub snippet: String,
    /// Why there is no snippet.
    pub reason: &'static str,
}

/// Files changed since the session started (its working directory started empty). With
/// `external_only`, only those that differ from what this service last wrote, each with a
/// diff from that where one can be made.
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
    let mut now: BTreeMap<String, (u64, String, Vec<u8>)> = BTreeMap::new();
    fsx::walk(
        &root,
        "",
        ".",
        |_, _| {},
        |walked, dir| {
            if excluded(&walked.rel) {
                return Step::Skip;
            }
            if fsx::kind(&walked.stat) != FileType::RegularFile {
                return Step::Descend;
            }
            let name = walked.rel.rsplit('/').next().unwrap_or(&walked.rel);
            if let Some(content) = fsx::read_entry(dir, name, super::MAX_FILE_BYTES, Some(ws.uid)) {
                let size = content.len() as u64;
                let hex = digest(&content);
                now.insert(walked.rel.clone(), (size, hex, content));
            }
            Step::Descend
        },
    )?;
    let mut out = Vec::new();
    for (path, (size, hex, content)) in &now {
        let before = expected.files.get(path);
        if external_only && before.is_some_and(|b| b.as_deref() == Some(hex.as_str())) {
            continue;
        }
        let change = match before {
            Some(Some(_)) => "modified",
            _ => "created",
        };
        let (snippet, reason) = if external_only {
            let earlier = match before {
                Some(Some(old)) => std::fs::read(ws.state.join("expected").join(old)).ok(),
                _ => Some(Vec::new()),
            };
            snippet_of(path, earlier.as_deref(), content, max_snippet)
        } else {
            (String::new(), "")
        };
        out.push(FileChange {
            path: path.clone(),
            change,
            size: *size,
            snippet,
            reason,
        });
    }
    if external_only {
        for (path, entry) in &expected.files {
            if entry.is_some() && !now.contains_key(path) && !excluded(path) {
                out.push(FileChange {
                    path: path.clone(),
                    change: "deleted",
                    size: 0,
                    snippet: String::new(),
                    reason: "deleted",
                });
            }
        }
        out.sort_by(|a, b| a.path.cmp(&b.path));
    }
    Ok(out)
}

fn snippet_of(
    path: &str,
    before: Option<&[u8]>,
    after: &[u8],
    max: usize,
) -> (String, &'static str) {
    let Some(before) = before else {
        return (String::new(), "partial-prior-read");
    };
    let (Ok(old), Ok(new)) = (std::str::from_utf8(before), std::str::from_utf8(after)) else {
        return (String::new(), "binary");
    };
    if old.contains('\0') || new.contains('\0') {
        return (String::new(), "binary");
    }
    let diff = similar::TextDiff::from_lines(old, new)
        .unified_diff()
        .context_radius(3)
        .header(&format!("a/{path}"), &format!("b/{path}"))
        .to_string();
    if diff.len() > max {
        return (String::new(), "snippet-too-large");
    }
    (diff, "")
}
