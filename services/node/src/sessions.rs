//! The sessions on this node, kept on disk so a restarted node serves them again:
//! `sessions/<id>/session.json` (what it reads, its uid) beside `sessions/<id>/work/`, the
//! working directory (mode 0700, owned by the session's uid). A session directory without its
//! record is a half-made attach and is removed at start.

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
    /// Its mount namespace, once made (isolated nodes only); it goes when the session does.
    pub namespace: tokio::sync::OnceCell<Arc<std::os::fd::OwnedFd>>,
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
    id.strip_prefix("sess_").is_some_and(|hex| {
        hex.len() == 32
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// The node's sessions.
#[derive(Debug)]
pub struct SessionTable {
    dir: PathBuf,
    base_uid: u32,
    sessions: Mutex<HashMap<String, Arc<LocalSession>>>,
}

impl SessionTable {
    /// Loads the sessions on disk under `dir`.
    pub fn load(dir: &Path, base_uid: u32) -> Result<Self, SessionError> {
        std::fs::create_dir_all(dir).map_err(io(format!("creating {}", dir.display())))?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711))
            .map_err(io(format!("securing {}", dir.display())))?;
        let mut sessions = HashMap::new();
        for entry in std::fs::read_dir(dir).map_err(io(format!("reading {}", dir.display())))? {
            let entry = entry.map_err(io(format!("reading {}", dir.display())))?;
            let path = entry.path();
            let record = std::fs::read(path.join("session.json"))
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
                    };
                    sessions.insert(session.record.session_id.clone(), Arc::new(session));
                }
                None => {
                    tracing::warn!(dir = %path.display(), "removing a session directory without a valid record");
                    remove_tree(&path);
                }
            }
        }
        Ok(SessionTable {
            dir: dir.to_owned(),
            base_uid,
            sessions: Mutex::new(sessions),
        })
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
        let made = (|| {
            std::fs::create_dir_all(&workdir).map_err(io("creating the working directory"))?;
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o711))
                .map_err(io("securing the session directory"))?;
            std::fs::set_permissions(&workdir, std::fs::Permissions::from_mode(0o700))
                .map_err(io("securing the working directory"))?;
            if owned_by_uid {
                std::os::unix::fs::chown(&workdir, Some(record.uid), Some(record.uid))
                    .map_err(io("giving the working directory to the session's uid"))?;
            }
            // The record last, atomically: a directory without one is a half-made attach.
            let json = serde_json::to_vec_pretty(&record)
                .map_err(|error| io("encoding the record")(std::io::Error::other(error)))?;
            let temporary = dir.join(".session.json.tmp");
            std::fs::write(&temporary, json).map_err(io("writing the session record"))?;
            std::fs::rename(&temporary, dir.join("session.json"))
                .map_err(io("writing the session record"))
        })();
        if let Err(error) = made {
            remove_tree(&dir);
            return Err(error);
        }
        let session = Arc::new(LocalSession {
            record,
            workdir,
            ended: CancellationToken::new(),
            namespace: Default::default(),
        });
        sessions.insert(session.record.session_id.clone(), session.clone());
        Ok(session)
    }

    /// Ends a session: its commands are killed and its directory removed before this returns.
    pub async fn detach(&self, id: &str) -> bool {
        let Some(session) = self.lock().remove(id) else {
            return false;
        };
        session.ended.cancel();
        let dir = self.dir.join(id);
        let _ = tokio::task::spawn_blocking(move || remove_tree(&dir)).await;
        true
    }

    /// Ends every session not in `live` (the catalog's list after a restart); answers how many.
    pub async fn retain(&self, live: &HashSet<String>) -> usize {
        let stale: Vec<String> = self
            .ids()
            .into_iter()
            .filter(|id| !live.contains(id))
            .collect();
        for id in &stale {
            self.detach(id).await;
        }
        stale.len()
    }
}
