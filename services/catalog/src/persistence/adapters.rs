//! Workspace adapters. What is durable here and why: an adapter row is the owner's record of
//! which environment a runtime's calls run on, where a Brain may be called back, and what
//! authenticates those calls; the dispatch endpoints look it up on every call, so a deleted
//! adapter stops working at once on every gateway. The environment is checked by the insert
//! itself (an adapter is never written pointing outside its scope however requests race), with
//! no foreign key, as for harnesses. A rotation moves the current credential to
//! `previous_secret` with its expiry in the same statement, so there is never a moment with
//! neither accepted (or, with no grace, drops it in that statement).
//!
//! Credentials are sealed with the store's key before they are written, with the adapter's id
//! bound to them, and the row names the key (`seal_key_id`); they are opened only to answer
//! `adapter_credentials`. Rows an earlier version wrote in clear (an empty `seal_key_id`) are
//! sealed at start by [`Store::seal_stored_credentials`], which also refuses a key that does not
//! open what is there.

use super::durability::Durable;
use plinth_kit::database::{Backend, now_ms};
use sqlx::any::AnyRow;
use sqlx::{Executor as _, Row};

use super::ledger::{self, Found, Table, Value};
pub use super::sessions::NewTurn;
use super::{Store, StoreError};
use crate::domain::adapters::{Adapter, AdapterId, NewAdapter, Protocol};
use crate::domain::model::{EnvironmentId, Scope};
use crate::domain::seal::SealError;
use crate::domain::sessions::Turn;

/// Most runs one `end_idle_runs` ends: its answer (the ended sessions) stays well inside a
/// gRPC message.
pub const END_IDLE_BATCH: u32 = 500;

/// A run's last use is written when it is at least this old (milliseconds), not on every call:
/// a quarter of the shortest idle time a run may be given (1 s).
pub const RUN_USE_STAMP_MS: i64 = 250;

const ADAPTER_COLUMNS: &str = "id, scope, protocol, environment_id, secret, previous_secret, \
     previous_expires_at_ms, created_at_ms, rotated_at_ms, callback_origins, seal_key_id";

/// An adapter with what verifies its calls now.
#[derive(Debug, Clone)]
pub struct AdapterCredentials {
    /// The adapter.
    pub adapter: Adapter,
    /// The current stored credential.
    pub current: String,
    /// The previous one while its grace window lasts.
    pub previous: Option<String>,
}

impl Store {
    /// Inserts an adapter, if its environment is one of the scope
    /// (`StoreError::NoSuchEnvironment` otherwise). Its credential is sealed first.
    pub async fn create_adapter(&self, new: NewAdapter) -> Result<Adapter, StoreError> {
        let now = now_ms();
        let adapter = Adapter {
            id: AdapterId::generate(),
            scope: new.scope,
            protocol: new.protocol,
            environment_id: new.environment_id,
            created_at_ms: now,
            rotated_at_ms: 0,
            previous_expires_at_ms: 0,
            callback_origins: new.callback_origins,
        };
        let sealed = self
            .seal
            .seal(adapter.id.as_str(), &new.stored_credential)?;
        let inserted = sqlx::query(
            "INSERT INTO workspace_adapters (id, scope, protocol, environment_id, secret, \
             created_at_ms, callback_origins, seal_key_id) \
             SELECT $1, scope, $2, id, $3, $4, $5, $6 FROM environments \
             WHERE scope = $7 AND id = $8",
        )
        .bind(adapter.id.as_str())
        .bind(adapter.protocol.label())
        .bind(&sealed)
        .bind(now)
        .bind(origins_text(&adapter.callback_origins))
        .bind(self.seal.id())
        .bind(adapter.scope.as_str())
        .bind(adapter.environment_id.as_str())
        .execute(&self.db.writer)
        .await?;
        if inserted.rows_affected() == 0 {
            return Err(StoreError::NoSuchEnvironment);
        }
        Ok(adapter)
    }

    /// One adapter of the scope (its credentials are not opened).
    pub async fn get_adapter(&self, scope: &Scope, id: &AdapterId) -> Result<Adapter, StoreError> {
        let sql = format!(
            "SELECT {ADAPTER_COLUMNS} FROM workspace_adapters WHERE scope = $1 AND id = $2"
        );
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(scope.as_str())
            .bind(id.as_str())
            .fetch_optional(&self.db.reader)
            .await?
            .ok_or(StoreError::NotFound)?;
        adapter_from_row(&row, now_ms())
    }

    /// Replaces the callback origins of an adapter of the scope (already checked against its
    /// protocol).
    pub async fn set_callback_origins(
        &self,
        scope: &Scope,
        id: &AdapterId,
        origins: &[String],
    ) -> Result<Adapter, StoreError> {
        let sql = format!(
            "UPDATE workspace_adapters SET callback_origins = $1 WHERE scope = $2 AND id = $3 \
             RETURNING {ADAPTER_COLUMNS}"
        );
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(origins_text(origins))
            .bind(scope.as_str())
            .bind(id.as_str())
            .fetch_optional(&self.db.writer)
            .await?
            .ok_or(StoreError::NotFound)?;
        adapter_from_row(&row, now_ms())
    }

    /// Deletes an adapter of the scope.
    pub async fn delete_adapter(&self, scope: &Scope, id: &AdapterId) -> Result<(), StoreError> {
        let deleted = sqlx::query("DELETE FROM workspace_adapters WHERE scope = $1 AND id = $2")
            .bind(scope.as_str())
            .bind(id.as_str())
            .execute(&self.db.writer)
            .await?;
        if deleted.rows_affected() == 0 {
            return Err(StoreError::NotFound);
        }
        Ok(())
    }

    /// Makes `stored` the adapter's credential (sealed first). With a `grace_ms` above 0 the
    /// one it replaces is accepted for that much longer; with 0 it is dropped in the same
    /// statement, refused from the moment this returns. A previous credential still in its
    /// window is dropped either way: only one is kept.
    pub async fn rotate_adapter(
        &self,
        scope: &Scope,
        id: &AdapterId,
        stored: &str,
        grace_ms: i64,
    ) -> Result<Adapter, StoreError> {
        let now = now_ms();
        let sealed = self.seal.seal(id.as_str(), stored)?;
        let expires = if grace_ms > 0 {
            now.saturating_add(grace_ms)
        } else {
            0
        };
        // Only a row sealed with this key is rotated: its current value moves to the previous
        // slot unopened, so it must be one this key opens.
        let sql = format!(
            "UPDATE workspace_adapters SET \
             previous_secret = CASE WHEN $1 > 0 THEN secret ELSE '' END, \
             previous_expires_at_ms = $1, secret = $2, rotated_at_ms = $3 \
             WHERE scope = $4 AND id = $5 AND seal_key_id = $6 RETURNING {ADAPTER_COLUMNS}"
        );
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(expires)
            .bind(&sealed)
            .bind(now)
            .bind(scope.as_str())
            .bind(id.as_str())
            .bind(self.seal.id())
            .fetch_optional(&self.db.writer)
            .await?;
        match row {
            Some(row) => adapter_from_row(&row, now),
            None => {
                // Not there, or sealed otherwise: say which.
                let sql = format!(
                    "SELECT {ADAPTER_COLUMNS} FROM workspace_adapters WHERE scope = $1 AND id = $2"
                );
                let row = sqlx::query(sqlx::AssertSqlSafe(sql))
                    .bind(scope.as_str())
                    .bind(id.as_str())
                    .fetch_optional(&self.db.writer)
                    .await?
                    .ok_or(StoreError::NotFound)?;
                Err(self.credentials_from_row(&row, now).err().unwrap_or_else(|| {
                    StoreError::Corrupt(format!(
                        "adapter {id}: its credential was written in clear by an earlier version; restart the catalog to seal it"
                    ))
                }))
            }
        }
    }

    /// An adapter by id alone, with the credentials accepted now, opened.
    pub async fn adapter_credentials(
        &self,
        id: &AdapterId,
    ) -> Result<AdapterCredentials, StoreError> {
        let sql = format!("SELECT {ADAPTER_COLUMNS} FROM workspace_adapters WHERE id = $1");
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(id.as_str())
            .fetch_optional(&self.db.reader)
            .await?
            .ok_or(StoreError::NotFound)?;
        self.credentials_from_row(&row, now_ms())
    }

    /// Seals every credential an earlier version stored in clear, and checks that this key
    /// opens every sealed one; answers how many adapters were sealed now. On SQLite the
    /// overwritten clear values are zeroed in the file and the write-ahead log is emptied, so
    /// the file keeps no copy of them.
    pub async fn seal_stored_credentials(&self) -> Result<u64, StoreError> {
        let rows = sqlx::query(
            "SELECT id, secret, previous_secret, seal_key_id FROM workspace_adapters ORDER BY id",
        )
        .fetch_all(&self.db.writer)
        .await?;
        let mut clear = Vec::new();
        for row in &rows {
            let id: String = row.try_get("id")?;
            let key_id: String = row.try_get("seal_key_id")?;
            let secret: String = row.try_get("secret")?;
            let previous: String = row.try_get("previous_secret")?;
            if key_id.is_empty() {
                clear.push((
                    self.seal.seal(&id, &secret)?,
                    self.seal.seal(&id, &previous)?,
                    id,
                ));
                continue;
            }
            if key_id != self.seal.id() {
                return Err(SealError::WrongKey {
                    adapter: id,
                    sealed_with: key_id,
                    key: self.seal.id().to_owned(),
                }
                .into());
            }
            self.seal.open(&id, &secret)?;
            self.seal.open(&id, &previous)?;
        }
        if clear.is_empty() {
            return Ok(0);
        }
        let mut connection = self.db.writer.acquire().await?;
        if self.db.backend == Backend::Sqlite {
            connection.execute("PRAGMA secure_delete = ON").await?;
        }
        let mut sealed = 0;
        for (secret, previous, id) in &clear {
            sealed += sqlx::query(
                "UPDATE workspace_adapters SET secret = $1, previous_secret = $2, \
                 seal_key_id = $3 WHERE id = $4 AND seal_key_id = ''",
            )
            .bind(secret)
            .bind(previous)
            .bind(self.seal.id())
            .bind(id)
            .execute(&mut *connection)
            .await?
            .rows_affected();
        }
        if self.db.backend == Backend::Sqlite {
            connection.execute("PRAGMA secure_delete = OFF").await?;
            connection
                .execute("PRAGMA wal_checkpoint(TRUNCATE)")
                .await?;
        }
        tracing::info!(
            sealed,
            seal_key = self.seal.id(),
            "workspace adapter credentials an earlier version stored in clear are sealed now"
        );
        Ok(sealed)
    }

    /// Reads a row's credentials, opened; a previous credential whose window closed before
    /// `now` is left out. A row sealed with another key is `SealError::WrongKey`; one an
    /// earlier version wrote in clear (possible only while such a version still runs beside
    /// this one) is read as it is.
    fn credentials_from_row(
        &self,
        row: &AnyRow,
        now: i64,
    ) -> Result<AdapterCredentials, StoreError> {
        let adapter = adapter_from_row(row, now)?;
        let id = adapter.id.as_str();
        let key_id: String = row.try_get("seal_key_id")?;
        let secret: String = row.try_get("secret")?;
        let previous: String = row.try_get("previous_secret")?;
        let (current, previous) = if key_id.is_empty() {
            (secret, previous)
        } else if key_id == self.seal.id() {
            (self.seal.open(id, &secret)?, self.seal.open(id, &previous)?)
        } else {
            return Err(SealError::WrongKey {
                adapter: id.to_owned(),
                sealed_with: key_id,
                key: self.seal.id().to_owned(),
            }
            .into());
        };
        let previous_live = adapter.previous_expires_at_ms > 0 && !previous.is_empty();
        Ok(AdapterCredentials {
            adapter,
            current,
            previous: previous_live.then_some(previous),
        })
    }
}

fn origins_text(origins: &[String]) -> String {
    serde_json::to_string(origins).unwrap_or_else(|_| "[]".to_owned())
}

/// Reads a row's adapter; a previous credential whose window closed before `now` shows no
/// expiry.
fn adapter_from_row(row: &AnyRow, now: i64) -> Result<Adapter, StoreError> {
    let id: String = row.try_get("id")?;
    let corrupt = |what: &str| StoreError::Corrupt(format!("{what} of adapter {id}"));
    let scope: String = row.try_get("scope")?;
    let protocol: String = row.try_get("protocol")?;
    let environment: String = row.try_get("environment_id")?;
    let previous: String = row.try_get("previous_secret")?;
    let expires: i64 = row.try_get("previous_expires_at_ms")?;
    let origins: String = row.try_get("callback_origins")?;
    let callback_origins: Vec<String> =
        serde_json::from_str(&origins).map_err(|_| corrupt("callback origins"))?;
    let previous_live = !previous.is_empty() && expires > now;
    Ok(Adapter {
        id: AdapterId::parse(&id).ok_or_else(|| corrupt("id"))?,
        scope: Scope::parse(&scope).map_err(|_| corrupt("scope"))?,
        protocol: Protocol::from_label(&protocol).ok_or_else(|| corrupt("protocol"))?,
        environment_id: EnvironmentId::parse(&environment).ok_or_else(|| corrupt("environment"))?,
        created_at_ms: row.try_get("created_at_ms")?,
        rotated_at_ms: row.try_get("rotated_at_ms")?,
        previous_expires_at_ms: if previous_live { expires } else { 0 },
        callback_origins,
    })
}

/// A run's session, as [`Store::open_run`] finds or makes it.
#[derive(Debug, Clone)]
pub struct OpenedRun {
    /// Its session.
    pub session: crate::domain::sessions::Session,
    /// When the run's first call came.
    pub started_at_ms: i64,
    /// Whether this call made the session.
    pub created: bool,
}

/// The HTTP status a settled claim answers (`outcome_unknown`).
pub const OUTCOME_UNKNOWN_STATUS: u32 = 409;

/// The answer stored for a claim whose holder stopped before storing one.
fn outcome_unknown_answer() -> String {
    let code = plinth_kit::ErrorCode::OutcomeUnknown;
    debug_assert_eq!(u32::from(code.http_status()), OUTCOME_UNKNOWN_STATUS);
    serde_json::json!({
        "error": {
            "code": code.as_str(),
            "message": "the first call with this idempotency key was dispatched, then its \
                server stopped before recording what it did (it was stopped, or lost the \
                catalog for longer than its claim's lease): the call may or may not have taken \
                effect, and it is not run again under this key. Check the workspace, then send \
                the call with a new key if it is still wanted",
        }
    })
    .to_string()
}

/// The idempotency ledger's columns.
const KEYS: Table = Table {
    name: "idempotency_keys",
    key: &["adapter_id", "key"],
    digest: "body_sha256",
    holder: "claim",
    state: "state",
    running: "running",
    done: "done",
    answer: &["status", "response"],
    stamp: "expires_at_ms",
};

/// The stored answer of a key `table` (whose answer is `status, response`) holds under
/// `key`, when it is done; `InFlight` when it still runs.
pub(super) async fn stored_answer(
    connection: &mut sqlx::AnyConnection,
    table: &Table,
    key: &[Value<'_>],
) -> Result<Claimed, StoreError> {
    let sql = format!(
        "SELECT {} AS state, status, response FROM {} WHERE {}",
        table.state,
        table.name,
        table.key_match(1)
    );
    let row = ledger::bind(sqlx::query(sqlx::AssertSqlSafe(sql)), key)
        .fetch_optional(&mut *connection)
        .await?
        .ok_or(StoreError::NotFound)?;
    let state: String = row.try_get("state")?;
    if state != table.done {
        return Ok(Claimed::InFlight);
    }
    let status: i64 = row.try_get("status")?;
    Ok(Claimed::Done {
        status: u32::try_from(status)
            .map_err(|_| StoreError::Corrupt(format!("{} answer status {status}", table.name)))?,
        response: row.try_get("response")?,
    })
}

/// A claim on a key of `table` (the ledger's rules, `super::ledger`), in `tx`: inserts a
/// running record of `columns` (the key's, the digest's, the holder's `claim`, the lease's and
/// retention's among the rest) unless one exists; takes a record past its retention over with
/// `fresh`; otherwise decides from the record, settling one abandoned with `unknown` kept until
/// `keep_until`. Answers what it found, and whether it settled an abandoned claim (for the
/// caller's log). The caller commits.
#[allow(clippy::too_many_arguments)]
pub(super) async fn claim_in(
    tx: &mut sqlx::AnyConnection,
    table: &Table,
    record: &[Value<'_>],
    (columns, values): (&[&str], &[Value<'_>]),
    fresh: &[(&str, Value<'_>)],
    (claim, body_sha256): (&str, &str),
    (now, keep_until): (i64, i64),
    unknown: &str,
) -> Result<(Claimed, bool), StoreError> {
    if table.claim(tx, columns, values).await? {
        return Ok((Claimed::Claimed(claim.to_owned()), false));
    }
    if let Some(taken) = table.take_over_expired(tx, record, fresh, now).await? {
        // Taken over by a concurrent claim otherwise: that one runs it.
        return Ok((
            if taken {
                Claimed::Claimed(claim.to_owned())
            } else {
                Claimed::InFlight
            },
            false,
        ));
    }
    let (digest, holder, running, lease_until_ms) =
        table.found(tx, record).await?.ok_or(StoreError::NotFound)?;
    Ok(
        match ledger::decide(&digest, running, lease_until_ms, body_sha256, now) {
            Found::Mismatch => (Claimed::Mismatch, false),
            Found::Live => (Claimed::InFlight, false),
            Found::Done => (stored_answer(tx, table, record).await?, false),
            Found::Abandoned => {
                // The claim's holder stopped renewing before storing an answer: it died, or
                // lost the catalog for a whole lease. What it did is not known and never
                // will be.
                let settled = table
                    .answer(
                        tx,
                        record,
                        &holder,
                        &[
                            Value::Int(i64::from(OUTCOME_UNKNOWN_STATUS)),
                            Value::Text(unknown),
                        ],
                        keep_until,
                        Some(now),
                    )
                    .await?;
                (stored_answer(tx, table, record).await?, settled)
            }
        },
    )
}

/// What a claim on an idempotency key found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claimed {
    /// The key is this call's: run it, then finish with this claim.
    Claimed(String),
    /// A call with this key and body ended: its answer.
    Done {
        /// HTTP status.
        status: u32,
        /// Body.
        response: String,
    },
    /// The first call with this key is still running.
    InFlight,
    /// The key was used with another body.
    Mismatch,
}

impl Store {
    /// The session of an adapter's run: the run's first call makes it (pinning the
    /// environment's active version, placed like any session), later calls find it and mark
    /// the run used. `StoreError::RunEnded` once its session ended. `limits` are the new
    /// session's, when this call makes it.
    pub async fn open_run(
        &self,
        adapter: &Adapter,
        run_id: &str,
        live_since_ms: i64,
        limits: crate::domain::sessions::SessionLimits,
    ) -> Result<OpenedRun, StoreError> {
        let now = now_ms();
        if let Some(found) = self.touch_run(adapter, run_id, now).await? {
            return Ok(found);
        }
        let mut tx = self.db.begin_write().await?;
        let session = super::sessions::insert_session(
            &mut tx,
            self.db.backend,
            &super::NewSession {
                scope: adapter.scope.clone(),
                environment_id: adapter.environment_id.clone(),
                version: None,
                harness_id: String::new(),
                owner: format!("{} run {run_id}", adapter.id),
                live_since_ms,
                exclude_node: None,
                // Whichever call of the run comes first attaches it: the empty working
                // directory is how the others know it has not been yet.
                workdir_at_placement: false,
                limits,
            },
            self.limit(&adapter.scope, plinth_kit::quota::Quota::Sessions),
        )
        .await?;
        let inserted = sqlx::query(
            "INSERT INTO adapter_runs (adapter_id, run_id, session_id, started_at_ms, \
             last_used_at_ms) VALUES ($1, $2, $3, $4, $4) ON CONFLICT DO NOTHING",
        )
        .bind(adapter.id.as_str())
        .bind(run_id)
        .bind(session.id.as_str())
        .bind(now)
        .execute(&mut *tx)
        .await?;
        if inserted.rows_affected() == 0 {
            // Another first call of the run won: its session is the run's.
            tx.rollback().await?;
            return self
                .touch_run(adapter, run_id, now)
                .await?
                .ok_or(StoreError::NotFound);
        }
        tx.commit().await?;
        Ok(OpenedRun {
            session,
            started_at_ms: now,
            created: true,
        })
    }

    async fn touch_run(
        &self,
        adapter: &Adapter,
        run_id: &str,
        now: i64,
    ) -> Result<Option<OpenedRun>, StoreError> {
        // Read first, from a reader: the run's last use is written at most every
        // `RUN_USE_STAMP_MS`, so a run's rapid calls do not each wait for the single writer
        // (the idle sweep counts in whole seconds).
        let row = sqlx::query(
            "SELECT session_id, started_at_ms, last_used_at_ms FROM adapter_runs \
             WHERE adapter_id = $1 AND run_id = $2",
        )
        .bind(adapter.id.as_str())
        .bind(run_id)
        .fetch_optional(&self.db.reader)
        .await?;
        let Some(row) = row else { return Ok(None) };
        let last_used: i64 = row.try_get("last_used_at_ms")?;
        if now.saturating_sub(last_used) >= RUN_USE_STAMP_MS {
            sqlx::query(
                "UPDATE adapter_runs SET last_used_at_ms = $1 \
                 WHERE adapter_id = $2 AND run_id = $3 AND last_used_at_ms < $1",
            )
            .bind(now)
            .bind(adapter.id.as_str())
            .bind(run_id)
            .execute(&self.db.writer)
            .await?;
        }
        let id: String = row.try_get("session_id")?;
        let id = crate::domain::sessions::SessionId::parse(&id)
            .ok_or_else(|| StoreError::Corrupt(format!("session of run {run_id}")))?;
        let session = self.get_session(&adapter.scope, &id).await?;
        if session.status != crate::domain::sessions::SessionStatus::Active {
            return Err(StoreError::RunEnded);
        }
        Ok(Some(OpenedRun {
            session,
            started_at_ms: row.try_get("started_at_ms")?,
            created: false,
        }))
    }

    /// Ends the sessions of runs unused since `idle_before_ms` with no claimed call running,
    /// at most `END_IDLE_BATCH` of them, the longest unused first; answers them. The caller
    /// sweeps again soon, so the rest wait one sweep rather than making one answer unbounded.
    pub async fn end_idle_runs(
        &self,
        idle_before_ms: i64,
    ) -> Result<Vec<crate::domain::sessions::Session>, StoreError> {
        let rows = sqlx::query(
            "SELECT r.session_id, s.scope FROM adapter_runs r JOIN sessions s ON s.id = r.session_id \
             WHERE r.last_used_at_ms < $1 AND s.status = 'active' AND NOT EXISTS \
             (SELECT 1 FROM idempotency_keys k WHERE k.adapter_id = r.adapter_id \
              AND k.run_id = r.run_id AND k.state = 'running' AND k.lease_until_ms > $2) \
             ORDER BY r.last_used_at_ms LIMIT $3",
        )
        .bind(idle_before_ms)
        .bind(now_ms())
        .bind(i64::from(END_IDLE_BATCH))
        .fetch_all(&self.db.reader)
        .await?;
        let mut ended = Vec::new();
        for row in rows {
            let id: String = row.try_get("session_id")?;
            let scope: String = row.try_get("scope")?;
            let (Some(id), Ok(scope)) = (
                crate::domain::sessions::SessionId::parse(&id),
                Scope::parse(&scope),
            ) else {
                continue;
            };
            // Only the replica whose update ends it reports it.
            let updated = sqlx::query(
                "UPDATE sessions SET status = 'ended', ended_at_ms = $1 WHERE id = $2 AND status = 'active'",
            )
            .bind(now_ms())
            .bind(id.as_str())
            .execute(&self.db.writer)
            .await?;
            if updated.rows_affected() == 1 {
                ended.push(self.get_session(&scope, &id).await?);
            }
        }
        Ok(ended)
    }

    /// Claims `key` for a call with this body (see [`Claimed`]), by the ledger's rules
    /// (`super::ledger`), in one transaction. A claim whose lease ran out with no answer is
    /// settled as an `outcome_unknown` answer (the call may have taken effect, so it is never
    /// run again); only a record past its retention is taken over and run anew.
    pub async fn claim_key(
        &self,
        adapter: &AdapterId,
        key: &str,
        run_id: &str,
        body_sha256: &str,
        lease_ms: i64,
        retention_ms: i64,
    ) -> Result<Claimed, StoreError> {
        let now = now_ms();
        let claim = uuid::Uuid::new_v4().simple().to_string();
        let lease_until = now.saturating_add(lease_ms);
        let keep_until = now.saturating_add(retention_ms);
        let record = [Value::Text(adapter.as_str()), Value::Text(key)];
        let unknown = outcome_unknown_answer();
        let columns = [
            "adapter_id",
            "key",
            "run_id",
            "body_sha256",
            "claim",
            "lease_until_ms",
            "expires_at_ms",
        ];
        let values = [
            record[0],
            record[1],
            Value::Text(run_id),
            Value::Text(body_sha256),
            Value::Text(&claim),
            Value::Int(lease_until),
            Value::Int(keep_until),
        ];
        // The first call with the key (nearly every one): one statement, its own transaction,
        // on disk before the call runs (on SQLite synced outside the writer, so concurrent
        // claims share the file system's commits).
        let claimed = if self.db.backend == Backend::Sqlite {
            let script = format!(
                "{}; SELECT changes() AS claimed",
                KEYS.insert_sql(&columns, &values, KEYS.running)
            );
            let rows = self.synced_script(&script, &values).await?;
            rows.first()
                .map(|row| row.try_get::<i64, _>("claimed"))
                .transpose()?
                == Some(1)
        } else {
            let mut connection = self.db.writer.acquire().await?;
            KEYS.claim(&mut connection, &columns, &values).await?
        };
        if claimed {
            return Ok(Claimed::Claimed(claim));
        }
        // Used before: what that call left decides, in one transaction, on disk before the
        // call runs.
        let mut tx = self.begin_ledger_write(Durable::BeforeAnswer).await?;
        let (claimed, settled) = claim_in(
            &mut tx,
            &KEYS,
            &record,
            (&columns, &values),
            &[
                ("run_id", Value::Text(run_id)),
                ("body_sha256", Value::Text(body_sha256)),
                ("claim", Value::Text(&claim)),
                ("lease_until_ms", Value::Int(lease_until)),
                ("status", Value::Int(0)),
                ("response", Value::Text("")),
                ("expires_at_ms", Value::Int(keep_until)),
            ],
            (&claim, body_sha256),
            (now, keep_until),
            &unknown,
        )
        .await?;
        if settled {
            tracing::warn!(adapter = %adapter, "an idempotent call's claim ran out with no answer; settled as outcome unknown");
        }
        tx.commit().await?;
        Ok(claimed)
    }

    /// Extends a running claim's lease to `lease_ms` from now; false once the claim has an
    /// answer, was settled, or is another's.
    pub async fn renew_key(
        &self,
        adapter: &AdapterId,
        key: &str,
        claim: &str,
        lease_ms: i64,
    ) -> Result<bool, StoreError> {
        let mut connection = self.db.writer.acquire().await?;
        let renewed = KEYS
            .renew(
                &mut connection,
                &[Value::Text(adapter.as_str()), Value::Text(key)],
                claim,
                now_ms().saturating_add(lease_ms),
                "",
            )
            .await?;
        Ok(renewed.is_some())
    }

    /// Stores a claimed call's answer, and records the turn the call made in the same
    /// transaction; answers whether the answer was stored, and the turn recorded. A claim
    /// that was settled (its lease ran out first) or taken over stores nothing: the answer
    /// already given to a retry stays the answer, and the turn is recorded all the same (the
    /// call ran). A repeat of a finish whose answer is already stored (its reply was lost)
    /// records no second turn. A session that takes no turn any more (it ended) leaves the
    /// answer stored and the turn out.
    pub async fn finish_key(
        &self,
        adapter: &AdapterId,
        key: &str,
        claim: &str,
        answer: (u32, &str),
        turn: Option<&NewTurn>,
        retention_ms: i64,
    ) -> Result<(bool, Option<Turn>), StoreError> {
        let (status, response) = answer;
        let record = [Value::Text(adapter.as_str()), Value::Text(key)];
        if self.db.backend == Backend::Sqlite {
            return self
                .finish_key_script(&record, claim, answer, turn, retention_ms)
                .await;
        }
        // The caller was answered already; the claim, synced, stands until this lands.
        let mut tx = self.begin_ledger_write(Durable::Committed).await?;
        let stored = KEYS
            .answer(
                &mut tx,
                &record,
                claim,
                &[Value::Int(i64::from(status)), Value::Text(response)],
                now_ms().saturating_add(retention_ms),
                None,
            )
            .await?;
        let same = stored
            || stored_answer(&mut tx, &KEYS, &record).await?
                == (Claimed::Done {
                    status,
                    response: response.to_owned(),
                });
        let mut recorded = None;
        if let Some(turn) = turn.filter(|_| ledger::turns_due(stored, same)) {
            recorded = super::sessions::insert_turn(&mut tx, turn).await?;
        }
        tx.commit().await?;
        Ok((stored, recorded))
    }

    /// [`Store::finish_key`] on SQLite: two trips to the database's thread (its statements,
    /// then the turn and the commit) where statement by statement it was six.
    async fn finish_key_script(
        &self,
        record: &[Value<'_>],
        claim: &str,
        (status, response): (u32, &str),
        turn: Option<&NewTurn>,
        retention_ms: i64,
    ) -> Result<(bool, Option<Turn>), StoreError> {
        let now = now_ms();
        let answer = [Value::Int(i64::from(status)), Value::Text(response)];
        let (update, mut values) = KEYS.answer_sql(
            record,
            claim,
            &answer,
            now.saturating_add(retention_ms),
            None,
        );
        // `changes()`: whether the UPDATE just before stored this answer.
        let select = format!(
            "SELECT {} AS state, status, response, changes() AS stored FROM {} WHERE {}",
            KEYS.state,
            KEYS.name,
            KEYS.key_match(answer.len() + 2)
        );
        let mut script = format!("{update}; {select};");
        if let Some(turn) = turn {
            script.push_str(&ledger::renumbered(
                super::sessions::TURN_TAKEN,
                values.len(),
            ));
            values.extend([
                Value::Text(turn.session.as_str()),
                Value::Text(turn.scope.as_str()),
                Value::Int(now),
            ]);
        }
        let (write, rows) = self
            .begin_ledger_script(Durable::Committed, &script, &values)
            .await?;
        let found = |column: &str| rows.iter().find(|row| ledger::has_column(row, column));
        let Some(row) = found("stored") else {
            write.rollback().await?;
            return Err(StoreError::NotFound);
        };
        let stored = row.try_get::<i64, _>("stored")? == 1;
        let same = stored
            || (row.try_get::<String, _>("state")? == KEYS.done
                && row.try_get::<i64, _>("status")? == i64::from(status)
                && row.try_get::<String, _>("response")? == response);
        let (Some(turn), Some(taken)) = (turn, found("turns")) else {
            write.commit().await?;
            return Ok((stored, None));
        };
        if !ledger::turns_due(stored, same) {
            write.rollback().await?;
            return Ok((stored, None));
        }
        let recorded = Turn {
            session_id: turn.session.clone(),
            sequence: u64::try_from(taken.try_get::<i64, _>("turns")?).unwrap_or(0),
            kind: turn.kind,
            detail: super::sessions::stored_detail(&turn.detail),
            version: u32::try_from(taken.try_get::<i64, _>("version")?).unwrap_or(0),
            at_ms: now,
            exit_code: turn.exit_code,
        };
        let sequence = i64::try_from(recorded.sequence).unwrap_or(i64::MAX);
        write
            .commit_script(
                &format!("{};", super::sessions::TURN_RECORDED),
                &[
                    Value::Text(recorded.session_id.as_str()),
                    Value::Int(sequence),
                    Value::Text(recorded.kind.as_str()),
                    Value::Text(&recorded.detail),
                    Value::Int(i64::from(recorded.version)),
                    Value::Int(now),
                    Value::MaybeInt(recorded.exit_code.map(i64::from)),
                ],
            )
            .await?;
        Ok((stored, Some(recorded)))
    }

    /// Gives a claim up, so a retry runs the call: only for a call that certainly did not
    /// start.
    pub async fn release_key(
        &self,
        adapter: &AdapterId,
        key: &str,
        claim: &str,
    ) -> Result<(), StoreError> {
        let mut connection = self.db.writer.acquire().await?;
        KEYS.release(
            &mut connection,
            &[Value::Text(adapter.as_str()), Value::Text(key)],
            claim,
        )
        .await?;
        Ok(())
    }

    /// Removes idempotency records past their retention; answers how many.
    pub async fn purge_keys(&self) -> Result<u64, StoreError> {
        // A claim never settled (no retry came) goes too once its lease and retention end.
        let deleted = sqlx::query(
            "DELETE FROM idempotency_keys WHERE expires_at_ms <= $1 \
             AND (state = 'done' OR lease_until_ms <= $1)",
        )
        .bind(now_ms())
        .execute(&self.db.writer)
        .await?;
        Ok(deleted.rows_affected())
    }
}

/// A Novo call whose signature verified, as the replay memory keeps it.
#[derive(Debug, Clone, Copy)]
pub struct SignedCall<'a> {
    /// The adapter it was sent to.
    pub adapter: &'a AdapterId,
    /// Lowercase hex SHA-256 of the signature that matched (which covers `t` and the body).
    pub signature: &'a str,
    /// Its `Novo-Run-Id`.
    pub run_id: &'a str,
    /// Its `Novo-Request-Id` (empty when it had none).
    pub request_id: &'a str,
    /// When its `t` stops being accepted, ms since the epoch: the row is kept until then.
    pub expires_at_ms: i64,
    /// Whether the call is claimed under its request id, in a synced commit, before it runs:
    /// then this admission is committed without a sync of its own (that claim's covers it,
    /// and until then nothing ran, so losing it loses nothing).
    pub claimed_next: bool,
}

/// What [`Store::admit_signed_call`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SignedCallSeen {
    /// Never used: it is remembered now.
    First,
    /// Used before by the same call (same non-empty request id, same run): a retry.
    SameRequest,
    /// Used before by another request id or run, or with none: a replay.
    Replayed,
    /// The adapter already holds its bound of live signatures; one leaves at this time (ms
    /// since the epoch).
    Full {
        /// When the adapter's oldest live signature expires.
        until_ms: i64,
    },
}

impl Store {
    /// Remembers a verified Novo call's signature for its adapter, once: the insert is the
    /// check (never check-then-insert), and it admits the row only while the adapter holds
    /// fewer than `max_live` signatures that have not expired, so one adapter cannot take
    /// another's room. A row already there is answered as a retry of the same call or a
    /// replay; a row that expired but was not yet swept is removed and the call admitted.
    pub async fn admit_signed_call(
        &self,
        call: SignedCall<'_>,
        max_live: i64,
    ) -> Result<SignedCallSeen, StoreError> {
        if call.claimed_next
            && self.db.backend == Backend::Sqlite
            && self.admit_first(&call, max_live).await?
        {
            return Ok(SignedCallSeen::First);
        }
        // One transaction, on disk before the call runs.
        let durable = if call.claimed_next {
            Durable::SyncedByClaim
        } else {
            Durable::BeforeAnswer
        };
        let mut tx = self.begin_ledger_write(durable).await?;
        let seen = admit_in(&mut tx, call, max_live).await?;
        tx.commit().await?;
        Ok(seen)
    }

    /// A keyed call's admission on SQLite when it is the first (nearly every one): one
    /// statement with no sync of its own (its claim's covers it), in one trip; false, with
    /// nothing written, when the full rules must decide.
    async fn admit_first(&self, call: &SignedCall<'_>, max_live: i64) -> Result<bool, StoreError> {
        let mut connection = self.db.writer.acquire().await?;
        let admitted = sqlx::query(
            "PRAGMA synchronous = NORMAL; \
             INSERT INTO novo_signatures (adapter_id, signature, run_id, request_id, \
             expires_at_ms) SELECT $1, $2, $3, $4, $5 WHERE (SELECT COUNT(*) FROM \
             novo_signatures WHERE adapter_id = $1 AND expires_at_ms > $6) < $7 \
             ON CONFLICT (adapter_id, signature) DO NOTHING; \
             SELECT changes() AS admitted; PRAGMA synchronous = FULL",
        )
        .bind(call.adapter.as_str())
        .bind(call.signature)
        .bind(call.run_id)
        .bind(call.request_id)
        .bind(call.expires_at_ms)
        .bind(now_ms())
        .bind(max_live.max(1))
        .fetch_all(&mut *connection)
        .await;
        match admitted {
            Ok(rows) => Ok(rows
                .first()
                .map(|row| row.try_get::<i64, _>("admitted"))
                .transpose()?
                == Some(1)),
            Err(error) => {
                // Which statement failed is not known: the writer may be left relaxed, so
                // it is closed rather than given back.
                connection.close_on_drop();
                Err(error.into())
            }
        }
    }

    /// Removes remembered Novo signatures whose `t` is no longer accepted; answers how many.
    pub async fn purge_signatures(&self) -> Result<u64, StoreError> {
        self.delete_batches(
            "novo_signatures",
            "adapter_id, signature",
            "expires_at_ms <= $1",
            &[now_ms()],
        )
        .await
    }
}

/// [`Store::admit_signed_call`]'s statements, in the caller's transaction.
async fn admit_in(
    connection: &mut sqlx::AnyConnection,
    call: SignedCall<'_>,
    max_live: i64,
) -> Result<SignedCallSeen, StoreError> {
    for _ in 0..2 {
        let now = now_ms();
        let inserted = sqlx::query(
            "INSERT INTO novo_signatures (adapter_id, signature, run_id, request_id, \
                 expires_at_ms) SELECT $1, $2, $3, $4, $5 WHERE (SELECT COUNT(*) FROM \
                 novo_signatures WHERE adapter_id = $1 AND expires_at_ms > $6) < $7 \
                 ON CONFLICT (adapter_id, signature) DO NOTHING",
        )
        .bind(call.adapter.as_str())
        .bind(call.signature)
        .bind(call.run_id)
        .bind(call.request_id)
        .bind(call.expires_at_ms)
        .bind(now)
        .bind(max_live.max(1))
        .execute(&mut *connection)
        .await?;
        if inserted.rows_affected() == 1 {
            return Ok(SignedCallSeen::First);
        }
        let row = sqlx::query(
            "SELECT run_id, request_id, expires_at_ms FROM novo_signatures \
                 WHERE adapter_id = $1 AND signature = $2",
        )
        .bind(call.adapter.as_str())
        .bind(call.signature)
        .fetch_optional(&mut *connection)
        .await?;
        let Some(row) = row else {
            let oldest: Option<i64> = sqlx::query(
                "SELECT MIN(expires_at_ms) AS oldest FROM novo_signatures \
                     WHERE adapter_id = $1 AND expires_at_ms > $2",
            )
            .bind(call.adapter.as_str())
            .bind(now)
            .fetch_one(&mut *connection)
            .await?
            .try_get("oldest")?;
            return Ok(SignedCallSeen::Full {
                until_ms: oldest.unwrap_or(now),
            });
        };
        let expires: i64 = row.try_get("expires_at_ms")?;
        if expires <= now {
            // Expired and not swept yet: it protects nothing any more.
            sqlx::query(
                "DELETE FROM novo_signatures WHERE adapter_id = $1 AND signature = $2 \
                     AND expires_at_ms <= $3",
            )
            .bind(call.adapter.as_str())
            .bind(call.signature)
            .bind(now)
            .execute(&mut *connection)
            .await?;
            continue;
        }
        let run: String = row.try_get("run_id")?;
        let request: String = row.try_get("request_id")?;
        let same = !call.request_id.is_empty() && request == call.request_id && run == call.run_id;
        return Ok(if same {
            SignedCallSeen::SameRequest
        } else {
            SignedCallSeen::Replayed
        });
    }
    Ok(SignedCallSeen::Replayed)
}
