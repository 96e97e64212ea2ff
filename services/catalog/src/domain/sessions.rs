//! Sessions, their turns, the node agents they run on, and tasks: the domain types and their
//! rules. A session pins what it reads (environment, version, layer tree) when it is created
//! and keeps it for its whole life (UHP §6); every exec or file call is a turn that records
//! the version it read (§6.5).

use crate::domain::model::{EnvironmentId, Scope, contract_enum};
use plinth_kit::clock::now_ms;
use plinth_proto::catalog::v1 as pb;

pub use plinth_kit::ids::{NodeId, SessionId, TaskId};

contract_enum! {
    /// Whether a session can still run commands.
    pub enum SessionStatus mirrors SessionStatus {
        /// Placed on a node; commands run.
        Active,
        /// Ended: its working directory is gone.
        Ended,
    }
}

/// How long a node may stay silent before placement passes it over, unless configured
/// (`catalog.node_ttl_ms`). Short, because a session placed on a dead node is a failed create:
/// three heartbeats of one second each, so a single late heartbeat does not drop a live node.
pub const DEFAULT_NODE_TTL_MS: i64 = 3_000;

/// When a node counts as live: heard from within its TTL. Nodes are told to heartbeat three
/// times per TTL.
#[derive(Debug, Clone, Copy)]
pub struct NodeTtl {
    ttl_ms: i64,
}

impl NodeTtl {
    /// A TTL of `ttl_ms`, at least 300 ms (heartbeats every 100 ms at most).
    pub fn from_ms(ttl_ms: i64) -> Self {
        NodeTtl {
            ttl_ms: ttl_ms.max(300),
        }
    }

    /// How often nodes are told to heartbeat.
    pub fn heartbeat_every_ms(self) -> i64 {
        self.ttl_ms / 3
    }

    /// Nodes whose last heartbeat is older than this (ms since the epoch) get no new sessions.
    pub fn live_since_ms(self) -> i64 {
        now_ms() - self.ttl_ms
    }
}

impl Default for NodeTtl {
    fn default() -> Self {
        NodeTtl::from_ms(DEFAULT_NODE_TTL_MS)
    }
}

/// Largest value any limit may have: beyond anything a host has, and small enough that a
/// lifetime or idle time in milliseconds added to a timestamp stays far inside an `i64`.
pub const MAX_LIMIT_VALUE: u64 = 1 << 40;

/// What a session may use; `None` is no limit. The gateway decides them (its configured
/// defaults and maxima); the catalog stores them and acts on `lifetime_ms` and `idle_ms`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SessionLimits {
    /// Memory, in MiB.
    pub memory_mb: Option<u64>,
    /// Processes and threads at once.
    pub pids: Option<u64>,
    /// CPU, in thousandths of a core.
    pub cpu_millicores: Option<u64>,
    /// Disk used in the working directory, in MiB.
    pub disk_mb: Option<u64>,
    /// Milliseconds from creation after which the session is ended.
    pub lifetime_ms: Option<u64>,
    /// Milliseconds without a turn after which the session is ended.
    pub idle_ms: Option<u64>,
}

/// A session limit sent past the most any limit may be (`MAX_LIMIT_VALUE`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("limits.{name}: {value} is more than {MAX_LIMIT_VALUE}")]
pub struct LimitTooLarge {
    /// The limit, as the wire names it (`memory_mb`, …).
    pub name: &'static str,
    /// The value sent.
    pub value: u64,
}

impl SessionLimits {
    /// Reads limits as sent (0 is no limit), refusing values past [`MAX_LIMIT_VALUE`].
    pub fn from_wire(
        [
            memory_mb,
            pids,
            cpu_millicores,
            disk_mb,
            lifetime_ms,
            idle_ms,
        ]: [u64; 6],
    ) -> Result<Self, LimitTooLarge> {
        let value = |name: &'static str, value: u64| match value {
            0 => Ok(None),
            value if value <= MAX_LIMIT_VALUE => Ok(Some(value)),
            value => Err(LimitTooLarge { name, value }),
        };
        Ok(SessionLimits {
            memory_mb: value("memory_mb", memory_mb)?,
            pids: value("pids", pids)?,
            cpu_millicores: value("cpu_millicores", cpu_millicores)?,
            disk_mb: value("disk_mb", disk_mb)?,
            lifetime_ms: value("lifetime_ms", lifetime_ms)?,
            idle_ms: value("idle_ms", idle_ms)?,
        })
    }

    /// The limits as sent: 0 for none.
    pub fn to_wire(self) -> [u64; 6] {
        [
            self.memory_mb,
            self.pids,
            self.cpu_millicores,
            self.disk_mb,
            self.lifetime_ms,
            self.idle_ms,
        ]
        .map(|limit| limit.unwrap_or(0))
    }

    /// When a session created at `created_at_ms` whose last turn (or creation) was at
    /// `active_at_ms` ends by these limits: the earlier of its lifetime's end and its idle
    /// time's end; `None` when it has neither limit.
    pub fn ends_at_ms(&self, created_at_ms: i64, active_at_ms: i64) -> Option<i64> {
        let after = |from: i64, limit_ms: Option<u64>| {
            limit_ms.map(|ms| from.saturating_add(i64::try_from(ms).unwrap_or(i64::MAX)))
        };
        match (
            after(created_at_ms, self.lifetime_ms),
            after(active_at_ms, self.idle_ms),
        ) {
            (Some(lifetime), Some(idle)) => Some(lifetime.min(idle)),
            (lifetime, idle) => lifetime.or(idle),
        }
    }
}

/// A session: where it runs and what it reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    /// Its id.
    pub id: SessionId,
    /// Its scope.
    pub scope: Scope,
    /// The environment it reads.
    pub environment_id: EnvironmentId,
    /// That environment's name when the session was created.
    pub environment_name: String,
    /// That environment's entry command, if any.
    pub entry: String,
    /// The pinned version.
    pub version: u32,
    /// The environment's slug: the mount is `/env/<slug>`.
    pub slug: String,
    /// The pinned version's layer tree.
    pub layer_tree: String,
    /// The node it runs on.
    pub node_id: NodeId,
    /// That node's gRPC address.
    pub node_address: String,
    /// The harness it was created for; empty when none.
    pub harness_id: String,
    /// Its working directory once attached; empty before.
    pub workdir: String,
    /// Whether its node isolates commands.
    pub isolated: bool,
    /// Active or ended.
    pub status: SessionStatus,
    /// Turns recorded.
    pub turns: u64,
    /// Creation time, ms since the epoch.
    pub created_at_ms: i64,
    /// End time, ms since the epoch; 0 while active.
    pub ended_at_ms: i64,
    /// Who it was made for (a Brain binding's label); empty when a client asked for it.
    pub owner: String,
    /// Its effective limits.
    pub limits: SessionLimits,
}

contract_enum! {
    /// What a turn did.
    pub enum TurnKind mirrors TurnKind {
        /// A shell command.
        Exec,
        /// A working-directory file read.
        ReadFile,
        /// A working-directory file write.
        WriteFile,
        /// A working-directory delete.
        DeleteFile,
        /// A directory listing.
        ListFiles,
        /// A content search.
        SearchFiles,
        /// A file-name glob search.
        FindFiles,
        /// An edit of one file.
        EditFile,
        /// A patch of several files.
        ApplyPatch,
        /// A read of a command's kept output.
        ReadOutput,
        /// Files put back from a rollback token.
        Restore,
        /// A listing of the files changed in the session.
        ListChanges,
    }
}

/// Most bytes of a turn's detail (a command or a path) kept in the record.
pub const MAX_TURN_DETAIL_BYTES: usize = 4096;

/// One exec or file call of a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Turn {
    /// The session.
    pub session_id: SessionId,
    /// 1, 2, … in order.
    pub sequence: u64,
    /// What it did.
    pub kind: TurnKind,
    /// The command or the path (cut to [`MAX_TURN_DETAIL_BYTES`]).
    pub detail: String,
    /// The version it read.
    pub version: u32,
    /// When it was recorded.
    pub at_ms: i64,
    /// The command's exit status (exec only).
    pub exit_code: Option<i32>,
}

/// A node agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    /// Its id.
    pub id: NodeId,
    /// Its gRPC address.
    pub address: String,
    /// Whether it isolates commands.
    pub isolated: bool,
    /// Where it keeps sessions (empty when it did not say).
    pub sessions_dir: String,
}

/// What a node says it can take; `None` for what it does not say (a node of an earlier
/// release says nothing), which is no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeCapacity {
    /// Sessions at once (`node.max_sessions`).
    pub max_sessions: Option<u64>,
    /// MiB of memory for sessions: its cgroup's limit (or the host's memory) less what the
    /// node keeps for itself.
    pub memory_mb: Option<u64>,
}

impl NodeCapacity {
    /// As the wire carries it: 0 is "not said".
    pub fn from_wire(max_sessions: u64, memory_mb: u64) -> Self {
        NodeCapacity {
            max_sessions: (max_sessions > 0).then_some(max_sessions),
            memory_mb: (memory_mb > 0).then_some(memory_mb),
        }
    }
}

/// What a node's heartbeat says of the versions it caches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CacheReport {
    /// Every version it caches, with the digest that names the set (`None`: the node names
    /// none, and sends the whole set each time; the catalog derives a digest itself).
    Whole {
        /// The node's name for this set; never `Some(0)`.
        digest: Option<u64>,
        /// Every version it caches.
        versions: Vec<(EnvironmentId, u32)>,
    },
    /// The set it sent before under this digest, unchanged since.
    Unchanged {
        /// The digest of that set.
        digest: u64,
    },
}

impl CacheReport {
    /// The report a heartbeat carries: `unchanged` with a digest, or the whole set
    /// (`digest` 0: the node names none).
    pub fn from_heartbeat(
        digest: u64,
        unchanged: bool,
        versions: Vec<(EnvironmentId, u32)>,
    ) -> Self {
        if unchanged {
            CacheReport::Unchanged { digest }
        } else {
            CacheReport::Whole {
                digest: (digest != 0).then_some(digest),
                versions,
            }
        }
    }
}

/// A digest for a set of cached versions a node sent without one: 64 bits of a SHA-256 of
/// the sorted, distinct versions, never 0 (0 means "none held").
pub fn cache_digest(versions: &[(EnvironmentId, u32)]) -> u64 {
    use sha2::Digest as _;
    let mut sorted: Vec<&(EnvironmentId, u32)> = versions.iter().collect();
    sorted.sort();
    sorted.dedup();
    let mut hash = sha2::Sha256::new();
    for (environment, version) in sorted {
        hash.update(environment.as_str().as_bytes());
        hash.update(b"\0");
        hash.update(version.to_be_bytes());
    }
    let bytes: [u8; 32] = hash.finalize().into();
    let mut first = [0u8; 8];
    first.copy_from_slice(&bytes[..8]);
    u64::from_be_bytes(first).max(1)
}

/// What the catalog answers a node's heartbeat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeartbeatAnswer {
    /// The node's cached versions that are their environment's active version; `None` when
    /// the node said its set was unchanged but the catalog does not hold that set, or when
    /// nothing changed since the list the node holds (`active_unchanged`).
    pub active: Option<Vec<(EnvironmentId, u32)>>,
    /// The versions to hold warm, most recently activated first: read whenever `active` is,
    /// and empty when it is `None`.
    pub warm: Vec<crate::domain::warm::WarmVersion>,
    /// The list was not read: the node's set is unchanged and it named the current `epoch`.
    pub active_unchanged: bool,
    /// The catalog's count of changes to which versions are active, for the node to name in
    /// its next heartbeat.
    pub epoch: u64,
    /// The digest of the set the catalog holds for the node now; 0 when it holds none.
    pub digest: u64,
    /// The node's sessions that are active.
    pub live_sessions: Vec<SessionId>,
}

/// A task: an input run in the session created for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Task {
    /// Its id.
    pub id: TaskId,
    /// Its input.
    pub input: String,
    /// The harness it names; empty when none.
    pub harness_id: String,
    /// Its metadata as given (a JSON object).
    pub metadata: String,
    /// Its session (which says the environment and version).
    pub session: Session,
    /// Creation time, ms since the epoch.
    pub created_at_ms: i64,
}

/// Cuts `text` to at most `max` bytes on a character boundary.
pub fn cut(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_checked_strictly() {
        let id = SessionId::generate();
        assert_eq!(SessionId::parse(id.as_str()), Some(id.clone()));
        assert!(SessionId::parse("sess_").is_none());
        assert!(SessionId::parse(&id.as_str().to_uppercase()).is_none());
        assert!(NodeId::parse(id.as_str()).is_none());
    }

    #[test]
    fn a_session_ends_at_the_earlier_of_its_lifetime_and_its_idle_time() {
        let limits = |lifetime_ms, idle_ms| SessionLimits {
            lifetime_ms,
            idle_ms,
            ..SessionLimits::default()
        };
        assert_eq!(limits(None, None).ends_at_ms(1_000, 5_000), None);
        assert_eq!(
            limits(Some(10_000), None).ends_at_ms(1_000, 5_000),
            Some(11_000)
        );
        assert_eq!(
            limits(None, Some(2_000)).ends_at_ms(1_000, 5_000),
            Some(7_000)
        );
        assert_eq!(
            limits(Some(10_000), Some(2_000)).ends_at_ms(1_000, 5_000),
            Some(7_000)
        );
        assert_eq!(
            limits(Some(5_000), Some(2_000)).ends_at_ms(1_000, 5_000),
            Some(6_000)
        );
    }

    #[test]
    fn limits_travel_as_zero_for_none_and_are_bounded() {
        let limits = SessionLimits::from_wire([1024, 0, 500, 0, 60, 0]).expect("valid");
        assert_eq!(limits.memory_mb, Some(1024));
        assert_eq!(limits.pids, None);
        assert_eq!(limits.to_wire(), [1024, 0, 500, 0, 60, 0]);
        let refused = SessionLimits::from_wire([0, 0, 0, 0, MAX_LIMIT_VALUE + 1, 0]);
        assert_eq!(
            refused.expect_err("too large"),
            LimitTooLarge {
                name: "lifetime_ms",
                value: MAX_LIMIT_VALUE + 1
            }
        );
    }

    #[test]
    fn details_are_cut_on_a_character_boundary() {
        assert_eq!(cut("héllo", 2), "h");
        assert_eq!(cut("abc", 10), "abc");
    }
}
