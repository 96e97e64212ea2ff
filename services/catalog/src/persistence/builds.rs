//! Builds and the build queue. What is durable here and why: a build row is both a version's
//! record and its queue entry, inserted in one transaction with the environment's version
//! counter (River's transactional enqueue). One build in flight per environment is a partial
//! unique index. A builder's claim is a lease with a token; every write of the builder is
//! conditional on the token and on the lease not having expired (fencing), so a builder that
//! paused past its lease cannot publish. Success activates the version in the same
//! transaction that marks it ready.

use plinth_kit::database::{Backend, now_ms};
use sqlx::Row;
use sqlx::any::AnyRow;

use super::leases::leased_build;
use super::{Store, StoreError};
use crate::domain::model::{
    Build, BuildStatus, Claim, EnvironmentId, InstallSettings, LeaseToken, Outcome, Package, Scope,
    Slug, Toolchain,
};

/// Most bytes of log a build may keep in the catalog; builders cap their logs below this.
pub const MAX_LOG_BYTES: u64 = 4 * 1024 * 1024;

const BUILD_COLUMNS: &str = "environment_id, version, status, source_tree, layer_tree, error, \
     packages, size, attempt, log_bytes, queued_at_ms, started_at_ms, finished_at_ms, clean, \
     toolchains";

/// The PostgreSQL channel a build's queuing is announced on, so that builders long-polling any
/// catalog replica hear of it at once (see `crate::background::wakeups`).
pub const BUILD_QUEUED_CHANNEL: &str = "plinth_build_queued";

/// Announces, when `tx` commits, that a build can be claimed. PostgreSQL delivers the
/// notification only if the transaction commits, and to every listening replica; SQLite has one
/// catalog process, whose waiting claims are woken in-process.
async fn announce_queued(
    backend: Backend,
    tx: &mut sqlx::Transaction<'static, sqlx::Any>,
) -> Result<(), StoreError> {
    if backend == Backend::Postgres {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "NOTIFY {BUILD_QUEUED_CHANNEL}"
        )))
        .execute(&mut **tx)
        .await?;
    }
    Ok(())
}

/// How the queue hands out work.
#[derive(Debug, Clone, Copy)]
pub struct LeasePolicy {
    /// How long a lease lasts unless renewed.
    pub lease_ms: i64,
    /// Leases a build may be handed before a lost builder fails it.
    pub max_attempts: u32,
    /// Builds of one scope that may run at once, however many builders wait (at least 1):
    /// one scope's backlog never takes every builder.
    pub running_per_scope: u32,
}

/// The default of [`LeasePolicy::running_per_scope`].
pub const DEFAULT_RUNNING_PER_SCOPE: u32 = 4;

impl Store {
    /// Queues the next version of an environment, building `source_tree`. A build already
    /// queued or running is `StoreError::Busy`, by the schema's partial unique index; a scope
    /// with as many builds queued or running as its quota allows is
    /// `StoreError::QuotaExceeded`, counted after taking the scope's row. A `clean` build is
    /// handed to its builder with the word to reuse nothing.
    pub async fn start_build(
        &self,
        scope: &Scope,
        id: &EnvironmentId,
        source_tree: &str,
        clean: bool,
    ) -> Result<Build, StoreError> {
        let mut tx = self.db.begin_write().await?;
        let quota = plinth_kit::quota::Quota::QueuedBuilds;
        super::quotas::take_scope(&mut tx, scope).await?;
        let row = sqlx::query(
            "SELECT COALESCE(latest_version, 0) AS latest FROM environments WHERE scope = $1 AND id = $2",
        )
        .bind(scope.as_str())
        .bind(id.as_str())
        .fetch_optional(&mut *tx)
        .await?
        .ok_or(StoreError::NotFound)?;
        let latest: i64 = row.try_get("latest")?;
        // The environment's own build in flight says more than the scope's quota would.
        let busy = sqlx::query(
            "SELECT 1 AS busy FROM builds WHERE environment_id = $1 \
             AND status IN ('queued', 'building')",
        )
        .bind(id.as_str())
        .fetch_optional(&mut *tx)
        .await?;
        if busy.is_some() {
            return Err(StoreError::Busy);
        }
        super::quotas::admit_one(&mut tx, scope, quota, self.limit(scope, quota)).await?;
        let version = latest + 1;
        let now = now_ms();
        let inserted = sqlx::query(
            "INSERT INTO builds (environment_id, version, status, source_tree, queued_at_ms, clean, \
             install) VALUES ($1, $2, 'queued', $3, $4, $5, \
             (SELECT install FROM environments WHERE id = $1))",
        )
        .bind(id.as_str())
        .bind(version)
        .bind(source_tree)
        .bind(now)
        .bind(i64::from(clean))
        .execute(&mut *tx)
        .await;
        match inserted {
            Ok(_) => {}
            Err(sqlx::Error::Database(error)) if error.is_unique_violation() => {
                return Err(StoreError::Busy);
            }
            Err(error) => return Err(error.into()),
        }
        sqlx::query(
            "UPDATE environments SET latest_version = $1, updated_at_ms = $2 WHERE id = $3",
        )
        .bind(version)
        .bind(now)
        .bind(id.as_str())
        .execute(&mut *tx)
        .await?;
        announce_queued(self.db.backend, &mut tx).await?;
        tx.commit().await?;
        self.get_build(scope, id, u32::try_from(version).unwrap_or(u32::MAX))
            .await
    }

    /// One build of an environment of the scope.
    pub async fn get_build(
        &self,
        scope: &Scope,
        id: &EnvironmentId,
        version: u32,
    ) -> Result<Build, StoreError> {
        let sql = format!(
            "SELECT {BUILD_COLUMNS} FROM builds WHERE environment_id = $1 AND version = $2 \
             AND EXISTS (SELECT 1 FROM environments WHERE id = $1 AND scope = $3)"
        );
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(id.as_str())
            .bind(i64::from(version))
            .bind(scope.as_str())
            .fetch_optional(&self.db.reader)
            .await?
            .ok_or(StoreError::NotFound)?;
        build_from_row(&row)
    }

    /// Every build of these environments, newest first within each.
    pub(super) async fn builds_of(&self, ids: &[&EnvironmentId]) -> Result<Vec<Build>, StoreError> {
        let mut builds = Vec::new();
        for batch in ids.chunks(500) {
            let placeholders: Vec<String> = (1..=batch.len()).map(|i| format!("${i}")).collect();
            let sql = format!(
                "SELECT {BUILD_COLUMNS} FROM builds WHERE environment_id IN ({}) \
                 ORDER BY environment_id, version DESC",
                placeholders.join(", ")
            );
            let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
            for id in batch {
                query = query.bind(id.as_str());
            }
            for row in query.fetch_all(&self.db.reader).await? {
                builds.push(build_from_row(&row)?);
            }
        }
        Ok(builds)
    }

    /// Makes a ready version the active one: one pointer update, stamped with when it became
    /// active (the versions nodes hold warm are the most recently activated).
    pub async fn activate(
        &self,
        scope: &Scope,
        id: &EnvironmentId,
        version: u32,
    ) -> Result<(), StoreError> {
        let build = self.get_build(scope, id, version).await?;
        if build.status != BuildStatus::Ready {
            return Err(StoreError::NotReady(build.status));
        }
        let updated = sqlx::query(
            "UPDATE environments SET active_version = $1, updated_at_ms = $2, \
             activated_at_ms = CASE WHEN active_version = $1 THEN activated_at_ms ELSE $2 END \
             WHERE id = $3 AND scope = $4 AND EXISTS (SELECT 1 FROM builds \
             WHERE environment_id = $3 AND version = $1 AND status = 'ready')",
        )
        .bind(i64::from(version))
        .bind(now_ms())
        .bind(id.as_str())
        .bind(scope.as_str())
        .execute(&self.db.writer)
        .await?;
        if updated.rows_affected() == 0 {
            return Err(StoreError::NotFound);
        }
        Ok(())
    }

    /// Hands a queued build to `builder` under a new lease, fairly across scopes: of the scopes
    /// with queued builds and fewer than `policy.running_per_scope` running, the one with the
    /// fewest running, then the one whose last claim is oldest (round robin), gets its oldest
    /// queued build. So one scope's backlog delays another scope's next build by at most the
    /// time one builder takes to free. Expired leases are dealt with first: re-queued, or failed
    /// once they used up their attempts.
    ///
    /// Atomic on every backend: on PostgreSQL a claim holds the chosen scope's `build_turns`
    /// row while it counts the scope's running builds and takes one (a claim on another
    /// replica skips a held row and serves the next scope), and the build's own row is taken
    /// `FOR UPDATE SKIP LOCKED`; SQLite has one writer, whose transaction excludes every other
    /// claim.
    pub async fn claim_build(
        &self,
        builder: &str,
        policy: LeasePolicy,
    ) -> Result<Option<Claim>, StoreError> {
        let now = now_ms();
        let mut tx = self.db.begin_write().await?;
        let failed = sqlx::query(
            "UPDATE builds SET status = 'failed', lease_token = '', finished_at_ms = $1, \
             error = 'the builder was lost: its lease expired ' || CAST(attempt AS TEXT) || \
             ' time(s) without a heartbeat, and the build was not retried again' \
             WHERE status = 'building' AND lease_expires_at_ms < $1 AND attempt >= $2",
        )
        .bind(now)
        .bind(i64::from(policy.max_attempts))
        .execute(&mut *tx)
        .await?
        .rows_affected();
        let requeued = sqlx::query(
            "UPDATE builds SET status = 'queued', lease_token = '', builder = '' \
             WHERE status = 'building' AND lease_expires_at_ms < $1 AND attempt < $2",
        )
        .bind(now)
        .bind(i64::from(policy.max_attempts))
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if requeued > 1 {
            // This claim takes one of them; builders waiting on other replicas take the rest.
            announce_queued(self.db.backend, &mut tx).await?;
        }
        // Counted once this transaction commits: a claim that rolls back took nothing over.
        let took_over = move || {
            if failed + requeued == 0 {
                return;
            }
            // A trace of its own: the claim that found them is usually a builder's routine
            // poll, which is not sampled.
            let span =
                tracing::info_span!(parent: None, "catalog.lease_takeover", requeued, failed);
            let _entered = span.enter();
            tracing::warn!(
                requeued,
                failed,
                "builds whose builder's lease ran out were taken over"
            );
            metrics::counter!("plinth_build_lease_takeovers_total", "outcome" => "requeued")
                .increment(requeued);
            metrics::counter!("plinth_build_lease_takeovers_total", "outcome" => "failed")
                .increment(failed);
        };
        let (next, contended) =
            next_fair_build(&mut tx, self.db.backend, policy.running_per_scope).await?;
        let Some((environment, version)) = next else {
            if contended {
                // Claims on other replicas held what this one passed over; once they commit
                // there may be room left, so waiting claims (this builder's too) look again.
                announce_queued(self.db.backend, &mut tx).await?;
            }
            tx.commit().await?;
            took_over();
            return Ok(None);
        };
        let token = LeaseToken::generate();
        let expires_at_ms = now + policy.lease_ms;
        sqlx::query(
            "UPDATE builds SET status = 'building', lease_token = $1, lease_expires_at_ms = $2, \
             builder = $3, attempt = attempt + 1, \
             started_at_ms = CASE WHEN started_at_ms = 0 THEN $4 ELSE started_at_ms END \
             WHERE environment_id = $5 AND version = $6",
        )
        .bind(token.as_str())
        .bind(expires_at_ms)
        .bind(builder)
        .bind(now)
        .bind(&environment)
        .bind(version)
        .execute(&mut *tx)
        .await?;
        let sql = format!(
            "SELECT {BUILD_COLUMNS}, install, \
             (SELECT slug FROM environments WHERE id = $1) AS slug, \
             (SELECT scope FROM environments WHERE id = $1) AS scope \
             FROM builds WHERE environment_id = $1 AND version = $2"
        );
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(&environment)
            .bind(version)
            .fetch_one(&mut *tx)
            .await?;
        tx.commit().await?;
        took_over();
        let slug: String = row.try_get("slug")?;
        let scope: String = row.try_get("scope")?;
        Ok(Some(Claim {
            build: build_from_row(&row)?,
            slug: Slug::from_stored(slug),
            scope: Scope::parse(&scope)
                .map_err(|_| StoreError::Corrupt(format!("scope {scope:?}")))?,
            install: InstallSettings::from_stored(&row.try_get::<String, _>("install")?).map_err(
                |why| {
                    StoreError::Corrupt(format!(
                        "install settings of a build of {environment}: {why}"
                    ))
                },
            )?,
            token,
            expires_at_ms,
        }))
    }

    /// Renews a lease; refused once it has expired or was handed on (fencing).
    pub async fn heartbeat(&self, token: &LeaseToken, lease_ms: i64) -> Result<i64, StoreError> {
        let now = now_ms();
        let expires_at_ms = now + lease_ms;
        let updated = sqlx::query(
            "UPDATE builds SET lease_expires_at_ms = $1 WHERE lease_token = $2 \
             AND status = 'building' AND lease_expires_at_ms >= $3",
        )
        .bind(expires_at_ms)
        .bind(token.as_str())
        .bind(now)
        .execute(&self.db.writer)
        .await?;
        if updated.rows_affected() == 0 {
            return Err(StoreError::LeaseLost);
        }
        Ok(expires_at_ms)
    }

    /// Gives a build leased under `token` back to the queue at once, as if its lease had run
    /// out (its log stays; the next claim is its next attempt). A lease already lost is
    /// `StoreError::LeaseLost`.
    pub async fn release_build(&self, token: &LeaseToken) -> Result<(), StoreError> {
        let mut tx = self.db.begin_write().await?;
        let released = sqlx::query(
            "UPDATE builds SET status = 'queued', lease_token = '', builder = '' \
             WHERE lease_token = $1 AND status = 'building' AND lease_expires_at_ms >= $2",
        )
        .bind(token.as_str())
        .bind(now_ms())
        .execute(&mut *tx)
        .await?;
        if released.rows_affected() == 0 {
            return Err(StoreError::LeaseLost);
        }
        announce_queued(self.db.backend, &mut tx).await?;
        tx.commit().await?;
        Ok(())
    }

    /// When the earliest lease of a running build runs out (ms since the epoch), if any build
    /// is running: a claim waiting for work wakes then, to take the build over should its
    /// builder have died. Nothing announces an expiry, so waiting claims time it themselves.
    pub async fn next_lease_expiry(&self) -> Result<Option<i64>, StoreError> {
        let row = sqlx::query(
            "SELECT MIN(lease_expires_at_ms) AS expires FROM builds WHERE status = 'building'",
        )
        .fetch_one(&self.db.reader)
        .await?;
        Ok(row.try_get::<Option<i64>, _>("expires")?)
    }

    /// Appends to a build's log under a live lease; returns the log's new length.
    pub async fn append_log(&self, token: &LeaseToken, chunk: &str) -> Result<u64, StoreError> {
        let mut tx = self.db.begin_write().await?;
        let leased = leased_build(&mut tx, token).await?;
        let (environment, version, offset) = (leased.environment, leased.version, leased.log_bytes);
        let offset_u64 = u64::try_from(offset).unwrap_or(0);
        if chunk.is_empty() || offset_u64 >= MAX_LOG_BYTES {
            tx.commit().await?;
            return Ok(offset_u64);
        }
        let mut end = chunk
            .len()
            .min(usize::try_from(MAX_LOG_BYTES - offset_u64).unwrap_or(usize::MAX));
        while !chunk.is_char_boundary(end) {
            end -= 1;
        }
        let kept = &chunk[..end];
        sqlx::query(
            "INSERT INTO build_logs (environment_id, version, start_offset, chunk) VALUES ($1, $2, $3, $4)",
        )
        .bind(&environment)
        .bind(version)
        .bind(offset)
        .bind(kept)
        .execute(&mut *tx)
        .await?;
        let length = offset + i64::try_from(kept.len()).unwrap_or(0);
        sqlx::query("UPDATE builds SET log_bytes = $1 WHERE environment_id = $2 AND version = $3")
            .bind(length)
            .bind(&environment)
            .bind(version)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(u64::try_from(length).unwrap_or(0))
    }

    /// Ends a build under a live lease. Ready activates the version in the same transaction;
    /// failed changes nothing else.
    pub async fn complete_build(
        &self,
        token: &LeaseToken,
        outcome: Outcome,
    ) -> Result<Build, StoreError> {
        let now = now_ms();
        let mut tx = self.db.begin_write().await?;
        let leased = leased_build(&mut tx, token).await?;
        let (environment, version) = (leased.environment, leased.version);
        match &outcome {
            Outcome::Ready {
                layer_tree,
                packages,
                size,
                dependency_key,
                toolchains,
            } => {
                let packages_json = serde_json::to_string(packages)
                    .map_err(|error| StoreError::Corrupt(error.to_string()))?;
                let toolchains_json = serde_json::to_string(toolchains)
                    .map_err(|error| StoreError::Corrupt(error.to_string()))?;
                sqlx::query(
                    "UPDATE builds SET status = 'ready', layer_tree = $1, packages = $2, \
                     package_count = $3, size = $4, finished_at_ms = $5, lease_token = '', \
                     dependency_key = $8, toolchains = $9 WHERE environment_id = $6 AND version = $7",
                )
                .bind(layer_tree)
                .bind(packages_json)
                .bind(i64::try_from(packages.len()).unwrap_or(i64::MAX))
                .bind(i64::try_from(*size).unwrap_or(i64::MAX))
                .bind(now)
                .bind(&environment)
                .bind(version)
                .bind(dependency_key)
                .bind(toolchains_json)
                .execute(&mut *tx)
                .await?;
                sqlx::query(
                    "UPDATE environments SET active_version = $1, updated_at_ms = $2, \
                     activated_at_ms = CASE WHEN active_version = $1 THEN activated_at_ms \
                     ELSE $2 END WHERE id = $3",
                )
                .bind(version)
                .bind(now)
                .bind(&environment)
                .execute(&mut *tx)
                .await?;
            }
            Outcome::Failed { error } => {
                sqlx::query(
                    "UPDATE builds SET status = 'failed', error = $1, finished_at_ms = $2, \
                     lease_token = '' WHERE environment_id = $3 AND version = $4",
                )
                .bind(error)
                .bind(now)
                .bind(&environment)
                .bind(version)
                .execute(&mut *tx)
                .await?;
            }
        }
        // The build's slot is free: a claim waiting on another replica while this scope was at
        // its cap of running builds may take the scope's next one now.
        announce_queued(self.db.backend, &mut tx).await?;
        // The build's holds end with it: a ready layer is kept as a version from now on.
        sqlx::query("DELETE FROM build_holds WHERE lease_token = $1")
            .bind(token.as_str())
            .execute(&mut *tx)
            .await?;
        let sql = format!(
            "SELECT {BUILD_COLUMNS} FROM builds WHERE environment_id = $1 AND version = $2"
        );
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(&environment)
            .bind(version)
            .fetch_one(&mut *tx)
            .await?;
        tx.commit().await?;
        build_from_row(&row)
    }

    /// What earlier ready builds of the leased build's scope can lend it: one with the same
    /// source tree (the whole layer), and one with the same dependency key (its installed
    /// dependencies). Only under a live lease. The layers found are held for the build in the
    /// same transaction that finds them (see `collection`), so no collection takes them while
    /// the build reuses them, even if retention retires their versions meanwhile.
    pub async fn find_reusable(
        &self,
        token: &LeaseToken,
        dependency_key: &str,
    ) -> Result<(Option<Build>, Option<Build>), StoreError> {
        loop {
            let mut tx = self.db.begin_write().await?;
            if let Some(until) = super::collection::fenced(&mut tx, self.db.backend).await? {
                drop(tx);
                super::collection::wait_for_fence(until).await;
                continue;
            }
            let found = find_reusable_in(&mut tx, token, dependency_key).await?;
            let layers: Vec<(&str, bool)> = [&found.0, &found.1]
                .into_iter()
                .flatten()
                .map(|build| (build.layer_tree.as_str(), true))
                .collect::<std::collections::BTreeMap<_, _>>()
                .into_iter()
                .collect();
            super::collection::insert_holds(&mut tx, token, &layers).await?;
            tx.commit().await?;
            return Ok(found);
        }
    }

    /// A build's log from byte `offset`: the text, where it ends, and whether the build has
    /// ended (so a follower knows nothing more will come).
    pub async fn read_log(
        &self,
        scope: &Scope,
        id: &EnvironmentId,
        version: u32,
        offset: u64,
    ) -> Result<(String, u64, bool), StoreError> {
        let build = self.get_build(scope, id, version).await?;
        let rows = sqlx::query(
            "SELECT start_offset, chunk FROM build_logs WHERE environment_id = $1 AND version = $2 \
             AND start_offset + LENGTH(chunk) > $3 ORDER BY start_offset",
        )
        .bind(id.as_str())
        .bind(i64::from(version))
        .bind(i64::try_from(offset).unwrap_or(i64::MAX))
        .fetch_all(&self.db.reader)
        .await?;
        let mut text = String::new();
        let mut end = offset;
        for row in &rows {
            let start: i64 = row.try_get("start_offset")?;
            let chunk: String = row.try_get("chunk")?;
            let start = u64::try_from(start).unwrap_or(0);
            let skip = usize::try_from(offset.saturating_sub(start)).unwrap_or(usize::MAX);
            if let Some(rest) = chunk.get(skip.min(chunk.len())..) {
                text.push_str(rest);
            }
            end = start + chunk.len() as u64;
        }
        let finished = matches!(build.status, BuildStatus::Ready | BuildStatus::Failed);
        Ok((text, end.max(offset), finished))
    }
}

/// Inside a claim's transaction: the build to hand out next (its environment and version), by
/// the order [`Store::claim_build`] describes, with the chosen scope's turn taken; `None` when
/// nothing queued may start now. The flag says whether a scope was passed over because
/// another transaction held it (PostgreSQL only).
async fn next_fair_build(
    tx: &mut sqlx::Transaction<'static, sqlx::Any>,
    backend: Backend,
    running_per_scope: u32,
) -> Result<(Option<(String, i64)>, bool), StoreError> {
    let cap = i64::from(running_per_scope.max(1));
    // Only builds in flight are read (the partial index `builds_one_in_flight`): a scope has
    // at most its `queued_builds` quota of them.
    let scopes = sqlx::query(
        "SELECT e.scope AS scope, \
         SUM(CASE WHEN b.status = 'building' THEN 1 ELSE 0 END) AS running, \
         MIN(CASE WHEN b.status = 'queued' THEN b.queued_at_ms END) AS oldest, \
         COALESCE(MAX(t.last_turn), 0) AS turn \
         FROM builds b JOIN environments e ON e.id = b.environment_id \
         LEFT JOIN build_turns t ON t.scope = e.scope \
         WHERE b.status IN ('queued', 'building') \
         GROUP BY e.scope \
         HAVING SUM(CASE WHEN b.status = 'queued' THEN 1 ELSE 0 END) > 0 \
         AND SUM(CASE WHEN b.status = 'building' THEN 1 ELSE 0 END) < $1 \
         ORDER BY running, turn, oldest, scope",
    )
    .bind(cap)
    .fetch_all(&mut **tx)
    .await?;
    let lock = match backend {
        Backend::Postgres => " FOR UPDATE SKIP LOCKED",
        // SQLite has one writer: this transaction already excludes every other claim.
        Backend::Sqlite => "",
    };
    let mut contended = false;
    for candidate in &scopes {
        let scope: String = candidate.try_get("scope")?;
        if !take_turn(tx, backend, &scope).await? {
            // Another replica's claim is serving this scope now: serve the next one.
            contended = true;
            continue;
        }
        if backend == Backend::Postgres {
            // Counted again now that the scope's row is held: a claim that held it before
            // this one committed, and this statement sees what it took.
            let running = sqlx::query(
                "SELECT COUNT(*) AS running FROM builds WHERE status = 'building' \
                 AND environment_id IN (SELECT id FROM environments WHERE scope = $1)",
            )
            .bind(&scope)
            .fetch_one(&mut **tx)
            .await?;
            if running.try_get::<i64, _>("running")? >= cap {
                continue;
            }
        }
        let next = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT environment_id, version FROM builds WHERE status = 'queued' \
             AND environment_id IN (SELECT id FROM environments WHERE scope = $1) \
             ORDER BY queued_at_ms, environment_id, version LIMIT 1{lock}"
        )))
        .bind(&scope)
        .fetch_optional(&mut **tx)
        .await?;
        let Some(next) = next else {
            // Its queued builds are held by another transaction (a lease taken over).
            contended = true;
            continue;
        };
        sqlx::query(
            "UPDATE build_turns SET last_turn = \
             (SELECT COALESCE(MAX(last_turn), 0) + 1 FROM build_turns) WHERE scope = $1",
        )
        .bind(&scope)
        .execute(&mut **tx)
        .await?;
        let next = (next.try_get("environment_id")?, next.try_get("version")?);
        return Ok((Some(next), contended));
    }
    Ok((None, contended))
}

/// Holds `scope`'s row of `build_turns` for the rest of `tx`, making it first if the scope
/// never had a build claimed. `false` when another transaction holds it (PostgreSQL only:
/// SQLite has one writer).
async fn take_turn(
    tx: &mut sqlx::Transaction<'static, sqlx::Any>,
    backend: Backend,
    scope: &str,
) -> Result<bool, StoreError> {
    let held = match backend {
        Backend::Postgres => " FOR UPDATE SKIP LOCKED",
        Backend::Sqlite => "",
    };
    let select = format!("SELECT last_turn FROM build_turns WHERE scope = $1{held}");
    if holds(tx, &select, scope).await? {
        return Ok(true);
    }
    let exists = sqlx::query("SELECT 1 AS present FROM build_turns WHERE scope = $1")
        .bind(scope)
        .fetch_optional(&mut **tx)
        .await?
        .is_some();
    if exists {
        return Ok(false);
    }
    sqlx::query(
        "INSERT INTO build_turns (scope, last_turn) VALUES ($1, 0) ON CONFLICT (scope) DO NOTHING",
    )
    .bind(scope)
    .execute(&mut **tx)
    .await?;
    holds(tx, &select, scope).await
}

/// Runs `select` (a read of `scope`'s row of `build_turns`, held or not) in `tx`: whether it
/// found the row.
async fn holds(
    tx: &mut sqlx::Transaction<'static, sqlx::Any>,
    select: &str,
    scope: &str,
) -> Result<bool, StoreError> {
    let row = sqlx::query(sqlx::AssertSqlSafe(select.to_owned()))
        .bind(scope)
        .fetch_optional(&mut **tx)
        .await?;
    Ok(row.is_some())
}

/// [`Store::find_reusable`]'s queries, inside its transaction.
async fn find_reusable_in(
    tx: &mut sqlx::Transaction<'static, sqlx::Any>,
    token: &LeaseToken,
    dependency_key: &str,
) -> Result<(Option<Build>, Option<Build>), StoreError> {
    let row = sqlx::query(
        "SELECT b.source_tree, e.scope FROM builds b JOIN environments e ON e.id = b.environment_id \
         WHERE b.lease_token = $1 AND b.status = 'building' AND b.lease_expires_at_ms >= $2",
    )
    .bind(token.as_str())
    .bind(now_ms())
    .fetch_optional(&mut **tx)
    .await?
    .ok_or(StoreError::LeaseLost)?;
    let source_tree: String = row.try_get("source_tree")?;
    let scope: String = row.try_get("scope")?;
    if dependency_key.is_empty() {
        return Ok((None, None));
    }
    let columns = BUILD_COLUMNS
        .split(", ")
        .map(|column| format!("b.{column}"))
        .collect::<Vec<_>>()
        .join(", ");
    // The whole layer needs the same source *and* the same dependency key: the key names
    // the mount path and toolchain the layer was built with.
    let mut found = [None, None];
    for (slot, source) in found.iter_mut().zip([Some(source_tree), None]) {
        let source_condition = if source.is_some() {
            " AND b.source_tree = $3"
        } else {
            ""
        };
        let sql = format!(
            "SELECT {columns} FROM builds b JOIN environments e ON e.id = b.environment_id \
             WHERE e.scope = $1 AND b.status = 'ready' AND b.dependency_key = $2{source_condition} \
             ORDER BY b.finished_at_ms DESC LIMIT 1"
        );
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(scope.clone())
            .bind(dependency_key.to_owned());
        if let Some(source) = source {
            query = query.bind(source);
        }
        let row = query.fetch_optional(&mut **tx).await?;
        *slot = row.as_ref().map(build_from_row).transpose()?;
    }
    let [whole, dependencies] = found;
    Ok((whole, dependencies))
}

fn build_from_row(row: &AnyRow) -> Result<Build, StoreError> {
    let environment: String = row.try_get("environment_id")?;
    let status: String = row.try_get("status")?;
    let version: i64 = row.try_get("version")?;
    let packages: String = row.try_get("packages")?;
    let toolchains: String = row.try_get("toolchains")?;
    let number = |column: &str| -> Result<i64, StoreError> { Ok(row.try_get::<i64, _>(column)?) };
    Ok(Build {
        environment_id: EnvironmentId::parse(&environment)
            .ok_or_else(|| StoreError::Corrupt(format!("build of {environment:?}")))?,
        version: u32::try_from(version)
            .map_err(|_| StoreError::Corrupt(format!("version {version}")))?,
        status: BuildStatus::parse(&status)
            .ok_or_else(|| StoreError::Corrupt(format!("build status {status:?}")))?,
        source_tree: row.try_get("source_tree")?,
        layer_tree: row.try_get("layer_tree")?,
        error: row.try_get("error")?,
        packages: serde_json::from_str::<Vec<Package>>(&packages)
            .map_err(|error| StoreError::Corrupt(format!("packages: {error}")))?,
        clean: number("clean")? != 0,
        toolchains: serde_json::from_str::<Vec<Toolchain>>(&toolchains)
            .map_err(|error| StoreError::Corrupt(format!("toolchains: {error}")))?,
        size: u64::try_from(number("size")?).unwrap_or(0),
        attempt: u32::try_from(number("attempt")?).unwrap_or(0),
        log_bytes: u64::try_from(number("log_bytes")?).unwrap_or(0),
        queued_at_ms: number("queued_at_ms")?,
        started_at_ms: number("started_at_ms")?,
        finished_at_ms: number("finished_at_ms")?,
    })
}
