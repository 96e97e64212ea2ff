//! Stored bytes per scope. What is durable here and why: for each scope, each distinct blob
//! its sources and recorded build layers hold (`scope_blobs`, with how many hold it) and the
//! sum of their sizes (`scope_stored_bytes`). A blob counts once per scope however many
//! files, environments and layers hold it, and stops counting when the last one lets go.
//!
//! Both are changed inside the transaction that changes what holds the blobs (a write, a
//! delete, an import, a layer recorded or forgotten, a source dropped), after taking the
//! scope's `scope_stored_bytes` row: the changes of one scope take turns on every replica,
//! and the stored-bytes quota is checked against what the previous change committed. So the
//! counter is exact at every commit and reading it costs one row; no query over every blob of
//! a scope is ever needed.

use std::collections::{BTreeMap, HashMap};

use sqlx::{Any, Row, Transaction};

use super::{INSERT_BATCH, IndexError};

/// How a change moves the holders of blobs: digest → (size, holders gained or lost).
pub(super) type Holders = BTreeMap<String, (i64, i64)>;

/// Adds `count` holders (negative: removes) of a blob of `size` bytes.
pub(super) fn hold(holders: &mut Holders, digest: &str, size: i64, count: i64) {
    let entry = holders.entry(digest.to_owned()).or_insert((size, 0));
    entry.1 += count;
}

/// The holders of every file of a source (or of the part of it under a path range), grouped
/// by blob.
pub(super) async fn source_holders(
    tx: &mut Transaction<'static, Any>,
    environment: &str,
    range: Option<(&str, &str, &str)>,
) -> Result<Holders, IndexError> {
    let rows = match range {
        None => {
            sqlx::query(
                "SELECT digest, MAX(size) AS size, COUNT(*) AS n FROM source_entries \
                 WHERE environment_id = $1 AND kind = 'file' GROUP BY digest",
            )
            .bind(environment)
            .fetch_all(&mut **tx)
            .await?
        }
        Some((path, low, high)) => {
            sqlx::query(
                "SELECT digest, MAX(size) AS size, COUNT(*) AS n FROM source_entries \
                 WHERE environment_id = $1 AND kind = 'file' \
                 AND (path = $2 OR (path >= $3 AND path < $4)) GROUP BY digest",
            )
            .bind(environment)
            .bind(path)
            .bind(low)
            .bind(high)
            .fetch_all(&mut **tx)
            .await?
        }
    };
    let mut holders = Holders::new();
    for row in rows {
        let digest: String = row.try_get("digest")?;
        let size: i64 = row.try_get("size")?;
        let n: i64 = row.try_get("n")?;
        hold(&mut holders, &digest, size, n);
    }
    Ok(holders)
}

/// `after` minus `before`, blob by blob.
pub(super) fn difference(before: &Holders, after: &Holders) -> Holders {
    let mut change = Holders::new();
    for (digest, (size, n)) in after {
        hold(&mut change, digest, *size, *n);
    }
    for (digest, (size, n)) in before {
        hold(&mut change, digest, *size, -*n);
    }
    change
}

/// The distinct blobs of a recorded layer tree, as one holder each.
pub(super) async fn layer_holders(
    tx: &mut Transaction<'static, Any>,
    layer_tree: &str,
    sign: i64,
) -> Result<Holders, IndexError> {
    let rows = sqlx::query("SELECT digest, size FROM layer_blobs WHERE layer_tree = $1")
        .bind(layer_tree)
        .fetch_all(&mut **tx)
        .await?;
    let mut holders = Holders::new();
    for row in rows {
        let digest: String = row.try_get("digest")?;
        let size: i64 = row.try_get("size")?;
        hold(&mut holders, &digest, size, sign);
    }
    Ok(holders)
}

/// Takes the scope's row for the rest of `tx`; answers the scope's stored bytes.
pub(super) async fn take_scope(
    tx: &mut Transaction<'static, Any>,
    scope: &str,
) -> Result<i64, IndexError> {
    let row = sqlx::query(
        "INSERT INTO scope_stored_bytes (scope, bytes) VALUES ($1, 0) \
         ON CONFLICT (scope) DO UPDATE SET bytes = scope_stored_bytes.bytes RETURNING bytes",
    )
    .bind(scope)
    .fetch_one(&mut **tx)
    .await?;
    Ok(row.try_get("bytes")?)
}

/// Applies `change` to the scope's blobs and stored bytes inside `tx`. With a `limit`, a
/// change that adds bytes and would take the scope past it is refused
/// (`IndexError::QuotaExceeded`) and `tx` must be dropped; a change that adds none is never
/// refused, so deleting always works, even past a lowered limit.
pub(super) async fn apply(
    tx: &mut Transaction<'static, Any>,
    scope: &str,
    change: &Holders,
    limit: Option<u64>,
) -> Result<(), IndexError> {
    let change: Vec<(&String, &(i64, i64))> = change.iter().filter(|(_, (_, n))| *n != 0).collect();
    if change.is_empty() {
        return Ok(());
    }
    let used = take_scope(tx, scope).await?;
    // What the scope holds of these blobs now.
    let mut held: HashMap<String, (i64, i64)> = HashMap::new();
    for batch in change.chunks(INSERT_BATCH) {
        let placeholders: Vec<String> = (2..=batch.len() + 1).map(|i| format!("${i}")).collect();
        let sql = format!(
            "SELECT digest, size, holders FROM scope_blobs WHERE scope = $1 AND digest IN ({})",
            placeholders.join(", ")
        );
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(scope);
        for (digest, _) in batch {
            query = query.bind(digest.as_str());
        }
        for row in query.fetch_all(&mut **tx).await? {
            let digest: String = row.try_get("digest")?;
            held.insert(digest, (row.try_get("size")?, row.try_get("holders")?));
        }
    }
    let mut added: i64 = 0;
    let mut keep: Vec<(&str, i64, i64)> = Vec::new();
    let mut drop: Vec<&str> = Vec::new();
    for (digest, (size, n)) in &change {
        let (size, before) = held.get(digest.as_str()).copied().unwrap_or((*size, 0));
        let after = before.saturating_add(*n);
        match (before > 0, after > 0) {
            (false, true) => added = added.saturating_add(size),
            (true, false) => added = added.saturating_sub(size),
            _ => {}
        }
        if after > 0 {
            keep.push((digest.as_str(), size, after));
        } else if before > 0 {
            drop.push(digest.as_str());
        }
    }
    if added > 0
        && let Some(limit) = limit
    {
        let after = u64::try_from(used.saturating_add(added)).unwrap_or(u64::MAX);
        if after > limit {
            return Err(IndexError::QuotaExceeded {
                limit,
                used: u64::try_from(used).unwrap_or(0),
                adding: u64::try_from(added).unwrap_or(0),
            });
        }
    }
    for batch in keep.chunks(INSERT_BATCH) {
        let mut sql =
            String::from("INSERT INTO scope_blobs (scope, digest, size, holders) VALUES ");
        for i in 0..batch.len() {
            let base = i * 4;
            if i > 0 {
                sql.push_str(", ");
            }
            sql.push_str(&format!(
                "(${}, ${}, ${}, ${})",
                base + 1,
                base + 2,
                base + 3,
                base + 4
            ));
        }
        sql.push_str(" ON CONFLICT (scope, digest) DO UPDATE SET holders = excluded.holders");
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        for (digest, size, holders) in batch {
            query = query.bind(scope).bind(*digest).bind(*size).bind(*holders);
        }
        query.execute(&mut **tx).await?;
    }
    for batch in drop.chunks(INSERT_BATCH) {
        let placeholders: Vec<String> = (2..=batch.len() + 1).map(|i| format!("${i}")).collect();
        let sql = format!(
            "DELETE FROM scope_blobs WHERE scope = $1 AND digest IN ({})",
            placeholders.join(", ")
        );
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(scope);
        for digest in batch {
            query = query.bind(*digest);
        }
        query.execute(&mut **tx).await?;
    }
    if added != 0 {
        sqlx::query("UPDATE scope_stored_bytes SET bytes = bytes + $1 WHERE scope = $2")
            .bind(added)
            .bind(scope)
            .execute(&mut **tx)
            .await?;
    }
    Ok(())
}
