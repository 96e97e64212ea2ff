//! The Brain operation ledger, bindings and pinned sessions in the store, every backend: each
//! test below runs against SQLite and against PostgreSQL (`PLINTH_TEST_POSTGRES_URL`;
//! required under CI).

use std::time::Duration;

use plinth_catalog::brain::{
    Binding, BindingKey, BindingState, Claim, Lifetime, NewOperation, OperationKey, OperationKind,
    OperationState,
};
use plinth_catalog::model::{
    BuildStatus, EnvironmentId, NewEnvironment, Outcome, PageRequest, Scope,
};
use plinth_catalog::persistence::{NewSession, NewTurn};
use plinth_catalog::sessions::CacheReport;
use plinth_catalog::{Store, StoreError};

use crate::LEASES;

backend_suite!(
    an_operation_runs_once_and_answers_its_receipt_ever_after,
    concurrent_deliveries_let_exactly_one_run,
    an_abandoned_operation_is_settled_once_and_its_runner_fenced,
    a_live_lease_is_never_settled,
    a_reused_sequence_is_refused_and_changes_nothing,
    a_receipt_and_its_turns_are_one_write_and_a_repeat_records_none,
    a_read_is_recorded_once_and_every_delivery_answers_the_first_receipt,
    a_record_meets_a_claim_as_a_repeat_would,
    a_ledger_write_cut_off_midway_never_makes_two_answers,
    a_torn_down_binding_is_neither_detached_nor_attached_again,
    a_session_is_given_only_to_an_attached_binding,
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

/// The receipt a delivery that finds its operation abandoned settles it with.
const UNKNOWN: &str = r#"{"type":"unknown"}"#;

fn delivery(sequence: u64, kind: OperationKind, runner: &str, lease_ms: i64) -> NewOperation {
    NewOperation {
        key: key(sequence),
        environment: "workspace".into(),
        kind,
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
        .claim_operation(
            &delivery(1, OperationKind::Execute, "runner-a", 60_000),
            UNKNOWN,
        )
        .await
        .expect("claim");
    let Claim::Claimed(started) = first else {
        panic!("a new operation is started: {first:?}")
    };
    assert_eq!(started.state, OperationState::Started);
    assert_eq!(started.runner, "runner-a");
    assert!(started.receipt.is_empty());

    // Delivered again while it runs: the first claim stands and its lease is live.
    let again = store
        .claim_operation(
            &delivery(1, OperationKind::Execute, "runner-b", 60_000),
            UNKNOWN,
        )
        .await
        .expect("claim again");
    let Claim::InProgress(operation) = again else {
        panic!("a second delivery while the first runs is in progress: {again:?}")
    };
    assert_eq!(operation.runner, "runner-a");

    // Only the runner that claimed it stores the receipt.
    let (recorded, _) = store
        .finish_operation(&key(1), "runner-b", r#"{"type":"result"}"#, &[])
        .await
        .expect("finish by another");
    assert!(!recorded);
    let (recorded, finished) = store
        .finish_operation(&key(1), "runner-a", r#"{"type":"result","output":1}"#, &[])
        .await
        .expect("finish");
    assert!(recorded);
    assert_eq!(finished.state, OperationState::Finished);
    assert_eq!(finished.receipt, r#"{"type":"result","output":1}"#);
    assert!(finished.finished_at_ms >= finished.started_at_ms);

    // Every later delivery finds that receipt, and nothing can replace it.
    let (recorded, _) = store
        .finish_operation(&key(1), "runner-a", r#"{"type":"result","output":2}"#, &[])
        .await
        .expect("finish twice");
    assert!(!recorded);
    let later = store
        .claim_operation(
            &delivery(1, OperationKind::Execute, "runner-c", 60_000),
            UNKNOWN,
        )
        .await
        .expect("claim after finish");
    let Claim::Duplicate(operation) = later else {
        panic!("a duplicate of a finished operation: {later:?}")
    };
    assert_eq!(operation.receipt, r#"{"type":"result","output":1}"#);
    assert_eq!(operation.digest, "digest-1");

    // Another sequence of the session, or the same sequence of another session, is new.
    let other = store
        .claim_operation(
            &delivery(2, OperationKind::Execute, "runner-a", 60_000),
            UNKNOWN,
        )
        .await
        .expect("next");
    assert!(matches!(other, Claim::Claimed(_)));
    let mut elsewhere = delivery(1, OperationKind::Execute, "runner-a", 60_000);
    elsewhere.key.session_id = "brain-session-2".into();
    let elsewhere = store
        .claim_operation(&elsewhere, UNKNOWN)
        .await
        .expect("elsewhere");
    assert!(matches!(elsewhere, Claim::Claimed(_)));
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
                .claim_operation(
                    &delivery(
                        7,
                        OperationKind::Execute,
                        &format!("runner-{runner}"),
                        60_000,
                    ),
                    UNKNOWN,
                )
                .await
                .expect("claim")
        }));
    }
    let mut started = Vec::new();
    for task in tasks {
        if let Claim::Claimed(operation) = task.await.expect("task") {
            started.push(operation.runner);
        }
    }
    assert_eq!(started.len(), 1, "{started:?}");
    let stored = store.operation(&key(7)).await.expect("stored");
    assert_eq!(stored.runner, started[0]);
}

async fn an_abandoned_operation_is_settled_once_and_its_runner_fenced(store: Store) {
    store
        .claim_operation(&delivery(3, OperationKind::Execute, "runner-a", 1), UNKNOWN)
        .await
        .expect("claim");
    tokio::time::sleep(Duration::from_millis(20)).await;
    // The runner stopped renewing: the redelivery settles it with the receipt it carries, in
    // its own claim.
    let again = store
        .claim_operation(
            &delivery(3, OperationKind::Execute, "runner-b", 60_000),
            UNKNOWN,
        )
        .await
        .expect("redelivery");
    let Claim::SettledUnknown(settled) = again else {
        panic!("an abandoned operation is settled: {again:?}")
    };
    assert_eq!(settled.state, OperationState::Finished);
    assert_eq!(settled.receipt, UNKNOWN);
    assert_eq!(settled.runner, "runner-a", "the redelivery does not run it");

    // Every later delivery gets that receipt; a later `unknown` does not replace it.
    let twice = store
        .claim_operation(
            &delivery(3, OperationKind::Execute, "runner-c", 60_000),
            r#"{"type":"unknown","again":true}"#,
        )
        .await
        .expect("settle twice");
    let Claim::Duplicate(twice) = twice else {
        panic!("settled once, a duplicate after: {twice:?}")
    };
    assert_eq!(twice.receipt, UNKNOWN);

    // The runner that wakes up late can neither renew nor overwrite what was answered.
    assert_eq!(
        store
            .renew_operation(&key(3), "runner-a", 60_000)
            .await
            .expect("renew"),
        None
    );
    let (recorded, stored) = store
        .finish_operation(&key(3), "runner-a", r#"{"type":"result"}"#, &[])
        .await
        .expect("late finish");
    assert!(!recorded);
    assert_eq!(stored.receipt, UNKNOWN);
}

async fn a_live_lease_is_never_settled(store: Store) {
    store
        .claim_operation(
            &delivery(4, OperationKind::Execute, "runner-a", 60_000),
            UNKNOWN,
        )
        .await
        .expect("claim");
    let untouched = store
        .claim_operation(
            &delivery(4, OperationKind::Execute, "runner-b", 60_000),
            UNKNOWN,
        )
        .await
        .expect("redelivery");
    let Claim::InProgress(untouched) = untouched else {
        panic!("a live lease is in progress: {untouched:?}")
    };
    assert_eq!(untouched.state, OperationState::Started);
    assert!(untouched.receipt.is_empty());
    // A renewed lease keeps it live: a lease of 1 ms renewed to a minute.
    store
        .claim_operation(&delivery(5, OperationKind::Execute, "runner-a", 1), UNKNOWN)
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
        .claim_operation(
            &delivery(5, OperationKind::Execute, "runner-b", 60_000),
            UNKNOWN,
        )
        .await
        .expect("redelivery");
    assert!(
        matches!(&still, Claim::InProgress(operation) if operation.state == OperationState::Started),
        "{still:?}"
    );
}

async fn a_reused_sequence_is_refused_and_changes_nothing(store: Store) {
    // Running, abandoned or finished: another request under the sequence is refused, and the
    // first is untouched (an abandoned one is not settled by it).
    store
        .claim_operation(&delivery(8, OperationKind::Execute, "runner-a", 1), UNKNOWN)
        .await
        .expect("claim");
    tokio::time::sleep(Duration::from_millis(20)).await;
    let mut other = delivery(8, OperationKind::Setup, "runner-b", 60_000);
    other.digest = "another request".into();
    let reused = store.claim_operation(&other, UNKNOWN).await.expect("reuse");
    let Claim::SequenceReused(stored) = reused else {
        panic!("another request under a sequence: {reused:?}")
    };
    assert_eq!(stored.state, OperationState::Started);
    assert_eq!(stored.kind, OperationKind::Execute);
    assert_eq!(stored.digest, "digest-8");
    // The same request still finds it abandoned, and settles it.
    assert!(matches!(
        store
            .claim_operation(
                &delivery(8, OperationKind::Execute, "runner-c", 60_000),
                UNKNOWN
            )
            .await
            .expect("redelivery"),
        Claim::SettledUnknown(_)
    ));
    assert!(matches!(
        store.claim_operation(&other, UNKNOWN).await.expect("reuse"),
        Claim::SequenceReused(_)
    ));
}

async fn a_cancellation_reaches_the_runner_through_its_lease(store: Store) {
    store
        .claim_operation(
            &delivery(6, OperationKind::Execute, "runner-a", 60_000),
            UNKNOWN,
        )
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
        .finish_operation(&key(6), "runner-a", r#"{"type":"failure"}"#, &[])
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
        .claim_operation(&delivery(10, OperationKind::Execute, "r", 60_000), UNKNOWN)
        .await
        .expect("claim");
    store
        .claim_operation(&delivery(11, OperationKind::Execute, "r", 60_000), UNKNOWN)
        .await
        .expect("claim");
    // Not an execution, a later one, a finished one, an abandoned one, another Environment.
    store
        .claim_operation(&delivery(12, OperationKind::Setup, "r", 60_000), UNKNOWN)
        .await
        .expect("claim");
    store
        .claim_operation(&delivery(30, OperationKind::Execute, "r", 60_000), UNKNOWN)
        .await
        .expect("claim");
    store
        .claim_operation(&delivery(13, OperationKind::Execute, "r", 60_000), UNKNOWN)
        .await
        .expect("claim");
    store
        .finish_operation(&key(13), "r", "{}", &[])
        .await
        .expect("finish");
    store
        .claim_operation(&delivery(14, OperationKind::Execute, "r", 1), UNKNOWN)
        .await
        .expect("claim");
    let mut other = delivery(15, OperationKind::Execute, "r", 60_000);
    other.environment = "other".into();
    store.claim_operation(&other, UNKNOWN).await.expect("claim");
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

async fn a_torn_down_binding_is_neither_detached_nor_attached_again(store: Store) {
    let environment = EnvironmentId::generate();
    store
        .create_binding(&new_binding(&environment))
        .await
        .expect("create");
    // Attached and detached move either way; the same state again changes nothing.
    for state in [
        BindingState::Detached,
        BindingState::Detached,
        BindingState::Attached,
        BindingState::Attached,
        BindingState::TornDown,
        BindingState::TornDown,
    ] {
        let moved = store
            .set_binding_state(&binding_key(), state)
            .await
            .unwrap_or_else(|error| panic!("move to {state:?}: {error}"));
        assert_eq!(moved.state, state);
    }
    // Torn down is final.
    for state in [BindingState::Detached, BindingState::Attached] {
        let refused = store.set_binding_state(&binding_key(), state).await;
        assert!(
            matches!(
                refused,
                Err(StoreError::BindingState(BindingState::TornDown))
            ),
            "{state:?}: {refused:?}"
        );
    }
    assert_eq!(
        store.binding(&binding_key()).await.expect("binding").state,
        BindingState::TornDown
    );
}

async fn a_session_is_given_only_to_an_attached_binding(store: Store) {
    use plinth_catalog::sessions::SessionId;

    let environment = EnvironmentId::generate();
    store
        .create_binding(&new_binding(&environment))
        .await
        .expect("create");
    let key = binding_key();
    store
        .set_binding_state(&key, BindingState::Detached)
        .await
        .expect("detach");
    let session = SessionId::generate();
    let refused = store.swap_binding_session(&key, None, Some(&session)).await;
    assert!(
        matches!(
            refused,
            Err(StoreError::BindingState(BindingState::Detached))
        ),
        "{refused:?}"
    );
    assert_eq!(
        store.binding(&key).await.expect("binding").plinth_session,
        None
    );
    // Attached again, it takes one; torn down, it can still have it taken away.
    store
        .set_binding_state(&key, BindingState::Attached)
        .await
        .expect("attach");
    let (swapped, _) = store
        .swap_binding_session(&key, None, Some(&session))
        .await
        .expect("give");
    assert!(swapped);
    store
        .set_binding_state(&key, BindingState::TornDown)
        .await
        .expect("tear down");
    let (swapped, taken) = store
        .swap_binding_session(&key, Some(&session), None)
        .await
        .expect("take");
    assert!(swapped);
    assert_eq!(taken.plinth_session, None);
    assert!(matches!(
        store.swap_binding_session(&key, None, Some(&session)).await,
        Err(StoreError::BindingState(BindingState::TornDown))
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
    store
        .node_heartbeat(
            &node,
            CacheReport::Whole {
                digest: None,
                versions: Vec::new(),
            },
        )
        .await
        .expect("heartbeat");
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

async fn a_receipt_and_its_turns_are_one_write_and_a_repeat_records_none(store: Store) {
    use plinth_catalog::sessions::TurnKind;

    let scope = Scope::parse("acme").expect("scope");
    let environment = store
        .create_environment(
            NewEnvironment::new(scope.clone(), "Turns".into(), String::new(), String::new())
                .expect("valid"),
        )
        .await
        .expect("create");
    build(&store, &scope, &environment.id, ready("layer-1")).await;
    let node = store
        .register_node("node-a", "http://127.0.0.1:1", true, "", "")
        .await
        .expect("node");
    store
        .node_heartbeat(
            &node,
            CacheReport::Whole {
                digest: None,
                versions: Vec::new(),
            },
        )
        .await
        .expect("heartbeat");
    let session = store
        .create_session(NewSession {
            scope: scope.clone(),
            environment_id: environment.id.clone(),
            version: None,
            harness_id: String::new(),
            owner: "brain:a:s:e".to_owned(),
            live_since_ms: 0,
            exclude_node: None,
            workdir_at_placement: true,
            limits: Default::default(),
        })
        .await
        .expect("session");
    let turn = |detail: &str| NewTurn {
        scope: scope.clone(),
        session: session.id.clone(),
        kind: TurnKind::Exec,
        detail: detail.to_owned(),
        exit_code: Some(0),
    };
    let turns = || async {
        store
            .list_turns(&scope, &session.id, &PageRequest::first())
            .await
            .expect("turns")
            .items
            .into_iter()
            .map(|turn| turn.detail)
            .collect::<Vec<_>>()
    };

    store
        .claim_operation(&delivery(40, OperationKind::Execute, "r", 60_000), UNKNOWN)
        .await
        .expect("claim");
    let receipt = r#"{"type":"result"}"#;
    let (recorded, _) = store
        .finish_operation(&key(40), "r", receipt, &[turn("ls")])
        .await
        .expect("finish");
    assert!(recorded);
    assert_eq!(turns().await, vec!["ls".to_owned()]);
    // The same finish again (its reply was lost) records nothing more.
    let (recorded, _) = store
        .finish_operation(&key(40), "r", receipt, &[turn("ls")])
        .await
        .expect("finish again");
    assert!(!recorded);
    assert_eq!(turns().await.len(), 1);

    // Settled as unknown while it ran: the receipt stands, and the tool's turn is recorded.
    store
        .claim_operation(&delivery(41, OperationKind::Execute, "r", 1), UNKNOWN)
        .await
        .expect("claim");
    tokio::time::sleep(Duration::from_millis(20)).await;
    store
        .claim_operation(&delivery(41, OperationKind::Execute, "r2", 60_000), UNKNOWN)
        .await
        .expect("settle");
    let (recorded, stored) = store
        .finish_operation(&key(41), "r", receipt, &[turn("make")])
        .await
        .expect("late finish");
    assert!(!recorded);
    assert_eq!(stored.receipt, UNKNOWN);
    assert_eq!(turns().await, vec!["ls".to_owned(), "make".to_owned()]);

    // A read's record takes its turn in the same write; a second record of it takes none.
    let read = |runner: &str| delivery(42, OperationKind::Execute, runner, 60_000);
    let first = store
        .record_operation(&read("r1"), receipt, &[turn("cat")], UNKNOWN)
        .await
        .expect("record");
    assert!(matches!(first, Claim::Claimed(_)), "{first:?}");
    let again = store
        .record_operation(&read("r2"), receipt, &[turn("cat")], UNKNOWN)
        .await
        .expect("record again");
    assert!(matches!(again, Claim::Duplicate(_)), "{again:?}");
    let expected = ["ls", "make", "cat"].map(str::to_owned).to_vec();
    assert_eq!(turns().await, expected);

    // Its session ended: the receipt is stored, and no turn is (nor counted).
    store
        .claim_operation(&delivery(43, OperationKind::Execute, "r", 60_000), UNKNOWN)
        .await
        .expect("claim");
    store.end_session(&scope, &session.id).await.expect("end");
    let (recorded, stored) = store
        .finish_operation(&key(43), "r", receipt, &[turn("late")])
        .await
        .expect("finish after the end");
    assert!(recorded);
    assert_eq!(stored.receipt, receipt);
    assert_eq!(turns().await, expected);
    let recorded = store
        .record_operation(
            &delivery(44, OperationKind::Execute, "r", 60_000),
            receipt,
            &[turn("late")],
            UNKNOWN,
        )
        .await
        .expect("record after the end");
    assert!(matches!(recorded, Claim::Claimed(_)), "{recorded:?}");
    assert_eq!(turns().await, expected);
}

async fn a_read_is_recorded_once_and_every_delivery_answers_the_first_receipt(store: Store) {
    let read = |runner: &str| delivery(50, OperationKind::Execute, runner, 60_000);
    let first = store
        .record_operation(
            &read("r1"),
            r#"{"type":"result","output":"a"}"#,
            &[],
            UNKNOWN,
        )
        .await
        .expect("record");
    assert!(matches!(first, Claim::Claimed(_)), "{first:?}");
    assert_eq!(first.operation().state, OperationState::Finished);
    // Run again (a redelivery elsewhere, after the file changed): the first receipt stands.
    let again = store
        .record_operation(
            &read("r2"),
            r#"{"type":"result","output":"b"}"#,
            &[],
            UNKNOWN,
        )
        .await
        .expect("record again");
    assert!(matches!(again, Claim::Duplicate(_)), "{again:?}");
    assert_eq!(
        again.operation().receipt,
        r#"{"type":"result","output":"a"}"#
    );
    // A claim of it finds it done; another request under its sequence is refused.
    let claimed = store
        .claim_operation(&read("r3"), UNKNOWN)
        .await
        .expect("claim");
    assert!(matches!(claimed, Claim::Duplicate(_)), "{claimed:?}");
    assert_eq!(claimed.operation().receipt, first.operation().receipt);
    let mut other = read("r4");
    other.digest = "another request".into();
    let reused = store
        .record_operation(&other, r#"{"type":"result","output":"c"}"#, &[], UNKNOWN)
        .await
        .expect("reused");
    assert!(matches!(reused, Claim::SequenceReused(_)), "{reused:?}");
    assert_eq!(reused.operation().receipt, first.operation().receipt);

    // Eight runs at once, each with its own output: one is stored, all answer it.
    let mut tasks = Vec::new();
    for runner in 0..8 {
        let store = store.clone();
        tasks.push(plinth_kit::tasks::spawn(async move {
            store
                .record_operation(
                    &delivery(51, OperationKind::Execute, &format!("r{runner}"), 60_000),
                    &format!(r#"{{"type":"result","output":{runner}}}"#),
                    &[],
                    UNKNOWN,
                )
                .await
                .expect("record")
        }));
    }
    let mut stored = Vec::new();
    let mut answers = std::collections::BTreeSet::new();
    for task in tasks {
        let outcome = task.await.expect("task");
        answers.insert(outcome.operation().receipt.clone());
        if let Claim::Claimed(operation) = outcome {
            stored.push(operation.receipt);
        }
    }
    assert_eq!(stored.len(), 1, "{stored:?}");
    assert_eq!(answers.into_iter().collect::<Vec<_>>(), stored);
}

async fn a_record_meets_a_claim_as_a_repeat_would(store: Store) {
    store
        .claim_operation(&delivery(52, OperationKind::Execute, "r1", 60_000), UNKNOWN)
        .await
        .expect("claim");
    let live = store
        .record_operation(
            &delivery(52, OperationKind::Execute, "r2", 60_000),
            r#"{"type":"result"}"#,
            &[],
            UNKNOWN,
        )
        .await
        .expect("record");
    assert!(matches!(live, Claim::InProgress(_)), "{live:?}");
    assert_eq!(live.operation().runner, "r1");

    store
        .claim_operation(&delivery(53, OperationKind::Execute, "r1", 1), UNKNOWN)
        .await
        .expect("claim");
    tokio::time::sleep(Duration::from_millis(20)).await;
    let settled = store
        .record_operation(
            &delivery(53, OperationKind::Execute, "r2", 60_000),
            r#"{"type":"result"}"#,
            &[],
            UNKNOWN,
        )
        .await
        .expect("record");
    assert!(matches!(settled, Claim::SettledUnknown(_)), "{settled:?}");
    assert_eq!(settled.operation().receipt, UNKNOWN);
    let (recorded, stored) = store
        .finish_operation(&key(53), "r1", r#"{"type":"result"}"#, &[])
        .await
        .expect("late finish");
    assert!(!recorded);
    assert_eq!(stored.receipt, UNKNOWN);
}

/// A catalog too slow for its caller: the caller gives up mid-write (its future is dropped,
/// as a gRPC deadline drops the handler's). Whatever the write had done is all or nothing,
/// every later delivery answers one receipt, and the writer goes on making durable writes.
async fn a_ledger_write_cut_off_midway_never_makes_two_answers(store: Store) {
    for round in 0..40u64 {
        let sequence = 100 + round;
        let cut = {
            let store = store.clone();
            plinth_kit::tasks::spawn(async move {
                let read = delivery(sequence, OperationKind::Execute, "cut", 60_000);
                store
                    .record_operation(&read, r#"{"type":"result","output":"cut"}"#, &[], UNKNOWN)
                    .await
            })
        };
        // Cut at a different point of the write each round.
        for _ in 0..round % 8 {
            tokio::task::yield_now().await;
        }
        cut.abort();
        let _ = cut.await;
        let retried = store
            .record_operation(
                &delivery(sequence, OperationKind::Execute, "retry", 60_000),
                r#"{"type":"result","output":"retry"}"#,
                &[],
                UNKNOWN,
            )
            .await
            .expect("retry");
        let answer = retried.operation().receipt.clone();
        assert!(
            answer.contains("cut") || matches!(retried, Claim::Claimed(_)),
            "{retried:?}"
        );
        let again = store
            .claim_operation(
                &delivery(sequence, OperationKind::Execute, "later", 60_000),
                UNKNOWN,
            )
            .await
            .expect("later");
        assert!(matches!(again, Claim::Duplicate(_)), "{again:?}");
        assert_eq!(again.operation().receipt, answer);
    }
    // A write that is not the ledger's still works on the writer.
    store
        .create_binding(&new_binding(&EnvironmentId::generate()))
        .await
        .expect("a write after");
}
