//! The source's side of garbage collection, as rows. What is durable here and why: the blobs
//! work in progress holds (`blob_work`, `blob_holds`), so a collection running while an
//! upload, an import or a snapshot writes never takes what it is about to reference; the
//! lease of the one collection pass running across replicas; and the fence a round raises
//! while it deletes (`collection_state`).
//!
//! A hold is taken before the blob is named or found named, in a transaction that reads the
//! fence row (FOR SHARE on PostgreSQL; on SQLite the transaction holds the write lock from its
//! start). A round raises the fence with an UPDATE of that row, which waits for holds being
//! taken; then reads holds and the index; then deletes. A hold is thus either seen by the
//! round, or waits until its deletes are done and its blob is written again if it was taken.

use std::collections::HashSet;

use plinth_blobs::Digest;
use plinth_kit::database::{Backend, now_ms};
use sqlx::Row;

use super::{INSERT_BATCH, Index, IndexError};

/// How long past its expiry a collection still counts a hold: the clocks of the process that
/// renews it and of the one that collects may disagree by this much.
pub const CLOCK_MARGIN_MS: i64 = 1000;

/// Inside a change's transaction: that `work`'s holds have not lapsed, so every blob it held
/// is still there. Nothing to check for no work.
pub(super) async fn holds_alive(
    tx: &mut sqlx::Transaction<'static, sqlx::Any>,
    work: Option<&WorkId>,
) -> Result<(), IndexError> {
    let Some(work) = work else {
        return Ok(());
    };
    let row = sqlx::query("SELECT expires_at_ms FROM blob_work WHERE work_id = $1")
        .bind(work.as_str())
        .fetch_optional(&mut **tx)
        .await?;
    let expires: i64 = match row {
        Some(row) => row.try_get("expires_at_ms")?,
        None => return Err(IndexError::HoldsLapsed),
    };
    if expires < now_ms() {
        return Err(IndexError::HoldsLapsed);
    }
    Ok(())
}

/// How often a hold waiting for a fence looks again.
const FENCE_POLL: std::time::Duration = std::time::Duration::from_millis(50);

/// Names one piece of work's holds.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct WorkId(String);

impl WorkId {
    /// A new, random one.
    pub fn generate() -> Self {
        WorkId(format!("work_{}", uuid::Uuid::new_v4().simple()))
    }

    /// As stored.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// What live work holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Held {
    /// Blobs held as they are.
    pub blobs: HashSet<Digest>,
    /// Trees held with everything they name.
    pub trees: HashSet<Digest>,
}

impl Index {
    /// Holds `blobs` (as they are) and `trees` (with what they name) for `work`, which lives
    /// `ttl_ms` from now unless renewed. Waits while a collection round's fence stands.
    pub async fn hold(
        &self,
        work: &WorkId,
        ttl_ms: i64,
        blobs: &[Digest],
        trees: &[Digest],
    ) -> Result<(), IndexError> {
        let mut unique: std::collections::BTreeMap<String, bool> =
            std::collections::BTreeMap::new();
        for digest in blobs {
            unique.entry(digest.to_string()).or_insert(false);
        }
        for digest in trees {
            unique.insert(digest.to_string(), true);
        }
        let rows: Vec<(String, bool)> = unique.into_iter().collect();
        loop {
            let mut tx = self.db.begin_write().await?;
            let lock = match self.db.backend {
                Backend::Postgres => " FOR SHARE",
                Backend::Sqlite => "",
            };
            let fence = sqlx::query(sqlx::AssertSqlSafe(format!(
                "SELECT until_ms FROM collection_state WHERE name = 'fence'{lock}"
            )))
            .fetch_optional(&mut *tx)
            .await?;
            let until: i64 = match fence {
                Some(row) => row.try_get("until_ms")?,
                None => 0,
            };
            let now = now_ms();
            if until > now {
                drop(tx);
                let left = u64::try_from(until - now).unwrap_or(0);
                tokio::time::sleep(FENCE_POLL.min(std::time::Duration::from_millis(left.max(1))))
                    .await;
                continue;
            }
            sqlx::query(
                "INSERT INTO blob_work (work_id, expires_at_ms) VALUES ($1, $2) \
                 ON CONFLICT (work_id) DO UPDATE SET expires_at_ms = excluded.expires_at_ms",
            )
            .bind(work.as_str())
            .bind(now + ttl_ms)
            .execute(&mut *tx)
            .await?;
            for batch in rows.chunks(INSERT_BATCH) {
                let mut sql =
                    String::from("INSERT INTO blob_holds (work_id, digest, tree) VALUES ");
                for i in 0..batch.len() {
                    if i > 0 {
                        sql.push_str(", ");
                    }
                    sql.push_str(&format!("(${}, ${}, ${})", i * 3 + 1, i * 3 + 2, i * 3 + 3));
                }
                sql.push_str(
                    " ON CONFLICT (work_id, digest) DO UPDATE SET tree = CASE \
                     WHEN excluded.tree > blob_holds.tree THEN excluded.tree ELSE blob_holds.tree END",
                );
                let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
                for (digest, tree) in batch {
                    query = query
                        .bind(work.as_str())
                        .bind(digest.as_str())
                        .bind(i64::from(*tree));
                }
                query.execute(&mut *tx).await?;
            }
            tx.commit().await?;
            return Ok(());
        }
    }

    /// Keeps `work` alive `ttl_ms` from now (nothing when it holds nothing yet).
    pub async fn renew_work(&self, work: &WorkId, ttl_ms: i64) -> Result<(), IndexError> {
        sqlx::query("UPDATE blob_work SET expires_at_ms = $1 WHERE work_id = $2")
            .bind(now_ms() + ttl_ms)
            .bind(work.as_str())
            .execute(&self.db.writer)
            .await?;
        Ok(())
    }

    /// Ends `work` and its holds.
    pub async fn release_work(&self, work: &WorkId) -> Result<(), IndexError> {
        let mut tx = self.db.begin_write().await?;
        sqlx::query("DELETE FROM blob_holds WHERE work_id = $1")
            .bind(work.as_str())
            .execute(&mut *tx)
            .await?;
        sqlx::query("DELETE FROM blob_work WHERE work_id = $1")
            .bind(work.as_str())
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    /// What work that has not expired holds. A digest that does not parse names no blob and
    /// is passed over.
    pub async fn live_holds(&self) -> Result<Held, IndexError> {
        let rows = sqlx::query(
            "SELECT DISTINCT h.digest, h.tree FROM blob_holds h \
             JOIN blob_work w ON w.work_id = h.work_id WHERE w.expires_at_ms >= $1",
        )
        .bind(now_ms() - CLOCK_MARGIN_MS)
        .fetch_all(&self.db.reader)
        .await?;
        let mut held = Held::default();
        for row in &rows {
            let digest: String = row.try_get("digest")?;
            let tree: i64 = row.try_get("tree")?;
            let Ok(digest) = digest.parse::<Digest>() else {
                continue;
            };
            if tree != 0 {
                held.trees.insert(digest);
            } else {
                held.blobs.insert(digest);
            }
        }
        Ok(held)
    }

    /// Forgets work that expired (its holder died or forgot it), with its holds; answers how
    /// many pieces of work.
    pub async fn drop_expired_work(&self) -> Result<u64, IndexError> {
        let now = now_ms() - CLOCK_MARGIN_MS;
        let mut tx = self.db.begin_write().await?;
        sqlx::query(
            "DELETE FROM blob_holds WHERE work_id IN \
             (SELECT work_id FROM blob_work WHERE expires_at_ms < $1)",
        )
        .bind(now)
        .execute(&mut *tx)
        .await?;
        // Holds whose work row never committed (a crash between the two is impossible: they
        // are one transaction) or was removed: nothing keeps them.
        sqlx::query(
            "DELETE FROM blob_holds WHERE NOT EXISTS \
             (SELECT 1 FROM blob_work w WHERE w.work_id = blob_holds.work_id)",
        )
        .execute(&mut *tx)
        .await?;
        let dropped = sqlx::query("DELETE FROM blob_work WHERE expires_at_ms < $1")
            .bind(now)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        tx.commit().await?;
        Ok(dropped)
    }

    /// Takes (or renews, for the same `holder`) the lease of the one collection pass, until
    /// `until_ms`; false while another holder's lease runs.
    pub async fn take_collection_pass(
        &self,
        holder: &str,
        until_ms: i64,
    ) -> Result<bool, IndexError> {
        let taken = sqlx::query(
            "UPDATE collection_state SET holder = $1, until_ms = $2 \
             WHERE name = 'pass' AND (until_ms < $3 OR holder = $1)",
        )
        .bind(holder)
        .bind(until_ms)
        .bind(now_ms())
        .execute(&self.db.writer)
        .await?;
        Ok(taken.rows_affected() == 1)
    }

    /// Gives the pass lease up.
    pub async fn end_collection_pass(&self, holder: &str) -> Result<(), IndexError> {
        sqlx::query(
            "UPDATE collection_state SET holder = '', until_ms = 0 \
             WHERE name = 'pass' AND holder = $1",
        )
        .bind(holder)
        .execute(&self.db.writer)
        .await?;
        Ok(())
    }

    /// Raises the fence until `until_ms` (0 lowers it). The UPDATE waits for holds being
    /// taken, and holds asked for after it wait for the fence to fall.
    pub async fn set_fence(&self, until_ms: i64) -> Result<(), IndexError> {
        sqlx::query("UPDATE collection_state SET until_ms = $1 WHERE name = 'fence'")
            .bind(until_ms)
            .execute(&self.db.writer)
            .await?;
        Ok(())
    }

    /// Which of `digests` a file of some environment names, leaving out the environments in
    /// `forgetting` (deleted ones whose rows are about to go).
    pub async fn referenced(
        &self,
        digests: &[Digest],
        forgetting: &[String],
    ) -> Result<HashSet<Digest>, IndexError> {
        let mut found = HashSet::new();
        let excluded = if forgetting.is_empty() {
            String::new()
        } else {
            format!(
                " AND environment_id NOT IN ({})",
                (1..=forgetting.len())
                    .map(|i| format!("${i}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        for batch in digests.chunks(INSERT_BATCH) {
            let first = forgetting.len() + 1;
            let placeholders: Vec<String> = (first..first + batch.len())
                .map(|i| format!("${i}"))
                .collect();
            let sql = format!(
                "SELECT DISTINCT digest FROM source_entries WHERE kind = 'file' \
                 AND digest IN ({}){excluded}",
                placeholders.join(", ")
            );
            let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
            for environment in forgetting {
                query = query.bind(environment.as_str());
            }
            for digest in batch {
                query = query.bind(digest.to_string());
            }
            for row in query.fetch_all(&self.db.reader).await? {
                let digest: String = row.try_get("digest")?;
                if let Ok(digest) = digest.parse() {
                    found.insert(digest);
                }
            }
        }
        Ok(found)
    }

    /// Which of `environments` have a source here.
    pub async fn with_source(&self, environments: &[String]) -> Result<Vec<String>, IndexError> {
        let mut found = Vec::new();
        for batch in environments.chunks(INSERT_BATCH) {
            let placeholders: Vec<String> = (1..=batch.len()).map(|i| format!("${i}")).collect();
            let sql = format!(
                "SELECT environment_id FROM source_environments WHERE environment_id IN ({}) \
                 UNION SELECT DISTINCT environment_id FROM source_entries WHERE environment_id IN ({})",
                placeholders.join(", "),
                placeholders.join(", ")
            );
            let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
            for environment in batch {
                query = query.bind(environment.as_str());
            }
            for row in query.fetch_all(&self.db.reader).await? {
                found.push(row.try_get("environment_id")?);
            }
        }
        Ok(found)
    }
}
