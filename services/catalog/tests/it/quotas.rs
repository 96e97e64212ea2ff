//! Quotas per scope in the store, every backend: environments, active sessions and builds
//! queued or running are refused past a scope's limit (and only that scope's), an override
//! raises one scope's limit, concurrent creates at the last slot let exactly one through, and
//! usage reports what is counted. Also the idempotency records of adapters' calls: a claim
//! renewed while its call runs is not settled, one whose lease runs out with no answer is
//! settled as `outcome_unknown` and never run again.

use plinth_catalog::adapters::{AdapterId, NewAdapter, Protocol};
use plinth_catalog::model::PageRequest;
use plinth_catalog::model::{EnvironmentId, NewEnvironment, Outcome};
use plinth_catalog::persistence::{Claimed, NewTurn};
use plinth_catalog::sessions::{SessionLimits, TurnKind};
use plinth_catalog::{NewSession, NewTask, Store, StoreError};
use plinth_kit::quota::{Quota, QuotaLimits, QuotaOverride, Quotas};

use crate::{LEASES, scope};

backend_suite!(
    each_quota_is_per_scope_and_an_override_raises_it,
    concurrent_environment_creates_at_the_last_slot_let_exactly_one_through,
    concurrent_session_creates_at_the_last_slot_let_exactly_one_through,
    a_build_counts_from_queued_until_it_ends,
    sessions_count_while_active_whoever_makes_them,
    a_claim_renewed_while_its_call_runs_is_not_settled,
    a_claim_whose_lease_ran_out_is_settled_as_unknown_and_never_run_again,
    an_answer_and_its_turn_are_one_write_and_a_repeat_records_no_second_turn,
    a_released_claim_runs_again_and_another_body_never_settles_an_abandoned_one,
);

/// Small limits, and a larger environments limit for `acme`.
fn quotas() -> Quotas {
    Quotas::new(QuotaLimits {
        environments: 2,
        stored_bytes: 1024,
        sessions: 1,
        queued_builds: 1,
    })
    .with_scope(
        "acme",
        QuotaOverride {
            environments: Some(3),
            ..QuotaOverride::default()
        },
    )
}

async fn create(store: &Store, owner: &str, name: &str) -> Result<EnvironmentId, StoreError> {
    store
        .create_environment(
            NewEnvironment::new(scope(owner), name.to_owned(), String::new(), String::new())
                .expect("valid"),
        )
        .await
        .map(|environment| environment.id)
}

fn refused(result: Result<impl std::fmt::Debug, StoreError>) -> (Quota, u64, u64) {
    match result {
        Err(StoreError::QuotaExceeded { quota, limit, used }) => (quota, limit, used),
        other => panic!("expected a quota refusal, got {other:?}"),
    }
}

/// Builds the next version of `id` (of `owner`) to ready.
async fn build(store: &Store, owner: &str, id: &EnvironmentId) {
    store
        .start_build(&scope(owner), id, "sha256:source", false)
        .await
        .expect("start");
    let claim = store
        .claim_build("builder", LEASES)
        .await
        .expect("claim")
        .expect("work");
    store
        .complete_build(
            &claim.token,
            Outcome::Ready {
                layer_tree: "sha256:layer".to_owned(),
                packages: Vec::new(),
                size: 1,
                dependency_key: String::new(),
                toolchains: Vec::new(),
            },
        )
        .await
        .expect("complete");
}

fn new_session(owner: &str, id: &EnvironmentId) -> NewSession {
    NewSession {
        scope: scope(owner),
        environment_id: id.clone(),
        version: None,
        harness_id: String::new(),
        owner: String::new(),
        live_since_ms: 0,
        exclude_node: None,
        workdir_at_placement: true,
        limits: SessionLimits::default(),
    }
}

async fn each_quota_is_per_scope_and_an_override_raises_it(store: Store) {
    let store = store.with_quotas(quotas());
    // globex has the default two environments; the third is refused, with what it has.
    create(&store, "globex", "One").await.expect("first");
    create(&store, "globex", "Two").await.expect("second");
    assert_eq!(
        refused(create(&store, "globex", "Three").await),
        (Quota::Environments, 2, 2)
    );
    // Another scope is served as if globex did not exist.
    create(&store, "initech", "One").await.expect("initech");
    // acme's override raises its limit to three.
    for name in ["One", "Two", "Three"] {
        create(&store, "acme", name).await.expect("acme");
    }
    assert_eq!(
        refused(create(&store, "acme", "Four").await),
        (Quota::Environments, 3, 3)
    );
    // A deleted environment frees its slot.
    let listed = store
        .list_environments(&scope("globex"))
        .await
        .expect("list");
    store
        .delete_environment(&scope("globex"), &listed[0].id)
        .await
        .expect("delete");
    create(&store, "globex", "Three")
        .await
        .expect("a freed slot");

    let usage = store.usage(&scope("acme")).await.expect("usage");
    assert_eq!(usage.environments, 3);
    assert_eq!(usage.limits.environments, 3);
    assert_eq!(usage.limits.sessions, 1);
    let usage = store.usage(&scope("nobody")).await.expect("usage");
    assert_eq!(
        (usage.environments, usage.sessions, usage.queued_builds),
        (0, 0, 0)
    );
    assert_eq!(usage.limits.environments, 2);
}

async fn concurrent_environment_creates_at_the_last_slot_let_exactly_one_through(store: Store) {
    let store = store.with_quotas(Quotas::new(QuotaLimits {
        environments: 3,
        ..QuotaLimits::DEFAULT
    }));
    create(&store, "globex", "First").await.expect("first");
    create(&store, "globex", "Second").await.expect("second");
    // Eight creates race for the one slot left.
    let racers: Vec<_> = (0..8)
        .map(|n| {
            let store = store.clone();
            plinth_kit::tasks::spawn(async move {
                create(&store, "globex", &format!("Racer {n}")).await
            })
        })
        .collect();
    let mut through = 0;
    for racer in racers {
        match racer.await.expect("join") {
            Ok(_) => through += 1,
            refusal => assert_eq!(refused(refusal), (Quota::Environments, 3, 3)),
        }
    }
    assert_eq!(through, 1);
    assert_eq!(
        store
            .list_environments(&scope("globex"))
            .await
            .expect("list")
            .len(),
        3
    );
}

async fn concurrent_session_creates_at_the_last_slot_let_exactly_one_through(store: Store) {
    let store = store.with_quotas(Quotas::new(QuotaLimits {
        sessions: 2,
        ..QuotaLimits::DEFAULT
    }));
    store
        .register_node("host-a", "http://10.0.0.1:7005", true, "", "")
        .await
        .expect("register");
    let id = create(&store, "globex", "Studio").await.expect("create");
    build(&store, "globex", &id).await;
    store
        .create_session(new_session("globex", &id))
        .await
        .expect("first session");
    let racers: Vec<_> = (0..8)
        .map(|_| {
            let store = store.clone();
            let new = new_session("globex", &id);
            plinth_kit::tasks::spawn(async move { store.create_session(new).await })
        })
        .collect();
    let mut through = 0;
    for racer in racers {
        match racer.await.expect("join") {
            Ok(_) => through += 1,
            refusal => assert_eq!(refused(refusal), (Quota::Sessions, 2, 2)),
        }
    }
    assert_eq!(through, 1);
    assert_eq!(
        store.usage(&scope("globex")).await.expect("usage").sessions,
        2
    );
}

async fn a_build_counts_from_queued_until_it_ends(store: Store) {
    let store = store.with_quotas(quotas());
    let first = create(&store, "globex", "First").await.expect("first");
    let second = create(&store, "globex", "Second").await.expect("second");
    store
        .start_build(&scope("globex"), &first, "sha256:source", false)
        .await
        .expect("queued");
    // The scope has its one build in flight: another environment's waits; the same
    // environment's is busy, as before.
    assert_eq!(
        refused(
            store
                .start_build(&scope("globex"), &second, "sha256:source", false)
                .await
        ),
        (Quota::QueuedBuilds, 1, 1)
    );
    assert!(matches!(
        store
            .start_build(&scope("globex"), &first, "sha256:source", false)
            .await,
        Err(StoreError::Busy)
    ));
    // Another scope is not held up.
    let theirs = create(&store, "initech", "Theirs").await.expect("initech");
    store
        .start_build(&scope("initech"), &theirs, "sha256:source", false)
        .await
        .expect("another scope's build");
    assert_eq!(
        store
            .usage(&scope("globex"))
            .await
            .expect("usage")
            .queued_builds,
        1
    );
    // Running still counts; ended frees the slot.
    let mut ended = 0;
    while let Some(claim) = store.claim_build("builder", LEASES).await.expect("claim") {
        assert_eq!(
            store
                .usage(&claim.scope)
                .await
                .expect("usage")
                .queued_builds,
            1,
            "a running build counts"
        );
        store
            .complete_build(
                &claim.token,
                Outcome::Failed {
                    error: "no".to_owned(),
                },
            )
            .await
            .expect("complete");
        ended += 1;
    }
    assert_eq!(ended, 2);
    store
        .start_build(&scope("globex"), &second, "sha256:source", false)
        .await
        .expect("the slot is free again");
}

async fn sessions_count_while_active_whoever_makes_them(store: Store) {
    let store = store.with_quotas(quotas());
    store
        .register_node("host-a", "http://10.0.0.1:7005", true, "", "")
        .await
        .expect("register");
    let id = create(&store, "globex", "Studio").await.expect("create");
    build(&store, "globex", &id).await;
    let session = store
        .create_session(new_session("globex", &id))
        .await
        .expect("the one session");
    assert_eq!(
        refused(store.create_session(new_session("globex", &id)).await),
        (Quota::Sessions, 1, 1)
    );
    // A task's session and an adapter's run's session count the same.
    assert_eq!(
        refused(
            store
                .create_task(NewTask {
                    input: "go".to_owned(),
                    metadata: "{}".to_owned(),
                    session: new_session("globex", &id),
                })
                .await
        ),
        (Quota::Sessions, 1, 1)
    );
    let adapter_id = store
        .create_adapter(NewAdapter {
            scope: scope("globex"),
            protocol: Protocol::Novo,
            environment_id: id.clone(),
            stored_credential: "a-secret-0123456789".to_owned(),
            callback_origins: Vec::new(),
        })
        .await
        .expect("adapter")
        .id;
    let adapter = store
        .get_adapter(&scope("globex"), &adapter_id)
        .await
        .expect("adapter");
    assert_eq!(
        refused(
            store
                .open_run(&adapter, "run_1", 0, SessionLimits::default())
                .await
        ),
        (Quota::Sessions, 1, 1)
    );
    // Another scope is served.
    let theirs = create(&store, "initech", "Theirs").await.expect("initech");
    build(&store, "initech", &theirs).await;
    store
        .create_session(new_session("initech", &theirs))
        .await
        .expect("another scope's session");
    // An ended session frees its slot.
    store
        .end_session(&scope("globex"), &session.id)
        .await
        .expect("end");
    assert_eq!(
        store.usage(&scope("globex")).await.expect("usage").sessions,
        0
    );
    store
        .open_run(&adapter, "run_1", 0, SessionLimits::default())
        .await
        .expect("the run gets the freed slot");
}

async fn adapter(store: &Store) -> AdapterId {
    let id = create(store, "globex", "Adapted").await.expect("create");
    store
        .create_adapter(NewAdapter {
            scope: scope("globex"),
            protocol: Protocol::Novo,
            environment_id: id,
            stored_credential: "a-secret-0123456789".to_owned(),
            callback_origins: Vec::new(),
        })
        .await
        .expect("adapter")
        .id
}

const DAY_MS: i64 = 24 * 60 * 60 * 1000;

async fn a_claim_renewed_while_its_call_runs_is_not_settled(store: Store) {
    let adapter = adapter(&store).await;
    let Claimed::Claimed(claim) = store
        .claim_key(&adapter, "req_long", "run_1", "body", 400, DAY_MS)
        .await
        .expect("claim")
    else {
        panic!("the first call claims its key");
    };
    // The call runs for three leases, its claim renewed every third of one.
    for _ in 0..9 {
        tokio::time::sleep(std::time::Duration::from_millis(130)).await;
        assert!(
            store
                .renew_key(&adapter, "req_long", &claim, 400)
                .await
                .expect("renew")
        );
        assert_eq!(
            store
                .claim_key(&adapter, "req_long", "run_1", "body", 400, DAY_MS)
                .await
                .expect("retry"),
            Claimed::InFlight,
            "a retry while the call runs does not run it"
        );
    }
    assert!(
        store
            .finish_key(
                &adapter,
                "req_long",
                &claim,
                (200, "{\"ok\":true}"),
                None,
                DAY_MS
            )
            .await
            .expect("finish")
            .0
    );
    assert_eq!(
        store
            .claim_key(&adapter, "req_long", "run_1", "body", 400, DAY_MS)
            .await
            .expect("retry"),
        Claimed::Done {
            status: 200,
            response: "{\"ok\":true}".to_owned()
        }
    );
    // Nothing is held any more.
    assert!(
        !store
            .renew_key(&adapter, "req_long", &claim, 400)
            .await
            .expect("renew")
    );
}

async fn a_claim_whose_lease_ran_out_is_settled_as_unknown_and_never_run_again(store: Store) {
    let adapter = adapter(&store).await;
    let Claimed::Claimed(claim) = store
        .claim_key(&adapter, "req_lost", "run_1", "body", 1, DAY_MS)
        .await
        .expect("claim")
    else {
        panic!("the first call claims its key");
    };
    // Its holder dies: no renewal, no answer. The next retry settles it.
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    let settled = store
        .claim_key(&adapter, "req_lost", "run_1", "body", 1, DAY_MS)
        .await
        .expect("retry");
    let Claimed::Done { status, response } = &settled else {
        panic!("a retry after the lease gets a definite answer, not the call: {settled:?}");
    };
    assert_eq!(*status, 409);
    let body: serde_json::Value = serde_json::from_str(response).expect("json");
    assert_eq!(body["error"]["code"], "outcome_unknown", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|message| message.contains("may or may not have taken effect")),
        "{body}"
    );
    // Every later retry gets the same answer; the holder, back, cannot overwrite it nor
    // renew; the same key with another body is still refused.
    assert_eq!(
        store
            .claim_key(&adapter, "req_lost", "run_1", "body", 1, DAY_MS)
            .await
            .expect("retry"),
        settled
    );
    assert!(
        !store
            .finish_key(&adapter, "req_lost", &claim, (200, "{}"), None, DAY_MS)
            .await
            .expect("finish")
            .0
    );
    assert!(
        !store
            .renew_key(&adapter, "req_lost", &claim, 1000)
            .await
            .expect("renew")
    );
    assert_eq!(
        store
            .claim_key(&adapter, "req_lost", "run_1", "other body", 1, DAY_MS)
            .await
            .expect("other body"),
        Claimed::Mismatch
    );
    // A release (for a call that did not start) frees a running claim only.
    assert_eq!(
        store
            .claim_key(&adapter, "req_lost", "run_1", "body", 1, DAY_MS)
            .await
            .expect("retry"),
        settled
    );
    store
        .release_key(&adapter, "req_lost", &claim)
        .await
        .expect("release");
    assert_eq!(
        store
            .claim_key(&adapter, "req_lost", "run_1", "body", 1, DAY_MS)
            .await
            .expect("retry"),
        settled,
        "a settled key is not released"
    );
}

async fn claimed(store: &Store, adapter: &AdapterId, key: &str, lease_ms: i64) -> String {
    match store
        .claim_key(adapter, key, "run_1", "body", lease_ms, DAY_MS)
        .await
        .expect("claim")
    {
        Claimed::Claimed(claim) => claim,
        other => panic!("the first call claims {key}: {other:?}"),
    }
}

/// Stores a claimed call's answer with its turn.
async fn finish(
    store: &Store,
    adapter: &AdapterId,
    key: &str,
    claim: &str,
    answer: (u32, &str),
    turn: Option<&NewTurn>,
) -> Result<(bool, Option<plinth_catalog::sessions::Turn>), StoreError> {
    store
        .finish_key(adapter, key, claim, answer, turn, DAY_MS)
        .await
}

async fn an_answer_and_its_turn_are_one_write_and_a_repeat_records_no_second_turn(store: Store) {
    store
        .register_node("host-a", "http://10.0.0.1:7005", true, "", "")
        .await
        .expect("register");
    let id = create(&store, "globex", "Studio").await.expect("create");
    build(&store, "globex", &id).await;
    let session = store
        .create_session(new_session("globex", &id))
        .await
        .expect("session");
    let adapter = adapter(&store).await;
    let turn = |detail: &str| NewTurn {
        scope: scope("globex"),
        session: session.id.clone(),
        kind: TurnKind::Exec,
        detail: detail.to_owned(),
        exit_code: Some(3),
    };
    let turns = || async {
        store
            .list_turns(&scope("globex"), &session.id, &PageRequest::first())
            .await
            .expect("turns")
            .items
            .into_iter()
            .map(|turn| (turn.detail, turn.exit_code))
            .collect::<Vec<_>>()
    };

    // The answer and the turn land together.
    let claim = claimed(&store, &adapter, "req_1", 60_000).await;
    let (stored, recorded) = finish(
        &store,
        &adapter,
        "req_1",
        &claim,
        (200, "{\"ok\":1}"),
        Some(&turn("make")),
    )
    .await
    .expect("finish");
    assert!(stored);
    let recorded = recorded.expect("the turn is recorded with the answer");
    assert_eq!(
        (recorded.kind, recorded.exit_code),
        (TurnKind::Exec, Some(3))
    );
    assert_eq!(turns().await, vec![("make".to_owned(), Some(3))]);
    // The same finish again (its reply was lost): nothing more is written.
    let (stored, recorded) = finish(
        &store,
        &adapter,
        "req_1",
        &claim,
        (200, "{\"ok\":1}"),
        Some(&turn("make")),
    )
    .await
    .expect("finish again");
    assert!(!stored);
    assert!(recorded.is_none());
    assert_eq!(turns().await.len(), 1);
    assert_eq!(
        store
            .claim_key(&adapter, "req_1", "run_1", "body", 60_000, DAY_MS)
            .await
            .expect("retry"),
        Claimed::Done {
            status: 200,
            response: "{\"ok\":1}".to_owned()
        }
    );

    // A claim settled as unknown keeps that answer, but the call ran: its turn is recorded.
    let claim = claimed(&store, &adapter, "req_2", 1).await;
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    let settled = store
        .claim_key(&adapter, "req_2", "run_1", "body", 1, DAY_MS)
        .await
        .expect("settle");
    assert!(
        matches!(settled, Claimed::Done { status: 409, .. }),
        "{settled:?}"
    );
    let (stored, recorded) = finish(
        &store,
        &adapter,
        "req_2",
        &claim,
        (200, "{}"),
        Some(&turn("late")),
    )
    .await
    .expect("late finish");
    assert!(!stored);
    assert!(recorded.is_some());
    assert_eq!(turns().await.len(), 2);

    // A session that takes no turn any more leaves the answer stored.
    store
        .end_session(&scope("globex"), &session.id)
        .await
        .expect("end");
    let claim = claimed(&store, &adapter, "req_3", 60_000).await;
    let (stored, recorded) = finish(
        &store,
        &adapter,
        "req_3",
        &claim,
        (200, "{}"),
        Some(&turn("after")),
    )
    .await
    .expect("finish after the end");
    assert!(stored);
    assert!(recorded.is_none());
    assert!(matches!(
        store
            .claim_key(&adapter, "req_3", "run_1", "body", 60_000, DAY_MS)
            .await
            .expect("retry"),
        Claimed::Done { status: 200, .. }
    ));
}

async fn a_released_claim_runs_again_and_another_body_never_settles_an_abandoned_one(store: Store) {
    let adapter = adapter(&store).await;
    // Released (its call never started): the next call with the key runs it.
    let first = claimed(&store, &adapter, "req_free", 60_000).await;
    store
        .release_key(&adapter, "req_free", &first)
        .await
        .expect("release");
    let second = claimed(&store, &adapter, "req_free", 60_000).await;
    assert_ne!(first, second);
    // A stale holder's release frees nothing.
    store
        .release_key(&adapter, "req_free", &first)
        .await
        .expect("stale release");
    assert!(
        store
            .renew_key(&adapter, "req_free", &second, 60_000)
            .await
            .expect("renew")
    );

    // Abandoned: another body is refused and leaves it as it is; the same body settles it.
    claimed(&store, &adapter, "req_gone", 1).await;
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    assert_eq!(
        store
            .claim_key(&adapter, "req_gone", "run_1", "other body", 1, DAY_MS)
            .await
            .expect("other body"),
        Claimed::Mismatch
    );
    let settled = store
        .claim_key(&adapter, "req_gone", "run_1", "body", 1, DAY_MS)
        .await
        .expect("same body");
    assert!(
        matches!(settled, Claimed::Done { status: 409, .. }),
        "{settled:?}"
    );
}
