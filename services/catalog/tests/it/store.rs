//! One suite, every backend: each test below runs against SQLite and against PostgreSQL
//! (`PLINTH_TEST_POSTGRES_URL`; required under CI).

use std::collections::HashSet;

use plinth_catalog::model::{EnvironmentChanges, EnvironmentId, NewEnvironment, Scope};
use plinth_catalog::testing::{self, PostgresAvailability};
use plinth_catalog::{Store, StoreError};

macro_rules! store_suite {
    ($($test:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    let dir = tempfile::tempdir().expect("temp dir");
                    let store = super::open(&plinth_catalog::testing::sqlite_url(dir.path())).await;
                    super::$test(store).await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    let Some(url) = super::postgres_url().await else { return };
                    let store = super::open(&url).await;
                    super::$test(store).await;
                }
            )*
        }
    };
}

store_suite!(
    created_environment_reads_back_whole,
    slug_is_unique_per_scope_not_across_scopes,
    concurrent_creates_of_one_slug_let_exactly_one_win,
    list_is_confined_to_its_scope_oldest_first,
    update_changes_fields_but_never_the_slug,
    another_scopes_environment_does_not_exist,
    delete_frees_the_slug,
    migrations_run_again_without_harm,
);

async fn postgres_url() -> Option<String> {
    match testing::postgres() {
        PostgresAvailability::Available(server) => {
            Some(testing::fresh_postgres_database(&server).await)
        }
        PostgresAvailability::NotConfigured => None,
    }
}

async fn open(url: &str) -> Store {
    let store = Store::connect(url, 5).await.expect("connect");
    store.migrate().await.expect("migrate");
    store
}

fn scope(name: &str) -> Scope {
    Scope::parse(name).expect("scope")
}

fn new(scope_name: &str, name: &str) -> NewEnvironment {
    NewEnvironment::new(
        scope(scope_name),
        name.to_owned(),
        "about".to_owned(),
        "run.sh".to_owned(),
    )
    .expect("valid environment")
}

async fn created_environment_reads_back_whole(store: Store) {
    let created = store
        .create_environment(new("acme", "Content Studio"))
        .await
        .expect("create");
    assert_eq!(created.slug.as_str(), "content-studio");
    assert_eq!(created.slug.mount(), "/env/content-studio");
    assert_eq!(created.active_version, None);
    assert_eq!(created.latest_version, None);
    assert!(created.created_at_ms > 1_700_000_000_000);
    assert_eq!(created.created_at_ms, created.updated_at_ms);
    let read = store
        .get_environment(&scope("acme"), &created.id)
        .await
        .expect("get");
    assert_eq!(read, created);
}

async fn slug_is_unique_per_scope_not_across_scopes(store: Store) {
    store
        .create_environment(new("acme", "Studio"))
        .await
        .expect("first");
    let second = store.create_environment(new("acme", "studio!!")).await;
    assert!(matches!(second, Err(StoreError::SlugTaken)), "{second:?}");
    store
        .create_environment(new("globex", "Studio"))
        .await
        .expect("same slug in another scope");
}

async fn concurrent_creates_of_one_slug_let_exactly_one_win(store: Store) {
    let attempts: Vec<_> = (0..8)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                store
                    .create_environment(new("acme", &format!("Race {}", "!".repeat(i))))
                    .await
            })
        })
        .collect();
    let mut won = 0;
    let mut taken = 0;
    for attempt in attempts {
        match attempt.await.expect("task") {
            Ok(_) => won += 1,
            Err(StoreError::SlugTaken) => taken += 1,
            Err(other) => panic!("unexpected error: {other}"),
        }
    }
    assert_eq!((won, taken), (1, 7));
    assert_eq!(
        store
            .list_environments(&scope("acme"))
            .await
            .expect("list")
            .len(),
        1
    );
}

async fn list_is_confined_to_its_scope_oldest_first(store: Store) {
    let mut ids = Vec::new();
    for name in ["one", "two", "three"] {
        ids.push(
            store
                .create_environment(new("acme", name))
                .await
                .expect("create")
                .id,
        );
    }
    store
        .create_environment(new("globex", "four"))
        .await
        .expect("create");
    let listed: Vec<EnvironmentId> = store
        .list_environments(&scope("acme"))
        .await
        .expect("list")
        .into_iter()
        .map(|environment| environment.id)
        .collect();
    assert_eq!(listed.len(), 3);
    let expected: HashSet<_> = ids.iter().collect();
    assert_eq!(listed.iter().collect::<HashSet<_>>(), expected);
    let listed_again: Vec<EnvironmentId> = store
        .list_environments(&scope("acme"))
        .await
        .expect("list")
        .into_iter()
        .map(|environment| environment.id)
        .collect();
    assert_eq!(listed, listed_again, "order is stable");
    assert!(
        store
            .list_environments(&scope("nobody"))
            .await
            .expect("list")
            .is_empty()
    );
}

async fn update_changes_fields_but_never_the_slug(store: Store) {
    let created = store
        .create_environment(new("acme", "Old Name"))
        .await
        .expect("create");
    let changes = EnvironmentChanges::new(Some("New Name".into()), None, Some(String::new()))
        .expect("valid changes");
    let updated = store
        .update_environment(&scope("acme"), &created.id, changes)
        .await
        .expect("update");
    assert_eq!(updated.name, "New Name");
    assert_eq!(updated.slug.as_str(), "old-name");
    assert_eq!(updated.description, "about", "absent fields stay");
    assert_eq!(updated.entry, "", "an explicit empty value is applied");
    assert!(updated.updated_at_ms >= created.updated_at_ms);
    assert_eq!(updated.created_at_ms, created.created_at_ms);
    let untouched = store
        .update_environment(&scope("acme"), &created.id, EnvironmentChanges::default())
        .await
        .expect("empty update");
    assert_eq!(
        untouched, updated,
        "an empty update changes nothing, not even updatedAt"
    );
    // The old slug stays taken: the mount path belongs to the renamed environment.
    let clash = store.create_environment(new("acme", "old name")).await;
    assert!(matches!(clash, Err(StoreError::SlugTaken)));
}

async fn another_scopes_environment_does_not_exist(store: Store) {
    let created = store
        .create_environment(new("acme", "Private"))
        .await
        .expect("create");
    let intruder = scope("globex");
    assert!(matches!(
        store.get_environment(&intruder, &created.id).await,
        Err(StoreError::NotFound)
    ));
    assert!(matches!(
        store
            .update_environment(&intruder, &created.id, EnvironmentChanges::default())
            .await,
        Err(StoreError::NotFound)
    ));
    assert!(matches!(
        store.delete_environment(&intruder, &created.id).await,
        Err(StoreError::NotFound)
    ));
    store
        .get_environment(&scope("acme"), &created.id)
        .await
        .expect("still there for its owner");
}

async fn delete_frees_the_slug(store: Store) {
    let created = store
        .create_environment(new("acme", "Scratch"))
        .await
        .expect("create");
    store
        .delete_environment(&scope("acme"), &created.id)
        .await
        .expect("delete");
    assert!(matches!(
        store.get_environment(&scope("acme"), &created.id).await,
        Err(StoreError::NotFound)
    ));
    assert!(matches!(
        store.delete_environment(&scope("acme"), &created.id).await,
        Err(StoreError::NotFound)
    ));
    let again = store
        .create_environment(new("acme", "Scratch"))
        .await
        .expect("slug is free");
    assert_ne!(again.id, created.id);
}

async fn migrations_run_again_without_harm(store: Store) {
    let created = store
        .create_environment(new("acme", "Kept"))
        .await
        .expect("create");
    store.migrate().await.expect("second migration run");
    let read = store
        .get_environment(&scope("acme"), &created.id)
        .await
        .expect("get");
    assert_eq!(read.name, "Kept");
}
