//! One suite, every backend: each test below runs against SQLite and against PostgreSQL
//! (`PLINTH_TEST_POSTGRES_URL`; required under CI).

use std::collections::HashSet;

use plinth_catalog::LeasePolicy;
use plinth_catalog::model::{
    BuildStatus, EnvironmentChanges, EnvironmentId, EnvironmentStatus, NewEnvironment, Outcome,
    Package, PackageManager, Toolchain, ToolchainName,
};
use plinth_catalog::{Store, StoreError};

use crate::{LEASES, scope};

backend_suite!(
    created_environment_reads_back_whole,
    slug_is_unique_per_scope_not_across_scopes,
    concurrent_creates_of_one_slug_let_exactly_one_win,
    list_is_confined_to_its_scope_oldest_first,
    update_changes_fields_but_never_the_slug,
    another_scopes_environment_does_not_exist,
    delete_frees_the_slug,
    migrations_run_again_without_harm,
    one_build_at_a_time_even_when_requests_race,
    a_build_runs_from_queue_to_active_version,
    a_failed_build_changes_nothing_else,
    activation_takes_only_ready_versions,
    an_expired_lease_is_fenced_and_the_build_requeued,
    a_build_whose_builders_keep_vanishing_fails,
    deleting_waits_for_the_build_and_takes_its_versions,
    a_clean_build_reaches_its_builder_and_toolchains_are_kept,
    a_released_build_is_queued_again_at_once_and_its_lease_is_dead,
);

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
            plinth_kit::tasks::spawn(async move {
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

/// Runs one build of `id` from queue to end, as a builder would.
async fn build_through(
    store: &Store,
    id: &EnvironmentId,
    source: &str,
    outcome: Outcome,
) -> plinth_catalog::model::Build {
    store
        .start_build(&scope("acme"), id, source, false)
        .await
        .expect("start");
    let claim = store
        .claim_build("b", LEASES)
        .await
        .expect("claim")
        .expect("work");
    store
        .complete_build(&claim.token, outcome)
        .await
        .expect("complete")
}

fn ready(layer: &str) -> Outcome {
    Outcome::Ready {
        layer_tree: layer.to_owned(),
        packages: vec![Package {
            manager: PackageManager::Pip,
            name: "requests".into(),
            version: "2.32.3".into(),
        }],
        size: 1234,
        dependency_key: String::new(),
        toolchains: Vec::new(),
    }
}

async fn one_build_at_a_time_even_when_requests_race(store: Store) {
    let environment = store
        .create_environment(new("acme", "Racy"))
        .await
        .expect("create");
    let attempts: Vec<_> = (0..8)
        .map(|_| {
            let (store, id) = (store.clone(), environment.id.clone());
            plinth_kit::tasks::spawn(async move {
                store
                    .start_build(&scope("acme"), &id, "sha256:tree", false)
                    .await
            })
        })
        .collect();
    let mut started = 0;
    for attempt in attempts {
        match attempt.await.expect("task") {
            Ok(build) => {
                started += 1;
                assert_eq!(build.version, 1);
                assert_eq!(build.status, BuildStatus::Queued);
            }
            Err(StoreError::Busy) => {}
            Err(other) => panic!("unexpected: {other}"),
        }
    }
    assert_eq!(started, 1);
    let read = store
        .get_environment(&scope("acme"), &environment.id)
        .await
        .expect("get");
    assert_eq!(read.latest_version, Some(1));
    assert_eq!(read.status(), EnvironmentStatus::Building);
}

async fn a_build_runs_from_queue_to_active_version(store: Store) {
    let environment = store
        .create_environment(new("acme", "Studio"))
        .await
        .expect("create");
    assert_eq!(environment.status(), EnvironmentStatus::Empty);
    store
        .start_build(&scope("acme"), &environment.id, "sha256:source", false)
        .await
        .expect("start");
    let claim = store
        .claim_build("builder-1", LEASES)
        .await
        .expect("claim")
        .expect("work");
    assert_eq!(claim.slug.as_str(), "studio");
    assert_eq!(claim.build.source_tree, "sha256:source");
    assert_eq!(claim.build.attempt, 1);
    assert!(
        store
            .claim_build("builder-2", LEASES)
            .await
            .expect("claim")
            .is_none(),
        "nothing else is queued"
    );
    store
        .heartbeat(&claim.token, LEASES.lease_ms)
        .await
        .expect("heartbeat");
    assert_eq!(
        store
            .append_log(&claim.token, "Collecting requests\n")
            .await
            .expect("log"),
        20
    );
    assert_eq!(
        store
            .append_log(&claim.token, "Installed ✓\n")
            .await
            .expect("log"),
        34
    );
    let (text, next, finished) = store
        .read_log(&scope("acme"), &environment.id, 1, 0)
        .await
        .expect("read");
    assert_eq!(
        (text.as_str(), next, finished),
        ("Collecting requests\nInstalled ✓\n", 34, false)
    );
    let (rest, _, _) = store
        .read_log(&scope("acme"), &environment.id, 1, 20)
        .await
        .expect("read");
    assert_eq!(
        rest, "Installed ✓\n",
        "a reader that reconnects with an offset gets only what it missed"
    );
    let building = store
        .get_environment(&scope("acme"), &environment.id)
        .await
        .expect("get");
    assert_eq!(building.status(), EnvironmentStatus::Building);
    assert_eq!(building.builds[0].status, BuildStatus::Building);

    let done = store
        .complete_build(&claim.token, ready("sha256:layer"))
        .await
        .expect("complete");
    assert_eq!(done.status, BuildStatus::Ready);
    let read = store
        .get_environment(&scope("acme"), &environment.id)
        .await
        .expect("get");
    assert_eq!(
        read.active_version,
        Some(1),
        "success activates in the same transaction"
    );
    assert_eq!(read.status(), EnvironmentStatus::Ready);
    assert_eq!(read.packages().len(), 1);
    assert_eq!(read.builds[0].layer_tree, "sha256:layer");
    let (_, _, finished) = store
        .read_log(&scope("acme"), &environment.id, 1, 34)
        .await
        .expect("read");
    assert!(finished);
    // The lease ended with the build.
    assert!(matches!(
        store.append_log(&claim.token, "late").await,
        Err(StoreError::LeaseLost)
    ));
    assert!(matches!(
        store.get_build(&scope("globex"), &environment.id, 1).await,
        Err(StoreError::NotFound)
    ));
}

async fn a_failed_build_changes_nothing_else(store: Store) {
    let environment = store
        .create_environment(new("acme", "Stable"))
        .await
        .expect("create");
    build_through(
        &store,
        &environment.id,
        "sha256:one",
        ready("sha256:layer-one"),
    )
    .await;
    store
        .start_build(&scope("acme"), &environment.id, "sha256:two", false)
        .await
        .expect("start");
    let second = store
        .claim_build("b", LEASES)
        .await
        .expect("claim")
        .expect("work");
    assert_eq!(second.build.version, 2);
    let failed = store
        .complete_build(
            &second.token,
            Outcome::Failed {
                error: "setup.sh exited with 3".into(),
            },
        )
        .await
        .expect("failed");
    assert_eq!(failed.status, BuildStatus::Failed);
    let read = store
        .get_environment(&scope("acme"), &environment.id)
        .await
        .expect("get");
    assert_eq!(
        read.active_version,
        Some(1),
        "the previous version stays active"
    );
    assert_eq!(read.latest_version, Some(2));
    assert_eq!(read.status(), EnvironmentStatus::Ready);
    assert_eq!(read.builds[0].error, "setup.sh exited with 3");

    // With nothing active, a failure is what the environment says.
    let fresh = store
        .create_environment(new("acme", "Broken"))
        .await
        .expect("create");
    build_through(
        &store,
        &fresh.id,
        "sha256:x",
        Outcome::Failed {
            error: "boom".into(),
        },
    )
    .await;
    let read = store
        .get_environment(&scope("acme"), &fresh.id)
        .await
        .expect("get");
    assert_eq!(read.status(), EnvironmentStatus::Failed);
}

async fn activation_takes_only_ready_versions(store: Store) {
    let environment = store
        .create_environment(new("acme", "Rollback"))
        .await
        .expect("create");
    for (source, outcome) in [
        ("sha256:1", ready("sha256:l1")),
        ("sha256:2", ready("sha256:l2")),
        ("sha256:3", Outcome::Failed { error: "no".into() }),
    ] {
        build_through(&store, &environment.id, source, outcome).await;
    }
    let read = store
        .get_environment(&scope("acme"), &environment.id)
        .await
        .expect("get");
    assert_eq!(read.active_version, Some(2));
    store
        .activate(&scope("acme"), &environment.id, 1)
        .await
        .expect("roll back");
    let read = store
        .get_environment(&scope("acme"), &environment.id)
        .await
        .expect("get");
    assert_eq!(read.active_version, Some(1));
    assert!(matches!(
        store.activate(&scope("acme"), &environment.id, 3).await,
        Err(StoreError::NotReady(BuildStatus::Failed))
    ));
    assert!(matches!(
        store.activate(&scope("acme"), &environment.id, 9).await,
        Err(StoreError::NotFound)
    ));
    assert!(matches!(
        store.activate(&scope("globex"), &environment.id, 1).await,
        Err(StoreError::NotFound)
    ));
    store
        .start_build(&scope("acme"), &environment.id, "sha256:4", false)
        .await
        .expect("start");
    assert!(matches!(
        store.activate(&scope("acme"), &environment.id, 4).await,
        Err(StoreError::NotReady(BuildStatus::Queued))
    ));
}

async fn an_expired_lease_is_fenced_and_the_build_requeued(store: Store) {
    let short = LeasePolicy {
        lease_ms: 50,
        max_attempts: 3,
        ..LEASES
    };
    let environment = store
        .create_environment(new("acme", "Fenced"))
        .await
        .expect("create");
    store
        .start_build(&scope("acme"), &environment.id, "sha256:s", false)
        .await
        .expect("start");
    let paused = store
        .claim_build("paused", short)
        .await
        .expect("claim")
        .expect("work");
    tokio::time::sleep(std::time::Duration::from_millis(120)).await;
    // The paused builder wakes after its lease: every write is refused.
    assert!(matches!(
        store.heartbeat(&paused.token, short.lease_ms).await,
        Err(StoreError::LeaseLost)
    ));
    assert!(matches!(
        store.append_log(&paused.token, "late").await,
        Err(StoreError::LeaseLost)
    ));
    assert!(matches!(
        store
            .complete_build(&paused.token, ready("sha256:stale"))
            .await,
        Err(StoreError::LeaseLost)
    ));
    // Another builder gets it, with a new token, as attempt 2.
    let second = store
        .claim_build("second", LEASES)
        .await
        .expect("claim")
        .expect("requeued");
    assert_eq!((second.build.version, second.build.attempt), (1, 2));
    assert_ne!(second.token, paused.token);
    assert!(matches!(
        store
            .complete_build(&paused.token, ready("sha256:stale"))
            .await,
        Err(StoreError::LeaseLost)
    ));
    store
        .complete_build(&second.token, ready("sha256:good"))
        .await
        .expect("complete");
    let read = store
        .get_environment(&scope("acme"), &environment.id)
        .await
        .expect("get");
    assert_eq!(read.builds.len(), 1, "exactly one version");
    assert_eq!(
        read.builds[0].layer_tree, "sha256:good",
        "the fenced builder's output is never referenced"
    );
    assert_eq!(read.active_version, Some(1));
}

async fn a_build_whose_builders_keep_vanishing_fails(store: Store) {
    let policy = LeasePolicy {
        lease_ms: 30,
        max_attempts: 2,
        ..LEASES
    };
    let environment = store
        .create_environment(new("acme", "Lost"))
        .await
        .expect("create");
    store
        .start_build(&scope("acme"), &environment.id, "sha256:s", false)
        .await
        .expect("start");
    for attempt in 1..=2 {
        let claim = store
            .claim_build("vanishing", policy)
            .await
            .expect("claim")
            .expect("work");
        assert_eq!(claim.build.attempt, attempt);
        tokio::time::sleep(std::time::Duration::from_millis(80)).await;
    }
    assert!(
        store
            .claim_build("next", policy)
            .await
            .expect("claim")
            .is_none()
    );
    let read = store
        .get_environment(&scope("acme"), &environment.id)
        .await
        .expect("get");
    assert_eq!(read.builds[0].status, BuildStatus::Failed);
    assert!(
        read.builds[0].error.contains("builder was lost"),
        "{}",
        read.builds[0].error
    );
    assert_eq!(read.status(), EnvironmentStatus::Failed);
    // A new build may start.
    store
        .start_build(&scope("acme"), &environment.id, "sha256:t", false)
        .await
        .expect("start again");
}

async fn deleting_waits_for_the_build_and_takes_its_versions(store: Store) {
    let environment = store
        .create_environment(new("acme", "Doomed"))
        .await
        .expect("create");
    store
        .start_build(&scope("acme"), &environment.id, "sha256:s", false)
        .await
        .expect("start");
    assert!(matches!(
        store
            .delete_environment(&scope("acme"), &environment.id)
            .await,
        Err(StoreError::Busy)
    ));
    let claim = store
        .claim_build("b", LEASES)
        .await
        .expect("claim")
        .expect("work");
    assert!(matches!(
        store
            .delete_environment(&scope("acme"), &environment.id)
            .await,
        Err(StoreError::Busy)
    ));
    store.append_log(&claim.token, "log").await.expect("log");
    store
        .complete_build(&claim.token, ready("sha256:l"))
        .await
        .expect("complete");
    store
        .delete_environment(&scope("acme"), &environment.id)
        .await
        .expect("delete");
    assert!(matches!(
        store.get_build(&scope("acme"), &environment.id, 1).await,
        Err(StoreError::NotFound)
    ));
    assert!(matches!(
        store
            .delete_environment(&scope("acme"), &environment.id)
            .await,
        Err(StoreError::NotFound)
    ));
}

async fn a_clean_build_reaches_its_builder_and_toolchains_are_kept(store: Store) {
    let environment = store
        .create_environment(new("acme", "Pinned"))
        .await
        .expect("create");
    store
        .start_build(&scope("acme"), &environment.id, "sha256:s", true)
        .await
        .expect("start");
    let claim = store
        .claim_build("b", LEASES)
        .await
        .expect("claim")
        .expect("work");
    assert!(claim.build.clean, "the builder is told to reuse nothing");
    let toolchains = vec![
        Toolchain {
            name: ToolchainName::Python,
            version: "3.11.7".into(),
            path: "/usr/bin/python3.11".into(),
        },
        Toolchain {
            name: ToolchainName::Node,
            version: "20.20.2".into(),
            path: "/usr/bin/node".into(),
        },
    ];
    let Outcome::Ready {
        layer_tree,
        packages,
        size,
        dependency_key,
        ..
    } = ready("sha256:l")
    else {
        unreachable!("ready")
    };
    let done = store
        .complete_build(
            &claim.token,
            Outcome::Ready {
                layer_tree,
                packages,
                size,
                dependency_key,
                toolchains: toolchains.clone(),
            },
        )
        .await
        .expect("complete");
    assert_eq!(done.toolchains, toolchains);
    let read = store
        .get_build(&scope("acme"), &environment.id, 1)
        .await
        .expect("get");
    assert!(read.clean);
    assert_eq!(read.toolchains, toolchains);
    // An ordinary build is not clean.
    let second = build_through(&store, &environment.id, "sha256:t", ready("sha256:m")).await;
    assert!(!second.clean);
    assert!(second.toolchains.is_empty());
}

async fn a_released_build_is_queued_again_at_once_and_its_lease_is_dead(store: Store) {
    let environment = store
        .create_environment(new("acme", "Released"))
        .await
        .expect("create");
    store
        .start_build(&scope("acme"), &environment.id, "sha256:s", false)
        .await
        .expect("start");
    let first = store
        .claim_build("stopping", LEASES)
        .await
        .expect("claim")
        .expect("work");
    store.release_build(&first.token).await.expect("release");
    // Long before the lease would have run out, another builder has it.
    let second = store
        .claim_build("other", LEASES)
        .await
        .expect("claim")
        .expect("the released build");
    assert_eq!(second.build.version, 1);
    assert_eq!(second.build.attempt, 2);
    // The released lease writes nothing any more, and cannot release twice.
    assert!(matches!(
        store.heartbeat(&first.token, LEASES.lease_ms).await,
        Err(StoreError::LeaseLost)
    ));
    assert!(matches!(
        store.release_build(&first.token).await,
        Err(StoreError::LeaseLost)
    ));
    store
        .complete_build(&second.token, ready("sha256:l"))
        .await
        .expect("complete");
}
