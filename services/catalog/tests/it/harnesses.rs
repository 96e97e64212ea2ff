//! Harnesses in the store, every backend: each test below runs against SQLite and against
//! PostgreSQL (`PLINTH_TEST_POSTGRES_URL`; required under CI).

use plinth_catalog::model::{
    Environment, EnvironmentId, Harness, HarnessFields, HarnessId, NewEnvironment,
};
use plinth_catalog::{Store, StoreError};

use crate::scope;

backend_suite!(
    a_created_harness_reads_back_whole,
    a_harness_must_name_an_environment_of_its_scope,
    list_is_confined_to_its_scope_oldest_first,
    another_scopes_harness_does_not_exist,
    update_replaces_every_field_and_checks_the_environment,
    an_environment_lists_the_harnesses_that_name_it,
    deleting_an_environment_keeps_the_reference,
    delete_removes_only_that_harness,
    a_harness_racing_its_environments_deletion_lands_or_is_refused,
);

async fn environment(store: &Store, scope_name: &str, name: &str) -> Environment {
    let new = NewEnvironment::new(
        scope(scope_name),
        name.to_owned(),
        String::new(),
        String::new(),
    )
    .expect("valid environment");
    store
        .create_environment(new)
        .await
        .expect("create environment")
}

fn fields(scope_name: &str, name: &str, base: &str, environment: &EnvironmentId) -> HarnessFields {
    HarnessFields::new(
        scope(scope_name),
        name.to_owned(),
        base.to_owned(),
        environment.as_str(),
    )
    .expect("valid harness")
}

async fn harness(
    store: &Store,
    scope_name: &str,
    name: &str,
    environment: &EnvironmentId,
) -> Harness {
    store
        .create_harness(fields(scope_name, name, "codex", environment))
        .await
        .expect("create harness")
}

async fn a_created_harness_reads_back_whole(store: Store) {
    let studio = environment(&store, "acme", "Content Studio").await;
    let created = store
        .create_harness(fields("acme", "Teaser cutter", "codex", &studio.id))
        .await
        .expect("create");
    assert!(HarnessId::parse(created.id.as_str()).is_some());
    assert_eq!(created.scope, scope("acme"));
    assert_eq!(created.name, "Teaser cutter");
    assert_eq!(created.base, "codex");
    assert_eq!(created.environment_id, studio.id);
    assert!(created.created_at_ms > 1_700_000_000_000);
    assert_eq!(created.created_at_ms, created.updated_at_ms);
    let read = store
        .get_harness(&scope("acme"), &created.id)
        .await
        .expect("get");
    assert_eq!(read, created);
}

async fn a_harness_must_name_an_environment_of_its_scope(store: Store) {
    let theirs = environment(&store, "globex", "Theirs").await;
    let refused = store
        .create_harness(fields("acme", "Thief", "codex", &theirs.id))
        .await;
    assert!(
        matches!(refused, Err(StoreError::NoSuchEnvironment)),
        "{refused:?}"
    );
    let missing = EnvironmentId::generate();
    let refused = store
        .create_harness(fields("acme", "Dangling", "codex", &missing))
        .await;
    assert!(
        matches!(refused, Err(StoreError::NoSuchEnvironment)),
        "{refused:?}"
    );
    assert_eq!(
        store.list_harnesses(&scope("acme")).await.expect("list"),
        Vec::new(),
        "refused writes leave nothing behind"
    );
}

async fn list_is_confined_to_its_scope_oldest_first(store: Store) {
    let acme = environment(&store, "acme", "Studio").await;
    let globex = environment(&store, "globex", "Studio").await;
    let first = harness(&store, "acme", "First", &acme.id).await;
    let theirs = harness(&store, "globex", "Theirs", &globex.id).await;
    let second = harness(&store, "acme", "Second", &acme.id).await;
    let listed = store.list_harnesses(&scope("acme")).await.expect("list");
    let ids: Vec<_> = listed.iter().map(|harness| harness.id.clone()).collect();
    assert_eq!(ids.len(), 2);
    assert!(ids.contains(&first.id) && ids.contains(&second.id));
    assert!(
        listed.windows(2).all(
            |pair| (pair[0].created_at_ms, &pair[0].id) <= (pair[1].created_at_ms, &pair[1].id)
        ),
        "oldest first"
    );
    assert_eq!(
        store.list_harnesses(&scope("globex")).await.expect("list"),
        vec![theirs]
    );
    assert_eq!(
        store.list_harnesses(&scope("initech")).await.expect("list"),
        Vec::new()
    );
}

async fn another_scopes_harness_does_not_exist(store: Store) {
    let acme = environment(&store, "acme", "Studio").await;
    let mine = harness(&store, "acme", "Mine", &acme.id).await;
    let globex = environment(&store, "globex", "Studio").await;
    let outsider = scope("globex");
    let read = store.get_harness(&outsider, &mine.id).await;
    assert!(matches!(read, Err(StoreError::NotFound)), "{read:?}");
    let updated = store
        .update_harness(&mine.id, fields("globex", "Stolen", "codex", &globex.id))
        .await;
    assert!(matches!(updated, Err(StoreError::NotFound)), "{updated:?}");
    let deleted = store.delete_harness(&outsider, &mine.id).await;
    assert!(matches!(deleted, Err(StoreError::NotFound)), "{deleted:?}");
    assert_eq!(
        store
            .get_harness(&scope("acme"), &mine.id)
            .await
            .expect("still there"),
        mine,
        "the other scope changed nothing"
    );
    let unknown = store
        .get_harness(&scope("acme"), &HarnessId::generate())
        .await;
    assert!(matches!(unknown, Err(StoreError::NotFound)), "{unknown:?}");
}

async fn update_replaces_every_field_and_checks_the_environment(store: Store) {
    let old = environment(&store, "acme", "Old Studio").await;
    let new = environment(&store, "acme", "New Studio").await;
    let theirs = environment(&store, "globex", "Theirs").await;
    let created = harness(&store, "acme", "Cutter", &old.id).await;

    let updated = store
        .update_harness(&created.id, fields("acme", "Renamed", "claude", &new.id))
        .await
        .expect("update");
    assert_eq!(updated.id, created.id);
    assert_eq!(updated.name, "Renamed");
    assert_eq!(updated.base, "claude");
    assert_eq!(updated.environment_id, new.id);
    assert_eq!(updated.created_at_ms, created.created_at_ms);
    assert!(updated.updated_at_ms >= created.updated_at_ms);
    assert_eq!(
        store
            .get_harness(&scope("acme"), &created.id)
            .await
            .expect("get"),
        updated
    );

    for outside in [theirs.id.clone(), EnvironmentId::generate()] {
        let refused = store
            .update_harness(&created.id, fields("acme", "Moved", "codex", &outside))
            .await;
        assert!(
            matches!(refused, Err(StoreError::NoSuchEnvironment)),
            "{refused:?}"
        );
    }
    assert_eq!(
        store
            .get_harness(&scope("acme"), &created.id)
            .await
            .expect("get"),
        updated,
        "a refused update changes nothing"
    );

    let unknown = store
        .update_harness(
            &HarnessId::generate(),
            fields("acme", "Ghost", "codex", &EnvironmentId::generate()),
        )
        .await;
    assert!(
        matches!(unknown, Err(StoreError::NotFound)),
        "an unknown harness is reported before its environment: {unknown:?}"
    );
}

async fn an_environment_lists_the_harnesses_that_name_it(store: Store) {
    let studio = environment(&store, "acme", "Studio").await;
    let other = environment(&store, "acme", "Other").await;
    let globex = environment(&store, "globex", "Studio").await;
    let first = harness(&store, "acme", "First", &studio.id).await;
    harness(&store, "acme", "Elsewhere", &other.id).await;
    let second = harness(&store, "acme", "Second", &studio.id).await;
    harness(&store, "globex", "Theirs", &globex.id).await;

    let reached = store
        .list_environment_harnesses(&scope("acme"), &studio.id)
        .await
        .expect("list");
    let mut ids: Vec<_> = reached.iter().map(|harness| harness.id.clone()).collect();
    ids.sort();
    let mut expected = vec![first.id.clone(), second.id.clone()];
    expected.sort();
    assert_eq!(ids, expected);

    let moved = store
        .update_harness(&first.id, fields("acme", "First", "codex", &other.id))
        .await
        .expect("move");
    let reached = store
        .list_environment_harnesses(&scope("acme"), &studio.id)
        .await
        .expect("list");
    assert_eq!(reached, vec![second]);
    let reached = store
        .list_environment_harnesses(&scope("acme"), &other.id)
        .await
        .expect("list");
    assert!(reached.contains(&moved));

    let empty = environment(&store, "acme", "Unused").await;
    assert_eq!(
        store
            .list_environment_harnesses(&scope("acme"), &empty.id)
            .await
            .expect("list"),
        Vec::new()
    );
    for (scope_name, id) in [
        ("acme", EnvironmentId::generate()),
        ("acme", globex.id.clone()),
    ] {
        let refused = store
            .list_environment_harnesses(&scope(scope_name), &id)
            .await;
        assert!(matches!(refused, Err(StoreError::NotFound)), "{refused:?}");
    }
}

async fn deleting_an_environment_keeps_the_reference(store: Store) {
    let studio = environment(&store, "acme", "Studio").await;
    let kept = harness(&store, "acme", "Cutter", &studio.id).await;
    store
        .delete_environment(&scope("acme"), &studio.id)
        .await
        .expect("the harness does not block the delete");
    assert_eq!(
        store
            .get_harness(&scope("acme"), &kept.id)
            .await
            .expect("the harness stays"),
        kept,
        "with the old environment id"
    );
    assert_eq!(
        store.list_harnesses(&scope("acme")).await.expect("list"),
        vec![kept.clone()]
    );
    let listed = store
        .list_environment_harnesses(&scope("acme"), &studio.id)
        .await;
    assert!(
        matches!(listed, Err(StoreError::NotFound)),
        "a deleted environment is not there: {listed:?}"
    );
    let rewritten = store
        .update_harness(&kept.id, fields("acme", "Cutter", "codex", &studio.id))
        .await;
    assert!(
        matches!(rewritten, Err(StoreError::NoSuchEnvironment)),
        "a write may not name it again: {rewritten:?}"
    );
    let replacement = environment(&store, "acme", "Studio Two").await;
    let repaired = store
        .update_harness(&kept.id, fields("acme", "Cutter", "codex", &replacement.id))
        .await
        .expect("pointed at a new environment");
    assert_eq!(repaired.environment_id, replacement.id);
}

async fn delete_removes_only_that_harness(store: Store) {
    let studio = environment(&store, "acme", "Studio").await;
    let gone = harness(&store, "acme", "Gone", &studio.id).await;
    let stays = harness(&store, "acme", "Stays", &studio.id).await;
    store
        .delete_harness(&scope("acme"), &gone.id)
        .await
        .expect("delete");
    let read = store.get_harness(&scope("acme"), &gone.id).await;
    assert!(matches!(read, Err(StoreError::NotFound)), "{read:?}");
    let again = store.delete_harness(&scope("acme"), &gone.id).await;
    assert!(matches!(again, Err(StoreError::NotFound)), "{again:?}");
    assert_eq!(
        store.list_harnesses(&scope("acme")).await.expect("list"),
        vec![stays]
    );
    store
        .get_environment(&scope("acme"), &studio.id)
        .await
        .expect("the environment is untouched");
}

/// A create racing the environment's delete either lands (and keeps the reference, like any
/// harness of a deleted environment) or is refused; neither side fails otherwise.
async fn a_harness_racing_its_environments_deletion_lands_or_is_refused(store: Store) {
    let mut landed = 0;
    for round in 0..5 {
        let studio = environment(&store, "acme", &format!("Race {round}")).await;
        let creates: Vec<_> = (0..4)
            .map(|i| {
                let store = store.clone();
                let id = studio.id.clone();
                plinth_kit::tasks::spawn(async move {
                    store
                        .create_harness(fields("acme", &format!("H{i}"), "codex", &id))
                        .await
                })
            })
            .collect();
        store
            .delete_environment(&scope("acme"), &studio.id)
            .await
            .expect("delete");
        for create in creates {
            match create.await.expect("task") {
                Ok(created) => {
                    assert_eq!(created.environment_id, studio.id);
                    landed += 1;
                }
                Err(StoreError::NoSuchEnvironment) => {}
                Err(other) => panic!("unexpected error: {other}"),
            }
        }
    }
    assert_eq!(
        store
            .list_harnesses(&scope("acme"))
            .await
            .expect("list")
            .len(),
        landed,
        "every harness that was acknowledged is kept"
    );
}
