//! Opening a service's database, SQLite or PostgreSQL, the same way everywhere.
//!
//! Queries run through sqlx's `Any` driver, so one SQL text serves both backends (times as
//! i64 milliseconds, ids as text). On SQLite the file is in WAL mode and writes go through a
//! pool of one connection: SQLite admits one writer at a time anyway, and a queue in the pool
//! is fair and prompt where writers racing for the file lock back off in sleeps of up to
//! 100 ms. Reads use their own pool and never wait for the writer. On PostgreSQL both are the
//! same pool. Each service keeps its own migrations table, so services may share a database.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

pub use crate::clock::now_ms;

use sqlx::any::AnyPoolOptions;
use sqlx::migrate::{Migration, MigrationType, Migrator};
use sqlx::{AnyConnection, AnyPool, Connection, Executor, SqlSafeStr};

/// Which database a service runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// One file; the embedded default.
    Sqlite,
    /// A server; for more than one replica.
    Postgres,
}

impl Backend {
    /// Picks the backend from a database URL's scheme.
    pub fn from_url(url: &str) -> Result<Self, DatabaseError> {
        if url.starts_with("sqlite:") {
            Ok(Backend::Sqlite)
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Ok(Backend::Postgres)
        } else {
            Err(DatabaseError::UnsupportedUrl)
        }
    }

    /// Its name, for logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Sqlite => "sqlite",
            Backend::Postgres => "postgres",
        }
    }
}

/// Opening or migrating failed.
#[derive(Debug, thiserror::Error)]
pub enum DatabaseError {
    /// The URL names no database Plinth supports.
    #[error("database URL must start with sqlite: or postgres://")]
    UnsupportedUrl,
    /// The database refused or failed.
    #[error("database error: {0}")]
    Sql(#[from] sqlx::Error),
    /// A migration failed.
    #[error("database migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
}

/// One migration file: version, description, SQL.
pub type MigrationFile = (i64, &'static str, &'static str);

/// How long a call waits for a PostgreSQL connection (a new one included) before it fails as
/// `unavailable`.
pub const POSTGRES_ACQUIRE_TIMEOUT: Duration = Duration::from_secs(1);

/// A service's connection pools.
#[derive(Clone, Debug)]
pub struct Database {
    /// For reads.
    pub reader: AnyPool,
    /// For writes (one connection on SQLite).
    pub writer: AnyPool,
    /// Which database.
    pub backend: Backend,
    /// [`Database::ping`]'s own connection (PostgreSQL).
    health: HealthConnection,
}

/// A connection of its own for asking whether PostgreSQL answers, made on first use and
/// again after a failure: a pool whose connections are all busy is load, not a database that
/// stopped answering, and must not make a replica turn its callers away.
#[derive(Clone)]
struct HealthConnection {
    url: Arc<str>,
    connection: Arc<tokio::sync::Mutex<Option<AnyConnection>>>,
}

impl std::fmt::Debug for HealthConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HealthConnection").finish_non_exhaustive()
    }
}

impl Database {
    /// Connects. SQLite files are created when missing.
    pub async fn connect(url: &str, max_connections: u32) -> Result<Self, DatabaseError> {
        let backend = Backend::from_url(url)?;
        sqlx::any::install_default_drivers();
        let url = match backend {
            Backend::Sqlite if !url.contains("mode=") => {
                let separator = if url.contains('?') { '&' } else { '?' };
                format!("{url}{separator}mode=rwc")
            }
            _ => url.to_owned(),
        };
        if backend == Backend::Sqlite {
            // The journal mode is stored in the file, and switching needs a lock busy_timeout
            // cannot wait for, so it is set once, before the pools open. `synchronous` stays
            // FULL: an acknowledged commit survives a power cut.
            // `auto_vacuum` too is stored in the file, and can be chosen only before its first
            // table: a database made here gives the pages of deleted rows back (see
            // [`Database::compact`]); one made before keeps reusing them.
            let mut connection = AnyConnection::connect(&url).await?;
            connection
                .execute("PRAGMA auto_vacuum = INCREMENTAL")
                .await?;
            connection.execute("PRAGMA journal_mode = WAL").await?;
            connection.close().await?;
        }
        let pool = |connections: u32| {
            AnyPoolOptions::new()
                .max_connections(connections.max(1))
                // PostgreSQL is shared by replicas: one whose database stops answering must
                // say so within a second (its callers then go to another replica) rather
                // than hold every call for ten. SQLite is this process's own file, behind
                // one writer: a queue there is load, not a fault.
                .acquire_timeout(match backend {
                    Backend::Postgres => POSTGRES_ACQUIRE_TIMEOUT,
                    Backend::Sqlite => Duration::from_secs(10),
                })
                // A pinged SQLite connection is a file in this process: the ping would be one
                // more trip to its worker thread on every query, and can tell nothing. A
                // Postgres connection can be dropped by the network while it idles.
                .test_before_acquire(backend == Backend::Postgres)
        };
        let reader = pool(max_connections).connect(&url).await?;
        let writer = match backend {
            Backend::Sqlite => pool(1).connect(&url).await?,
            Backend::Postgres => reader.clone(),
        };
        Ok(Database {
            reader,
            writer,
            backend,
            health: HealthConnection {
                url: url.as_str().into(),
                connection: Arc::default(),
            },
        })
    }

    /// Applies `files` in order, recording them in `table`; safe to run from every replica at
    /// start-up (sqlx takes a lock on PostgreSQL).
    pub async fn migrate(
        &self,
        table: &'static str,
        files: &[MigrationFile],
    ) -> Result<(), DatabaseError> {
        let migrations = files
            .iter()
            .map(|&(version, description, sql)| {
                Migration::new(
                    version,
                    Cow::Borrowed(description),
                    MigrationType::Simple,
                    sqlx::AssertSqlSafe(sql).into_sql_str(),
                    false,
                )
            })
            .collect();
        let mut migrator = Migrator::with_migrations(migrations);
        migrator.dangerous_set_table_name(table);
        migrator.run(&self.writer).await?;
        Ok(())
    }

    /// Begins a write transaction that holds the write lock from its first statement
    /// (SQLite's `BEGIN IMMEDIATE`; a plain `BEGIN` on PostgreSQL). A SQLite transaction that
    /// reads before it writes could otherwise fail at its first write, without waiting, when
    /// another process wrote to the file in between (`plinth gc` beside `plinth serve`);
    /// taken at `BEGIN`, the lock waits its turn like any other write. Every write
    /// transaction begins here.
    pub async fn begin_write(&self) -> Result<sqlx::Transaction<'static, sqlx::Any>, sqlx::Error> {
        match self.backend {
            Backend::Sqlite => self.writer.begin_with("BEGIN IMMEDIATE").await,
            Backend::Postgres => self.writer.begin().await,
        }
    }

    /// Gives the disk what deleted rows held, after retention or garbage collection deleted
    /// many: on SQLite the free pages are returned to the file system (for a database with
    /// incremental auto-vacuum, as [`Database::connect`] makes them) and the write-ahead log
    /// is checkpointed and truncated. PostgreSQL's autovacuum does its own.
    pub async fn compact(&self) -> Result<(), sqlx::Error> {
        if self.backend == Backend::Sqlite {
            let mut connection = self.writer.acquire().await?;
            (&mut *connection)
                .execute("PRAGMA incremental_vacuum")
                .await?;
            // Readers in the middle of a transaction make it stop short, without error: the
            // next compaction takes the rest.
            (&mut *connection)
                .execute("PRAGMA wal_checkpoint(TRUNCATE)")
                .await?;
        }
        Ok(())
    }

    /// Answers when the database does.
    pub async fn ping(&self) -> Result<(), DatabaseError> {
        if self.backend == Backend::Sqlite {
            sqlx::query("SELECT 1").execute(&self.reader).await?;
            return Ok(());
        }
        // On its own connection, not the pool's (see `HealthConnection`). Taken out while in
        // use: a ping cut off by its caller's timeout drops it, and the next one connects anew.
        let mut held = self.health.connection.lock().await;
        let mut connection = match held.take() {
            Some(connection) => connection,
            None => AnyConnection::connect(&self.health.url).await?,
        };
        sqlx::query("SELECT 1").execute(&mut connection).await?;
        *held = Some(connection);
        Ok(())
    }

    /// Closes every connection.
    pub async fn close(&self) {
        self.writer.close().await;
        self.reader.close().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bytes of a SQLite database on disk: the file and its write-ahead log.
    fn on_disk(dir: &std::path::Path) -> u64 {
        ["db.sqlite", "db.sqlite-wal"]
            .iter()
            .map(|name| std::fs::metadata(dir.join(name)).map_or(0, |m| m.len()))
            .sum()
    }

    #[tokio::test]
    async fn compaction_gives_the_pages_of_deleted_rows_back_to_the_disk() {
        let dir = tempfile::tempdir().expect("dir");
        let url = format!("sqlite://{}", dir.path().join("db.sqlite").display());
        let db = Database::connect(&url, 2).await.expect("connect");
        sqlx::query("CREATE TABLE t (id INTEGER PRIMARY KEY, body TEXT NOT NULL)")
            .execute(&db.writer)
            .await
            .expect("table");
        db.compact().await.expect("compact");
        let empty = on_disk(dir.path());
        let body = "x".repeat(4096);
        for _ in 0..20 {
            let mut tx = db.begin_write().await.expect("begin");
            for _ in 0..100 {
                sqlx::query("INSERT INTO t (body) VALUES ($1)")
                    .bind(&body)
                    .execute(&mut *tx)
                    .await
                    .expect("insert");
            }
            tx.commit().await.expect("commit");
        }
        db.compact().await.expect("compact");
        let full = on_disk(dir.path());
        assert!(full > empty + 2000 * 4096, "{empty} then {full}");

        sqlx::query("DELETE FROM t")
            .execute(&db.writer)
            .await
            .expect("delete");
        db.compact().await.expect("compact");
        let after = on_disk(dir.path());
        assert!(
            after < empty + 64 * 1024,
            "the deleted rows' 8 MiB went back: {empty} empty, {full} full, {after} after"
        );
        db.close().await;
    }
}
