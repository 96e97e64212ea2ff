//! Sessions, turns, nodes and tasks. What is durable here and why: a session row pins the
//! version it reads (and that version's layer tree) at creation, in the same transaction that
//! reads the environment's active version, so a later activation never reaches it. A turn's
//! sequence is the session row's counter, incremented under the row's lock, so concurrent
//! turns of one session are numbered without gaps or duplicates. A task row and its session
//! are inserted together: a task is never left without its session.
//!
//! A session's limits are stored with it when it is placed, in the placing statement itself.
//! `ends_at_ms` is when its lifetime or idle limit ends it, whichever comes first: set at
//! placement, moved by each turn (in the turn's own update of the row), and read by the sweep
//! that ends sessions past it with one conditional UPDATE. A session past it takes no turn even
//! before the sweep reaches it.
//!
//! Placement reads each node's `active_sessions`, a count the database's triggers keep in the
//! transaction that inserts, ends or deletes a session (migration 20): the least-loaded live
//! node is the first live one of an index, however many sessions are live. A node's cached
//! versions are rows of `node_cached_versions`, replaced only when the node reports a set
//! under a digest the catalog does not hold; an unchanged set is reported by its digest alone.
//!
//! A node's row keeps what it can take, as it last said (sessions at once, MiB of memory for
//! sessions; NULL is no limit), and beside `active_sessions` the memory its active sessions'
//! limits commit, kept by the same triggers (migration 22). Placement takes the first live
//! node of the load index that has a free slot and room for the session's memory limit, and
//! locks that row on PostgreSQL (`FOR UPDATE`, whose re-check after a wait sees the other
//! placement's committed count and passes the node over if it is full now): two placements
//! at once never both take a node's last slot. SQLite has one writer. A node that left on
//! purpose (`left_at_ms`) is given nothing until it registers again.

use plinth_kit::database::{Backend, now_ms};
use plinth_kit::quota::Quota;
use sqlx::Row;
use sqlx::any::AnyRow;

use super::{Store, StoreError};
use crate::domain::model::{Cursor, EnvironmentId, Page, PageRequest, Scope};
use crate::domain::sessions::{
    CacheReport, HeartbeatAnswer, MAX_TURN_DETAIL_BYTES, Node, NodeCapacity, NodeId, Session,
    SessionId, SessionLimits, SessionStatus, Task, TaskId, Turn, TurnKind, cache_digest, cut,
};
use crate::domain::warm::WarmVersion;

const SESSION_COLUMNS: &str = "s.id, s.scope, s.environment_id, s.environment_name, s.entry, \
     s.version, s.slug, s.layer_tree, s.node_id, n.address AS node_address, s.harness_id, \
     s.workdir, s.isolated, s.status, s.turns, s.created_at_ms, s.ended_at_ms, s.owner, \
     s.limit_memory_mb, s.limit_pids, s.limit_cpu_millicores, s.limit_disk_mb, \
     s.limit_lifetime_ms, s.limit_idle_ms";

/// Whether a heartbeat is answered the active versions (and the versions to hold warm): the
/// catalog holds the node's set (`$2`), and the node names no list (`$3` 0) or another
/// activation epoch's.
const LISTED: &str =
    "$2 = 1 AND ($3 = 0 OR $3 <> (SELECT epoch FROM activation_epoch WHERE id = 1))";

/// Cached versions inserted per statement when a node's set changes: two parameters each (and
/// the node's id once) stay well inside SQLite's 32,766 and PostgreSQL's 65,535, so a node
/// would need more than this many versions in its cache to need a second statement.
const CACHED_VERSIONS_PER_INSERT: usize = 10_000;

/// A limit as stored: NULL for none.
fn stored(limit: Option<u64>) -> Option<i64> {
    limit.map(|value| i64::try_from(value).unwrap_or(i64::MAX))
}

/// What a new session reads and where it runs.
#[derive(Debug, Clone)]
pub struct NewSession {
    /// The caller's scope.
    pub scope: Scope,
    /// The environment to read (its active version is pinned, unless `version` names one).
    pub environment_id: EnvironmentId,
    /// A ready version to pin instead of the active one.
    pub version: Option<u32>,
    /// The harness it was created for; empty when none.
    pub harness_id: String,
    /// Who it was made for (a Brain binding's label); empty when a client asked for it.
    pub owner: String,
    /// Nodes whose last heartbeat is older than this are not given sessions.
    pub live_since_ms: i64,
    /// A node not to place the session on (one its caller could not reach just now).
    pub exclude_node: Option<NodeId>,
    /// Record the working directory when the session is placed (on a node that says where it
    /// keeps sessions), for a caller that attaches the session before it answers. Otherwise
    /// the working directory stays empty until `mark_attached`, which is how a caller that
    /// finds the session later knows it still has to be attached.
    pub workdir_at_placement: bool,
    /// Its effective limits, stored with it.
    pub limits: SessionLimits,
}

/// A new task.
#[derive(Debug, Clone)]
pub struct NewTask {
    /// Its input.
    pub input: String,
    /// Its metadata (a JSON object, as text).
    pub metadata: String,
    /// The session it runs in.
    pub session: NewSession,
}

/// A session's end once it is used at `$3` (milliseconds): `now + idle`, unless its lifetime
/// ends it sooner; unchanged without an idle limit. One expression for turns and touches.
macro_rules! idle_end {
    () => {
        "CASE WHEN limit_idle_ms IS NULL THEN ends_at_ms \
         WHEN limit_lifetime_ms IS NOT NULL \
         AND created_at_ms + limit_lifetime_ms < $3 + limit_idle_ms \
         THEN created_at_ms + limit_lifetime_ms \
         ELSE $3 + limit_idle_ms END"
    };
}

impl Store {
    /// Registers a node agent by name (a restarted agent keeps its id and its sessions), with
    /// no limit on what it takes (as a node that says nothing of its capacity).
    /// `session_workdir`, when not empty, is where every session of the node sees its working
    /// directory; otherwise a session's is `<sessions_dir>/<id>/work`, or unknown until it
    /// attaches when `sessions_dir` is empty too.
    pub async fn register_node(
        &self,
        name: &str,
        address: &str,
        isolated: bool,
        sessions_dir: &str,
        session_workdir: &str,
    ) -> Result<NodeId, StoreError> {
        self.register_node_with(
            name,
            address,
            isolated,
            sessions_dir,
            session_workdir,
            NodeCapacity::default(),
        )
        .await
    }

    /// [`Store::register_node`] for a node that says what it can take. A node that left on
    /// purpose (`leave_node`) is back once it registers again, and one a gateway held suspect
    /// is cleared: it has just answered, at the address it gives now (a restarted node's
    /// mark would otherwise outlive the gateway that set it, and only that gateway clears it).
    pub async fn register_node_with(
        &self,
        name: &str,
        address: &str,
        isolated: bool,
        sessions_dir: &str,
        session_workdir: &str,
        capacity: NodeCapacity,
    ) -> Result<NodeId, StoreError> {
        let now = now_ms();
        let row = sqlx::query(
            "INSERT INTO nodes (id, name, address, isolated, registered_at_ms, heartbeat_at_ms, \
             sessions_dir, session_workdir, max_sessions, memory_mb) \
             VALUES ($1, $2, $3, $4, $5, $5, $6, $7, $8, $9) \
             ON CONFLICT (name) DO UPDATE SET address = excluded.address, \
             isolated = excluded.isolated, heartbeat_at_ms = excluded.heartbeat_at_ms, \
             sessions_dir = excluded.sessions_dir, session_workdir = excluded.session_workdir, \
             max_sessions = excluded.max_sessions, memory_mb = excluded.memory_mb, \
             left_at_ms = 0, suspect_until_ms = 0 \
             RETURNING id",
        )
        .bind(NodeId::generate().as_str())
        .bind(name)
        .bind(address)
        .bind(i64::from(isolated))
        .bind(now)
        .bind(sessions_dir)
        .bind(session_workdir)
        .bind(stored(capacity.max_sessions))
        .bind(stored(capacity.memory_mb))
        .fetch_one(&self.db.writer)
        .await?;
        let id: String = row.try_get("id")?;
        NodeId::parse(&id).ok_or_else(|| StoreError::Corrupt(format!("node id {id:?}")))
    }

    /// Holds the nodes registered at `address` suspect until `until_ms` (0: clears the mark):
    /// placement passes over them meanwhile, however recent their heartbeat. Answers how many
    /// nodes have that address. A gateway that cannot reach a node marks it; the mark lapses
    /// by itself, so one that died holding it excludes the node only until then.
    pub async fn mark_node_suspect(&self, address: &str, until_ms: i64) -> Result<u64, StoreError> {
        let done = sqlx::query("UPDATE nodes SET suspect_until_ms = $1 WHERE address = $2")
            .bind(until_ms)
            .bind(address)
            .execute(&self.db.writer)
            .await?;
        Ok(done.rows_affected())
    }

    /// The name a node registered with, if it is registered.
    pub async fn node_name(&self, node: &NodeId) -> Result<Option<String>, StoreError> {
        let row = sqlx::query("SELECT name FROM nodes WHERE id = $1")
            .bind(node.as_str())
            .fetch_optional(&self.db.reader)
            .await?;
        Ok(row.map(|row| row.try_get("name")).transpose()?)
    }

    /// Records that a node is alive, and the versions it caches when its report carries a set
    /// the catalog does not hold; answers which of them are active and which of the node's
    /// sessions are live, read after the heartbeat was recorded. However many versions the
    /// node caches, an unchanged set costs one UPDATE and one read; a changed one adds one
    /// transaction of three statements (the digest, the old rows deleted, the new inserted).
    /// What the node can take stays as it was.
    pub async fn node_heartbeat(
        &self,
        node: &NodeId,
        report: CacheReport,
    ) -> Result<HeartbeatAnswer, StoreError> {
        self.node_heartbeat_with(node, report, None, 0).await
    }

    /// [`Store::node_heartbeat`] that also records what the node can take now, in the same
    /// UPDATE, when `capacity` is given. A node that left on purpose stays out of placement
    /// while it still heartbeats: only registering brings it back. `known_epoch` is the
    /// activation epoch of the active list the node holds (0: none): when it is current and
    /// the set unchanged, the list is not read again (`active_unchanged`).
    pub async fn node_heartbeat_with(
        &self,
        node: &NodeId,
        report: CacheReport,
        capacity: Option<NodeCapacity>,
        known_epoch: u64,
    ) -> Result<HeartbeatAnswer, StoreError> {
        let given = capacity.is_some();
        let capacity = capacity.unwrap_or_default();
        let row = sqlx::query(match self.db.backend {
            // A heartbeat's stamp is news for a few seconds and sent again every second: its
            // commit does not wait for the write-ahead log to reach the disk
            // (`synchronous_commit` off for this statement's transaction alone). A database
            // that crashes loses at most the last fraction of a second of stamps, which the
            // next heartbeats write again; nothing else is written here. Waiting for the flush
            // made the commit most of a heartbeat's cost: 2,700 of these statements a second
            // on the test machine's PostgreSQL against 19,000 without.
            Backend::Postgres => {
                "WITH relaxed AS (SELECT set_config('synchronous_commit', 'off', true)) \
                 UPDATE nodes SET heartbeat_at_ms = $1, \
                 max_sessions = CASE WHEN $3 = 1 THEN $4 ELSE max_sessions END, \
                 memory_mb = CASE WHEN $3 = 1 THEN $5 ELSE memory_mb END \
                 FROM relaxed WHERE id = $2 RETURNING cache_digest"
            }
            Backend::Sqlite => {
                "UPDATE nodes SET heartbeat_at_ms = $1, \
                 max_sessions = CASE WHEN $3 = 1 THEN $4 ELSE max_sessions END, \
                 memory_mb = CASE WHEN $3 = 1 THEN $5 ELSE memory_mb END \
                 WHERE id = $2 RETURNING cache_digest"
            }
        })
        .bind(now_ms())
        .bind(node.as_str())
        .bind(i64::from(given))
        .bind(stored(capacity.max_sessions))
        .bind(stored(capacity.memory_mb))
        .fetch_optional(&self.db.writer)
        .await?
        .ok_or(StoreError::NotFound)?;
        let mut held = row.try_get::<i64, _>("cache_digest")?.cast_unsigned();
        // A changed set is answered its list whatever the node last held.
        let known_epoch = match report {
            CacheReport::Unchanged { .. } => known_epoch,
            CacheReport::Whole { .. } => 0,
        };
        let holds_the_set = match report {
            CacheReport::Unchanged { digest } => digest != 0 && digest == held,
            CacheReport::Whole {
                digest,
                mut versions,
            } => {
                let digest = digest
                    .filter(|digest| *digest != 0)
                    .unwrap_or_else(|| cache_digest(&versions));
                if digest != held {
                    versions.sort();
                    versions.dedup();
                    self.replace_cached_versions(node, digest, &versions)
                        .await?;
                    held = digest;
                }
                true
            }
        };
        // One read for all four answers, in one snapshot: the active versions of the set
        // held (`v` rows; none when the node named a set the catalog does not hold, or when
        // it holds the list of the current activation epoch), the versions to hold warm
        // (`w` rows, under the same condition: every environment's active version, the most
        // recently activated first, from the index on `activated_at_ms`), the live sessions,
        // and the epoch (`e`). The condition is a constant of the statement, tested once
        // before the rows it guards are read: a heartbeat that is not answered the lists
        // reads neither. SQLite tests a WHERE condition row by row, down the whole index when
        // it is false, so there it is the LIMIT of the warm rows (0 when false); PostgreSQL
        // plans a prepared statement once for any parameters, and a LIMIT it cannot read at
        // planning would make it sort every environment, so there the condition is a filter
        // it tests once and the LIMIT a number in the statement. Each warm version's layer
        // tree is read by its key rather than joined, so no plan hashes every build.
        let (warm_filter, warm_limit) = match self.db.backend {
            Backend::Postgres => (format!("AND {LISTED}"), self.prewarm_versions.to_string()),
            Backend::Sqlite => (
                String::new(),
                format!(
                    "CASE WHEN {LISTED} THEN {} ELSE 0 END",
                    self.prewarm_versions
                ),
            ),
        };
        let sql = format!(
            "SELECT 'v' AS kind, c.environment_id AS id, c.version, '' AS slug, \
             '' AS layer_tree, 0 AS activated_at_ms FROM node_cached_versions c \
             JOIN environments e ON e.id = c.environment_id AND e.active_version = c.version \
             WHERE c.node_id = $1 AND {LISTED} \
             UNION ALL \
             SELECT 'w' AS kind, w.id, w.version, w.slug, \
             COALESCE((SELECT b.layer_tree FROM builds b \
             WHERE b.environment_id = w.id AND b.version = w.version), '') AS layer_tree, \
             w.activated_at_ms FROM (SELECT e.id, e.active_version AS version, e.slug, \
             e.activated_at_ms FROM environments e \
             WHERE e.active_version IS NOT NULL {warm_filter} \
             ORDER BY e.activated_at_ms DESC, e.id LIMIT {warm_limit}) w \
             UNION ALL \
             SELECT 's' AS kind, s.id, 0 AS version, '' AS slug, '' AS layer_tree, \
             0 AS activated_at_ms FROM sessions s \
             WHERE s.node_id = $1 AND s.status = 'active' \
             UNION ALL \
             SELECT 'e' AS kind, '' AS id, epoch AS version, '' AS slug, '' AS layer_tree, \
             0 AS activated_at_ms FROM activation_epoch WHERE id = 1"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(node.as_str())
            .bind(i64::from(holds_the_set))
            .bind(known_epoch.cast_signed())
            .fetch_all(&self.db.reader)
            .await?;
        let mut active = Vec::new();
        let mut warm = Vec::new();
        let mut live_sessions = Vec::new();
        let mut epoch = 0;
        for row in &rows {
            let kind: String = row.try_get("kind")?;
            let id: String = row.try_get("id")?;
            let corrupt = || StoreError::Corrupt(format!("{kind} {id:?} of node {node}"));
            if kind == "s" {
                live_sessions.push(SessionId::parse(&id).ok_or_else(corrupt)?);
            } else if kind == "e" {
                epoch = row.try_get::<i64, _>("version")?.cast_unsigned();
            } else {
                let version: i64 = row.try_get("version")?;
                let environment_id = EnvironmentId::parse(&id).ok_or_else(corrupt)?;
                let version = u32::try_from(version).map_err(|_| corrupt())?;
                if kind == "w" {
                    let activated_at_ms: i64 = row.try_get("activated_at_ms")?;
                    warm.push((
                        activated_at_ms,
                        WarmVersion {
                            environment_id,
                            slug: row.try_get("slug")?,
                            version,
                            layer_tree: row.try_get("layer_tree")?,
                        },
                    ));
                } else {
                    active.push((environment_id, version));
                }
            }
        }
        // The rows of a UNION ALL come in no promised order: most recently activated first.
        warm.sort_by(|(a_at, a), (b_at, b)| {
            b_at.cmp(a_at)
                .then_with(|| a.environment_id.cmp(&b.environment_id))
        });
        let listed = holds_the_set && (known_epoch == 0 || known_epoch != epoch);
        Ok(HeartbeatAnswer {
            active: listed.then_some(active),
            warm: if listed {
                warm.into_iter().map(|(_, version)| version).collect()
            } else {
                Vec::new()
            },
            active_unchanged: holds_the_set && !listed,
            epoch,
            digest: held,
            live_sessions,
        })
    }

    /// Replaces the versions a node caches with `versions` (sorted, distinct), named `digest`,
    /// in one transaction: the node's row first (two heartbeats of one node take turns), then
    /// the old rows deleted and the new ones inserted in one statement per
    /// [`CACHED_VERSIONS_PER_INSERT`].
    async fn replace_cached_versions(
        &self,
        node: &NodeId,
        digest: u64,
        versions: &[(EnvironmentId, u32)],
    ) -> Result<(), StoreError> {
        let mut tx = self.db.begin_write().await?;
        sqlx::query("UPDATE nodes SET cache_digest = $1 WHERE id = $2")
            .bind(digest.cast_signed())
            .bind(node.as_str())
            .execute(&mut *tx)
            .await?;
        sqlx::query("DELETE FROM node_cached_versions WHERE node_id = $1")
            .bind(node.as_str())
            .execute(&mut *tx)
            .await?;
        for chunk in versions.chunks(CACHED_VERSIONS_PER_INSERT) {
            let mut sql = String::from(
                "INSERT INTO node_cached_versions (node_id, environment_id, version) VALUES ",
            );
            for index in 0..chunk.len() {
                if index > 0 {
                    sql.push_str(", ");
                }
                sql.push_str(&format!("($1, ${}, ${})", 2 * index + 2, 2 * index + 3));
            }
            let mut query = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(node.as_str());
            for (environment, version) in chunk {
                query = query.bind(environment.as_str()).bind(i64::from(*version));
            }
            query.execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Creates a session on the environment's active version, placed on the live node with
    /// the fewest live sessions.
    /// A scope with as many active sessions as its quota allows is refused
    /// (`StoreError::QuotaExceeded`), counted after taking the scope's row.
    pub async fn create_session(&self, new: NewSession) -> Result<Session, StoreError> {
        let limit = self.limit(&new.scope, Quota::Sessions);
        let mut tx = self.db.begin_write().await?;
        super::quotas::take_scope(&mut tx, &new.scope).await?;
        // One statement places the session whenever it can be placed. When it places
        // nothing, the step-by-step checks say why (or place the session, if what was missing
        // has appeared since).
        if let Some(session) = place_session(&mut tx, self.db.backend, &new, limit).await? {
            tx.commit().await?;
            return Ok(session);
        }
        let session = insert_session(&mut tx, self.db.backend, &new, limit).await?;
        tx.commit().await?;
        Ok(session)
    }

    /// Creates a task and the session it runs in, together.
    pub async fn create_task(&self, new: NewTask) -> Result<Task, StoreError> {
        let limit = self.limit(&new.session.scope, Quota::Sessions);
        let mut tx = self.db.begin_write().await?;
        let session = insert_session(&mut tx, self.db.backend, &new.session, limit).await?;
        let session_id = session.id.clone();
        let id = TaskId::generate();
        let now = now_ms();
        sqlx::query(
            "INSERT INTO tasks (id, scope, input, harness_id, environment_id, version, \
             session_id, metadata, created_at_ms) \
             SELECT $1, scope, $2, harness_id, environment_id, version, id, $3, $4 \
             FROM sessions WHERE id = $5",
        )
        .bind(id.as_str())
        .bind(&new.input)
        .bind(&new.metadata)
        .bind(now)
        .bind(session_id.as_str())
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(Task {
            id,
            input: new.input,
            harness_id: new.session.harness_id.clone(),
            metadata: new.metadata,
            session,
            created_at_ms: now,
        })
    }

    /// Records where a session's working directory is.
    pub async fn mark_attached(
        &self,
        scope: &Scope,
        id: &SessionId,
        workdir: &str,
        isolated: bool,
    ) -> Result<Session, StoreError> {
        let updated = sqlx::query(
            "UPDATE sessions SET workdir = $1, isolated = $2 WHERE id = $3 AND scope = $4",
        )
        .bind(workdir)
        .bind(i64::from(isolated))
        .bind(id.as_str())
        .bind(scope.as_str())
        .execute(&self.db.writer)
        .await?;
        if updated.rows_affected() == 0 {
            return Err(StoreError::NotFound);
        }
        self.get_session(scope, id).await
    }

    /// One session of the scope.
    pub async fn get_session(&self, scope: &Scope, id: &SessionId) -> Result<Session, StoreError> {
        let sql = format!(
            "SELECT {SESSION_COLUMNS} FROM sessions s JOIN nodes n ON n.id = s.node_id \
             WHERE s.id = $1 AND s.scope = $2"
        );
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(id.as_str())
            .bind(scope.as_str())
            .fetch_optional(&self.db.reader)
            .await?
            .ok_or(StoreError::NotFound)?;
        session_from_row(&row)
    }

    /// Ends a session; an ended one stays as it was.
    pub async fn end_session(&self, scope: &Scope, id: &SessionId) -> Result<Session, StoreError> {
        sqlx::query(
            "UPDATE sessions SET status = 'ended', ended_at_ms = $1 \
             WHERE id = $2 AND scope = $3 AND status = 'active'",
        )
        .bind(now_ms())
        .bind(id.as_str())
        .bind(scope.as_str())
        .execute(&self.db.writer)
        .await?;
        self.get_session(scope, id).await
    }

    /// Records that the node named `name` left on purpose (`plinth node --drain`): it gets no
    /// new sessions and is counted neither live nor late, until it registers again. Answers
    /// its id and how many of its sessions are still active, or `NotFound` for no such node.
    /// Leaving again keeps the first time it left.
    pub async fn leave_node(&self, name: &str) -> Result<(NodeId, u64), StoreError> {
        let row = sqlx::query(
            "UPDATE nodes SET left_at_ms = CASE WHEN left_at_ms = 0 THEN $1 ELSE left_at_ms END \
             WHERE name = $2 RETURNING id, active_sessions",
        )
        .bind(now_ms())
        .bind(name)
        .fetch_optional(&self.db.writer)
        .await?
        .ok_or(StoreError::NotFound)?;
        let id: String = row.try_get("id")?;
        let active: i64 = row.try_get("active_sessions")?;
        Ok((
            NodeId::parse(&id).ok_or_else(|| StoreError::Corrupt(format!("node id {id:?}")))?,
            u64::try_from(active).unwrap_or(0),
        ))
    }

    /// Records a turn with the version the session reads; numbered under the session's lock.
    pub async fn record_turn(
        &self,
        scope: &Scope,
        id: &SessionId,
        kind: TurnKind,
        detail: &str,
        exit_code: Option<i32>,
    ) -> Result<Turn, StoreError> {
        let mut tx = self.db.begin_write().await?;
        let new = NewTurn {
            scope: scope.clone(),
            session: id.clone(),
            kind,
            detail: detail.to_owned(),
            exit_code,
        };
        let turn = insert_turn(&mut tx, &new)
            .await?
            .ok_or(StoreError::NotFound)?;
        tx.commit().await?;
        Ok(turn)
    }

    /// Moves an active session's idle end as a turn does, recording no turn: it is in use
    /// between turns (an interactive terminal with traffic). `NotFound` for a session that is
    /// not there, has ended or is past its end.
    pub async fn touch_session(&self, scope: &Scope, id: &SessionId) -> Result<(), StoreError> {
        let touched = sqlx::query(concat!(
            "UPDATE sessions SET ends_at_ms = ",
            idle_end!(),
            " WHERE id = $1 AND scope = $2 AND status = 'active' \
             AND (ends_at_ms IS NULL OR ends_at_ms > $3)",
        ))
        .bind(id.as_str())
        .bind(scope.as_str())
        .bind(now_ms())
        .execute(&self.db.writer)
        .await?;
        if touched.rows_affected() == 0 {
            return Err(StoreError::NotFound);
        }
        Ok(())
    }

    /// Records how a command's turn ended; a turn ended already keeps its first exit status.
    pub async fn finish_turn(
        &self,
        scope: &Scope,
        id: &SessionId,
        sequence: u64,
        exit_code: i32,
    ) -> Result<(), StoreError> {
        let updated = sqlx::query(
            "UPDATE turns SET exit_code = $1 WHERE session_id = $2 AND sequence = $3 \
             AND exit_code IS NULL \
             AND EXISTS (SELECT 1 FROM sessions s WHERE s.id = $2 AND s.scope = $4)",
        )
        .bind(i64::from(exit_code))
        .bind(id.as_str())
        .bind(i64::try_from(sequence).map_err(|_| StoreError::NotFound)?)
        .bind(scope.as_str())
        .execute(&self.db.writer)
        .await?;
        if updated.rows_affected() == 0 {
            // Finished already, or not there: only the second is an error.
            let exists = sqlx::query(
                "SELECT 1 FROM turns t JOIN sessions s ON s.id = t.session_id \
                 WHERE t.session_id = $1 AND t.sequence = $2 AND s.scope = $3",
            )
            .bind(id.as_str())
            .bind(i64::try_from(sequence).map_err(|_| StoreError::NotFound)?)
            .bind(scope.as_str())
            .fetch_optional(&self.db.reader)
            .await?;
            if exists.is_none() {
                return Err(StoreError::NotFound);
            }
        }
        Ok(())
    }

    /// One page of a session's turns, oldest first: those after `page.after` (whose key is a
    /// sequence and whose id must be `turns_cursor_id` of this session), read with one more
    /// than the limit so the answer knows whether another page follows.
    pub async fn list_turns(
        &self,
        scope: &Scope,
        id: &SessionId,
        page: &PageRequest,
    ) -> Result<Page<Turn>, StoreError> {
        // The scope check first: another scope's session has no turns to show.
        self.get_session(scope, id).await?;
        let cursor_id = turns_cursor_id(id);
        let after = match &page.after {
            None => 0,
            Some(cursor) if cursor.id == cursor_id => cursor.key,
            Some(_) => return Err(StoreError::ForeignCursor),
        };
        let limit = page.limit as usize;
        let rows = sqlx::query(
            "SELECT sequence, kind, detail, version, at_ms, exit_code FROM turns \
             WHERE session_id = $1 AND sequence > $2 ORDER BY sequence LIMIT $3",
        )
        .bind(id.as_str())
        .bind(after)
        .bind(i64::try_from(limit + 1).unwrap_or(i64::MAX))
        .fetch_all(&self.db.reader)
        .await?;
        let mut turns = rows
            .iter()
            .map(|row| {
                let kind: String = row.try_get("kind")?;
                let sequence: i64 = row.try_get("sequence")?;
                let version: i64 = row.try_get("version")?;
                let exit_code: Option<i64> = row.try_get("exit_code")?;
                Ok(Turn {
                    session_id: id.clone(),
                    sequence: u64::try_from(sequence).unwrap_or(0),
                    kind: TurnKind::parse(&kind)
                        .ok_or_else(|| StoreError::Corrupt(format!("turn kind {kind:?}")))?,
                    detail: row.try_get("detail")?,
                    version: u32::try_from(version).unwrap_or(0),
                    at_ms: row.try_get("at_ms")?,
                    exit_code: exit_code.and_then(|code| i32::try_from(code).ok()),
                })
            })
            .collect::<Result<Vec<_>, StoreError>>()?;
        let next = if turns.len() > limit {
            turns.truncate(limit);
            turns.last().map(|last| Cursor {
                key: i64::try_from(last.sequence).unwrap_or(i64::MAX),
                id: cursor_id,
            })
        } else {
            None
        };
        Ok(Page { items: turns, next })
    }

    /// One page of the live sessions placed on a node, oldest first.
    pub async fn node_sessions(
        &self,
        node: &NodeId,
        page: &PageRequest,
    ) -> Result<Page<Session>, StoreError> {
        self.sessions_page(
            "s.node_id = $1 AND s.status = 'active'",
            &[node.as_str()],
            page,
        )
        .await
    }

    /// The ids of the live sessions placed on a node: what a node's heartbeat is answered, so
    /// it detaches the sessions that ended without it being told.
    pub async fn node_session_ids(&self, node: &NodeId) -> Result<Vec<SessionId>, StoreError> {
        let rows = sqlx::query("SELECT id FROM sessions WHERE node_id = $1 AND status = 'active'")
            .bind(node.as_str())
            .fetch_all(&self.db.reader)
            .await?;
        rows.iter()
            .map(|row| {
                let id: String = row.try_get("id")?;
                SessionId::parse(&id)
                    .ok_or_else(|| StoreError::Corrupt(format!("session id {id:?}")))
            })
            .collect()
    }

    /// Ends at most `batch` active sessions whose lifetime or idle limit has passed at `now_ms`,
    /// as [`Store::end_session`] ends a session, and answers their ids. One statement that
    /// ends only what is still active and still past its end, so replicas sweeping at once
    /// each end a session at most once between them, and a turn that moved a session's end
    /// meanwhile keeps it.
    pub async fn end_sessions_past_their_limits(
        &self,
        now_ms: i64,
        batch: u32,
    ) -> Result<Vec<SessionId>, StoreError> {
        let rows = sqlx::query(
            "UPDATE sessions SET status = 'ended', ended_at_ms = $1 \
             WHERE id IN (SELECT id FROM sessions WHERE status = 'active' AND ends_at_ms <= $1 \
             ORDER BY ends_at_ms LIMIT $2) \
             AND status = 'active' AND ends_at_ms <= $1 RETURNING id",
        )
        .bind(now_ms)
        .bind(i64::from(batch))
        .fetch_all(&self.db.writer)
        .await?;
        rows.iter()
            .map(|row| {
                let id: String = row.try_get("id")?;
                SessionId::parse(&id)
                    .ok_or_else(|| StoreError::Corrupt(format!("session id {id:?}")))
            })
            .collect()
    }

    /// One page of the live sessions of the scope made for `owner`, oldest first.
    pub async fn owned_sessions(
        &self,
        scope: &Scope,
        owner: &str,
        page: &PageRequest,
    ) -> Result<Page<Session>, StoreError> {
        self.sessions_page(
            "s.scope = $1 AND s.owner = $2 AND s.status = 'active'",
            &[scope.as_str(), owner],
            page,
        )
        .await
    }

    /// One page of a scope's sessions, active and ended, oldest first: of one environment
    /// when `environment` is given, in one status (`active`, `ended`) when `status` is.
    pub async fn scope_sessions(
        &self,
        scope: &Scope,
        environment: Option<&str>,
        status: Option<&str>,
        page: &PageRequest,
    ) -> Result<Page<Session>, StoreError> {
        let mut filter = "s.scope = $1".to_owned();
        let mut binds = vec![scope.as_str()];
        if let Some(environment) = environment {
            binds.push(environment);
            filter.push_str(&format!(" AND s.environment_id = ${}", binds.len()));
        }
        if let Some(status) = status {
            binds.push(status);
            filter.push_str(&format!(" AND s.status = ${}", binds.len()));
        }
        self.sessions_page(&filter, &binds, page).await
    }

    /// One page of the sessions matching `filter` (whose parameters are `binds`, from
    /// `$1`), in creation order then id: those after `page.after`, read with one more than
    /// the limit so the answer knows whether another page follows. The cursor's id must be a
    /// session's: a cursor from a list of something else is refused.
    async fn sessions_page(
        &self,
        filter: &str,
        binds: &[&str],
        page: &PageRequest,
    ) -> Result<Page<Session>, StoreError> {
        if let Some(after) = &page.after
            && SessionId::parse(&after.id).is_none()
        {
            return Err(StoreError::ForeignCursor);
        }
        let limit = page.limit as usize;
        let first = binds.len() + 1;
        // Row comparison is the keyset condition on both SQLite and PostgreSQL.
        let after_clause = match page.after {
            Some(_) => format!(" AND (s.created_at_ms, s.id) > (${first}, ${})", first + 1),
            None => String::new(),
        };
        let sql = format!(
            "SELECT {SESSION_COLUMNS} FROM sessions s JOIN nodes n ON n.id = s.node_id \
             WHERE {filter}{after_clause} \
             ORDER BY s.created_at_ms, s.id LIMIT {}",
            limit + 1
        );
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        for bind in binds {
            query = query.bind(*bind);
        }
        if let Some(after) = &page.after {
            query = query.bind(after.key).bind(after.id.as_str());
        }
        let rows = query.fetch_all(&self.db.reader).await?;
        let mut sessions = rows
            .iter()
            .map(session_from_row)
            .collect::<Result<Vec<_>, _>>()?;
        let next = if sessions.len() > limit {
            sessions.truncate(limit);
            sessions.last().map(|last| Cursor {
                key: last.created_at_ms,
                id: last.id.as_str().to_owned(),
            })
        } else {
            None
        };
        Ok(Page {
            items: sessions,
            next,
        })
    }
}

/// The id a cursor into a session's turns carries: the session's, marked so that a cursor
/// from a list of sessions (which carries a bare session id) is not taken for one.
fn turns_cursor_id(session: &SessionId) -> String {
    format!("turns_{}", session.as_str())
}

/// The live nodes with room for a session wanting `$want` MiB, as a condition on `nodes c`
/// (`$live`: heard from since; `$exclude`: a node id, or ''; `$now`: now): heard from
/// recently, not left, not held suspect, a free slot, and the memory its sessions commit plus
/// this one's within what it has.
macro_rules! node_with_room {
    ($live:literal, $exclude:literal, $want:literal, $now:literal) => {
        concat!(
            "c.heartbeat_at_ms >= ",
            $live,
            " AND c.left_at_ms = 0 AND c.suspect_until_ms <= ",
            $now,
            " AND c.id <> ",
            $exclude,
            " AND (c.max_sessions IS NULL OR c.active_sessions < c.max_sessions) \
             AND (c.memory_mb IS NULL OR c.committed_memory_mb + ",
            $want,
            " <= c.memory_mb)"
        )
    };
}

/// What placement locks the chosen node's row with: on PostgreSQL the row is held until the
/// placing transaction ends, and a placement that waited for it re-checks the row as the
/// other left it (a node full now is passed over for the next one). SQLite has one writer.
fn node_lock(backend: Backend) -> &'static str {
    match backend {
        Backend::Postgres => " FOR UPDATE OF c",
        Backend::Sqlite => "",
    }
}

/// The memory a session commits on its node: its memory limit, or none without one.
fn wanted_memory(limits: &SessionLimits) -> i64 {
    stored(limits.memory_mb).unwrap_or(0)
}

/// Places a session in one statement: the version asked for (or the active one) if it is a
/// ready build with a layer, on the live node not held suspect (see
/// [`Store::mark_node_suspect`]) with the fewest active sessions that has room for it, with
/// its limits, while the scope has fewer than `limit` active sessions (counted up to
/// `limit`). `None` when any of that is missing.
async fn place_session(
    tx: &mut sqlx::Transaction<'static, sqlx::Any>,
    backend: Backend,
    new: &NewSession,
    limit: u64,
) -> Result<Option<Session>, StoreError> {
    let id = SessionId::generate();
    let created_at_ms = now_ms();
    let limits = &new.limits;
    let sql = format!(
        "INSERT INTO sessions (id, scope, environment_id, environment_name, entry, version, \
         slug, layer_tree, node_id, harness_id, isolated, status, created_at_ms, owner, workdir, \
         limit_memory_mb, limit_pids, limit_cpu_millicores, limit_disk_mb, limit_lifetime_ms, \
         limit_idle_ms, ends_at_ms) \
         SELECT $1, e.scope, e.id, e.name, e.entry, b.version, e.slug, b.layer_tree, n.id, $5, \
         n.isolated, 'active', $6, $7, \
         CASE WHEN $8 = 0 THEN '' WHEN n.session_workdir <> '' THEN n.session_workdir \
         WHEN n.sessions_dir = '' THEN '' \
         ELSE rtrim(n.sessions_dir, '/') || '/' || $1 || '/work' END, \
         $10, $11, $12, $13, $14, $15, $16 \
         FROM environments e \
         JOIN builds b ON b.environment_id = e.id \
         AND b.version = COALESCE($4, e.active_version) \
         AND b.status = 'ready' AND b.layer_tree <> '' \
         JOIN nodes n ON n.id = (SELECT c.id FROM nodes c WHERE {room} \
         ORDER BY c.active_sessions, c.registered_at_ms, c.id LIMIT 1{lock}) \
         WHERE e.id = $2 AND e.scope = $3 \
         AND (SELECT COUNT(*) FROM (SELECT 1 FROM sessions q WHERE q.scope = $3 \
         AND q.status = 'active' LIMIT $17) counted) < $17 \
         RETURNING id, scope, environment_id, environment_name, entry, version, slug, \
         layer_tree, node_id, harness_id, workdir, isolated, status, turns, created_at_ms, \
         ended_at_ms, owner, limit_memory_mb, limit_pids, limit_cpu_millicores, \
         limit_disk_mb, limit_lifetime_ms, limit_idle_ms, \
         (SELECT address FROM nodes WHERE id = node_id) AS node_address",
        room = node_with_room!("$9", "$18", "$19", "$6"),
        lock = node_lock(backend),
    );
    let row = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(id.as_str())
        .bind(new.environment_id.as_str())
        .bind(new.scope.as_str())
        .bind(new.version.map(i64::from))
        .bind(&new.harness_id)
        .bind(created_at_ms)
        .bind(&new.owner)
        .bind(i64::from(new.workdir_at_placement))
        .bind(new.live_since_ms)
        .bind(stored(limits.memory_mb))
        .bind(stored(limits.pids))
        .bind(stored(limits.cpu_millicores))
        .bind(stored(limits.disk_mb))
        .bind(stored(limits.lifetime_ms))
        .bind(stored(limits.idle_ms))
        .bind(limits.ends_at_ms(created_at_ms, created_at_ms))
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .bind(excluded(new))
        .bind(wanted_memory(limits))
        .fetch_optional(&mut **tx)
        .await?;
    row.as_ref().map(session_from_row).transpose()
}

/// Pins the environment's active version and places the session, inside `tx`.
pub(super) async fn insert_session(
    tx: &mut sqlx::Transaction<'static, sqlx::Any>,
    backend: Backend,
    new: &NewSession,
    limit: u64,
) -> Result<Session, StoreError> {
    // The version asked for, else the active one; either must be a ready build.
    let environment = sqlx::query(
        "SELECT e.name, e.slug, e.entry, b.version, b.status, b.layer_tree FROM environments e \
         LEFT JOIN builds b ON b.environment_id = e.id \
         AND b.version = COALESCE($3, e.active_version) \
         WHERE e.id = $1 AND e.scope = $2",
    )
    .bind(new.environment_id.as_str())
    .bind(new.scope.as_str())
    .bind(new.version.map(i64::from))
    .fetch_optional(&mut **tx)
    .await?
    .ok_or(StoreError::NotFound)?;
    let Some(version) = environment.try_get::<Option<i64>, _>("version")? else {
        return Err(StoreError::NothingBuilt);
    };
    let status: Option<String> = environment.try_get("status")?;
    if status.as_deref() != Some("ready") {
        let status = status
            .as_deref()
            .and_then(crate::domain::model::BuildStatus::parse)
            .ok_or_else(|| StoreError::Corrupt(format!("status of version {version}")))?;
        return Err(StoreError::NotReady(status));
    }
    let layer_tree: Option<String> = environment.try_get("layer_tree")?;
    let layer_tree = layer_tree.filter(|tree| !tree.is_empty()).ok_or_else(|| {
        StoreError::Corrupt(format!(
            "active version {version} of {} has no layer",
            new.environment_id
        ))
    })?;
    super::quotas::admit_one(tx, &new.scope, Quota::Sessions, limit).await?;
    let node = match live_node(tx, backend, new, wanted_memory(&new.limits)).await? {
        Some(node) => node,
        None => return Err(why_no_node(tx, new).await?),
    };
    let id = SessionId::generate();
    // Where the node will make the working directory, when it says where it keeps sessions.
    let workdir = if node.sessions_dir.is_empty() || !new.workdir_at_placement {
        String::new()
    } else {
        format!(
            "{}/{}/work",
            node.sessions_dir.trim_end_matches('/'),
            id.as_str()
        )
    };
    let created_at_ms = now_ms();
    let session = Session {
        id,
        scope: new.scope.clone(),
        environment_id: new.environment_id.clone(),
        environment_name: environment.try_get("name")?,
        entry: environment.try_get("entry")?,
        version: u32::try_from(version)
            .map_err(|_| StoreError::Corrupt(format!("version {version}")))?,
        slug: environment.try_get("slug")?,
        layer_tree,
        node_id: node.id,
        node_address: node.address,
        harness_id: new.harness_id.clone(),
        workdir,
        isolated: node.isolated,
        status: SessionStatus::Active,
        turns: 0,
        created_at_ms,
        ended_at_ms: 0,
        owner: new.owner.clone(),
        limits: new.limits,
    };
    let limits = &new.limits;
    sqlx::query(
        "INSERT INTO sessions (id, scope, environment_id, environment_name, entry, version, \
         slug, layer_tree, node_id, harness_id, isolated, status, created_at_ms, owner, workdir, \
         limit_memory_mb, limit_pids, limit_cpu_millicores, limit_disk_mb, limit_lifetime_ms, \
         limit_idle_ms, ends_at_ms) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, 'active', $12, $13, $14, \
         $15, $16, $17, $18, $19, $20, $21)",
    )
    .bind(session.id.as_str())
    .bind(session.scope.as_str())
    .bind(session.environment_id.as_str())
    .bind(&session.environment_name)
    .bind(&session.entry)
    .bind(version)
    .bind(&session.slug)
    .bind(&session.layer_tree)
    .bind(session.node_id.as_str())
    .bind(&session.harness_id)
    .bind(i64::from(session.isolated))
    .bind(session.created_at_ms)
    .bind(&session.owner)
    .bind(&session.workdir)
    .bind(stored(limits.memory_mb))
    .bind(stored(limits.pids))
    .bind(stored(limits.cpu_millicores))
    .bind(stored(limits.disk_mb))
    .bind(stored(limits.lifetime_ms))
    .bind(stored(limits.idle_ms))
    .bind(limits.ends_at_ms(created_at_ms, created_at_ms))
    .execute(&mut **tx)
    .await?;
    Ok(session)
}

/// The node a new session must not go to, as the queries bind it: '' (no node's id) for none.
fn excluded(new: &NewSession) -> &str {
    new.exclude_node.as_ref().map_or("", NodeId::as_str)
}

/// The live node not held suspect with the fewest live sessions that has room for a session
/// wanting `want` MiB, other than the one `new` excludes; its row locked on PostgreSQL (see
/// [`node_lock`]).
async fn live_node(
    tx: &mut sqlx::Transaction<'static, sqlx::Any>,
    backend: Backend,
    new: &NewSession,
    want: i64,
) -> Result<Option<Node>, StoreError> {
    let sql = format!(
        "SELECT c.id, c.address, c.isolated, c.sessions_dir FROM nodes c WHERE {room} \
         ORDER BY c.active_sessions, c.registered_at_ms, c.id LIMIT 1{lock}",
        room = node_with_room!("$1", "$2", "$3", "$4"),
        lock = node_lock(backend),
    );
    let row = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(new.live_since_ms)
        .bind(excluded(new))
        .bind(want)
        .bind(now_ms())
        .fetch_optional(&mut **tx)
        .await?;
    let Some(row) = row else { return Ok(None) };
    let id: String = row.try_get("id")?;
    let isolated: i64 = row.try_get("isolated")?;
    Ok(Some(Node {
        id: NodeId::parse(&id).ok_or_else(|| StoreError::Corrupt(format!("node id {id:?}")))?,
        address: row.try_get("address")?,
        isolated: isolated != 0,
        sessions_dir: row.try_get("sessions_dir")?,
    }))
}

/// Why no node took a session: none is live and answering the gateways (`NoLiveNode`: a
/// suspect node counts as not answering), or every such node is full (`NoCapacity`, with how
/// many there are). Read only when placement found nothing.
async fn why_no_node(
    tx: &mut sqlx::Transaction<'static, sqlx::Any>,
    new: &NewSession,
) -> Result<StoreError, StoreError> {
    let row = sqlx::query(
        "SELECT COUNT(*) AS live FROM nodes c \
         WHERE c.heartbeat_at_ms >= $1 AND c.left_at_ms = 0 AND c.id <> $2 \
         AND c.suspect_until_ms <= $3",
    )
    .bind(new.live_since_ms)
    .bind(excluded(new))
    .bind(now_ms())
    .fetch_one(&mut **tx)
    .await?;
    let live: i64 = row.try_get("live")?;
    Ok(if live == 0 {
        StoreError::NoLiveNode
    } else {
        StoreError::NoCapacity {
            live_nodes: u64::try_from(live).unwrap_or(0),
            memory_mb: new.limits.memory_mb,
        }
    })
}

fn session_from_row(row: &AnyRow) -> Result<Session, StoreError> {
    let id: String = row.try_get("id")?;
    let corrupt = |what: &str| StoreError::Corrupt(format!("{what} of session {id}"));
    let scope: String = row.try_get("scope")?;
    let environment: String = row.try_get("environment_id")?;
    let node: String = row.try_get("node_id")?;
    let status: String = row.try_get("status")?;
    let version: i64 = row.try_get("version")?;
    let isolated: i64 = row.try_get("isolated")?;
    let turns: i64 = row.try_get("turns")?;
    let limit = |column: &str| -> Result<Option<u64>, StoreError> {
        let value: Option<i64> = row.try_get(column)?;
        value
            .map(|value| u64::try_from(value).map_err(|_| corrupt(column)))
            .transpose()
    };
    let limits = SessionLimits {
        memory_mb: limit("limit_memory_mb")?,
        pids: limit("limit_pids")?,
        cpu_millicores: limit("limit_cpu_millicores")?,
        disk_mb: limit("limit_disk_mb")?,
        lifetime_ms: limit("limit_lifetime_ms")?,
        idle_ms: limit("limit_idle_ms")?,
    };
    Ok(Session {
        id: SessionId::parse(&id).ok_or_else(|| corrupt("id"))?,
        scope: Scope::parse(&scope).map_err(|_| corrupt("scope"))?,
        environment_id: EnvironmentId::parse(&environment).ok_or_else(|| corrupt("environment"))?,
        environment_name: row.try_get("environment_name")?,
        entry: row.try_get("entry")?,
        version: u32::try_from(version).map_err(|_| corrupt("version"))?,
        slug: row.try_get("slug")?,
        layer_tree: row.try_get("layer_tree")?,
        node_id: NodeId::parse(&node).ok_or_else(|| corrupt("node"))?,
        node_address: row.try_get("node_address")?,
        harness_id: row.try_get("harness_id")?,
        workdir: row.try_get("workdir")?,
        isolated: isolated != 0,
        status: SessionStatus::parse(&status).ok_or_else(|| corrupt("status"))?,
        turns: u64::try_from(turns).unwrap_or(0),
        created_at_ms: row.try_get("created_at_ms")?,
        ended_at_ms: row.try_get("ended_at_ms")?,
        owner: row.try_get("owner")?,
        limits,
    })
}

/// A turn to record with an adapter's stored answer (an idempotent call's, an operation's
/// receipt), in the same transaction.
#[derive(Debug, Clone)]
pub struct NewTurn {
    /// The session's scope.
    pub scope: Scope,
    /// The session.
    pub session: SessionId,
    /// What the call was.
    pub kind: TurnKind,
    /// Its detail (a path, a command).
    pub detail: String,
    /// A command's exit code.
    pub exit_code: Option<i32>,
}

/// Records `turn` in `connection`'s transaction (as [`Store::record_turn`] does); `None` when
/// its session takes no turn (not there, ended, or past its end), with nothing written.
/// A turn taken by session `$1` of scope `$2` at `$3` (ms): its count and idle end move, and
/// it answers the turn's sequence and the session's version; no row when the session ended
/// or is past its end. [`insert_turn`]'s first statement, which a ledger's script also runs.
pub(super) const TURN_TAKEN: &str = concat!(
    "UPDATE sessions SET turns = turns + 1, ends_at_ms = ",
    idle_end!(),
    " WHERE id = $1 AND scope = $2 AND status = 'active' \
     AND (ends_at_ms IS NULL OR ends_at_ms > $3) RETURNING turns, version",
);

/// The turn itself: session, sequence, kind, detail, version, time, exit code.
pub(super) const TURN_RECORDED: &str = "INSERT INTO turns \
     (session_id, sequence, kind, detail, version, at_ms, exit_code) \
     VALUES ($1, $2, $3, $4, $5, $6, $7)";

/// A turn's detail as it is stored.
pub(super) fn stored_detail(detail: &str) -> String {
    cut(detail, MAX_TURN_DETAIL_BYTES)
}

pub(super) async fn insert_turn(
    connection: &mut sqlx::AnyConnection,
    turn: &NewTurn,
) -> Result<Option<Turn>, StoreError> {
    let NewTurn {
        scope,
        session: id,
        kind,
        detail,
        exit_code,
    } = turn;
    let (kind, exit_code) = (*kind, *exit_code);
    let now = now_ms();
    // A turn moves the session's idle end to `now + idle`, unless its lifetime ends it
    // sooner; a session past its end takes no turn, whether or not the sweep ended it yet.
    let row = sqlx::query(TURN_TAKEN)
        .bind(id.as_str())
        .bind(scope.as_str())
        .bind(now)
        .fetch_optional(&mut *connection)
        .await?;
    let Some(row) = row else { return Ok(None) };
    let sequence: i64 = row.try_get("turns")?;
    let version: i64 = row.try_get("version")?;
    let turn = Turn {
        session_id: id.clone(),
        sequence: u64::try_from(sequence).unwrap_or(0),
        kind,
        detail: stored_detail(detail),
        version: u32::try_from(version).unwrap_or(0),
        at_ms: now,
        exit_code,
    };
    sqlx::query(TURN_RECORDED)
        .bind(id.as_str())
        .bind(sequence)
        .bind(kind.as_str())
        .bind(&turn.detail)
        .bind(version)
        .bind(turn.at_ms)
        .bind(exit_code.map(i64::from))
        .execute(&mut *connection)
        .await?;
    Ok(Some(turn))
}
