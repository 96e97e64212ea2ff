//! The catalog's part in garbage collection of the blob store. What is durable here and why:
//! the blobs each leased build holds (`build_holds`), so a collection running while the build
//! uploads its layer never takes them; the fence a collection round raises while it deletes
//! (`collection_fence`); and the environments deleted here (`deleted_environments`), so the
//! source service forgets their files even if nobody told it.
//!
//! The protocol, with the collector's side in `plinth-source`'s `gc` module: a hold is taken
//! *before* the blob it names is stored or found stored, in a transaction that also reads the
//! fence row (FOR SHARE on PostgreSQL; on SQLite both are writes, and there is one writer). A
//! round raises the fence (an UPDATE of that row, which waits for every hold's transaction in
//! progress), then reads holds and roots, then deletes. So a hold is either committed before
//! the round reads, and seen, or it waits until the fence falls, after the deletes, and the
//! blob it names is then written again if it was taken. Holds are read before roots: a build
//! that completes in between has its layer in one or the other.

use plinth_kit::database::{Backend, now_ms};
use sqlx::Row;

use super::{Store, StoreError};
use crate::domain::model::LeaseToken;

/// Rows per multi-row INSERT.
const BATCH: usize = 500;

/// How often a hold waiting for a fence looks again.
const FENCE_POLL: std::time::Duration = std::time::Duration::from_millis(50);

/// What the catalog keeps, read after its fence went up.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CollectionRoots {
    /// Trees kept with everything they name.
    pub trees: Vec<String>,
    /// Blobs kept as they are.
    pub blobs: Vec<String>,
    /// Environments deleted within the retention period.
    pub deleted_environments: Vec<String>,
    /// When the fence falls by itself.
    pub fence_until_ms: i64,
}

impl Store {
    /// Records that the build leased under `token` relies on `blobs` (as they are) and
    /// `trees` (with all they name), until it ends. Waits while a collection round's fence
    /// stands; `LeaseLost` once the lease is gone.
    pub async fn hold_blobs(
        &self,
        token: &LeaseToken,
        blobs: &[String],
        trees: &[String],
    ) -> Result<(), StoreError> {
        // One row per digest (a statement may not touch a row twice); a tree wins.
        let mut unique: std::collections::BTreeMap<&str, bool> = std::collections::BTreeMap::new();
        for digest in blobs {
            unique.entry(digest.as_str()).or_insert(false);
        }
        for digest in trees {
            unique.insert(digest.as_str(), true);
        }
        let rows: Vec<(&str, bool)> = unique.into_iter().collect();
        loop {
            let mut tx = self.db.begin_write().await?;
            if let Some(until) = fenced(&mut tx, self.db.backend).await? {
                drop(tx);
                wait_for_fence(until).await;
                continue;
            }
            super::leases::live_lease(&mut tx, token).await?;
            insert_holds(&mut tx, token, &rows).await?;
            tx.commit().await?;
            return Ok(());
        }
    }

    /// Raises the fence for `fence_ms` (none for 0) and answers what the catalog keeps: holds
    /// of builds whose lease is live, then every ready version's layer, every active
    /// session's layer, the source tree of every queued or running build, and the
    /// environments deleted.
    pub async fn begin_collection(&self, fence_ms: i64) -> Result<CollectionRoots, StoreError> {
        let fence_until_ms = if fence_ms > 0 { now_ms() + fence_ms } else { 0 };
        if fence_ms > 0 {
            sqlx::query("UPDATE collection_fence SET until_ms = $1 WHERE name = 'blobs'")
                .bind(fence_until_ms)
                .execute(&self.db.writer)
                .await?;
        }
        let mut roots = CollectionRoots {
            fence_until_ms,
            ..CollectionRoots::default()
        };
        // Holds first: a build that completes after this read has its layer among the roots
        // read next.
        let holds = sqlx::query(
            "SELECT DISTINCT h.digest, h.tree FROM build_holds h \
             JOIN builds b ON b.lease_token = h.lease_token \
             WHERE b.status = 'building' AND b.lease_expires_at_ms >= $1",
        )
        .bind(now_ms())
        .fetch_all(&self.db.writer)
        .await?;
        for row in &holds {
            let digest: String = row.try_get("digest")?;
            let tree: i64 = row.try_get("tree")?;
            if tree != 0 {
                roots.trees.push(digest);
            } else {
                roots.blobs.push(digest);
            }
        }
        let trees = sqlx::query(
            "SELECT layer_tree AS tree FROM builds WHERE status = 'ready' AND layer_tree <> '' \
             UNION SELECT layer_tree AS tree FROM sessions WHERE status = 'active' \
             UNION SELECT source_tree AS tree FROM builds WHERE status IN ('queued', 'building')",
        )
        .fetch_all(&self.db.writer)
        .await?;
        for row in &trees {
            roots.trees.push(row.try_get("tree")?);
        }
        let deleted = sqlx::query("SELECT id FROM deleted_environments ORDER BY id")
            .fetch_all(&self.db.writer)
            .await?;
        for row in &deleted {
            roots.deleted_environments.push(row.try_get("id")?);
        }
        roots.trees.sort();
        roots.trees.dedup();
        roots.blobs.sort();
        roots.blobs.dedup();
        Ok(roots)
    }

    /// Lowers the fence.
    pub async fn end_collection(&self) -> Result<(), StoreError> {
        sqlx::query("UPDATE collection_fence SET until_ms = 0 WHERE name = 'blobs'")
            .execute(&self.db.writer)
            .await?;
        Ok(())
    }
}

/// Inside a hold's transaction: when the fence stands, the time it falls by itself. On
/// PostgreSQL the row is read FOR SHARE, so a round raising the fence waits for this
/// transaction, and this read waits for a round's raise in progress.
pub(super) async fn fenced(
    tx: &mut sqlx::Transaction<'static, sqlx::Any>,
    backend: Backend,
) -> Result<Option<i64>, StoreError> {
    let lock = match backend {
        Backend::Postgres => " FOR SHARE",
        Backend::Sqlite => "",
    };
    let row = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT until_ms FROM collection_fence WHERE name = 'blobs'{lock}"
    )))
    .fetch_optional(&mut **tx)
    .await?;
    let until: i64 = match row {
        Some(row) => row.try_get("until_ms")?,
        None => 0,
    };
    Ok((until > now_ms()).then_some(until))
}

/// Sleeps a little, no later than when the fence falls by itself.
pub(super) async fn wait_for_fence(until_ms: i64) {
    let left = u64::try_from(until_ms.saturating_sub(now_ms())).unwrap_or(0);
    tokio::time::sleep(FENCE_POLL.min(std::time::Duration::from_millis(left.max(1)))).await;
}

/// Inserts holds for `token`, in batches; a digest already held stays held.
pub(super) async fn insert_holds(
    tx: &mut sqlx::Transaction<'static, sqlx::Any>,
    token: &LeaseToken,
    rows: &[(&str, bool)],
) -> Result<(), StoreError> {
    for batch in rows.chunks(BATCH) {
        let mut sql = String::from("INSERT INTO build_holds (lease_token, digest, tree) VALUES ");
        for i in 0..batch.len() {
            if i > 0 {
                sql.push_str(", ");
            }
            sql.push_str(&format!("(${}, ${}, ${})", i * 3 + 1, i * 3 + 2, i * 3 + 3));
        }
        sql.push_str(
            " ON CONFLICT (lease_token, digest) DO UPDATE \
             SET tree = CASE WHEN excluded.tree > build_holds.tree THEN excluded.tree ELSE build_holds.tree END",
        );
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        for (digest, tree) in batch {
            query = query
                .bind(token.as_str())
                .bind(*digest)
                .bind(i64::from(*tree));
        }
        query.execute(&mut **tx).await?;
    }
    Ok(())
}
