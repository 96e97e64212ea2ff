//! The Brain operation ledger, bindings and pinned sessions in the store, every backend: each
//! test below runs against SQLite and against PostgreSQL (`PLINTH_TEST_POSTGRES_URL`;
//! required under CI).

use std::time::Duration;

use plinth_catalog::brain::{
    Binding, BindingKey, BindingState, Claim, Lifetime, NewOperation, OperationKey, OperationState,
};
use plinth_catalog::model::{
    BuildStatus, EnvironmentId, NewEnvironment, Outcome, PageRequest, Scope,
};
use plinth_catalog::persistence::NewSession;
use plinth_catalog::{Store, StoreError};

use crate::LEASES;

backend_suite!(
    an_operation_runs_once_and_answers_its_receipt_ever_after,
    concurrent_deliveries_let_exactly_one_run,
    an_abandoned_operation_is_settled_once_and_its_runner_fenced,
    a_live_lease_is_never_settled,
    a_cancellation_reaches_the_runner_through_its_lease,
    a_release_waits_only_for_earlier_live_executions_of_its_binding,
    a_binding_is_set_up_once_and_its_session_swapped_by_compare_and_set,
    a_session_can_pin_a_ready_version_and_is_found_by_its_owner,
);

fn key(sequence: u64) -> OperationKey {
    OperationKey {
        adapter_id: "wadp_test".into(),
        session_id: "brain-session-1".into(),
        sequence,
    }
}

fn delivery(sequence: u64, kind: &str, runner: &str, lease_ms: i64) -> NewOperation {
    NewOperation {
        key: key(sequence),
        environment: "workspace".into(),
        kind: kind.into(),
        digest: format!("digest-{sequence}"),
        runner: runner.into(),
        lease_ms,
    }
}

fn binding_key() -> BindingKey {
    BindingKey {
        adapter_id: "wadp_test".into(),
        session_id: "brain-session-1".into(),
        environment: "workspace".into(),
    }
}

async fn an_operation_runs_once_and_answers_its_receipt_ever_after(store: Store) {
    let first = store
        .claim_operation(&delivery(1, "execute", "runner-a", 60_000))
        .await
        .expect("claim");
    let Claim::Started(started) = first else {
        panic!("a new operation is started: {first:?}")
    };
    assert_eq!(started.state, OperationState::Started);
    assert_eq!(started.runner, "runner-a");
    assert!(started.receipt.is_empty());

    // Delivered again while it runs: the first claim stands and its lease is live.
    let again = store
        .claim_operation(&delivery(1, "execute", "runner-b", 60_000))
        .await
        .expect("claim again");
    let Claim::Duplicate {
        operation,
        lease_live,
    } = again
    else {
        panic!("a second delivery is a duplicate: {again:?}")
    };
    assert!(lease_live);
    assert_eq!(operation.runner, "runner-a");

    // Only the runner that claimed it stores the receipt.
    let (recorded, _) = store
        .finish_operation(&key(1), "runner-b", r#"{"type":"result"}"#)
        .await
        .expect("finish by another");
    assert!(!recorded);
    let (recorded, finished) = store
        .finish_operation(&key(1), "runner-a", r#"{"type":"result","output":1}"#)
        .await
        .expect("finish");
    assert!(recorded);
    assert_eq!(finished.state, OperationState::Finished);
    assert_eq!(finished.receipt, r#"{"type":"result","output":1}"#);
    assert!(finished.finished_at_ms >= finished.started_at_ms);

    // Every later delivery finds that receipt, and nothing can replace it.
    let (recorded, _) = store
        .finish_operation(&key(1), "runner-a", r#"{"type":"result","output":2}"#)
        .await
        .expect("finish twice");
    assert!(!recorded);
    let later = store
        .claim_operation(&delivery(1, "execute", "runner-c", 60_000))
        .await
        .expect("claim after finish");
    let Claim::Duplicate {
        operation,
        lease_live,
    } = later
    else {
        panic!("still a duplicate: {later:?}")
    };
    assert!(!lease_live);
    assert_eq!(operation.receipt, r#"{"type":"result","output":1}"#);
    assert_eq!(operation.digest, "digest-1");

    // Another sequence of the session, or the same sequence of another session, is new.
    let other = store
        .claim_operation(&delivery(2, "execute", "runner-a", 60_000))
        .await
        .expect("next");
    assert!(matches!(other, Claim::Started(_)));
    let mut elsewhere = delivery(1, "execute", "runner-a", 60_000);
    elsewhere.key.session_id = "brain-session-2".into();
    let elsewhere = store.claim_operation(&elsewhere).await.expect("elsewhere");
    assert!(matches!(elsewhere, Claim::Started(_)));
    assert!(matches!(
        store.operation(&key(99)).await,
        Err(StoreError::NotFound)
    ));
}

async fn concurrent_deliveries_let_exactly_one_run(store: Store) {
    let mut tasks = Vec::new();
    for runner in 0..8 {
        let store = store.clone();
        tasks.push(plinth_kit::tasks::spawn(async move {
            store
                .claim_operation(&delivery(7, "execute", &format!("runner-{runner}"), 60_000))
                .await
                .expect("claim")
        }));
    }
    let mut started = Vec::new();
    for task in tasks {
        if let Claim::Started(operation) = task.await.expect("task") {
            started.push(operation.runner);
        }
    }
    assert_eq!(started.len(), 1, "{started:?}");
    let stored = store.operation(&key(7)).await.expect("stored");
    assert_eq!(stored.runner, started[0]);
}

async fn an_abandoned_operation_is_settled_once_and_its_runner_fenced(store: Store) {
    store
        .claim_operation(&delivery(3, "execute", "runner-a", 1))
        .await
        .expect("claim");
    tokio::time::sleep(Duration::from_millis(20)).await;
    let again = store
        .claim_operation(&delivery(3, "execute", "runner-b", 60_000))
        .await
        .expect("redelivery");
    let Claim::Duplicate {
        operation,
        lease_live,
    } = again
    else {
        panic!("a duplicate: {again:?}")
    };
    assert!(!lease_live, "the runner stopped renewing");
    assert_eq!(operation.state, OperationState::Started);

    let settled = store
        .settle_abandoned(&key(3), r#"{"type":"unknown"}"#)
        .await
        .expect("settle");
    assert_eq!(settled.state, OperationState::Finished);
    assert_eq!(settled.receipt, r#"{"type":"unknown"}"#);
    // A second settlement keeps the first receipt.
    let twice = store
        .settle_abandoned(&key(3), r#"{"type":"unknown","again":true}"#)
        .await
        .expect("settle twice");
    assert_eq!(twice.receipt, r#"{"type":"unknown"}"#);

    // The runner that wakes up late can neither renew nor overwrite what was answered.
    assert_eq!(
        store
            .renew_operation(&key(3), "runner-a", 60_000)
            .await
            .expect("renew"),
        None
    );
    let (recorded, stored) = store
        .finish_operation(&key(3), "runner-a", r#"{"type":"result"}"#)
        .await
        .expect("late finish");
    assert!(!recorded);
    assert_eq!(stored.receipt, r#"{"type":"unknown"}"#);
}

async fn a_live_lease_is_never_settled(store: Store) {
    store
        .claim_operation(&delivery(4, "execute", "runner-a", 60_000))
        .await
        .expect("claim");
    let untouched = store
        .settle_abandoned(&key(4), r#"{"type":"unknown"}"#)
        .await
        .expect("settle");
    assert_eq!(untouched.state, OperationState::Started);
    assert!(untouched.receipt.is_empty());
    // A renewed lease keeps it live: a lease of 1 ms renewed to a minute.
    store
        .claim_operation(&delivery(5, "execute", "runner-a", 1))
        .await
        .expect("claim");
    assert_eq!(
        store
            .renew_operation(&key(5), "runner-a", 60_000)
            .await
            .expect("renew"),
        Some(false)
    );
    tokio::time::sleep(Duration::from_millis(20)).await;
    let still = store
        .settle_abandoned(&key(5), r#"{"type":"unknown"}"#)
        .await
        .expect("settle");
    assert_eq!(still.state, OperationState::Started);
}

async fn a_cancellation_reaches_the_runner_through_its_lease(store: Store) {
    store
        .claim_operation(&delivery(6, "execute", "runner-a", 60_000))
        .await
        .expect("claim");
    let cancelled = store.cancel_operation(&key(6)).await.expect("cancel");
    assert!(cancelled.cancel_requested);
    assert_eq!(
        store
            .renew_operation(&key(6), "runner-a", 60_000)
            .await
            .expect("renew"),
        Some(true)
    );
    store
        .finish_operation(&key(6), "runner-a", r#"{"type":"failure"}"#)
        .await
        .expect("finish");
    // Cancelling what already finished changes nothing; what was never delivered is not found.
    let after = store.cancel_operation(&key(6)).await.expect("cancel after");
    assert_eq!(after.receipt, r#"{"type":"failure"}"#);
    assert!(matches!(
        store.cancel_operation(&key(60)).await,
        Err(StoreError::NotFound)
    ));
}

async fn a_release_waits_only_for_earlier_live_executions_of_its_binding(store: Store) {
    let binding = binding_key();
    assert_eq!(store.count_running(&binding, 100).await.expect("count"), 0);
    store
        .claim_operation(&delivery(10, "execute", "r", 60_000))
        .await
        .expect("claim");
    store
        .claim_operation(&delivery(11, "execute", "r", 60_000))
        .await
        .expect("claim");
    // Not an execution, a later one, a finished one, an abandoned one, another Environment.
    store
        .claim_operation(&delivery(12, "setup", "r", 60_000))
        .await
        .expect("claim");
    store
        .claim_operation(&delivery(30, "execute", "r", 60_000))
        .await
        .expect("claim");
    store
        .claim_operation(&delivery(13, "execute", "r", 60_000))
        .await
        .expect("claim");
    store
        .finish_operation(&key(13), "r", "{}")
        .await
        .expect("finish");
    store
        .claim_operation(&delivery(14, "execute", "r", 1))
        .await
        .expect("claim");
    let mut other = delivery(15, "execute", "r", 60_000);
    other.environment = "other".into();
    store.claim_operation(&other).await.expect("claim");
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(store.count_running(&binding, 20).await.expect("count"), 2);
    assert_eq!(store.count_running(&binding, 11).await.expect("count"), 1);
}

fn new_binding(environment: &EnvironmentId) -> Binding {
    Binding {
        key: binding_key(),
        scope: Scope::parse("acme").expect("scope"),
        environment_id: environment.clone(),
        version: 3,
        lifetime: Lifetime::Disposable,
        release_on_turn_end: true,
        plinth_session: None,
        state: BindingState::Attached,
        configuration: r#"{"lifetime":"disposable"}"#.into(),
        created_at_ms: 0,
        updated_at_ms: 0,
    }
}

async fn a_binding_is_set_up_once_and_its_session_swapped_by_compare_and_set(store: Store) {
    use plinth_catalog::sessions::SessionId;

    let environment = EnvironmentId::generate();
    assert!(matches!(
        store.binding(&binding_key()).await,
        Err(StoreError::NotFound)
    ));
    let first_session = SessionId::generate();
    let mut wanted = new_binding(&environment);
    wanted.plinth_session = Some(first_session.clone());
    let (created, binding) = store.create_binding(&wanted).await.expect("create");
    assert!(created);
    assert_eq!(binding.state, BindingState::Attached);
    assert_eq!(binding.version, 3);
    assert_eq!(binding.lifetime, Lifetime::Disposable);
    assert!(binding.release_on_turn_end);
    assert_eq!(binding.plinth_session.as_ref(), Some(&first_session));
    assert_eq!(binding.configuration, r#"{"lifetime":"disposable"}"#);

    // Set up again: the first stands.
    let mut again = new_binding(&environment);
    again.version = 9;
    let (created, kept) = store.create_binding(&again).await.expect("again");
    assert!(!created);
    assert_eq!(kept.version, 3);
    assert_eq!(kept.plinth_session.as_ref(), Some(&first_session));

    // Released: the session goes only if it is still the one expected.
    let stale = SessionId::generate();
    let (swapped, unchanged) = store
        .swap_binding_session(&binding_key(), Some(&stale), None)
        .await
        .expect("stale swap");
    assert!(!swapped);
    assert_eq!(unchanged.plinth_session.as_ref(), Some(&first_session));
    let (swapped, released) = store
        .swap_binding_session(&binding_key(), Some(&first_session), None)
        .await
        .expect("release");
    assert!(swapped);
    assert_eq!(released.plinth_session, None);

    // Two allocations race after the release: one wins, the other sees the winner.
    let (a, b) = (SessionId::generate(), SessionId::generate());
    let key = binding_key();
    let (first, second) = tokio::join!(
        store.swap_binding_session(&key, None, Some(&a)),
        store.swap_binding_session(&key, None, Some(&b)),
    );
    let (first, second) = (first.expect("a"), second.expect("b"));
    assert!(first.0 != second.0, "exactly one allocation wins");
    let winner = if first.0 { &a } else { &b };
    assert_eq!(first.1.plinth_session.as_ref(), Some(winner));
    assert_eq!(second.1.plinth_session.as_ref(), Some(winner));

    let detached = store
        .set_binding_state(&binding_key(), BindingState::Detached)
        .await
        .expect("detach");
    assert_eq!(detached.state, BindingState::Detached);
    let mut missing = binding_key();
    missing.environment = "none".into();
    assert!(matches!(
        store
            .set_binding_state(&missing, BindingState::TornDown)
            .await,
        Err(StoreError::NotFound)
    ));
}

async fn build(store: &Store, scope: &Scope, id: &EnvironmentId, outcome: Outcome) {
    store
        .start_build(scope, id, "tree", false)
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
        .expect("complete");
}

fn ready(layer: &str) -> Outcome {
    Outcome::Ready {
        layer_tree: layer.to_owned(),
        packages: Vec::new(),
        size: 1,
        dependency_key: String::new(),
        toolchains: Vec::new(),
    }
}

async fn a_session_can_pin_a_ready_version_and_is_found_by_its_owner(store: Store) {
    let scope = Scope::parse("acme").expect("scope");
    let environment = store
        .create_environment(
            NewEnvironment::new(scope.clone(), "Pinned".into(), String::new(), String::new())
                .expect("valid"),
        )
        .await
        .expect("create");
    build(&store, &scope, &environment.id, ready("layer-1")).await;
    build(&store, &scope, &environment.id, ready("layer-2")).await;
    build(
        &store,
        &scope,
        &environment.id,
        Outcome::Failed {
            error: "broken".into(),
        },
    )
    .await;
    let node = store
        .register_node("node-a", "http://127.0.0.1:1", true, "", "")
        .await
        .expect("node");
    store.node_heartbeat(&node, &[]).await.expect("heartbeat");
    let session = |version: Option<u32>, owner: &str| NewSession {
        scope: scope.clone(),
        environment_id: environment.id.clone(),
        version,
        harness_id: String::new(),
        owner: owner.to_owned(),
        live_since_ms: 0,
        exclude_node: None,
        workdir_at_placement: true,
        limits: Default::default(),
    };

    let active = store
        .create_session(session(None, ""))
        .await
        .expect("active");
    assert_eq!(active.version, 2);
    assert_eq!(active.layer_tree, "layer-2");
    let pinned = store
        .create_session(session(Some(1), "brain:a:s:e"))
        .await
        .expect("pinned");
    assert_eq!(pinned.version, 1);
    assert_eq!(pinned.layer_tree, "layer-1");
    assert_eq!(pinned.owner, "brain:a:s:e");
    assert!(matches!(
        store.create_session(session(Some(3), "")).await,
        Err(StoreError::NotReady(BuildStatus::Failed))
    ));
    assert!(matches!(
        store.create_session(session(Some(9), "")).await,
        Err(StoreError::NothingBuilt)
    ));

    let owned = store
        .owned_sessions(&scope, "brain:a:s:e", &PageRequest::first())
        .await
        .expect("owned");
    assert_eq!(
        owned.items.iter().map(|s| s.id.clone()).collect::<Vec<_>>(),
        vec![pinned.id.clone()]
    );
    let other_scope = Scope::parse("globex").expect("scope");
    assert!(
        store
            .owned_sessions(&other_scope, "brain:a:s:e", &PageRequest::first())
            .await
            .expect("other scope")
            .items
            .is_empty()
    );
    store.end_session(&scope, &pinned.id).await.expect("end");
    assert!(
        store
            .owned_sessions(&scope, "brain:a:s:e", &PageRequest::first())
            .await
            .expect("owned after end")
            .items
            .is_empty()
    );
}
