//! Every query the catalog makes, and nothing else touches the database.
//!
//! What is durable here and why: the environment registry (ids, names, slugs, the active and
//! latest version pointers) is the system of record for what sessions may mount, so it lives
//! in a transactional database, SQLite for one machine or PostgreSQL for a cluster. Both run
//! the same SQL through sqlx's `Any` driver: times are i64 milliseconds, ids are text.
//! Uniqueness (one slug per scope) is an index, so it holds across catalog replicas.
//! Workspace adapters' credentials are sealed (`crate::domain::seal`) with a key the store is given
//! and never writes: what is stored verifies nothing without it.

mod adapters;
mod brain;
mod builds;
mod collection;
mod durability;
mod gauges;
mod harnesses;
mod leases;
mod ledger;
mod quotas;
mod request_keys;
mod retention;
mod sessions;
mod tickets;
mod warm;

pub use adapters::{AdapterCredentials, Claimed, NewTurn, OpenedRun, SignedCall, SignedCallSeen};
pub use builds::{BUILD_QUEUED_CHANNEL, DEFAULT_RUNNING_PER_SCOPE, LeasePolicy, MAX_LOG_BYTES};
pub use collection::CollectionRoots;
use plinth_kit::database::{Backend, Database, DatabaseError, MigrationFile, now_ms};
pub use quotas::Usage;
pub use request_keys::RequestKey;
pub use retention::{RetentionPolicy, Retired};
pub use sessions::{NewSession, NewTask};
use sqlx::Row;
use sqlx::any::AnyRow;
pub use tickets::TerminalTicket;

use crate::domain::model::{
    Cursor, Environment, EnvironmentChanges, EnvironmentId, InstallSettings, NewEnvironment, Page,
    PageRequest, Scope, Slug,
};

/// The migrations, in order, each from `migrations/common` (the same SQL on both databases) or,
/// where the two differ, from `migrations/sqlite` and `migrations/postgres` under one name.
macro_rules! migration_lists {
    ($($version:literal, $name:literal, $kind:ident $file:literal;)*) => {
        const SQLITE_MIGRATIONS: &[MigrationFile] =
            &[$(($version, $name, migration_lists!(@sql sqlite $kind $file))),*];
        const POSTGRES_MIGRATIONS: &[MigrationFile] =
            &[$(($version, $name, migration_lists!(@sql postgres $kind $file))),*];
    };
    (@sql $backend:ident common $file:literal) => {
        include_str!(concat!("../../migrations/common/", $file))
    };
    (@sql sqlite split $file:literal) => {
        include_str!(concat!("../../migrations/sqlite/", $file))
    };
    (@sql postgres split $file:literal) => {
        include_str!(concat!("../../migrations/postgres/", $file))
    };
}

migration_lists! {
    1, "environments", common "0001_environments.sql";
    2, "builds", common "0002_builds.sql";
    3, "dependency keys", common "0003_dependency_keys.sql";
    4, "harnesses", common "0004_harnesses.sql";
    5, "sessions", common "0005_sessions.sql";
    6, "workspace adapters", common "0006_workspace_adapters.sql";
    7, "brain", common "0007_brain.sql";
    8, "adapter runs and idempotency keys", common "0008_adapter_runs.sql";
    9, "where nodes keep sessions", common "0009_node_sessions_dir.sql";
    10, "where sessions see their working directory", common "0010_node_session_workdir.sql";
    11, "session limits and when sessions end", common "0011_session_limits.sql";
    12, "adapter callback origins and sealed credentials", common "0012_adapter_origins_and_sealing.sql";
    13, "quotas per scope", common "0013_quotas.sql";
    14, "garbage collection and retention", split "0014_collection_and_retention.sql";
    15, "clean_builds_and_toolchains", common "0015_clean_builds_and_toolchains.sql";
    16, "limits_in_ms_and_session_pages", common "0016_limits_in_ms_and_session_pages.sql";
    17, "build_turns", common "0017_build_turns.sql";
    18, "novo_signatures", common "0018_novo_signatures.sql";
    19, "request_keys", common "0019_request_keys.sql";
    20, "node_load_and_cache_sets", split "0020_node_load_and_cache_sets.sql";
    21, "suspect_nodes", common "0021_suspect_nodes.sql";
    22, "node_capacity", split "0022_node_capacity.sql";
    23, "activation_epoch", split "0023_activation_epoch.sql";
    24, "install_settings", common "0024_install_settings.sql";
    25, "warm_versions_and_read_orders", common "0025_warm_versions_and_read_orders.sql";
    26, "terminal_tickets", common "0026_terminal_tickets.sql";
}

fn migrations(backend: Backend) -> &'static [MigrationFile] {
    match backend {
        Backend::Sqlite => SQLITE_MIGRATIONS,
        Backend::Postgres => POSTGRES_MIGRATIONS,
    }
}

/// What can go wrong in the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// No such object in the scope.
    #[error("not found")]
    NotFound,
    /// A harness write names an environment that is not in the scope.
    #[error("the environment is not in this scope")]
    NoSuchEnvironment,
    /// The slug is taken in the scope.
    #[error("slug is taken in this scope")]
    SlugTaken,
    /// A build of the environment is queued or running.
    #[error("a build is queued or running")]
    Busy,
    /// The version cannot be activated: it is not ready.
    #[error("the version is {}, not ready", .0.as_str())]
    NotReady(crate::domain::model::BuildStatus),
    /// The environment has no active version: nothing was built yet, or nothing ready.
    #[error("the environment has no ready version")]
    NothingBuilt,
    /// An adapter's run whose session has ended.
    #[error("the run's session has ended")]
    RunEnded,
    /// A Brain binding's life does not allow the change: it is in this state.
    #[error("the binding is {}", .0.label())]
    BindingState(crate::domain::brain::BindingState),
    /// No node agent has heartbeated recently enough to be given a session.
    #[error("no node agent is alive")]
    NoLiveNode,
    /// Node agents are alive, and none has room for the session: each is at its most
    /// sessions, or has less memory left than the session's limit.
    #[error("no live node has room for the session")]
    NoCapacity {
        /// How many nodes are alive (and full).
        live_nodes: u64,
        /// The session's memory limit, in MiB.
        memory_mb: Option<u64>,
    },
    /// A page was asked for after a cursor this list did not hand out (another list's, or
    /// another session's turns').
    #[error("not a cursor this list handed out")]
    ForeignCursor,
    /// The builder's lease expired or was handed on; its write is refused.
    #[error("the lease expired or was handed to another builder")]
    LeaseLost,
    /// One more would take the scope past a quota.
    #[error("the scope is at its {quota} quota ({used} of {limit})")]
    QuotaExceeded {
        /// Which quota.
        quota: plinth_kit::quota::Quota,
        /// The scope's limit.
        limit: u64,
        /// What the scope has.
        used: u64,
    },
    /// The database could not be opened or migrated.
    #[error(transparent)]
    Open(#[from] DatabaseError),
    /// The database refused or failed.
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    /// A stored row breaks an invariant the schema should have kept.
    #[error("stored row is corrupt: {0}")]
    Corrupt(String),
    /// A sealed credential cannot be opened with this store's key.
    #[error(transparent)]
    Seal(#[from] crate::domain::seal::SealError),
}

/// The catalog's database.
#[derive(Clone)]
pub struct Store {
    db: Database,
    seal: std::sync::Arc<crate::domain::seal::SealKey>,
    /// Every scope's limits (`quotas`); the defaults unless `with_quotas` set them.
    quotas: std::sync::Arc<plinth_kit::quota::Quotas>,
    /// How many versions a heartbeat names to hold warm; the default unless
    /// `with_prewarm_versions` set it.
    prewarm_versions: u32,
    /// Which ledger writes are synced (`durability`).
    flusher: std::sync::Arc<durability::Flusher>,
}

const ENVIRONMENT_COLUMNS: &str = "id, scope, name, slug, description, entry, active_version, \
     latest_version, files_count, files_bytes, created_at_ms, updated_at_ms, install";

impl Store {
    /// Connects. SQLite files are created when missing. `seal` seals adapter credentials.
    pub async fn connect(
        url: &str,
        max_connections: u32,
        seal: crate::domain::seal::SealKey,
    ) -> Result<Self, StoreError> {
        Ok(Store {
            db: Database::connect(url, max_connections).await?,
            seal: std::sync::Arc::new(seal),
            quotas: std::sync::Arc::default(),
            prewarm_versions: crate::domain::warm::DEFAULT_PREWARM_VERSIONS,
            flusher: std::sync::Arc::default(),
        })
    }
    /// Connects for maintenance that never reads or writes an adapter's credential
    /// (retention, garbage collection): it needs no seal key, and is given a throwaway one.
    /// Migrations are the catalog's to apply; a database it has not migrated is refused by
    /// the queries that need its tables.
    pub async fn connect_for_maintenance(
        url: &str,
        max_connections: u32,
    ) -> Result<Self, StoreError> {
        let mut throwaway = [0u8; 32];
        getrandom::fill(&mut throwaway)
            .map_err(|error| StoreError::Corrupt(format!("no randomness: {error}")))?;
        Self::connect(
            url,
            max_connections,
            crate::domain::seal::SealKey::from_bytes(&throwaway)?,
        )
        .await
    }

    /// Which database this is.
    pub fn backend(&self) -> Backend {
        self.db.backend
    }

    /// Applies the migrations this build knows, in order, then seals the adapter credentials
    /// an earlier version stored in clear and checks that this store's key opens every sealed
    /// one (`StoreError::Seal` names the adapter and both keys otherwise); safe to run from
    /// every replica.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        self.db
            .migrate("_plinth_catalog_migrations", migrations(self.db.backend))
            .await?;
        self.seal_stored_credentials().await?;
        Ok(())
    }

    /// Applies the migrations up to `version` only, then runs `statements`: a database as an
    /// earlier release left it, for a test of what a later migration does to its rows.
    #[cfg(feature = "testing")]
    pub async fn migrate_up_to(&self, version: i64, statements: &[&str]) -> Result<(), StoreError> {
        let files: Vec<MigrationFile> = migrations(self.db.backend)
            .iter()
            .copied()
            .filter(|(at, _, _)| *at <= version)
            .collect();
        self.db
            .migrate("_plinth_catalog_migrations", &files)
            .await?;
        for statement in statements {
            sqlx::query(sqlx::AssertSqlSafe(*statement))
                .execute(&self.db.writer)
                .await?;
        }
        Ok(())
    }

    /// Answers when the database does.
    pub async fn ping(&self) -> Result<(), StoreError> {
        Ok(self.db.ping().await?)
    }

    /// Closes every connection.
    pub async fn close(&self) {
        self.db.close().await;
    }

    /// Inserts a new environment. A slug already used in the scope is refused by the unique
    /// index, so two concurrent creates cannot both succeed; a scope at its environments
    /// quota is refused (`StoreError::QuotaExceeded`), counted after taking the scope's row.
    pub async fn create_environment(&self, new: NewEnvironment) -> Result<Environment, StoreError> {
        let now = now_ms();
        let environment = Environment {
            id: EnvironmentId::generate(),
            scope: new.scope,
            name: new.name,
            slug: new.slug,
            description: new.description,
            entry: new.entry,
            install: new.install,
            active_version: None,
            latest_version: None,
            files_count: 0,
            files_bytes: 0,
            created_at_ms: now,
            updated_at_ms: now,
            builds: Vec::new(),
        };
        let mut tx = self.db.begin_write().await?;
        let limit = self.limit(&environment.scope, plinth_kit::quota::Quota::Environments);
        quotas::admit_one(
            &mut tx,
            &environment.scope,
            plinth_kit::quota::Quota::Environments,
            limit,
        )
        .await?;
        let result = sqlx::query(
            "INSERT INTO environments (id, scope, name, slug, description, entry, \
             created_at_ms, updated_at_ms, install) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
        )
        .bind(environment.id.as_str())
        .bind(environment.scope.as_str())
        .bind(&environment.name)
        .bind(environment.slug.as_str())
        .bind(&environment.description)
        .bind(&environment.entry)
        .bind(now)
        .bind(now)
        .bind(environment.install.stored())
        .execute(&mut *tx)
        .await;
        match result {
            Ok(_) => {
                tx.commit().await?;
                Ok(environment)
            }
            Err(sqlx::Error::Database(error)) if error.is_unique_violation() => {
                Err(StoreError::SlugTaken)
            }
            Err(error) => Err(error.into()),
        }
    }

    /// One environment of the scope.
    pub async fn get_environment(
        &self,
        scope: &Scope,
        id: &EnvironmentId,
    ) -> Result<Environment, StoreError> {
        let sql =
            format!("SELECT {ENVIRONMENT_COLUMNS} FROM environments WHERE scope = $1 AND id = $2");
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(scope.as_str())
            .bind(id.as_str())
            .fetch_optional(&self.db.reader)
            .await?
            .ok_or(StoreError::NotFound)?;
        let mut environment = environment_from_row(&row)?;
        environment.builds = self.builds_of(&[&environment.id]).await?;
        Ok(environment)
    }

    /// Every environment of the scope, oldest first.
    pub async fn list_environments(&self, scope: &Scope) -> Result<Vec<Environment>, StoreError> {
        self.environments_after(scope, None, None).await
    }

    /// One page of the scope's environments, oldest first: those after `page.after`, read
    /// with one more than the limit so the answer knows whether another page follows.
    pub async fn list_environments_page(
        &self,
        scope: &Scope,
        page: &PageRequest,
    ) -> Result<Page<Environment>, StoreError> {
        let limit = page.limit as usize;
        let mut environments = self
            .environments_after(scope, page.after.as_ref(), Some(limit + 1))
            .await?;
        let next = if environments.len() > limit {
            environments.truncate(limit);
            environments.last().map(|last| Cursor {
                key: last.created_at_ms,
                id: last.id.as_str().to_owned(),
            })
        } else {
            None
        };
        Ok(Page {
            items: environments,
            next,
        })
    }

    /// The scope's environments in listing order (creation time, then id), after `after` and
    /// at most `limit` of them, with their builds.
    async fn environments_after(
        &self,
        scope: &Scope,
        after: Option<&Cursor>,
        limit: Option<usize>,
    ) -> Result<Vec<Environment>, StoreError> {
        // Row comparison `(a, b) > (x, y)` is the keyset condition on both SQLite and
        // PostgreSQL, and the `(scope, created_at_ms, id)` order lets either walk an index.
        let after_clause = if after.is_some() {
            " AND (created_at_ms, id) > ($2, $3)"
        } else {
            ""
        };
        let limit_clause = match limit {
            Some(limit) => format!(" LIMIT {limit}"),
            None => String::new(),
        };
        let sql = format!(
            "SELECT {ENVIRONMENT_COLUMNS} FROM environments WHERE scope = $1{after_clause} \
             ORDER BY created_at_ms, id{limit_clause}"
        );
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(scope.as_str());
        if let Some(after) = after {
            query = query.bind(after.key).bind(after.id.as_str());
        }
        let rows = query.fetch_all(&self.db.reader).await?;
        let mut environments = rows
            .iter()
            .map(environment_from_row)
            .collect::<Result<Vec<_>, _>>()?;
        let ids: Vec<&EnvironmentId> = environments.iter().map(|e| &e.id).collect();
        let mut builds = self.builds_of(&ids).await?;
        for environment in &mut environments {
            let (mine, rest): (Vec<_>, Vec<_>) = builds
                .into_iter()
                .partition(|build| build.environment_id == environment.id);
            environment.builds = mine;
            builds = rest;
        }
        Ok(environments)
    }

    /// Applies the changes that are set; the slug never changes.
    pub async fn update_environment(
        &self,
        scope: &Scope,
        id: &EnvironmentId,
        changes: EnvironmentChanges,
    ) -> Result<Environment, StoreError> {
        if changes.is_empty() {
            return self.get_environment(scope, id).await;
        }
        let sql = format!(
            "UPDATE environments SET name = COALESCE($1, name), \
             description = COALESCE($2, description), entry = COALESCE($3, entry), \
             install = COALESCE($7, install), \
             updated_at_ms = $4 WHERE scope = $5 AND id = $6 RETURNING {ENVIRONMENT_COLUMNS}"
        );
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(changes.name)
            .bind(changes.description)
            .bind(changes.entry)
            .bind(now_ms())
            .bind(scope.as_str())
            .bind(id.as_str())
            .bind(changes.install.as_ref().map(InstallSettings::stored))
            .fetch_optional(&self.db.writer)
            .await?
            .ok_or(StoreError::NotFound)?;
        let mut environment = environment_from_row(&row)?;
        environment.builds = self.builds_of(&[&environment.id]).await?;
        Ok(environment)
    }

    /// Deletes the environment and every version of it; refused while a build is queued or
    /// running (the condition is part of the DELETE, so a build queued meanwhile wins). The
    /// environment is remembered as deleted (for the retention period), so the source service
    /// forgets its files and a collection its blobs, whoever tells the source.
    pub async fn delete_environment(
        &self,
        scope: &Scope,
        id: &EnvironmentId,
    ) -> Result<(), StoreError> {
        let mut tx = self.db.begin_write().await?;
        let result = sqlx::query(
            "DELETE FROM environments WHERE scope = $1 AND id = $2 AND NOT EXISTS \
             (SELECT 1 FROM builds WHERE environment_id = $2 AND status IN ('queued', 'building'))",
        )
        .bind(scope.as_str())
        .bind(id.as_str())
        .execute(&mut *tx)
        .await?;
        if result.rows_affected() == 0 {
            drop(tx);
            self.get_environment(scope, id).await?;
            return Err(StoreError::Busy);
        }
        sqlx::query(
            "INSERT INTO deleted_environments (id, deleted_at_ms) VALUES ($1, $2) \
             ON CONFLICT (id) DO NOTHING",
        )
        .bind(id.as_str())
        .bind(now_ms())
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }
}

fn environment_from_row(row: &AnyRow) -> Result<Environment, StoreError> {
    let id: String = row.try_get("id")?;
    let scope: String = row.try_get("scope")?;
    Ok(Environment {
        id: EnvironmentId::parse(&id)
            .ok_or_else(|| StoreError::Corrupt(format!("environment id {id:?}")))?,
        scope: Scope::parse(&scope).map_err(|_| StoreError::Corrupt(format!("scope of {id}")))?,
        name: row.try_get("name")?,
        slug: Slug::from_stored(row.try_get("slug")?),
        description: row.try_get("description")?,
        entry: row.try_get("entry")?,
        install: InstallSettings::from_stored(&row.try_get::<String, _>("install")?)
            .map_err(|why| StoreError::Corrupt(format!("install settings of {id}: {why}")))?,
        active_version: version(row, "active_version")?,
        latest_version: version(row, "latest_version")?,
        files_count: count(row, "files_count")?,
        files_bytes: count(row, "files_bytes")?,
        created_at_ms: row.try_get("created_at_ms")?,
        updated_at_ms: row.try_get("updated_at_ms")?,
        builds: Vec::new(),
    })
}

fn version(row: &AnyRow, column: &str) -> Result<Option<u32>, StoreError> {
    let value: Option<i64> = row.try_get(column)?;
    value
        .map(|v| u32::try_from(v).map_err(|_| StoreError::Corrupt(format!("{column} = {v}"))))
        .transpose()
}

fn count(row: &AnyRow, column: &str) -> Result<u64, StoreError> {
    let value: i64 = row.try_get(column)?;
    u64::try_from(value).map_err(|_| StoreError::Corrupt(format!("{column} = {value}")))
}

#[cfg(test)]
mod migration_list_tests {
    use super::*;

    /// Every file under `migrations/` is in the list once, for the database it is for, in the
    /// order of the number its name starts with.
    #[test]
    fn the_list_names_every_migration_file_in_order() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations");
        for (backend, own, list) in [
            (Backend::Sqlite, "sqlite", SQLITE_MIGRATIONS),
            (Backend::Postgres, "postgres", POSTGRES_MIGRATIONS),
        ] {
            assert_eq!(migrations(backend).len(), list.len());
            let mut files: Vec<(u32, String)> = ["common", own]
                .iter()
                .flat_map(|dir| std::fs::read_dir(root.join(dir)).expect("a migrations folder"))
                .map(|entry| entry.expect("an entry").path())
                .map(|path| {
                    let name = path
                        .file_name()
                        .expect("a name")
                        .to_string_lossy()
                        .into_owned();
                    let number = name[..4].parse().expect("a numbered file");
                    (number, std::fs::read_to_string(&path).expect("SQL"))
                })
                .collect();
            files.sort_by_key(|(number, _)| *number);
            let listed: Vec<(u32, String)> = list
                .iter()
                .map(|(version, _, sql)| {
                    (
                        u32::try_from(*version).expect("a version"),
                        (*sql).to_owned(),
                    )
                })
                .collect();
            assert_eq!(listed, files, "{own}");
        }
    }
}
