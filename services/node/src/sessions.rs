//! The sessions on this node, kept on disk so a restarted node serves them again:
//! `sessions/<id>/session.json` (what it reads, its uid) beside `sessions/<id>/work/`, the
//! working directory (mode 0700, owned by the session's uid). A session directory without its
//! record is a half-made attach and is removed at start.
//!
//! A few directories of that shape (`sessions/.spare-…/`, with an empty record file to fill)
//! are made ahead of need in the background, so an attach renames one into place and fills
//! its record instead of creating three inodes while the caller waits. They have no record,
//! so a restart removes them like any half-made attach.

use std::collections::{HashMap, HashSet};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use plinth_kit::tasks::CancellationToken;
use serde::{Deserialize, Serialize};

use crate::cache::{VersionKey, remove_tree};

/// Most sessions one node holds at once (each has its own uid).
pub const MAX_SESSIONS: u32 = 60_000;

/// What a session reads and who it runs as; stored as `session.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionRecord {
    /// `sess_…`.
    pub session_id: String,
    /// `henv_…`.
    pub environment_id: String,
    /// The pinned version.
    pub version: u32,
    /// The environment's slug.
    pub slug: String,
    /// The version's layer tree.
    pub layer_tree: String,
    /// The uid (and gid) its commands run as.
    pub uid: u32,
    /// What it may use, as the catalog stored it. Records written before limits existed
    /// have none.
    #[serde(default)]
    pub limits: SessionLimits,
    /// The scope it belongs to (empty in records written before scopes were sent): its
    /// sessions share one CPU weight on this node (see [`crate::shares`]).
    #[serde(default)]
    pub scope: String,
}

/// A session's limits, as its record keeps them; `None` is no limit. The node records them
/// when the session attaches; the catalog ends sessions past `lifetime_ms` or `idle_ms`, and the
/// node detaches them when its heartbeat no longer lists them. The node never acts on those two
/// itself, so a record written when they were kept in seconds (`lifetime_s`, `idle_s`) loads
/// without them rather than with a wrong unit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct SessionLimits {
    /// Memory, in MiB.
    pub memory_mb: Option<u64>,
    /// Processes and threads at once.
    pub pids: Option<u64>,
    /// CPU, in thousandths of a core.
    pub cpu_millicores: Option<u64>,
    /// Disk used in the working directory, in MiB.
    pub disk_mb: Option<u64>,
    /// Milliseconds from creation after which the session ends.
    pub lifetime_ms: Option<u64>,
    /// Milliseconds without a turn after which the session ends.
    pub idle_ms: Option<u64>,
}

/// A session on this node.
#[derive(Debug)]
pub struct LocalSession {
    /// Its record.
    pub record: SessionRecord,
    /// Its working directory.
    pub workdir: PathBuf,
    /// Cancelled when it ends: its running commands are killed.
    pub ended: CancellationToken,
    /// Its sandbox's keeper, once started (isolated nodes only); killing it ends every
    /// process of the session.
    pub namespace: tokio::sync::OnceCell<Arc<crate::isolation::Sandbox>>,
    /// Its working directory's disk limit, when the node limits disks: an image mounted at
    /// `workdir`, removed when the session ends.
    pub disk: Mutex<Option<plinth_sandbox::disk::LimitedDir>>,
    /// Set once a command of it ran without a sandbox (`--insecure-no-isolation`): what its
    /// commands left running is then found by its id when it ends (see
    /// [`end_unisolated`]).
    pub unisolated: std::sync::atomic::AtomicBool,
}

/// Why a session could not be made.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// Every uid of the node's range is taken.
    #[error("this node holds {MAX_SESSIONS} sessions already")]
    Full,
    /// The id is not a session id.
    #[error("invalid session id {0:?}")]
    InvalidId(String),
    /// The session asks for a disk limit, and this node cannot make one.
    #[error(
        "the session asks for disk_mb, and this node cannot limit working directories (see its log at start)"
    )]
    NoDiskLimits,
    /// Local disk.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        source: std::io::Error,
    },
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> SessionError {
    let what = what.into();
    move |source| SessionError::Io { what, source }
}

/// `sess_` + 32 lowercase hex, so it is a safe directory name.
pub fn valid_session_id(id: &str) -> bool {
    plinth_kit::ids::SessionId::is_valid(id)
}

/// Spare session directories kept ready.
const SPARES: usize = 8;

/// The node's sessions.
#[derive(Debug)]
pub struct SessionTable {
    dir: PathBuf,
    base_uid: u32,
    sessions: Mutex<HashMap<String, Arc<LocalSession>>>,
    /// Session directories made ahead of need, each with its `work/` and an empty record.
    spares: Mutex<Vec<PathBuf>>,
    /// Told when a spare is taken.
    spare_taken: tokio::sync::Notify,
    /// Numbers spares' names within this process's run.
    spare_names: std::sync::atomic::AtomicU64,
    /// How working directories are limited (when the node can), and the default size
    /// spares are made with.
    disk: Option<(Arc<plinth_sandbox::disk::DiskLimits>, Option<u64>)>,
}

const RECORD: &str = "session.json";
const RECORD_DRAFT: &str = ".session.json.tmp";

/// Makes a session directory: itself (0711), `work/` (0700) and an empty record draft.
fn make_session_dir(dir: &Path) -> Result<(), SessionError> {
    let work = dir.join("work");
    std::fs::create_dir(dir).map_err(io("creating the session directory"))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711))
        .map_err(io("securing the session directory"))?;
    std::fs::create_dir(&work).map_err(io("creating the working directory"))?;
    std::fs::set_permissions(&work, std::fs::Permissions::from_mode(0o700))
        .map_err(io("securing the working directory"))?;
    std::fs::File::create(dir.join(RECORD_DRAFT)).map_err(io("writing the session record"))?;
    Ok(())
}

impl SessionTable {
    /// Loads the sessions on disk under `dir`.
    pub fn load(dir: &Path, base_uid: u32) -> Result<Self, SessionError> {
        Self::load_limited(dir, base_uid, None)
    }

    /// Loads the sessions on disk under `dir`, working directories limited by `disk` where
    /// their limits say (spares made for the default size given): what a killed node left of
    /// images is removed first, and the limited working directories of the sessions kept are
    /// mounted again.
    pub fn load_limited(
        dir: &Path,
        base_uid: u32,
        disk: Option<(Arc<plinth_sandbox::disk::DiskLimits>, Option<u64>)>,
    ) -> Result<Self, SessionError> {
        std::fs::create_dir_all(dir).map_err(io(format!("creating {}", dir.display())))?;
        if let Some((limits, _)) = &disk {
            // Before anything removes a session directory: a mounted one cannot be.
            let sessions_dir = dir.to_owned();
            limits
                .remove_leftovers(dir, |name| sessions_dir.join(name).join(RECORD).is_file())
                .map_err(|error| {
                    io("removing disk images a stopped node left")(std::io::Error::other(
                        error.to_string(),
                    ))
                })?;
        }
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711))
            .map_err(io(format!("securing {}", dir.display())))?;
        let mut sessions = HashMap::new();
        for entry in std::fs::read_dir(dir).map_err(io(format!("reading {}", dir.display())))? {
            let entry = entry.map_err(io(format!("reading {}", dir.display())))?;
            let path = entry.path();
            let record = std::fs::read(path.join(RECORD))
                .ok()
                .and_then(|bytes| serde_json::from_slice::<SessionRecord>(&bytes).ok())
                .filter(|record| {
                    valid_session_id(&record.session_id) && *entry.file_name() == *record.session_id
                });
            match record {
                Some(record) => {
                    let session = LocalSession {
                        workdir: path.join("work"),
                        record,
                        ended: CancellationToken::new(),
                        namespace: Default::default(),
                        disk: Mutex::new(None),
                        unisolated: Default::default(),
                    };
                    sessions.insert(session.record.session_id.clone(), Arc::new(session));
                }
                None if entry.file_name().to_string_lossy().starts_with(".spare-") => {
                    remove_tree(&path);
                }
                None => {
                    tracing::warn!(dir = %path.display(), "removing a session directory without a valid record");
                    remove_tree(&path);
                }
            }
        }
        if let Some((limits, _)) = &disk {
            for session in sessions.values() {
                let session_dir = dir.join(&session.record.session_id);
                if !session_dir.join("work.ext4").exists() {
                    continue;
                }
                let limited = limits.open(&session_dir).map_err(|error| {
                    io("mounting a session's working directory again")(std::io::Error::other(
                        error.to_string(),
                    ))
                })?;
                *session
                    .disk
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(limited);
            }
        }
        Ok(SessionTable {
            dir: dir.to_owned(),
            base_uid,
            sessions: Mutex::new(sessions),
            spares: Mutex::new(Vec::new()),
            spare_taken: tokio::sync::Notify::new(),
            spare_names: std::sync::atomic::AtomicU64::new(0),
            disk,
        })
    }

    /// Makes spare session directories until there are enough; blocking.
    pub fn make_spares(&self) -> Result<(), SessionError> {
        let unique = std::process::id();
        while self.lock_spares().len() < SPARES {
            let number = self
                .spare_names
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let dir = self.dir.join(format!(".spare-{unique}-{number}"));
            let made = make_session_dir(&dir).and_then(|()| match &self.disk {
                // The image of the default size formatted ahead too: an attach only mounts it.
                Some((limits, Some(size_mb))) => limits.prepare(&dir, *size_mb).map_err(|error| {
                    io("formatting a spare disk image")(std::io::Error::other(error.to_string()))
                }),
                _ => Ok(()),
            });
            if let Err(error) = made {
                remove_tree(&dir);
                return Err(error);
            }
            self.lock_spares().push(dir);
        }
        Ok(())
    }

    /// Waits until a spare is taken.
    pub async fn spare_taken(&self) {
        self.spare_taken.notified().await;
    }

    fn lock_spares(&self) -> std::sync::MutexGuard<'_, Vec<PathBuf>> {
        self.spares
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Puts a spare session directory at `dir`, or makes one there when none is ready.
    fn place_session_dir(&self, dir: &Path) -> Result<(), SessionError> {
        let spare = self.lock_spares().pop();
        if let Some(spare) = spare {
            self.spare_taken.notify_one();
            match std::fs::rename(&spare, dir) {
                Ok(()) => return Ok(()),
                Err(error) => {
                    tracing::warn!(spare = %spare.display(), %error, "cannot use a spare session directory; making one");
                    remove_tree(&spare);
                }
            }
        }
        make_session_dir(dir)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<LocalSession>>> {
        self.sessions
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// One session, if this node has it.
    pub fn get(&self, id: &str) -> Option<Arc<LocalSession>> {
        self.lock().get(id).cloned()
    }

    /// Every session's id.
    pub fn ids(&self) -> Vec<String> {
        self.lock().keys().cloned().collect()
    }

    /// How many sessions the node holds.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether the node holds none.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    /// The versions live sessions read.
    pub fn live_versions(&self) -> HashSet<VersionKey> {
        self.lock()
            .values()
            .map(|s| (s.record.environment_id.clone(), s.record.version))
            .collect()
    }

    /// Makes a session's working directory and record; attaching an attached session answers
    /// the same session.
    pub fn attach(
        &self,
        mut record: SessionRecord,
        owned_by_uid: bool,
    ) -> Result<Arc<LocalSession>, SessionError> {
        if !valid_session_id(&record.session_id) {
            return Err(SessionError::InvalidId(record.session_id));
        }
        let mut sessions = self.lock();
        if let Some(session) = sessions.get(&record.session_id) {
            return Ok(session.clone());
        }
        let used: HashSet<u32> = sessions.values().map(|s| s.record.uid).collect();
        record.uid = (0..MAX_SESSIONS)
            .map(|slot| self.base_uid + slot)
            .find(|uid| !used.contains(uid))
            .ok_or(SessionError::Full)?;
        let dir = self.dir.join(&record.session_id);
        let workdir = dir.join("work");
        let mut limited = None;
        let made = (|| {
            self.place_session_dir(&dir)?;
            if owned_by_uid {
                std::os::unix::fs::chown(&workdir, Some(record.uid), Some(record.uid))
                    .map_err(io("giving the working directory to the session's uid"))?;
            }
            if let Some(size_mb) = record.limits.disk_mb {
                let Some((disk, _)) = &self.disk else {
                    return Err(SessionError::NoDiskLimits);
                };
                limited = Some(disk.create(&dir, size_mb, record.uid, record.uid).map_err(
                    |error| {
                        io("limiting the working directory's disk")(std::io::Error::other(
                            error.to_string(),
                        ))
                    },
                )?);
            }
            // The record last, atomically: a directory without one is a half-made attach.
            let json = serde_json::to_vec_pretty(&record)
                .map_err(|error| io("encoding the record")(std::io::Error::other(error)))?;
            let draft = dir.join(RECORD_DRAFT);
            std::fs::write(&draft, json).map_err(io("writing the session record"))?;
            std::fs::rename(&draft, dir.join(RECORD)).map_err(io("writing the session record"))
        })();
        if let Err(error) = made {
            if let Some(limited) = limited.take() {
                let _ = limited.remove();
            }
            remove_tree(&dir);
            return Err(error);
        }
        let session = Arc::new(LocalSession {
            record,
            workdir,
            ended: CancellationToken::new(),
            namespace: Default::default(),
            disk: Mutex::new(limited),
            unisolated: Default::default(),
        });
        sessions.insert(session.record.session_id.clone(), session.clone());
        Ok(session)
    }

    /// Ends a session: its commands are killed and its directory removed before this returns.
    pub async fn detach(&self, id: &str) -> bool {
        let Some(session) = self.get(id) else {
            return false;
        };
        session.ended.cancel();
        // Every process of the session is gone before its uid is free for another session:
        // the keeper is reaped only once its PID namespace is empty.
        if let Some(sandbox) = session.namespace.get().cloned() {
            let _ = tokio::task::spawn_blocking(move || sandbox.end()).await;
        } else if session
            .unisolated
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            let id = id.to_owned();
            let _ = tokio::task::spawn_blocking(move || end_unisolated(&id)).await;
        }
        if self.lock().remove(id).is_none() {
            return false;
        }
        let limited = session
            .disk
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(limited) = limited {
            let _ = tokio::task::spawn_blocking(move || {
                if let Err(error) = limited.remove() {
                    tracing::warn!(%error, "cannot remove a session's disk image");
                }
            })
            .await;
        }
        let dir = self.dir.join(id);
        let _ = tokio::task::spawn_blocking(move || remove_tree(&dir)).await;
        true
    }

    /// Ends every session not in `live` (the catalog's list after a restart); answers how many.
    pub async fn retain(&self, live: &HashSet<String>) -> usize {
        self.retain_of(self.ids(), live).await
    }

    /// Ends every session of `known` (ids this node held before it asked the catalog) that is
    /// not in `live` (the catalog's answer); answers how many. A session attached after the
    /// question was sent is not in `known`, so an answer older than it cannot end it.
    pub async fn retain_of(&self, known: Vec<String>, live: &HashSet<String>) -> usize {
        let stale: Vec<String> = known.into_iter().filter(|id| !live.contains(id)).collect();
        for id in &stale {
            self.detach(id).await;
        }
        stale.len()
    }
}

/// How many times [`end_unisolated`] looks again for processes forked while it killed.
const UNISOLATED_ROUNDS: usize = 50;

/// Ends what a session's commands left running on a node that does not isolate them, which has
/// no namespace or cgroup to find them by: every process of the host whose environment names
/// the session (`PLINTH_SESSION_ID=<id>`, which each of its commands gets and their children
/// inherit), until none is left. Each is killed through a pidfd taken while its `/proc` entry
/// still answered for the process whose environment was read, so a pid reused meanwhile is
/// never signalled. A process that replaced its environment is not found: one reason running
/// without isolation is not for production. Blocking.
pub fn end_unisolated(session_id: &str) {
    use rustix::fs::{Mode, OFlags};
    let tag = format!("PLINTH_SESSION_ID={session_id}");
    let own = std::process::id();
    for _ in 0..UNISOLATED_ROUNDS {
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return;
        };
        let mut killed = 0;
        for entry in entries.flatten() {
            let Some(raw) = entry
                .file_name()
                .to_str()
                .and_then(|name| name.parse::<u32>().ok())
                .filter(|pid| *pid != own)
            else {
                continue;
            };
            let Some(pid) = i32::try_from(raw)
                .ok()
                .and_then(rustix::process::Pid::from_raw)
            else {
                continue;
            };
            let Ok(dir) = rustix::fs::open(
                entry.path(),
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
            ) else {
                continue;
            };
            let environ = rustix::fs::openat(
                &dir,
                "environ",
                OFlags::RDONLY | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .ok()
            .and_then(|file| {
                let mut bytes = Vec::new();
                std::io::Read::read_to_end(&mut std::fs::File::from(file), &mut bytes).ok()?;
                Some(bytes)
            });
            let Some(environ) = environ else {
                continue;
            };
            if !environ
                .split(|byte| *byte == 0)
                .any(|entry| entry == tag.as_bytes())
            {
                continue;
            }
            let Ok(pidfd) = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty())
            else {
                continue;
            };
            // A `/proc/<pid>` directory answers only for the process it was opened for: the
            // pidfd is that process's if the directory still answers after it was taken.
            if rustix::fs::statat(&dir, "stat", rustix::fs::AtFlags::empty()).is_err() {
                continue;
            }
            if rustix::process::pidfd_send_signal(&pidfd, rustix::process::Signal::KILL).is_ok() {
                killed += 1;
            }
        }
        if killed == 0 {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    tracing::warn!(session = %session_id, "processes of an unisolated session kept appearing while they were killed");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: &str) -> SessionRecord {
        SessionRecord {
            session_id: id.to_owned(),
            environment_id: "henv_0123456789abcdef0123456789abcdef".to_owned(),
            version: 1,
            slug: "demo".to_owned(),
            layer_tree: "sha256:00".to_owned(),
            uid: 0,
            limits: SessionLimits::default(),
            scope: "acme".to_owned(),
        }
    }

    fn entries(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .expect("test setup")
            .map(|entry| {
                entry
                    .expect("test setup")
                    .file_name()
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        names.sort();
        names
    }

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path)
            .expect("test setup")
            .permissions()
            .mode()
            & 0o7777
    }

    #[test]
    fn an_attach_takes_a_spare_and_a_restart_keeps_sessions_but_not_spares() {
        let root = tempfile::tempdir().expect("test setup");
        let dir = root.path().join("sessions");
        let table = SessionTable::load(&dir, 50_000).expect("test setup");
        table.make_spares().expect("test setup");
        let spares = entries(&dir);
        assert_eq!(spares.len(), SPARES);
        assert!(spares.iter().all(|name| name.starts_with(".spare-")));

        let id = "sess_0123456789abcdef0123456789abcdef";
        let session = table.attach(record(id), false).expect("test setup");
        assert_eq!(session.workdir, dir.join(id).join("work"));
        let names = entries(&dir);
        assert_eq!(
            names.len(),
            SPARES,
            "one spare became the session: {names:?}"
        );
        assert!(names.contains(&id.to_owned()));
        assert_eq!(entries(&dir.join(id)), ["session.json", "work"]);
        assert_eq!(mode(&dir.join(id)), 0o711);
        assert_eq!(mode(&session.workdir), 0o700);
        std::fs::write(session.workdir.join("notes.txt"), "kept").expect("test setup");

        // Made again, the spare taken is replaced.
        table.make_spares().expect("test setup");
        assert_eq!(entries(&dir).len(), SPARES + 1);

        drop(table);
        let reloaded = SessionTable::load(&dir, 50_000).expect("test setup");
        assert_eq!(entries(&dir), [id]);
        let again = reloaded.get(id).expect("the session survives a restart");
        assert_eq!(again.record.uid, session.record.uid);
        assert_eq!(
            std::fs::read_to_string(again.workdir.join("notes.txt")).expect("test setup"),
            "kept"
        );
    }

    #[test]
    fn without_spares_an_attach_makes_its_own_directory() {
        let root = tempfile::tempdir().expect("test setup");
        let dir = root.path().join("sessions");
        let table = SessionTable::load(&dir, 50_000).expect("test setup");
        let id = "sess_fedcba9876543210fedcba9876543210";
        let session = table.attach(record(id), false).expect("test setup");
        assert_eq!(entries(&dir), [id]);
        assert_eq!(entries(&dir.join(id)), ["session.json", "work"]);
        assert_eq!(mode(&session.workdir), 0o700);
        let stored: SessionRecord = serde_json::from_slice(
            &std::fs::read(dir.join(id).join("session.json")).expect("test setup"),
        )
        .expect("test setup");
        assert_eq!(stored, session.record);
    }

    #[tokio::test]
    async fn limits_are_recorded_and_a_record_without_them_still_loads() {
        let root = tempfile::tempdir().expect("test setup");
        let dir = root.path().join("sessions");
        let table = SessionTable::load(&dir, 50_000).expect("test setup");
        let limited = "sess_00000000000000000000000000000001";
        let limits = SessionLimits {
            memory_mb: Some(1024),
            pids: Some(512),
            cpu_millicores: Some(500),
            disk_mb: None,
            lifetime_ms: Some(60_000),
            idle_ms: Some(30_000),
        };
        table
            .attach(
                SessionRecord {
                    limits,
                    ..record(limited)
                },
                false,
            )
            .expect("test setup");
        // A record of a node from before limits: no `limits` key.
        let old = "sess_00000000000000000000000000000002";
        std::fs::create_dir_all(dir.join(old).join("work")).expect("test setup");
        let mut json = serde_json::to_value(record(old)).expect("test setup");
        json.as_object_mut().expect("object").remove("limits");
        std::fs::write(dir.join(old).join("session.json"), json.to_string()).expect("test setup");
        drop(table);

        let reloaded = SessionTable::load(&dir, 50_000).expect("test setup");
        assert_eq!(reloaded.get(limited).expect("kept").record.limits, limits);
        assert_eq!(
            reloaded
                .get(old)
                .expect("an old record loads")
                .record
                .limits,
            SessionLimits::default()
        );

        // Only sessions known before the catalog was asked are ended for missing from its
        // answer.
        let live: HashSet<String> = HashSet::new();
        assert_eq!(reloaded.retain_of(vec![old.to_owned()], &live).await, 1);
        assert!(reloaded.get(old).is_none());
        assert!(reloaded.get(limited).is_some());
        assert!(!dir.join(old).exists());
    }
}
