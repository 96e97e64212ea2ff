//! Retention and the catalog's part in garbage collection, every backend: each test below
//! runs against SQLite and against PostgreSQL (`PLINTH_TEST_POSTGRES_URL`; required under CI).

use std::collections::BTreeSet;
use std::time::Duration;

use plinth_catalog::adapters::{NewAdapter, Protocol};
use plinth_catalog::brain::{
    Binding, BindingKey, BindingState, Lifetime, NewOperation, OperationKey,
};
use plinth_catalog::model::{
    EnvironmentId, LeaseToken, NewEnvironment, Outcome, PageRequest, Scope,
};
use plinth_catalog::sessions::{SessionLimits, TurnKind};
use plinth_catalog::{NewSession, NewTask, RetentionPolicy, Store, StoreError};

use crate::LEASES;

backend_suite!(
    retention_keeps_the_active_the_pinned_and_the_newest_ready_versions,
    records_of_ended_work_go_after_the_retention_period_and_live_ones_stay,
    a_builds_holds_keep_its_blobs_until_it_ends,
    a_hold_waits_while_a_collection_fence_stands,
    a_layer_a_build_reuses_stays_kept_when_its_version_is_retired,
    a_deleted_environment_is_named_to_the_collector_for_the_retention_period,
);

fn scope() -> Scope {
    Scope::parse("acme").expect("scope")
}

fn digest(name: &str) -> String {
    format!("sha256:{}", hex_of(name))
}

/// 64 hex digits derived from `name` (tests need distinct, well-formed digests).
fn hex_of(name: &str) -> String {
    let mut hex = String::new();
    for byte in name.bytes().cycle().take(32) {
        hex.push_str(&format!("{byte:02x}"));
    }
    hex
}

async fn environment(store: &Store, name: &str) -> EnvironmentId {
    store
        .create_environment(
            NewEnvironment::new(scope(), name.to_owned(), String::new(), String::new())
                .expect("valid"),
        )
        .await
        .expect("create")
        .id
}

/// Claims the next queued build; answers its lease.
async fn claim(store: &Store) -> LeaseToken {
    store
        .claim_build("builder", LEASES)
        .await
        .expect("claim")
        .expect("work")
        .token
}

/// Builds the next version of `id` to `outcome` (ready with `layer`, or failed).
async fn build(store: &Store, id: &EnvironmentId, layer: Option<&str>, key: &str) -> u32 {
    let queued = store
        .start_build(&scope(), id, &digest("source"), false)
        .await
        .expect("start");
    let token = claim(store).await;
    let outcome = match layer {
        Some(layer) => Outcome::Ready {
            layer_tree: layer.to_owned(),
            packages: Vec::new(),
            size: 1,
            dependency_key: key.to_owned(),
            toolchains: Vec::new(),
        },
        None => Outcome::Failed {
            error: "it failed".to_owned(),
        },
    };
    store
        .complete_build(&token, outcome)
        .await
        .expect("complete");
    queued.version
}

async fn versions(store: &Store, id: &EnvironmentId) -> Vec<u32> {
    let mut versions: Vec<u32> = store
        .get_environment(&scope(), id)
        .await
        .expect("environment")
        .builds
        .iter()
        .map(|build| build.version)
        .collect();
    versions.sort();
    versions
}

fn session(id: &EnvironmentId, version: Option<u32>) -> NewSession {
    NewSession {
        scope: scope(),
        environment_id: id.clone(),
        version,
        harness_id: String::new(),
        owner: String::new(),
        live_since_ms: 0,
        exclude_node: None,
        workdir_at_placement: true,
        limits: SessionLimits::default(),
    }
}

fn binding(id: &EnvironmentId, version: u32, brain_session: &str) -> Binding {
    Binding {
        key: BindingKey {
            adapter_id: "adp_test".to_owned(),
            session_id: brain_session.to_owned(),
            environment: "main".to_owned(),
        },
        scope: scope(),
        environment_id: id.clone(),
        version,
        lifetime: Lifetime::Workspace,
        release_on_turn_end: false,
        plinth_session: None,
        state: BindingState::Attached,
        configuration: "{}".to_owned(),
        created_at_ms: 0,
        updated_at_ms: 0,
    }
}

fn keep(versions: u32) -> RetentionPolicy {
    RetentionPolicy {
        keep_versions: versions,
        ..RetentionPolicy::default()
    }
}

/// What a collector would keep, without raising the fence.
async fn kept_trees(store: &Store) -> BTreeSet<String> {
    store
        .begin_collection(0)
        .await
        .expect("roots")
        .trees
        .into_iter()
        .collect()
}

async fn retention_keeps_the_active_the_pinned_and_the_newest_ready_versions(store: Store) {
    store
        .register_node("host-a", "http://10.0.0.1:7005", true, "", "")
        .await
        .expect("node");
    let id = environment(&store, "Kept").await;
    let layer = |version: u32| digest(&format!("layer-{version}"));
    for version in 1..=6 {
        assert_eq!(build(&store, &id, Some(&layer(version)), "").await, version);
    }
    store.activate(&scope(), &id, 2).await.expect("activate 2");
    let reader = store
        .create_session(session(&id, Some(3)))
        .await
        .expect("a session reads version 3");
    let (created, _) = store
        .create_binding(&binding(&id, 1, "brain-1"))
        .await
        .expect("a binding pins version 1");
    assert!(created);
    // Another environment's versions are its own.
    let other = environment(&store, "Other").await;
    for version in 1..=3 {
        build(
            &store,
            &other,
            Some(&digest(&format!("other-{version}"))),
            "",
        )
        .await;
    }
    // A build in flight is never retired.
    store
        .start_build(&scope(), &other, &digest("source"), false)
        .await
        .expect("queued");
    claim(&store).await;

    let retired = store.apply_retention(keep(2)).await.expect("retention");
    assert_eq!(retired.versions, 2, "{retired:?}");
    assert_eq!(
        versions(&store, &id).await,
        [1, 2, 3, 5, 6],
        "active (2), read by a session (3), pinned by a binding (1), the newest two (5, 6)"
    );
    assert_eq!(versions(&store, &other).await, [2, 3, 4]);
    assert!(matches!(
        store.read_log(&scope(), &id, 4, 0).await,
        Err(StoreError::NotFound)
    ));
    let trees = kept_trees(&store).await;
    assert!(trees.contains(&layer(1)) && trees.contains(&layer(3)) && trees.contains(&layer(6)));
    assert!(
        !trees.contains(&layer(4)),
        "a retired version's layer is not kept"
    );
    // Applied again, nothing more goes.
    assert_eq!(
        store
            .apply_retention(keep(2))
            .await
            .expect("again")
            .versions,
        0
    );

    // Once the session ends and the binding is torn down, their versions go too.
    store.end_session(&scope(), &reader.id).await.expect("end");
    store
        .set_binding_state(&binding(&id, 1, "brain-1").key, BindingState::TornDown)
        .await
        .expect("tear down");
    store.apply_retention(keep(2)).await.expect("retention");
    assert_eq!(versions(&store, &id).await, [2, 5, 6]);

    // A failed build stays while it is the latest (the environment shows its failure), and
    // goes once enough ready versions follow it.
    let failed = build(&store, &id, None, "").await;
    store.apply_retention(keep(2)).await.expect("retention");
    assert!(versions(&store, &id).await.contains(&failed));
    build(&store, &id, Some(&layer(8)), "").await;
    build(&store, &id, Some(&layer(9)), "").await;
    store
        .activate(&scope(), &id, 2)
        .await
        .expect("activate 2 again");
    store.apply_retention(keep(2)).await.expect("retention");
    assert_eq!(versions(&store, &id).await, [2, 8, 9]);
    let environment = store.get_environment(&scope(), &id).await.expect("get");
    assert_eq!(
        environment.active_version,
        Some(2),
        "activation is untouched"
    );
}

async fn records_of_ended_work_go_after_the_retention_period_and_live_ones_stay(store: Store) {
    store
        .register_node("host-a", "http://10.0.0.1:7005", true, "", "")
        .await
        .expect("node");
    let id = environment(&store, "Records").await;
    build(&store, &id, Some(&digest("layer")), "").await;
    let live = store
        .create_session(session(&id, None))
        .await
        .expect("live");
    store
        .record_turn(&scope(), &live.id, TurnKind::Exec, "true", Some(0))
        .await
        .expect("turn");
    let task = store
        .create_task(NewTask {
            input: "do it".to_owned(),
            metadata: "{}".to_owned(),
            session: session(&id, None),
        })
        .await
        .expect("task");
    let ended_with_task = task.session.id.clone();
    store
        .record_turn(&scope(), &ended_with_task, TurnKind::Exec, "true", Some(0))
        .await
        .expect("turn");
    store
        .end_session(&scope(), &ended_with_task)
        .await
        .expect("end");
    // A session a Brain binding still names stays, ended or not.
    let named = store
        .create_session(session(&id, None))
        .await
        .expect("named");
    store.end_session(&scope(), &named.id).await.expect("end");
    let mut held = binding(&id, 1, "brain-2");
    held.plinth_session = Some(named.id.clone());
    store.create_binding(&held).await.expect("binding");
    // A binding torn down goes with its session's receipts; an attached one stays.
    let torn = binding(&id, 1, "brain-3");
    store.create_binding(&torn).await.expect("binding");
    store
        .set_binding_state(&torn.key, BindingState::TornDown)
        .await
        .expect("tear down");
    // More ended sessions than one batch.
    for _ in 0..520 {
        let gone = store
            .create_session(session(&id, None))
            .await
            .expect("session");
        store.end_session(&scope(), &gone.id).await.expect("end");
    }
    // An adapter's run whose session ended.
    let adapter = store
        .create_adapter(NewAdapter {
            scope: scope(),
            protocol: Protocol::Novo,
            environment_id: id.clone(),
            stored_credential: "a-secret-of-enough-length".to_owned(),
            callback_origins: Vec::new(),
        })
        .await
        .expect("adapter");
    let run = store
        .open_run(&adapter, "run-1", 0, SessionLimits::default())
        .await
        .expect("run");
    store
        .end_session(&scope(), &run.session.id)
        .await
        .expect("end");
    // A finished Brain operation, and a running one.
    let operation = |sequence| OperationKey {
        adapter_id: "adp_test".to_owned(),
        session_id: "brain-9".to_owned(),
        sequence,
    };
    for sequence in [1, 2] {
        store
            .claim_operation(
                &NewOperation {
                    key: operation(sequence),
                    environment: "main".to_owned(),
                    kind: plinth_catalog::brain::OperationKind::Execute,
                    digest: "d".to_owned(),
                    runner: "runner".to_owned(),
                    lease_ms: 60_000,
                },
                "{\"type\":\"unknown\"}",
            )
            .await
            .expect("claim");
    }
    store
        .finish_operation(&operation(1), "runner", "{\"receipt\":1}", &[])
        .await
        .expect("finish");
    // An idempotency record answered, and one answered but kept a day.
    let done = store
        .claim_key(&adapter.id, "key-1", "run-1", "body", 60_000, 0)
        .await
        .expect("claim key");
    let plinth_catalog::persistence::Claimed::Claimed(claim_token) = done else {
        panic!("claimed: {done:?}")
    };
    store
        .finish_key(&adapter.id, "key-1", &claim_token, (200, "{}"), None, 0)
        .await
        .expect("finish key");
    let kept = store
        .claim_key(&adapter.id, "key-2", "run-1", "body", 60_000, 86_400_000)
        .await
        .expect("claim key");
    let plinth_catalog::persistence::Claimed::Claimed(kept_token) = kept else {
        panic!("claimed: {kept:?}")
    };
    store
        .finish_key(
            &adapter.id,
            "key-2",
            &kept_token,
            (200, "{}"),
            None,
            86_400_000,
        )
        .await
        .expect("finish key");

    // Within the retention period nothing of ended work goes but the expired record.
    let retired = store
        .apply_retention(RetentionPolicy::default())
        .await
        .expect("retention");
    assert_eq!(retired.sessions, 0, "{retired:?}");
    assert_eq!(retired.idempotency_keys, 1, "{retired:?}");
    assert!(store.operation(&operation(1)).await.is_ok());

    tokio::time::sleep(Duration::from_millis(20)).await;
    let retired = store
        .apply_retention(RetentionPolicy {
            retention_ms: 0,
            ..RetentionPolicy::default()
        })
        .await
        .expect("retention");
    assert_eq!(
        (retired.sessions, retired.tasks, retired.brain_operations),
        (522, 1, 1),
        "{retired:?}"
    );
    assert!(retired.adapter_runs >= 1, "{retired:?}");
    assert_eq!(retired.brain_bindings, 1, "{retired:?}");
    assert!(matches!(
        store.binding(&torn.key).await,
        Err(StoreError::NotFound)
    ));
    assert!(store.binding(&held.key).await.is_ok());
    // The live session, its turns, the session a binding names, and the running operation
    // stay; the rest is gone.
    assert_eq!(
        store
            .list_turns(&scope(), &live.id, &PageRequest::first())
            .await
            .expect("live turns")
            .items
            .len(),
        1
    );
    assert!(store.get_session(&scope(), &named.id).await.is_ok());
    for gone in [&ended_with_task, &run.session.id] {
        assert!(matches!(
            store.get_session(&scope(), gone).await,
            Err(StoreError::NotFound)
        ));
    }
    assert!(matches!(
        store.operation(&operation(1)).await,
        Err(StoreError::NotFound)
    ));
    assert!(store.operation(&operation(2)).await.is_ok());
    // The run's id starts a new session now; the record kept a day still answers.
    let again = store
        .open_run(&adapter, "run-1", 0, SessionLimits::default())
        .await
        .expect("run again");
    assert!(again.created && again.session.id != run.session.id);
    assert!(matches!(
        store
            .claim_key(&adapter.id, "key-2", "run-1", "body", 60_000, 0)
            .await
            .expect("claim key"),
        plinth_catalog::persistence::Claimed::Done { .. }
    ));
}

async fn a_builds_holds_keep_its_blobs_until_it_ends(store: Store) {
    let id = environment(&store, "Held").await;
    store
        .start_build(&scope(), &id, &digest("source"), false)
        .await
        .expect("start");
    let token = claim(&store).await;
    store
        .hold_blobs(
            &token,
            &[digest("file-a"), digest("file-b"), digest("file-a")],
            &[digest("reused-layer")],
        )
        .await
        .expect("hold");
    let roots = store.begin_collection(0).await.expect("roots");
    assert_eq!(roots.fence_until_ms, 0, "no fence was raised");
    assert_eq!(roots.blobs, [digest("file-a"), digest("file-b")]);
    assert!(roots.trees.contains(&digest("reused-layer")));
    assert!(
        roots.trees.contains(&digest("source")),
        "a build in flight keeps its source"
    );

    store
        .complete_build(
            &token,
            Outcome::Ready {
                layer_tree: digest("layer"),
                packages: Vec::new(),
                size: 1,
                dependency_key: String::new(),
                toolchains: Vec::new(),
            },
        )
        .await
        .expect("complete");
    let roots = store.begin_collection(0).await.expect("roots");
    assert!(roots.blobs.is_empty(), "holds end with the build");
    assert_eq!(roots.trees, [digest("layer")]);
    assert!(matches!(
        store.hold_blobs(&token, &[digest("late")], &[]).await,
        Err(StoreError::LeaseLost)
    ));
}

async fn a_hold_waits_while_a_collection_fence_stands(store: Store) {
    let id = environment(&store, "Fenced").await;
    store
        .start_build(&scope(), &id, &digest("source"), false)
        .await
        .expect("start");
    let token = claim(&store).await;
    let roots = store.begin_collection(30_000).await.expect("fence");
    assert!(roots.fence_until_ms > 0);
    let holding = {
        let (store, token) = (store.clone(), token.clone());
        plinth_kit::tasks::spawn(
            async move { store.hold_blobs(&token, &[digest("blob")], &[]).await },
        )
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!holding.is_finished(), "the hold waits for the fence");
    assert!(
        store
            .begin_collection(0)
            .await
            .expect("roots")
            .blobs
            .is_empty(),
        "and is not recorded meanwhile"
    );
    store.end_collection().await.expect("lower");
    holding
        .await
        .expect("joined")
        .expect("held once the fence fell");
    assert_eq!(
        store.begin_collection(0).await.expect("roots").blobs,
        [digest("blob")]
    );
}

async fn a_layer_a_build_reuses_stays_kept_when_its_version_is_retired(store: Store) {
    let id = environment(&store, "Reused").await;
    build(&store, &id, Some(&digest("old-layer")), "key-1").await;
    build(&store, &id, Some(&digest("new-layer")), "key-2").await;
    // The next build reuses version 1's dependencies: the catalog holds its layer for it.
    store
        .start_build(&scope(), &id, &digest("source-3"), false)
        .await
        .expect("start");
    let token = claim(&store).await;
    let (_, dependencies) = store
        .find_reusable(&token, "key-1")
        .await
        .expect("reusable");
    assert_eq!(
        dependencies.map(|build| build.layer_tree),
        Some(digest("old-layer"))
    );
    let retired = store.apply_retention(keep(1)).await.expect("retention");
    assert_eq!(retired.versions, 1);
    assert_eq!(versions(&store, &id).await, [2, 3]);
    assert!(
        kept_trees(&store).await.contains(&digest("old-layer")),
        "the build still holds the layer it reuses"
    );
    store
        .complete_build(
            &token,
            Outcome::Failed {
                error: "stopped".to_owned(),
            },
        )
        .await
        .expect("complete");
    assert!(!kept_trees(&store).await.contains(&digest("old-layer")));
}

async fn a_deleted_environment_is_named_to_the_collector_for_the_retention_period(store: Store) {
    let id = environment(&store, "Gone").await;
    build(&store, &id, Some(&digest("gone-layer")), "").await;
    store
        .delete_environment(&scope(), &id)
        .await
        .expect("delete");
    let roots = store.begin_collection(0).await.expect("roots");
    assert_eq!(roots.deleted_environments, [id.as_str().to_owned()]);
    assert!(!roots.trees.contains(&digest("gone-layer")));
    store
        .apply_retention(RetentionPolicy::default())
        .await
        .expect("retention");
    assert_eq!(
        store
            .begin_collection(0)
            .await
            .expect("roots")
            .deleted_environments,
        [id.as_str().to_owned()]
    );
    tokio::time::sleep(Duration::from_millis(20)).await;
    let retired = store
        .apply_retention(RetentionPolicy {
            retention_ms: 0,
            ..RetentionPolicy::default()
        })
        .await
        .expect("retention");
    assert_eq!(retired.deleted_environments, 1);
    assert!(
        store
            .begin_collection(0)
            .await
            .expect("roots")
            .deleted_environments
            .is_empty()
    );
}
