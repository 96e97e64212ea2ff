//! Workspace adapters. What is durable here and why: an adapter row is the owner's record of
//! which environment a runtime's calls run on and what authenticates those calls; the
//! dispatch endpoints look it up on every call, so a deleted adapter stops working at once on
//! every gateway. The environment is checked by the insert itself (an adapter is never written
//! pointing outside its scope however requests race), with no foreign key, as for harnesses.
//! A rotation moves the current credential to `previous_secret` with its expiry in the same
//! statement, so there is never a moment with neither accepted.

use plinth_kit::database::now_ms;
use sqlx::Row;
use sqlx::any::AnyRow;

use super::{Store, StoreError};
use crate::adapters::{Adapter, AdapterId, NewAdapter, Protocol};
use crate::model::{EnvironmentId, Scope};

const ADAPTER_COLUMNS: &str = "id, scope, protocol, environment_id, secret, previous_secret, \
     previous_expires_at_ms, created_at_ms, rotated_at_ms";

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
    /// (`StoreError::NoSuchEnvironment` otherwise).
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
        };
        let inserted = sqlx::query(
            "INSERT INTO workspace_adapters (id, scope, protocol, environment_id, secret, \
             created_at_ms) SELECT $1, scope, $2, id, $3, $4 FROM environments \
             WHERE scope = $5 AND id = $6",
        )
        .bind(adapter.id.as_str())
        .bind(adapter.protocol.as_str())
        .bind(&new.stored_credential)
        .bind(now)
        .bind(adapter.scope.as_str())
        .bind(adapter.environment_id.as_str())
        .execute(&self.db.writer)
        .await?;
        if inserted.rows_affected() == 0 {
            return Err(StoreError::NoSuchEnvironment);
        }
        Ok(adapter)
    }

    /// One adapter of the scope.
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
        Ok(adapter_from_row(&row, now_ms())?.adapter)
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

    /// Makes `stored` the adapter's credential; the one it replaces is accepted for
    /// `grace_ms` more. A previous credential still in its window is dropped: only one is
    /// kept.
    pub async fn rotate_adapter(
        &self,
        scope: &Scope,
        id: &AdapterId,
        stored: &str,
        grace_ms: i64,
    ) -> Result<Adapter, StoreError> {
        let now = now_ms();
        let sql = format!(
            "UPDATE workspace_adapters SET previous_secret = secret, \
             previous_expires_at_ms = $1, secret = $2, rotated_at_ms = $3 \
             WHERE scope = $4 AND id = $5 RETURNING {ADAPTER_COLUMNS}"
        );
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(now.saturating_add(grace_ms.max(0)))
            .bind(stored)
            .bind(now)
            .bind(scope.as_str())
            .bind(id.as_str())
            .fetch_optional(&self.db.writer)
            .await?
            .ok_or(StoreError::NotFound)?;
        Ok(adapter_from_row(&row, now)?.adapter)
    }

    /// An adapter by id alone, with the credentials accepted now.
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
        adapter_from_row(&row, now_ms())
    }
}

/// Reads a row; a previous credential whose window closed before `now` is left out.
fn adapter_from_row(row: &AnyRow, now: i64) -> Result<AdapterCredentials, StoreError> {
    let id: String = row.try_get("id")?;
    let corrupt = |what: &str| StoreError::Corrupt(format!("{what} of adapter {id}"));
    let scope: String = row.try_get("scope")?;
    let protocol: String = row.try_get("protocol")?;
    let environment: String = row.try_get("environment_id")?;
    let previous: String = row.try_get("previous_secret")?;
    let expires: i64 = row.try_get("previous_expires_at_ms")?;
    let previous_live = !previous.is_empty() && expires > now;
    Ok(AdapterCredentials {
        adapter: Adapter {
            id: AdapterId::parse(&id).ok_or_else(|| corrupt("id"))?,
            scope: Scope::parse(&scope).map_err(|_| corrupt("scope"))?,
            protocol: Protocol::parse(&protocol).ok_or_else(|| corrupt("protocol"))?,
            environment_id: EnvironmentId::parse(&environment)
                .ok_or_else(|| corrupt("environment"))?,
            created_at_ms: row.try_get("created_at_ms")?,
            rotated_at_ms: row.try_get("rotated_at_ms")?,
            previous_expires_at_ms: if previous_live { expires } else { 0 },
        },
        current: row.try_get("secret")?,
        previous: previous_live.then_some(previous),
    })
}
