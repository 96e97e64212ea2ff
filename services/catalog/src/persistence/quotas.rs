//! Quotas per scope: environments, active sessions, builds queued or running. What is durable
//! here and why: nothing but a row per scope (`scope_quota_locks`) that every quota-limited
//! create takes first in its own transaction. The count is always of the rows themselves
//! (never a counter that every path ending a session would have to keep true), read after the
//! scope's row is held: on PostgreSQL the next statement of a transaction that waited for the
//! row sees what the other committed, and SQLite has one writer. So two creates at the last
//! slot, on any replicas, take turns, and the second sees the first. A create counts only up
//! to the limit (what lies beyond it cannot change the answer), so the check reads at most as
//! many index entries as the scope may have, however many it has.

use plinth_kit::quota::{Quota, Quotas};
use sqlx::{Any, Row, Transaction};

use super::{Store, StoreError};
use crate::domain::model::Scope;

/// What a scope uses of each quota the catalog counts, and the limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// Environments.
    pub environments: u64,
    /// Active sessions.
    pub sessions: u64,
    /// Builds queued or running.
    pub queued_builds: u64,
    /// The scope's limits.
    pub limits: plinth_kit::quota::QuotaLimits,
}

impl Store {
    /// These limits from now on (the defaults until set).
    pub fn with_quotas(mut self, quotas: Quotas) -> Self {
        self.quotas = std::sync::Arc::new(quotas);
        self
    }

    /// The limit of one quota of a scope.
    pub(super) fn limit(&self, scope: &Scope, quota: Quota) -> u64 {
        self.quotas.limit(scope.as_str(), quota)
    }

    /// What the scope uses of the quotas the catalog counts, and its limits.
    pub async fn usage(&self, scope: &Scope) -> Result<Usage, StoreError> {
        let mut connection = self.db.reader.acquire().await?;
        let mut counts = [0u64; 3];
        for (slot, quota) in [Quota::Environments, Quota::Sessions, Quota::QueuedBuilds]
            .into_iter()
            .enumerate()
        {
            let Some(sql) = count_sql(quota) else {
                continue;
            };
            let row = sqlx::query(sqlx::AssertSqlSafe(sql))
                .bind(scope.as_str())
                .fetch_one(&mut *connection)
                .await?;
            counts[slot] = u64::try_from(row.try_get::<i64, _>("used")?).unwrap_or(0);
        }
        Ok(Usage {
            environments: counts[0],
            sessions: counts[1],
            queued_builds: counts[2],
            limits: self.quotas.for_scope(scope.as_str()),
        })
    }
}

/// The query that counts what a scope uses of a quota (`$1` is the scope); none for stored
/// bytes, which the source service counts.
fn count_sql(quota: Quota) -> Option<String> {
    rows_sql(quota).map(|rows| format!("SELECT COUNT(*) AS used {rows}"))
}

/// The rows a scope uses of a quota, as `FROM … WHERE …` (`$1` is the scope).
fn rows_sql(quota: Quota) -> Option<&'static str> {
    match quota {
        Quota::Environments => Some("FROM environments WHERE scope = $1"),
        Quota::Sessions => Some("FROM sessions WHERE scope = $1 AND status = 'active'"),
        Quota::QueuedBuilds => Some(
            "FROM builds b JOIN environments e ON e.id = b.environment_id \
             WHERE e.scope = $1 AND b.status IN ('queued', 'building')",
        ),
        Quota::StoredBytes => None,
    }
}

/// Takes the scope's row for the rest of `tx`: every other quota-limited create of the scope
/// waits for `tx` to end.
pub(super) async fn take_scope(
    tx: &mut Transaction<'static, Any>,
    scope: &Scope,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO scope_quota_locks (scope, takes) VALUES ($1, 1) \
         ON CONFLICT (scope) DO UPDATE SET takes = scope_quota_locks.takes + 1",
    )
    .bind(scope.as_str())
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Takes the scope's row, then refuses with `StoreError::QuotaExceeded` when one more of
/// `quota` would pass `limit`.
pub(super) async fn admit_one(
    tx: &mut Transaction<'static, Any>,
    scope: &Scope,
    quota: Quota,
    limit: u64,
) -> Result<(), StoreError> {
    take_scope(tx, scope).await?;
    let Some(rows) = rows_sql(quota) else {
        return Ok(());
    };
    let sql = format!("SELECT COUNT(*) AS used FROM (SELECT 1 {rows} LIMIT $2) counted");
    let row = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(scope.as_str())
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_one(&mut **tx)
        .await?;
    let used = u64::try_from(row.try_get::<i64, _>("used")?).unwrap_or(0);
    if used >= limit {
        return Err(StoreError::QuotaExceeded { quota, limit, used });
    }
    Ok(())
}
