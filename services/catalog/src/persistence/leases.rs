//! A builder's lease on a build, as every write of the builder checks it: the one place that
//! knows when a lease token still holds its build. Both the build queue (`super::builds`) and
//! garbage collection's holds (`super::collection`) ask it, so neither asks the other.

use plinth_kit::database::now_ms;
use sqlx::Row;

use super::StoreError;
use crate::domain::model::LeaseToken;

/// The build a token holds, inside a write transaction: every write of a builder starts here,
/// and a token whose lease expired or was handed on finds nothing (fencing).
pub(super) struct Leased {
    pub(super) environment: String,
    pub(super) version: i64,
    pub(super) log_bytes: i64,
}

pub(super) async fn leased_build(
    tx: &mut sqlx::Transaction<'static, sqlx::Any>,
    token: &LeaseToken,
) -> Result<Leased, StoreError> {
    let row = sqlx::query(
        "SELECT environment_id, version, log_bytes FROM builds WHERE lease_token = $1 \
         AND status = 'building' AND lease_expires_at_ms >= $2",
    )
    .bind(token.as_str())
    .bind(now_ms())
    .fetch_optional(&mut **tx)
    .await?
    .ok_or(StoreError::LeaseLost)?;
    Ok(Leased {
        environment: row.try_get("environment_id")?,
        version: row.try_get("version")?,
        log_bytes: row.try_get("log_bytes")?,
    })
}

/// Inside a transaction: that `token`'s lease is live, or `LeaseLost`.
pub(super) async fn live_lease(
    tx: &mut sqlx::Transaction<'static, sqlx::Any>,
    token: &LeaseToken,
) -> Result<(), StoreError> {
    leased_build(tx, token).await.map(|_| ())
}
