//! Workspace operations on a session's files: what agent runtimes' tools do (read, list,
//! search, find, edit, patch, write, restore, changes). The gRPC face is
//! `crate::grpc::workspace`; the gateway's Novo and Brain adapters map their protocols
//! onto it.
//!
//! A workspace is the session's working directory (its root, writable) and the version
//! mounted at `/env/<slug>` (readable by absolute path, never writable). Every path is
//! resolved beneath one of those two directories by the file system (`beneath`). Beside the
//! working directory, hidden from the session's commands, the node keeps what undoes edits
//! (snapshots appended to packs, `snapshots/pack-<n>`, that `snapshots/ledger` lists) and
//! what this service itself last wrote to each file (`expected.json`), so it can tell its
//! own writes from anybody else's.

pub mod beneath;
pub mod patch;
pub mod search;
pub mod text;
pub mod track;

use std::os::fd::OwnedFd;
use std::path::PathBuf;

use plinth_kit::{ErrorCode, PlinthError};

/// Largest file a workspace call reads or writes whole.
pub const MAX_FILE_BYTES: u64 = 64 * 1024 * 1024;

/// Which directory a path is beneath.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Base {
    /// The session's working directory.
    Root,
    /// The environment's mount (read-only).
    Mount,
}

/// A checked workspace path.
#[derive(Debug, Clone)]
pub struct Target {
    /// Its directory.
    pub base: Base,
    /// Components beneath it (empty: the directory itself).
    pub parts: Vec<String>,
    /// As answered: relative to the root (`.` for the root), or absolute under the mount.
    pub display: String,
}

impl Target {
    /// The components joined with `/` (`""` for the base itself).
    pub fn rel(&self) -> String {
        self.parts.join("/")
    }
}

/// One session's workspace.
#[derive(Debug, Clone)]
pub struct Workspace {
    /// The working directory, on the host.
    pub root: PathBuf,
    /// The working directory as the session's commands see it: absolute paths beneath it are
    /// the session's files, and answers name it so.
    pub shown_root: PathBuf,
    /// `/env/<slug>`.
    pub mount: String,
    /// What the mount shows, as the session's commands see it: the mount inside the
    /// session's sandbox (`/proc/<keeper>/root/env/<slug>`, an overlay of a layered version
    /// over its bases), or the materialized version's directory without isolation.
    pub version_dir: PathBuf,
    /// Who files written for the session belong to.
    pub uid: u32,
    /// Where the node keeps this workspace's snapshots and records (hidden from commands).
    pub state: PathBuf,
    /// Bytes of snapshots kept; the oldest past it are removed (`track`).
    pub snapshot_budget: u64,
}

fn invalid(path: &str, why: &str) -> PlinthError {
    PlinthError::new(ErrorCode::WorkspacePathInvalid, format!("{path:?}: {why}"))
}

impl Workspace {
    /// Checks `path`: relative to the root, or absolute beneath the root or the mount. `.`
    /// and empty components are dropped; `..` is refused (never resolved by string).
    pub fn resolve(&self, path: &str) -> Result<Target, PlinthError> {
        if path.contains('\0') {
            return Err(invalid(path, "contains a NUL byte"));
        }
        if path.len() > 4096 {
            return Err(invalid(path, "longer than 4096 bytes"));
        }
        let root = self.shown_root.to_string_lossy();
        let (base, rest) = if let Some(rest) = path.strip_prefix('/') {
            let absolute = format!("/{rest}");
            if let Some(rest) = strip_dir(&absolute, &self.mount) {
                (Base::Mount, rest.to_owned())
            } else if let Some(rest) = strip_dir(&absolute, &root) {
                (Base::Root, rest.to_owned())
            } else {
                return Err(invalid(
                    path,
                    &format!(
                        "outside the workspace: paths are relative to the workspace root, or absolute beneath it ({root}) or beneath the read-only environment ({})",
                        self.mount
                    ),
                ));
            }
        } else {
            (Base::Root, path.to_owned())
        };
        let mut parts = Vec::new();
        for part in rest.split('/') {
            match part {
                "" | "." => {}
                ".." => return Err(invalid(path, "has a .. component")),
                part if part.len() > 255 => {
                    return Err(invalid(path, "a name is longer than 255 bytes"));
                }
                part => parts.push(part.to_owned()),
            }
        }
        let display = match base {
            Base::Root if parts.is_empty() => ".".to_owned(),
            Base::Root => parts.join("/"),
            Base::Mount if parts.is_empty() => self.mount.clone(),
            Base::Mount => format!("{}/{}", self.mount, parts.join("/")),
        };
        Ok(Target {
            base,
            parts,
            display,
        })
    }

    /// Like [`Workspace::resolve`], refusing the mount: for writes.
    pub fn resolve_writable(&self, path: &str) -> Result<Target, PlinthError> {
        let target = self.resolve(path)?;
        if target.base == Base::Mount {
            return Err(PlinthError::new(
                ErrorCode::WorkspaceReadOnly,
                format!(
                    "{}: the environment at {} is read-only; write in the workspace (relative paths) instead",
                    target.display, self.mount
                ),
            ));
        }
        if target.parts.is_empty() {
            return Err(invalid(path, "names the workspace root, not a file"));
        }
        Ok(target)
    }

    /// Opens the directory a target is beneath.
    pub fn open_base(&self, base: Base) -> Result<OwnedFd, PlinthError> {
        match base {
            Base::Root => beneath::open_root(&self.root),
            Base::Mount => beneath::open_root(&self.version_dir),
        }
    }

    /// Whose hard-linked files may be read: the session's, in its working directory; in the
    /// version anything (its files are the node's own, hard-linked from the cache).
    pub fn owner(&self, base: Base) -> Option<u32> {
        match base {
            Base::Root => Some(self.uid),
            Base::Mount => None,
        }
    }

    /// How a path beneath `target`'s base is answered.
    pub fn display(&self, base: Base, rel: &str) -> String {
        match base {
            Base::Root if rel.is_empty() => ".".to_owned(),
            Base::Root => rel.to_owned(),
            Base::Mount if rel.is_empty() => self.mount.clone(),
            Base::Mount => format!("{}/{rel}", self.mount),
        }
    }
}

/// `path` minus the directory `dir`, when it is `dir` or beneath it.
fn strip_dir<'a>(path: &'a str, dir: &str) -> Option<&'a str> {
    let rest = path.strip_prefix(dir.trim_end_matches('/'))?;
    if rest.is_empty() {
        Some("")
    } else {
        rest.strip_prefix('/')
    }
}

/// A workspace over real directories made under `dir` (`work`, `version` and `state`), run as
/// this process's user, for tests.
#[cfg(test)]
pub(crate) fn on_disk(dir: &std::path::Path, snapshot_budget: u64) -> Workspace {
    let root = dir.join("work");
    let version = dir.join("version");
    let state = dir.join("state");
    for made in [&root, &version, &state] {
        std::fs::create_dir_all(made).expect("dir");
    }
    Workspace {
        root,
        shown_root: "/home/session".into(),
        mount: "/env/demo".to_owned(),
        version_dir: version,
        uid: rustix::process::getuid().as_raw(),
        state,
        snapshot_budget,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workspace() -> Workspace {
        Workspace {
            root: PathBuf::from("/state/sessions/s/work"),
            shown_root: PathBuf::from("/home/session"),
            mount: "/env/demo".to_owned(),
            version_dir: PathBuf::from("/state/cache/versions/e/1"),
            uid: 200_000,
            state: PathBuf::from("/state/sessions/s/workspace"),
            snapshot_budget: 1 << 20,
        }
    }

    #[test]
    fn paths_resolve_beneath_the_root_or_the_mount() {
        let ws = workspace();
        let t = ws.resolve("./src//a.py").expect("relative");
        assert_eq!((t.base, t.display.as_str()), (Base::Root, "src/a.py"));
        let t = ws.resolve(".").expect("root");
        assert_eq!(
            (t.base, t.display.as_str(), t.parts.len()),
            (Base::Root, ".", 0)
        );
        let t = ws.resolve("/home/session/b").expect("absolute root");
        assert_eq!((t.base, t.display.as_str()), (Base::Root, "b"));
        let t = ws.resolve("/env/demo/run.py").expect("mount");
        assert_eq!(
            (t.base, t.display.as_str()),
            (Base::Mount, "/env/demo/run.py")
        );
        for bad in [
            "../x",
            "a/../../x",
            "/etc/passwd",
            // The host path is not the session's: it sees its files at the shown root only.
            "/state/sessions/s/work/b",
            "/home/sessionx",
            "/env/demox/a",
            "/env/other",
            "a\0b",
        ] {
            let error = ws.resolve(bad).expect_err(bad);
            assert_eq!(error.code, ErrorCode::WorkspacePathInvalid, "{bad}");
        }
        let error = ws
            .resolve_writable("/env/demo/run.py")
            .expect_err("read-only");
        assert_eq!(error.code, ErrorCode::WorkspaceReadOnly);
        let error = ws.resolve_writable(".").expect_err("root is no file");
        assert_eq!(error.code, ErrorCode::WorkspacePathInvalid);
    }
}
