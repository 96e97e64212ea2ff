//! Retention: what the catalog forgets, and when. Versions beyond the newest few ready ones of
//! each environment are retired (their rows and logs; their blobs go at the next collection),
//! except the active one and any a live session or Brain binding reads. Records of ended work
//! (sessions and their turns and tasks, adapter runs, idempotency records (adapters' and the
//! tenant API's `Idempotency-Key`s), Brain operations, deleted environments' names) go once
//! older than the retention period.
//!
//! Everything is deleted in batches of [`BATCH`] rows, each its own short transaction that
//! re-checks its conditions, so retention never holds a long lock and a row that became live
//! meanwhile stays.

use plinth_kit::database::now_ms;
use sqlx::Row;

use super::{Store, StoreError};

/// Rows per batch, and per transaction.
pub const BATCH: i64 = 500;

/// What retention keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetentionPolicy {
    /// Ready versions kept per environment, newest first (besides the active one and those
    /// live sessions or Brain bindings read). At least 1.
    pub keep_versions: u32,
    /// How long records of ended work are kept, in milliseconds.
    pub retention_ms: i64,
}

impl Default for RetentionPolicy {
    fn default() -> Self {
        RetentionPolicy {
            keep_versions: 10,
            retention_ms: 30 * 24 * 3600 * 1000,
        }
    }
}

/// What one retention pass removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Retired {
    /// Versions (build rows and their logs).
    pub versions: u64,
    /// Ended sessions, with their turns.
    pub sessions: u64,
    /// Tasks of those sessions.
    pub tasks: u64,
    /// Adapter runs whose session ended.
    pub adapter_runs: u64,
    /// Idempotency records.
    pub idempotency_keys: u64,
    /// Idempotency records of the tenant API's own requests (`Idempotency-Key`).
    pub request_keys: u64,
    /// Remembered Novo signatures whose `t` is no longer accepted.
    pub novo_signatures: u64,
    /// Finished Brain operations (their receipts).
    pub brain_operations: u64,
    /// Names of deleted environments.
    pub deleted_environments: u64,
    /// Holds of builds that ended or lost their lease.
    pub build_holds: u64,
    /// Brain bindings torn down, with no operation of their Brain session left.
    pub brain_bindings: u64,
}

impl Retired {
    /// Whether nothing was removed.
    pub fn is_empty(&self) -> bool {
        *self == Retired::default()
    }
}

/// Conditions under which version `b` (of environment `e`) is kept whatever its age: active,
/// read by a live session, or pinned by a Brain binding that is not torn down.
const PINNED: &str = "(b.version = COALESCE(e.active_version, 0) \
     OR EXISTS (SELECT 1 FROM sessions s WHERE s.environment_id = b.environment_id \
        AND s.version = b.version AND s.status = 'active') \
     OR EXISTS (SELECT 1 FROM brain_bindings g WHERE g.environment_id = b.environment_id \
        AND g.version = b.version AND g.state <> 'torn_down'))";

impl Store {
    /// Retires versions and removes records of ended work past the policy; answers what went.
    pub async fn apply_retention(&self, policy: RetentionPolicy) -> Result<Retired, StoreError> {
        let now = now_ms();
        let cutoff = now.saturating_sub(policy.retention_ms.max(0));
        let mut retired = Retired {
            versions: self.retire_versions(policy.keep_versions, cutoff).await?,
            ..Retired::default()
        };
        self.purge_ended_sessions(cutoff, &mut retired).await?;
        retired.brain_operations = self
            .delete_batches(
                "brain_operations",
                "adapter_id, session_id, sequence",
                "state = 'finished' AND finished_at_ms < $1",
                &[cutoff],
            )
            .await?;
        retired.idempotency_keys = self
            .delete_batches(
                "idempotency_keys",
                "adapter_id, key",
                "(state = 'done' AND expires_at_ms <= $2) OR expires_at_ms < $1",
                &[cutoff, now],
            )
            .await?;
        retired.request_keys = self
            .delete_batches(
                "request_keys",
                "scope, route, key",
                "(state = 'done' AND expires_at_ms <= $2) OR expires_at_ms < $1",
                &[cutoff, now],
            )
            .await?;
        retired.novo_signatures = self.purge_signatures().await?;
        retired.adapter_runs += self
            .delete_batches(
                "adapter_runs",
                "adapter_id, run_id",
                "last_used_at_ms < $1 AND NOT EXISTS (SELECT 1 FROM sessions s \
                 WHERE s.id = adapter_runs.session_id AND s.status = 'active')",
                &[cutoff],
            )
            .await?;
        retired.deleted_environments = self
            .delete_batches(
                "deleted_environments",
                "id",
                "deleted_at_ms < $1",
                &[cutoff],
            )
            .await?;
        retired.build_holds = self
            .delete_batches(
                "build_holds",
                "lease_token, digest",
                "NOT EXISTS (SELECT 1 FROM builds b WHERE b.lease_token = build_holds.lease_token \
                 AND b.status = 'building' AND b.lease_expires_at_ms >= $1)",
                &[now],
            )
            .await?;
        // After the operations: a binding goes once its session's receipts have gone.
        retired.brain_bindings = self
            .delete_batches(
                "brain_bindings",
                "adapter_id, session_id, environment",
                "state = 'torn_down' AND updated_at_ms < $1 AND NOT EXISTS (SELECT 1 FROM \
                 brain_operations o WHERE o.adapter_id = brain_bindings.adapter_id \
                 AND o.session_id = brain_bindings.session_id)",
                &[cutoff],
            )
            .await?;
        if !retired.is_empty() {
            self.db.compact().await?;
        }
        Ok(retired)
    }

    /// Deletes the versions retention lets go: not pinned (see `PINNED`), not queued or
    /// building, and either with `keep` ready versions newer than themselves, or failed,
    /// finished before `failed_before_ms` and not the environment's latest build (whose
    /// failure is what the environment shows). Answers how many.
    pub async fn retire_versions(
        &self,
        keep: u32,
        failed_before_ms: i64,
    ) -> Result<u64, StoreError> {
        let keep = i64::from(keep.max(1));
        let mut retired = 0;
        loop {
            let sql = format!(
                "SELECT b.environment_id, b.version FROM builds b \
                 JOIN environments e ON e.id = b.environment_id \
                 WHERE b.status IN ('ready', 'failed') AND NOT {PINNED} AND ( \
                   (SELECT COUNT(*) FROM builds n WHERE n.environment_id = b.environment_id \
                    AND n.status = 'ready' AND n.version > b.version) >= $1 \
                   OR (b.status = 'failed' AND b.finished_at_ms < $2 \
                    AND b.version < COALESCE(e.latest_version, 0))) \
                 ORDER BY b.environment_id, b.version LIMIT $3"
            );
            let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
                .bind(keep)
                .bind(failed_before_ms)
                .bind(BATCH)
                .fetch_all(&self.db.reader)
                .await?;
            if rows.is_empty() {
                return Ok(retired);
            }
            let mut tx = self.db.begin_write().await?;
            for row in &rows {
                let environment: String = row.try_get("environment_id")?;
                let version: i64 = row.try_get("version")?;
                // Re-checked in the DELETE itself: a session placed on the version since is
                // not left without its row.
                let sql = format!(
                    "DELETE FROM builds WHERE environment_id = $1 AND version = $2 \
                     AND status IN ('ready', 'failed') AND NOT EXISTS (SELECT 1 FROM builds b \
                     JOIN environments e ON e.id = b.environment_id \
                     WHERE b.environment_id = $1 AND b.version = $2 AND {PINNED})"
                );
                let deleted = sqlx::query(sqlx::AssertSqlSafe(sql))
                    .bind(&environment)
                    .bind(version)
                    .execute(&mut *tx)
                    .await?;
                retired += deleted.rows_affected();
            }
            tx.commit().await?;
            if (rows.len() as i64) < BATCH {
                return Ok(retired);
            }
        }
    }

    /// Removes sessions that ended before `cutoff`, with their turns, tasks and adapter runs,
    /// batch by batch; a session a Brain binding still names stays.
    async fn purge_ended_sessions(
        &self,
        cutoff: i64,
        retired: &mut Retired,
    ) -> Result<(), StoreError> {
        loop {
            let rows = sqlx::query(
                "SELECT s.id FROM sessions s WHERE s.status = 'ended' AND s.ended_at_ms < $1 \
                 AND NOT EXISTS (SELECT 1 FROM brain_bindings g WHERE g.plinth_session_id = s.id \
                 AND g.state <> 'torn_down') ORDER BY s.ended_at_ms LIMIT $2",
            )
            .bind(cutoff)
            .bind(BATCH)
            .fetch_all(&self.db.reader)
            .await?;
            if rows.is_empty() {
                return Ok(());
            }
            let ids: Vec<String> = rows
                .iter()
                .map(|row| row.try_get("id"))
                .collect::<Result<_, _>>()?;
            let placeholders: Vec<String> = (2..ids.len() + 2).map(|i| format!("${i}")).collect();
            let list = placeholders.join(", ");
            // Only sessions still ended before the cutoff: `$1` is checked again per table.
            let doomed = format!(
                "SELECT id FROM sessions WHERE id IN ({list}) AND status = 'ended' AND ended_at_ms < $1"
            );
            let mut tx = self.db.begin_write().await?;
            let mut counts = [0u64; 4];
            for (count, table, column) in [
                (0, "tasks", "session_id"),
                (1, "turns", "session_id"),
                (2, "adapter_runs", "session_id"),
                (3, "sessions", "id"),
            ] {
                let sql = format!("DELETE FROM {table} WHERE {column} IN ({doomed})");
                let mut query = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(cutoff);
                for id in &ids {
                    query = query.bind(id.as_str());
                }
                counts[count] = query.execute(&mut *tx).await?.rows_affected();
            }
            tx.commit().await?;
            retired.tasks += counts[0];
            retired.adapter_runs += counts[2];
            retired.sessions += counts[3];
            if (ids.len() as i64) < BATCH {
                return Ok(());
            }
        }
    }

    /// Deletes rows of `table` matching `condition` (`$1`… are `binds`) in batches of
    /// [`BATCH`], each one statement; answers how many.
    pub(super) async fn delete_batches(
        &self,
        table: &str,
        key: &str,
        condition: &str,
        binds: &[i64],
    ) -> Result<u64, StoreError> {
        let limit = binds.len() + 1;
        let sql = format!(
            "DELETE FROM {table} WHERE ({key}) IN \
             (SELECT {key} FROM {table} WHERE {condition} LIMIT ${limit})"
        );
        let mut deleted = 0;
        loop {
            let mut query = sqlx::query(sqlx::AssertSqlSafe(sql.clone()));
            for bind in binds {
                query = query.bind(*bind);
            }
            let done = query
                .bind(BATCH)
                .execute(&self.db.writer)
                .await?
                .rows_affected();
            deleted += done;
            if (done as i64) < BATCH {
                return Ok(deleted);
            }
        }
    }
}
