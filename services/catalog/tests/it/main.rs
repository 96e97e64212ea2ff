//! The catalog's integration tests: the store conformance suite, run unchanged against
//! SQLite and PostgreSQL.

use plinth_catalog::Store;
use plinth_catalog::testing::{self, PostgresAvailability};

/// Runs each named `async fn(Store)` of the calling module twice: against a fresh SQLite
/// database and against a fresh PostgreSQL database (`PLINTH_TEST_POSTGRES_URL`; required
/// under CI).
macro_rules! backend_suite {
    ($($test:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    let dir = tempfile::tempdir().expect("temp dir");
                    let store = crate::open(&plinth_catalog::testing::sqlite_url(dir.path())).await;
                    super::$test(store).await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    let Some(url) = crate::postgres_url().await else { return };
                    let store = crate::open(&url).await;
                    super::$test(store).await;
                }
            )*
        }
    };
}

mod adapters;
mod brain;
mod capacity;
mod fair_builds;
mod harnesses;
mod paging;
mod quotas;
mod request_keys;
mod retention;
mod sealing;
mod sessions;
mod store;
mod warm;

/// A fresh PostgreSQL database, or `None` when none is configured (outside CI).
async fn postgres_url() -> Option<String> {
    match testing::postgres() {
        PostgresAvailability::Available(server) => {
            Some(testing::fresh_postgres_database(&server).await)
        }
        PostgresAvailability::NotConfigured => None,
    }
}

/// Leases long enough that no test's claim runs out unless the test makes it.
const LEASES: plinth_catalog::LeasePolicy = plinth_catalog::LeasePolicy {
    lease_ms: 60_000,
    max_attempts: 3,
    running_per_scope: plinth_catalog::DEFAULT_RUNNING_PER_SCOPE,
};

/// The scope called `name`.
fn scope(name: &str) -> plinth_catalog::model::Scope {
    plinth_catalog::model::Scope::parse(name).expect("scope")
}

/// The seal key the suite's stores use.
fn seal_key() -> plinth_catalog::SealKey {
    plinth_catalog::SealKey::from_bytes(&[42; 32]).expect("key")
}

/// The store at `url`, migrated.
async fn open(url: &str) -> Store {
    let store = Store::connect(url, 5, seal_key()).await.expect("connect");
    store.migrate().await.expect("migrate");
    store
}
