//! Adapter credentials at rest, every backend, read as someone holding a copy of the database
//! would: the rows (and, on SQLite, every byte of the database's files) hold no secret in
//! clear; a catalog with another key opens nothing and says why; a sealed value moved to
//! another adapter's row does not open there; and clear credentials an earlier version stored
//! are sealed at start.

use plinth_catalog::adapters::{AdapterId, Credential, NewAdapter, Protocol};
use plinth_catalog::model::{NewEnvironment, Scope};
use plinth_catalog::{SealError, SealKey, Store, StoreError};
use sqlx::{AnyConnection, Connection as _, Row as _};

/// Runs each `async fn(url: String)` against a fresh SQLite file and a fresh PostgreSQL
/// database (required under CI).
macro_rules! url_suite {
    ($($test:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    let dir = tempfile::tempdir().expect("temp dir");
                    super::$test(plinth_catalog::testing::sqlite_url(dir.path())).await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    let Some(url) = crate::postgres_url().await else { return };
                    super::$test(url).await;
                }
            )*
        }
    };
}

url_suite!(
    no_credential_is_stored_in_clear,
    another_key_opens_nothing_and_says_why,
    a_sealed_credential_moved_to_another_adapter_does_not_open,
    clear_credentials_of_an_earlier_version_are_sealed_at_start,
);

fn other_key() -> SealKey {
    SealKey::from_bytes(&[7; 32]).expect("key")
}

fn scope() -> Scope {
    Scope::parse("acme").expect("scope")
}

async fn novo(store: &Store, secret: &str) -> AdapterId {
    let environment = store
        .create_environment(
            NewEnvironment::new(
                scope(),
                format!("Sealed {}", uuid::Uuid::new_v4().simple()),
                String::new(),
                String::new(),
            )
            .expect("valid"),
        )
        .await
        .expect("environment");
    store
        .create_adapter(NewAdapter {
            scope: scope(),
            protocol: Protocol::Novo,
            environment_id: environment.id,
            stored_credential: secret.to_owned(),
            callback_origins: Vec::new(),
        })
        .await
        .expect("adapter")
        .id
}

/// Every row of the adapters table, every column as text, as a copy of the database shows it.
async fn rows(url: &str) -> String {
    sqlx::any::install_default_drivers();
    let mut connection = AnyConnection::connect(url).await.expect("connect");
    let rows = sqlx::query(
        "SELECT id, scope, protocol, environment_id, secret, previous_secret, callback_origins, \
         seal_key_id FROM workspace_adapters",
    )
    .fetch_all(&mut connection)
    .await
    .expect("rows");
    let _ = connection.close().await;
    rows.iter()
        .map(|row| {
            (0..8)
                .map(|column| row.try_get::<String, _>(column).expect("text"))
                .collect::<Vec<_>>()
                .join("|")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// On SQLite, every byte of the database's files (the database, its write-ahead log).
fn file_bytes(url: &str) -> Vec<u8> {
    let Some(path) = url
        .strip_prefix("sqlite://")
        .map(|rest| rest.split('?').next().unwrap_or(rest))
    else {
        return Vec::new();
    };
    let mut bytes = Vec::new();
    for suffix in ["", "-wal", "-journal"] {
        if let Ok(content) = std::fs::read(format!("{path}{suffix}")) {
            bytes.extend(content);
        }
    }
    bytes
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|window| window == needle.as_bytes())
}

async fn no_credential_is_stored_in_clear(url: String) {
    let store = crate::open(&url).await;
    let first = "env_secret_first_0123456789";
    let second = "env_secret_second_0123456789";
    let id = novo(&store, first).await;
    store
        .rotate_adapter(&scope(), &id, second, 60_000)
        .await
        .expect("rotated");
    let brain = Credential::new(Protocol::Brain, "").expect("token");
    let environment = store
        .list_environments(&scope())
        .await
        .expect("list")
        .remove(0);
    store
        .create_adapter(NewAdapter {
            scope: scope(),
            protocol: Protocol::Brain,
            environment_id: environment.id,
            stored_credential: brain.stored.clone(),
            callback_origins: Vec::new(),
        })
        .await
        .expect("brain");

    let credentials = store.adapter_credentials(&id).await.expect("opens");
    assert_eq!(credentials.current, second);
    assert_eq!(credentials.previous.as_deref(), Some(first));

    let table = rows(&url).await;
    let bytes = file_bytes(&url);
    for secret in [first, second, &brain.shown, &brain.stored] {
        assert!(
            !table.contains(secret),
            "{secret} is in the table:\n{table}"
        );
        assert!(
            !contains(&bytes, secret),
            "{secret} is in the database's files"
        );
    }
    assert!(table.contains("v1:"), "{table}");
    store.close().await;
}

async fn another_key_opens_nothing_and_says_why(url: String) {
    let store = crate::open(&url).await;
    let id = novo(&store, "env_secret_keyed_0123456789").await;
    store.close().await;

    let wrong = Store::connect(&url, 2, other_key()).await.expect("connect");
    let refused = wrong
        .migrate()
        .await
        .expect_err("another key is refused at start");
    let message = refused.to_string();
    assert!(
        matches!(refused, StoreError::Seal(SealError::WrongKey { .. })),
        "{message}"
    );
    assert!(message.contains(id.as_str()), "{message}");
    assert!(message.contains(other_key().id()), "{message}");
    assert!(message.contains(crate::seal_key().id()), "{message}");
    assert!(message.contains("seal_key_file"), "{message}");
    // Per call too (a replica started with another key beside the right one).
    let per_call = wrong
        .adapter_credentials(&id)
        .await
        .expect_err("not opened");
    assert!(
        matches!(per_call, StoreError::Seal(SealError::WrongKey { .. })),
        "{per_call}"
    );
    assert!(
        wrong
            .rotate_adapter(&scope(), &id, "env_secret_other_0123456789", 0)
            .await
            .is_err(),
        "a rotation does not re-seal a row under another key"
    );
    wrong.close().await;

    // The right key still opens it, unchanged.
    let store = crate::open(&url).await;
    assert_eq!(
        store.adapter_credentials(&id).await.expect("opens").current,
        "env_secret_keyed_0123456789"
    );
    store.close().await;
}

async fn a_sealed_credential_moved_to_another_adapter_does_not_open(url: String) {
    let store = crate::open(&url).await;
    let victim = novo(&store, "env_secret_victim_0123456789").await;
    let attacker = novo(&store, "env_secret_attacker_012345678").await;
    // Someone with write access to the database copies the victim's sealed secret onto the
    // adapter whose runtime they control.
    sqlx::any::install_default_drivers();
    let mut connection = AnyConnection::connect(&url).await.expect("connect");
    sqlx::query(
        "UPDATE workspace_adapters SET secret = (SELECT secret FROM workspace_adapters WHERE id = $1) WHERE id = $2",
    )
    .bind(victim.as_str())
    .bind(attacker.as_str())
    .execute(&mut connection)
    .await
    .expect("copied");
    let _ = connection.close().await;
    let refused = store
        .adapter_credentials(&attacker)
        .await
        .expect_err("bound to the victim's id");
    assert!(
        matches!(refused, StoreError::Seal(SealError::Damaged { .. })),
        "{refused}"
    );
    assert_eq!(
        store
            .adapter_credentials(&victim)
            .await
            .expect("victim")
            .current,
        "env_secret_victim_0123456789"
    );
    store.close().await;
}

async fn clear_credentials_of_an_earlier_version_are_sealed_at_start(url: String) {
    let store = crate::open(&url).await;
    let environment = store
        .create_environment(
            NewEnvironment::new(scope(), "Older".to_owned(), String::new(), String::new())
                .expect("valid"),
        )
        .await
        .expect("environment");
    store.close().await;
    // Rows as an earlier version wrote them: its columns only, the secret in clear.
    let old_current = "env_secret_written_in_clear_01";
    let old_previous = "env_secret_previous_in_clear_1";
    let id = AdapterId::generate();
    sqlx::any::install_default_drivers();
    let mut connection = AnyConnection::connect(&url).await.expect("connect");
    sqlx::query(
        "INSERT INTO workspace_adapters (id, scope, protocol, environment_id, secret, \
         previous_secret, previous_expires_at_ms, created_at_ms, rotated_at_ms) \
         VALUES ($1, 'acme', 'novo', $2, $3, $4, $5, 1, 1)",
    )
    .bind(id.as_str())
    .bind(environment.id.as_str())
    .bind(old_current)
    .bind(old_previous)
    .bind(plinth_kit::clock::now_ms() + 600_000)
    .execute(&mut connection)
    .await
    .expect("old row");
    let _ = connection.close().await;
    assert!(rows(&url).await.contains(old_current));
    if url.starts_with("sqlite:") {
        assert!(
            contains(&file_bytes(&url), old_current),
            "the file shows what an earlier version wrote"
        );
    }

    let store = crate::open(&url).await;
    let credentials = store.adapter_credentials(&id).await.expect("opens");
    assert_eq!(credentials.current, old_current);
    assert_eq!(credentials.previous.as_deref(), Some(old_previous));
    let table = rows(&url).await;
    let bytes = file_bytes(&url);
    for secret in [old_current, old_previous] {
        assert!(
            !table.contains(secret),
            "{secret} is still in clear:\n{table}"
        );
        assert!(
            !contains(&bytes, secret),
            "{secret} is still in the database's files"
        );
    }
    // Sealed once: a second start has nothing to do.
    assert_eq!(store.seal_stored_credentials().await.expect("checked"), 0);
    store.close().await;
}
