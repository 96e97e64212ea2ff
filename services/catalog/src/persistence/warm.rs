//! Read orders: the files a version's first sessions read, one row per version, the first
//! recording kept (an `INSERT … ON CONFLICT DO NOTHING`, so two nodes recording at once leave
//! one of them, whole). The row's foreign key takes it away with its version, when the
//! environment is deleted or retention retires the version. The versions to hold warm are read
//! with a heartbeat's other answers (`sessions.rs`).

use plinth_kit::database::now_ms;
use sqlx::Row;

use super::{Store, StoreError};
use crate::domain::model::EnvironmentId;
use crate::domain::sessions::NodeId;
use crate::domain::warm::ReadOrder;

impl Store {
    /// Names at most `versions` versions to hold warm in a heartbeat's answer (0: none).
    pub fn with_prewarm_versions(mut self, versions: u32) -> Self {
        self.prewarm_versions = versions;
        self
    }

    /// Records `order` as the read order of a ready version, recorded by `node`, unless one is
    /// recorded already: answers whether it was stored. An empty order stores nothing.
    /// `StoreError::NotFound` when the version is not a ready build of the environment.
    pub async fn record_read_order(
        &self,
        node: &NodeId,
        environment: &EnvironmentId,
        version: u32,
        order: &ReadOrder,
    ) -> Result<bool, StoreError> {
        if !order.is_empty() {
            let done = sqlx::query(
                "INSERT INTO read_orders (environment_id, version, paths, path_count, node_id, \
                 recorded_at_ms) SELECT environment_id, version, $3, $4, $5, $6 FROM builds \
                 WHERE environment_id = $1 AND version = $2 AND status = 'ready' \
                 ON CONFLICT (environment_id, version) DO NOTHING",
            )
            .bind(environment.as_str())
            .bind(i64::from(version))
            .bind(order.to_stored())
            .bind(i64::try_from(order.paths().len()).unwrap_or(i64::MAX))
            .bind(node.as_str())
            .bind(now_ms())
            .execute(&self.db.writer)
            .await?;
            if done.rows_affected() > 0 {
                return Ok(true);
            }
        }
        let ready = sqlx::query(
            "SELECT 1 AS ready FROM builds \
             WHERE environment_id = $1 AND version = $2 AND status = 'ready'",
        )
        .bind(environment.as_str())
        .bind(i64::from(version))
        .fetch_optional(&self.db.reader)
        .await?;
        match ready {
            Some(_) => Ok(false),
            None => Err(StoreError::NotFound),
        }
    }

    /// The read order recorded for a version; `None` when none is (or there is no such
    /// version).
    pub async fn read_order(
        &self,
        environment: &EnvironmentId,
        version: u32,
    ) -> Result<Option<ReadOrder>, StoreError> {
        let row =
            sqlx::query("SELECT paths FROM read_orders WHERE environment_id = $1 AND version = $2")
                .bind(environment.as_str())
                .bind(i64::from(version))
                .fetch_optional(&self.db.reader)
                .await?;
        let Some(row) = row else {
            return Ok(None);
        };
        let paths: String = row.try_get("paths")?;
        ReadOrder::from_stored(&paths).map(Some).ok_or_else(|| {
            StoreError::Corrupt(format!("read order of {environment} version {version}"))
        })
    }
}
