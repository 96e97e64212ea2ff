//! Fresh databases for tests, of either backend. PostgreSQL tests read the server from
//! `PLINTH_TEST_POSTGRES_URL` (a URL whose user may create databases); each call makes a new
//! database on it so tests never see each other's rows.

use sqlx::{Connection, Executor};

/// The variable naming the PostgreSQL server for tests.
pub const POSTGRES_URL_VAR: &str = "PLINTH_TEST_POSTGRES_URL";

/// What a test should do about PostgreSQL on this machine.
pub enum PostgresAvailability {
    /// Use this server.
    Available(String),
    /// Not configured, and not required here: the test says so and returns.
    NotConfigured,
}

/// Whether PostgreSQL tests run here. Under CI (`CI` set) a missing server is a failure, never
/// a silent skip.
pub fn postgres() -> PostgresAvailability {
    match std::env::var(POSTGRES_URL_VAR) {
        Ok(url) if !url.is_empty() => PostgresAvailability::Available(url),
        _ if std::env::var_os("CI").is_some() => panic!(
            "{POSTGRES_URL_VAR} is not set under CI: the PostgreSQL suite must run there (.ci/run starts the server)"
        ),
        _ => {
            eprintln!("{POSTGRES_URL_VAR} is not set: skipping a PostgreSQL test (CI runs it)");
            PostgresAvailability::NotConfigured
        }
    }
}

/// Creates a new, empty database on the server at `server_url` and returns its URL.
pub async fn fresh_postgres_database(server_url: &str) -> String {
    sqlx::any::install_default_drivers();
    let name = format!("plinth_test_{}", uuid::Uuid::new_v4().simple());
    let mut connection = sqlx::PgConnection::connect(server_url)
        .await
        .unwrap_or_else(|error| panic!("cannot reach PostgreSQL at {POSTGRES_URL_VAR}: {error}"));
    connection
        .execute(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .await
        .unwrap_or_else(|error| panic!("cannot create test database {name}: {error}"));
    let _ = connection.close().await;
    replace_database(server_url, &name)
}

fn replace_database(server_url: &str, name: &str) -> String {
    let (base, query) = match server_url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (server_url, None),
    };
    // postgres://user:pass@host:port/db: the database is after the first '/' past the host.
    let scheme_end = base.find("://").map_or(0, |i| i + 3);
    let host_part_end = base[scheme_end..]
        .find('/')
        .map_or(base.len(), |i| scheme_end + i);
    let mut url = format!("{}/{name}", &base[..host_part_end]);
    if let Some(query) = query {
        url.push('?');
        url.push_str(query);
    }
    url
}

/// A SQLite database URL in `dir`.
pub fn sqlite_url(dir: &std::path::Path) -> String {
    format!("sqlite://{}/catalog.db?mode=rwc", dir.display())
}
