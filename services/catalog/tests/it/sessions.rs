//! Sessions, turns, nodes and tasks in the store, every backend: each test below runs against
//! SQLite and against PostgreSQL (`PLINTH_TEST_POSTGRES_URL`; required under CI).

use plinth_catalog::model::{
    Cursor, EnvironmentId, NewEnvironment, Outcome, Package, PackageManager, PageRequest,
};
use plinth_catalog::sessions::{
    CacheReport, HeartbeatAnswer, NodeId, SessionLimits, SessionStatus, TurnKind,
};
use plinth_catalog::{NewSession, NewTask, Store, StoreError};

use crate::{LEASES, scope};

backend_suite!(
    a_session_pins_the_active_version_and_keeps_it,
    sessions_need_a_ready_environment_and_a_live_node,
    turns_are_numbered_in_order_even_when_they_race,
    a_task_and_its_session_land_together,
    a_restarted_node_keeps_its_id_and_its_sessions,
    limits_are_stored_with_the_session_and_its_task,
    the_sweep_ends_sessions_past_their_lifetime_and_no_others,
    idle_time_counts_from_the_last_turn,
    a_touch_moves_the_idle_end_as_a_turn_does_and_records_none,
    pages_of_turns_walk_every_turn_once_in_order,
    pages_of_a_nodes_and_an_owners_sessions_walk_each_live_one_once,
    a_heartbeat_sends_the_cache_set_only_when_it_changed,
    a_heartbeat_answers_the_active_list_again_only_when_it_may_have_changed,
    placement_goes_to_the_least_loaded_live_node,
    the_load_stays_counted_when_sessions_start_and_end_at_once,
    a_suspect_node_gets_no_sessions_until_cleared_or_lapsed,
    a_node_registering_again_is_no_longer_suspect,
);

async fn environment(store: &Store, name: &str) -> EnvironmentId {
    store
        .create_environment(
            NewEnvironment::new(scope("acme"), name.to_owned(), String::new(), String::new())
                .expect("valid"),
        )
        .await
        .expect("create")
        .id
}

/// Builds the next version of `id` to ready with layer `layer`.
async fn build(store: &Store, id: &EnvironmentId, layer: &str) {
    store
        .start_build(&scope("acme"), id, "sha256:source", false)
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
                layer_tree: layer.to_owned(),
                packages: vec![Package {
                    manager: PackageManager::Pip,
                    name: "requests".into(),
                    version: "2.32.3".into(),
                }],
                size: 1,
                dependency_key: String::new(),
                toolchains: Vec::new(),
            },
        )
        .await
        .expect("complete");
}

fn new_session(id: &EnvironmentId) -> NewSession {
    NewSession {
        scope: scope("acme"),
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

/// A session on a built environment of a registered node, with `limits`.
async fn limited_session(
    store: &Store,
    id: &EnvironmentId,
    limits: SessionLimits,
) -> plinth_catalog::sessions::Session {
    store
        .create_session(NewSession {
            limits,
            ..new_session(id)
        })
        .await
        .expect("session")
}

fn lifetime(ms: u64) -> SessionLimits {
    SessionLimits {
        lifetime_ms: Some(ms),
        ..SessionLimits::default()
    }
}

async fn a_session_pins_the_active_version_and_keeps_it(store: Store) {
    let node = store
        .register_node("host-a", "http://10.0.0.1:7005", true, "", "")
        .await
        .expect("register");
    let id = environment(&store, "Studio").await;
    build(&store, &id, "sha256:one").await;
    let session = store
        .create_session(new_session(&id))
        .await
        .expect("session");
    assert_eq!(session.version, 1);
    assert_eq!(session.layer_tree, "sha256:one");
    assert_eq!(session.slug, "studio");
    assert_eq!(session.node_id, node);
    assert_eq!(session.node_address, "http://10.0.0.1:7005");
    assert_eq!(session.status, SessionStatus::Active);
    assert_eq!(session.workdir, "");

    build(&store, &id, "sha256:two").await;
    let attached = store
        .mark_attached(&scope("acme"), &session.id, "/w/1", true)
        .await
        .expect("attach");
    assert_eq!(attached.version, 1, "a session keeps its version");
    assert_eq!(attached.workdir, "/w/1");
    let later = store
        .create_session(new_session(&id))
        .await
        .expect("session");
    assert_eq!(
        (later.version, later.layer_tree.as_str()),
        (2, "sha256:two")
    );

    // Another scope's session does not exist.
    assert!(matches!(
        store.get_session(&scope("other"), &session.id).await,
        Err(StoreError::NotFound)
    ));
    let ended = store
        .end_session(&scope("acme"), &session.id)
        .await
        .expect("end");
    assert_eq!(ended.status, SessionStatus::Ended);
    assert!(ended.ended_at_ms > 0);
    let again = store
        .end_session(&scope("acme"), &session.id)
        .await
        .expect("end again");
    assert_eq!(
        again.ended_at_ms, ended.ended_at_ms,
        "ending twice changes nothing"
    );
    let live: Vec<_> = store
        .node_sessions(&node, &PageRequest::first())
        .await
        .expect("node sessions")
        .items
        .into_iter()
        .map(|s| s.id)
        .collect();
    assert_eq!(live, vec![later.id]);

    // A node that says where it keeps sessions gets each one's working directory recorded
    // when the session is placed.
    store
        .register_node(
            "host-a",
            "http://10.0.0.1:7005",
            true,
            "/var/lib/plinth/sessions/",
            "",
        )
        .await
        .expect("register again");
    let placed = store
        .create_session(new_session(&id))
        .await
        .expect("session");
    assert_eq!(
        placed.workdir,
        format!("/var/lib/plinth/sessions/{}/work", placed.id.as_str())
    );

    // A node that mounts each session's working directory at one path in the session's own
    // namespace gets that path recorded for every session.
    store
        .register_node(
            "host-a",
            "http://10.0.0.1:7005",
            true,
            "/var/lib/plinth/sessions/",
            "/home/session",
        )
        .await
        .expect("register again");
    let placed = store
        .create_session(new_session(&id))
        .await
        .expect("session");
    assert_eq!(placed.workdir, "/home/session");
}

async fn sessions_need_a_ready_environment_and_a_live_node(store: Store) {
    let id = environment(&store, "Unbuilt").await;
    assert!(matches!(
        store.create_session(new_session(&id)).await,
        Err(StoreError::NothingBuilt)
    ));
    build(&store, &id, "sha256:one").await;
    assert!(matches!(
        store.create_session(new_session(&id)).await,
        Err(StoreError::NoLiveNode)
    ));
    store
        .register_node("host-a", "http://a", true, "", "")
        .await
        .expect("register");
    let mut stale = new_session(&id);
    stale.live_since_ms = i64::MAX;
    assert!(matches!(
        store.create_session(stale).await,
        Err(StoreError::NoLiveNode)
    ));
    let mut other = new_session(&id);
    other.scope = scope("other");
    assert!(matches!(
        store.create_session(other).await,
        Err(StoreError::NotFound)
    ));
    // The emptier node gets the next session.
    store
        .register_node("host-b", "http://b", true, "", "")
        .await
        .expect("register");
    let first = store.create_session(new_session(&id)).await.expect("first");
    let second = store
        .create_session(new_session(&id))
        .await
        .expect("second");
    assert_ne!(first.node_id, second.node_id);
    // A node the caller could not reach is passed over, however empty.
    for _ in 0..3 {
        let mut elsewhere = new_session(&id);
        elsewhere.exclude_node = Some(first.node_id.clone());
        let placed = store.create_session(elsewhere).await.expect("elsewhere");
        assert_eq!(placed.node_id, second.node_id);
    }
}

async fn turns_are_numbered_in_order_even_when_they_race(store: Store) {
    store
        .register_node("host-a", "http://a", true, "", "")
        .await
        .expect("register");
    let id = environment(&store, "Studio").await;
    build(&store, &id, "sha256:one").await;
    let session = store
        .create_session(new_session(&id))
        .await
        .expect("session");
    let recorded = futures::future::join_all((0..16).map(|i| {
        let store = store.clone();
        let session = session.id.clone();
        async move {
            store
                .record_turn(
                    &scope("acme"),
                    &session,
                    TurnKind::Exec,
                    &format!("echo {i}"),
                    Some(0),
                )
                .await
        }
    }))
    .await;
    let mut sequences: Vec<u64> = recorded
        .into_iter()
        .map(|turn| turn.expect("turn").sequence)
        .collect();
    sequences.sort_unstable();
    assert_eq!(sequences, (1..=16).collect::<Vec<_>>());
    let turns = store
        .list_turns(&scope("acme"), &session.id, &PageRequest::first())
        .await
        .expect("turns")
        .items;
    assert_eq!(turns.len(), 16);
    assert!(
        turns
            .iter()
            .all(|turn| turn.version == 1 && turn.exit_code == Some(0))
    );
    let long = "x".repeat(10_000);
    let cut = store
        .record_turn(
            &scope("acme"),
            &session.id,
            TurnKind::WriteFile,
            &long,
            None,
        )
        .await
        .expect("turn");
    assert_eq!(cut.detail.len(), 4096);
    assert!(matches!(
        store
            .list_turns(&scope("other"), &session.id, &PageRequest::first())
            .await,
        Err(StoreError::NotFound)
    ));

    // A command's turn is recorded as it starts and finished when it ends, once.
    let running = store
        .record_turn(&scope("acme"), &session.id, TurnKind::Exec, "sleep 1", None)
        .await
        .expect("turn");
    let exit_of = |turns: Vec<plinth_catalog::sessions::Turn>, sequence: u64| {
        turns
            .into_iter()
            .find(|turn| turn.sequence == sequence)
            .map(|turn| turn.exit_code)
    };
    let turns = store
        .list_turns(&scope("acme"), &session.id, &PageRequest::first())
        .await
        .expect("turns")
        .items;
    assert_eq!(exit_of(turns, running.sequence), Some(None));
    assert!(matches!(
        store
            .finish_turn(&scope("other"), &session.id, running.sequence, 3)
            .await,
        Err(StoreError::NotFound)
    ));
    store
        .finish_turn(&scope("acme"), &session.id, running.sequence, 3)
        .await
        .expect("finish");
    store
        .finish_turn(&scope("acme"), &session.id, running.sequence, 9)
        .await
        .expect("finishing again changes nothing");
    let turns = store
        .list_turns(&scope("acme"), &session.id, &PageRequest::first())
        .await
        .expect("turns")
        .items;
    assert_eq!(exit_of(turns, running.sequence), Some(Some(3)));
    assert!(matches!(
        store.finish_turn(&scope("acme"), &session.id, 999, 0).await,
        Err(StoreError::NotFound)
    ));

    // An ended session takes no more turns.
    store
        .end_session(&scope("acme"), &session.id)
        .await
        .expect("end");
    assert!(matches!(
        store
            .record_turn(&scope("acme"), &session.id, TurnKind::Exec, "true", None)
            .await,
        Err(StoreError::NotFound)
    ));
}

async fn a_task_and_its_session_land_together(store: Store) {
    store
        .register_node("host-a", "http://a", true, "", "")
        .await
        .expect("register");
    let id = environment(&store, "Studio").await;
    let refused = store
        .create_task(NewTask {
            input: "go".into(),
            metadata: "{}".into(),
            session: new_session(&id),
        })
        .await;
    assert!(matches!(refused, Err(StoreError::NothingBuilt)));
    build(&store, &id, "sha256:one").await;
    let task = store
        .create_task(NewTask {
            input: "Render it.".into(),
            metadata: r#"{"harness_id":"chrn_x"}"#.into(),
            session: NewSession {
                harness_id: "chrn_x".into(),
                ..new_session(&id)
            },
        })
        .await
        .expect("task");
    assert_eq!(task.session.version, 1);
    assert_eq!(task.session.harness_id, "chrn_x");
    assert_eq!(task.input, "Render it.");
}

async fn a_restarted_node_keeps_its_id_and_its_sessions(store: Store) {
    let first = store
        .register_node("host-a", "http://old", true, "", "")
        .await
        .expect("register");
    let id = environment(&store, "Studio").await;
    build(&store, &id, "sha256:one").await;
    let session = store
        .create_session(new_session(&id))
        .await
        .expect("session");
    let again = store
        .register_node("host-a", "http://new", false, "", "")
        .await
        .expect("register again");
    assert_eq!(again, first);
    let moved = store
        .get_session(&scope("acme"), &session.id)
        .await
        .expect("session");
    assert_eq!(moved.node_address, "http://new");
    let answer = store
        .node_heartbeat(&again, whole(&[(&id, 1), (&id, 7)]))
        .await
        .expect("heartbeat");
    assert_eq!(answer.active, Some(vec![(id, 1)]));
}

/// A heartbeat with a node's whole set and no digest, as nodes before digests sent it.
fn whole(versions: &[(&EnvironmentId, u32)]) -> CacheReport {
    CacheReport::Whole {
        digest: None,
        versions: versions
            .iter()
            .map(|(environment, version)| ((*environment).clone(), *version))
            .collect(),
    }
}

/// The active versions a heartbeat answered, sorted; `None` when it did not say.
fn active(answer: &HeartbeatAnswer) -> Option<Vec<(EnvironmentId, u32)>> {
    answer.active.clone().map(|mut active| {
        active.sort();
        active
    })
}

async fn a_heartbeat_sends_the_cache_set_only_when_it_changed(store: Store) {
    let node = store
        .register_node("host-a", "http://a", true, "", "")
        .await
        .expect("register");
    let studio = environment(&store, "Studio").await;
    build(&store, &studio, "sha256:one").await;
    let lab = environment(&store, "Lab").await;
    build(&store, &lab, "sha256:two").await;
    build(&store, &lab, "sha256:three").await;

    // The whole set, named by the node's digest: what of it is active is answered.
    let set = vec![(studio.clone(), 1), (lab.clone(), 1), (lab.clone(), 2)];
    let answer = store
        .node_heartbeat(
            &node,
            CacheReport::Whole {
                digest: Some(11),
                versions: set.clone(),
            },
        )
        .await
        .expect("heartbeat");
    assert_eq!(answer.digest, 11);
    let mut expected = vec![(studio.clone(), 1), (lab.clone(), 2)];
    expected.sort();
    assert_eq!(active(&answer), Some(expected.clone()));

    // Unchanged: the digest alone stands for the set, and still marks the node alive.
    let before = plinth_kit::clock::now_ms();
    while plinth_kit::clock::now_ms() == before {
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    let since = plinth_kit::clock::now_ms();
    let mut placed_since = new_session(&studio);
    placed_since.live_since_ms = since;
    assert!(matches!(
        store.create_session(placed_since.clone()).await,
        Err(StoreError::NoLiveNode)
    ));
    let answer = store
        .node_heartbeat(&node, CacheReport::Unchanged { digest: 11 })
        .await
        .expect("heartbeat");
    assert_eq!((answer.digest, active(&answer)), (11, Some(expected)));
    let placed = store
        .create_session(placed_since)
        .await
        .expect("the heartbeat made the node live");
    assert_eq!(placed.node_id, node);

    // What is active is read at each heartbeat from the set held: a new build of Studio
    // leaves its cached version 1 inactive.
    build(&store, &studio, "sha256:four").await;
    let answer = store
        .node_heartbeat(&node, CacheReport::Unchanged { digest: 11 })
        .await
        .expect("heartbeat");
    assert_eq!(active(&answer), Some(vec![(lab.clone(), 2)]));
    assert_eq!(
        answer.live_sessions,
        vec![placed.id.clone()],
        "the answer lists the node's live sessions too"
    );

    // A changed set replaces the one held.
    let answer = store
        .node_heartbeat(
            &node,
            CacheReport::Whole {
                digest: Some(12),
                versions: vec![(studio.clone(), 2), (studio.clone(), 2)],
            },
        )
        .await
        .expect("heartbeat");
    assert_eq!(
        (answer.digest, active(&answer)),
        (12, Some(vec![(studio.clone(), 2)]))
    );
    let answer = store
        .node_heartbeat(&node, CacheReport::Unchanged { digest: 12 })
        .await
        .expect("heartbeat");
    assert_eq!(
        active(&answer),
        Some(vec![(studio.clone(), 2)]),
        "Lab's versions went with the old set"
    );

    // A digest the catalog does not hold (a node that missed an answer, or a database that
    // lost the set): nothing is answered, and the digest held tells the node to send it all.
    for stale in [11, 0] {
        let answer = store
            .node_heartbeat(&node, CacheReport::Unchanged { digest: stale })
            .await
            .expect("heartbeat");
        assert_eq!((answer.active, answer.digest), (None, 12));
        assert_eq!(answer.live_sessions, vec![placed.id.clone()]);
    }
    store
        .end_session(&scope("acme"), &placed.id)
        .await
        .expect("end");
    let answer = store
        .node_heartbeat(&node, CacheReport::Unchanged { digest: 12 })
        .await
        .expect("heartbeat");
    assert!(
        answer.live_sessions.is_empty(),
        "an ended session is not listed"
    );
    // Another node holds nothing yet: it is asked for its set too.
    let other = store
        .register_node("host-b", "http://b", true, "", "")
        .await
        .expect("register");
    let answer = store
        .node_heartbeat(&other, CacheReport::Unchanged { digest: 12 })
        .await
        .expect("heartbeat");
    assert_eq!((answer.active, answer.digest), (None, 0));

    // A node that names no digest sends its whole set each time: the catalog names it, the
    // same way each time, and answers from it.
    let first = store
        .node_heartbeat(&other, whole(&[(&lab, 2), (&studio, 1)]))
        .await
        .expect("heartbeat");
    let second = store
        .node_heartbeat(&other, whole(&[(&studio, 1), (&lab, 2)]))
        .await
        .expect("heartbeat");
    assert_ne!(first.digest, 0);
    assert_eq!(first.digest, second.digest);
    assert_eq!(active(&second), Some(vec![(lab.clone(), 2)]));
    assert_eq!(
        active(
            &store
                .node_heartbeat(&node, CacheReport::Unchanged { digest: 12 })
                .await
                .expect("heartbeat")
        ),
        Some(vec![(studio.clone(), 2)]),
        "each node's set is its own"
    );

    // An unknown node is told so, and registers again.
    let unknown = plinth_catalog::sessions::NodeId::generate();
    assert!(matches!(
        store
            .node_heartbeat(&unknown, CacheReport::Unchanged { digest: 12 })
            .await,
        Err(StoreError::NotFound)
    ));
}

async fn a_heartbeat_answers_the_active_list_again_only_when_it_may_have_changed(store: Store) {
    let node = store
        .register_node("host-a", "http://a", true, "", "")
        .await
        .expect("register");
    let studio = environment(&store, "Studio").await;
    build(&store, &studio, "sha256:one").await;
    build(&store, &studio, "sha256:two").await;
    let lab = environment(&store, "Lab").await;
    build(&store, &lab, "sha256:three").await;
    let heartbeat = |report: CacheReport, known: u64| {
        let (store, node) = (store.clone(), node.clone());
        async move {
            store
                .node_heartbeat_with(&node, report, None, known)
                .await
                .expect("heartbeat")
        }
    };
    let unchanged = || CacheReport::Unchanged { digest: 21 };

    // A node that holds no list (epoch 0) is answered it, with the epoch that names it.
    let first = heartbeat(
        CacheReport::Whole {
            digest: Some(21),
            versions: vec![(studio.clone(), 1), (studio.clone(), 2), (lab.clone(), 1)],
        },
        0,
    )
    .await;
    assert_ne!(first.epoch, 0);
    assert!(!first.active_unchanged);
    let mut both = vec![(studio.clone(), 2), (lab.clone(), 1)];
    both.sort();
    assert_eq!(active(&first), Some(both.clone()));
    // Naming it, with the set unchanged: the list is not answered again, and not emptied.
    let quiet = heartbeat(unchanged(), first.epoch).await;
    assert!(quiet.active_unchanged);
    assert_eq!((quiet.active.clone(), quiet.epoch), (None, first.epoch));
    // A node that names an older epoch, or none, is answered the list.
    for known in [0, first.epoch - 1] {
        let answer = heartbeat(unchanged(), known).await;
        assert!(!answer.active_unchanged);
        assert_eq!(active(&answer), Some(both.clone()));
    }

    // A rollback changes what is active: the next heartbeat naming the old epoch is
    // answered the new list and a new epoch.
    store
        .activate(&scope("acme"), &studio, 1)
        .await
        .expect("rollback");
    let rolled = heartbeat(unchanged(), first.epoch).await;
    assert!(rolled.epoch > first.epoch);
    let mut after = vec![(studio.clone(), 1), (lab.clone(), 1)];
    after.sort();
    assert_eq!(active(&rolled), Some(after));
    assert!(heartbeat(unchanged(), rolled.epoch).await.active_unchanged);
    // So does a build that becomes active, and an environment deleted.
    build(&store, &lab, "sha256:four").await;
    let built = heartbeat(unchanged(), rolled.epoch).await;
    assert!(built.epoch > rolled.epoch);
    assert_eq!(active(&built), Some(vec![(studio.clone(), 1)]));
    store
        .delete_environment(&scope("acme"), &studio)
        .await
        .expect("delete");
    let deleted = heartbeat(unchanged(), built.epoch).await;
    assert!(deleted.epoch > built.epoch);
    assert_eq!(active(&deleted), Some(vec![]));

    // A changed set is answered its list whatever epoch the node names.
    let changed = heartbeat(
        CacheReport::Whole {
            digest: Some(22),
            versions: vec![(lab.clone(), 2)],
        },
        deleted.epoch,
    )
    .await;
    assert!(!changed.active_unchanged);
    assert_eq!(active(&changed), Some(vec![(lab.clone(), 2)]));
}

/// Nodes by how many sessions they run now: the node each of `count` new sessions lands on.
async fn place(store: &Store, session: &NewSession, count: usize) -> Vec<NodeId> {
    let mut nodes = Vec::new();
    for _ in 0..count {
        let placed = store
            .create_session(session.clone())
            .await
            .expect("session");
        nodes.push(placed.node_id);
    }
    nodes
}

async fn placement_goes_to_the_least_loaded_live_node(store: Store) {
    let id = environment(&store, "Studio").await;
    build(&store, &id, "sha256:one").await;
    let mut nodes = Vec::new();
    for name in ["host-a", "host-b", "host-c"] {
        nodes.push(
            store
                .register_node(name, &format!("http://{name}"), true, "", "")
                .await
                .expect("register"),
        );
        // Registered in this order, which breaks ties between equally loaded nodes.
        let before = plinth_kit::clock::now_ms();
        while plinth_kit::clock::now_ms() == before {
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
    }
    let [a, b, c] = [nodes[0].clone(), nodes[1].clone(), nodes[2].clone()];
    let session = new_session(&id);
    assert_eq!(
        place(&store, &session, 4).await,
        vec![a.clone(), b.clone(), c.clone(), a.clone()]
    );
    // b's session ends: b is the emptiest.
    let on_b = store
        .node_sessions(&b, &PageRequest::first())
        .await
        .expect("b's sessions")
        .items;
    store
        .end_session(&scope("acme"), &on_b[0].id)
        .await
        .expect("end");
    assert_eq!(place(&store, &session, 1).await, vec![b.clone()]);
    // a 2, b 1, c 1. A node the caller could not reach is passed over, however empty.
    let mut elsewhere = session.clone();
    elsewhere.exclude_node = Some(b.clone());
    assert_eq!(place(&store, &elsewhere, 1).await, vec![c.clone()]);
    // a 2, b 1, c 2. A task's session is placed by the same rule and counts as one.
    let task = store
        .create_task(NewTask {
            input: "Render it.".into(),
            metadata: "{}".into(),
            session: session.clone(),
        })
        .await
        .expect("task");
    assert_eq!(task.session.node_id, b);
    // a 2, b 2, c 2. A short-lived session goes to b (a excluded, b before c), and the sweep
    // ends it: b is back to 2, and the next three go one to each.
    let mut short = session.clone();
    short.limits = lifetime(1_000);
    short.exclude_node = Some(a.clone());
    let swept = store
        .create_session(short)
        .await
        .expect("short-lived session");
    assert_eq!(swept.node_id, b, "a 2, b 3, c 2");
    store
        .end_sessions_past_their_limits(swept.created_at_ms + 2_000, 10)
        .await
        .expect("sweep");
    assert_eq!(
        place(&store, &session, 3).await,
        vec![a.clone(), b.clone(), c.clone()]
    );

    // A node past its TTL gets nothing, however empty.
    let late = store
        .register_node("host-d", "http://host-d", true, "", "")
        .await
        .expect("register");
    let before = plinth_kit::clock::now_ms();
    while plinth_kit::clock::now_ms() == before {
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    let since = plinth_kit::clock::now_ms();
    for node in [&a, &b, &c] {
        store
            .node_heartbeat(node, CacheReport::Unchanged { digest: 1 })
            .await
            .expect("heartbeat");
    }
    let mut live = session.clone();
    live.live_since_ms = since;
    let placed = place(&store, &live, 3).await;
    assert!(!placed.contains(&late), "{placed:?}");
    // Then live again, it is the emptiest.
    store
        .node_heartbeat(&late, CacheReport::Unchanged { digest: 1 })
        .await
        .expect("heartbeat");
    assert_eq!(place(&store, &live, 1).await, vec![late.clone()]);
}

async fn a_suspect_node_gets_no_sessions_until_cleared_or_lapsed(store: Store) {
    let id = environment(&store, "Studio").await;
    build(&store, &id, "sha256:one").await;
    let a = store
        .register_node("host-a", "http://host-a:7005", true, "", "")
        .await
        .expect("register");
    let b = store
        .register_node("host-b", "http://host-b:7005", true, "", "")
        .await
        .expect("register");
    let session = new_session(&id);
    let now = plinth_kit::clock::now_ms();
    // A gateway cannot reach a: however empty, it is passed over while the mark lasts, its
    // heartbeats notwithstanding.
    assert_eq!(
        store
            .mark_node_suspect("http://host-a:7005", now + 60_000)
            .await
            .expect("mark"),
        1
    );
    store
        .node_heartbeat(&a, CacheReport::Unchanged { digest: 1 })
        .await
        .expect("heartbeat");
    assert_eq!(place(&store, &session, 3).await, vec![b.clone(); 3]);
    let counts = store
        .counts(plinth_kit::clock::now_ms(), 0)
        .await
        .expect("counts");
    assert_eq!((counts.nodes_live, counts.nodes_suspect), (1, 1));
    // Every live node suspect (or excluded): no node for the session, and the caller is told
    // to retry.
    store
        .mark_node_suspect("http://host-b:7005", now + 60_000)
        .await
        .expect("mark");
    assert!(matches!(
        store.create_session(session.clone()).await,
        Err(StoreError::NoLiveNode)
    ));
    // Cleared (a answers the gateway again): a, the emptiest, takes sessions again.
    store
        .mark_node_suspect("http://host-a:7005", 0)
        .await
        .expect("clear");
    assert_eq!(place(&store, &session, 1).await, vec![a.clone()]);
    // A mark nobody renews lapses by itself.
    store
        .mark_node_suspect("http://host-b:7005", plinth_kit::clock::now_ms() + 50)
        .await
        .expect("mark");
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let mut elsewhere = session.clone();
    elsewhere.exclude_node = Some(a.clone());
    assert_eq!(place(&store, &elsewhere, 1).await, vec![b.clone()]);
    // An address no node has marks nothing.
    assert_eq!(
        store
            .mark_node_suspect("http://nowhere:7005", now + 60_000)
            .await
            .expect("mark"),
        0
    );
    let counts = store
        .counts(plinth_kit::clock::now_ms(), 0)
        .await
        .expect("counts");
    assert_eq!((counts.nodes_live, counts.nodes_suspect), (2, 0));
}

async fn a_node_registering_again_is_no_longer_suspect(store: Store) {
    let id = environment(&store, "Studio").await;
    build(&store, &id, "sha256:one").await;
    let node = store
        .register_node("host-a", "http://127.0.0.1:40001", true, "", "")
        .await
        .expect("register");
    // A gateway that could not reach it held it suspect for an hour, then went away.
    store
        .mark_node_suspect(
            "http://127.0.0.1:40001",
            plinth_kit::clock::now_ms() + 3_600_000,
        )
        .await
        .expect("mark");
    let session = new_session(&id);
    assert!(matches!(
        store.create_session(session.clone()).await,
        Err(StoreError::NoLiveNode)
    ));
    // Restarted, it registers again (at another address): it answers, and takes sessions.
    let again = store
        .register_node("host-a", "http://127.0.0.1:40002", true, "", "")
        .await
        .expect("register again");
    assert_eq!(again, node);
    assert_eq!(place(&store, &session, 1).await, vec![node]);
}

async fn the_load_stays_counted_when_sessions_start_and_end_at_once(store: Store) {
    let id = environment(&store, "Studio").await;
    build(&store, &id, "sha256:one").await;
    let a = store
        .register_node("host-a", "http://a", true, "", "")
        .await
        .expect("register");
    let before = plinth_kit::clock::now_ms();
    while plinth_kit::clock::now_ms() == before {
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    let b = store
        .register_node("host-b", "http://b", true, "", "")
        .await
        .expect("register");
    let creates = (0..16).map(|_| {
        let store = store.clone();
        let session = new_session(&id);
        plinth_kit::tasks::spawn(
            async move { store.create_session(session).await.expect("session") },
        )
    });
    let sessions: Vec<_> = futures::future::join_all(creates)
        .await
        .into_iter()
        .map(|joined| joined.expect("joined"))
        .collect();
    let ends = sessions.iter().map(|session| {
        let store = store.clone();
        let id = session.id.clone();
        plinth_kit::tasks::spawn(async move {
            // Twice: ending an ended session changes nothing, the count included.
            store.end_session(&scope("acme"), &id).await.expect("end");
            store.end_session(&scope("acme"), &id).await.expect("end");
        })
    });
    for joined in futures::future::join_all(ends).await {
        joined.expect("joined");
    }
    // Both nodes are empty again: the next two sessions go one to each, in registration order.
    assert_eq!(place(&store, &new_session(&id), 2).await, vec![a, b]);
}

/// Sessions live when a database of the previous release is migrated count towards their
/// nodes' load from then on.
async fn live_sessions_count_once_migrated(url: String) {
    let store = Store::connect(&url, 5, crate::seal_key())
        .await
        .expect("connect");
    let node = |n: u8| format!("node_{n:032x}");
    let session = |n: u8, node_n: u8, status: &str| {
        format!(
            "INSERT INTO sessions (id, scope, environment_id, environment_name, version, \
             slug, layer_tree, node_id, status, created_at_ms) \
             VALUES ('sess_{n:032x}', 'acme', 'henv_0123456789abcdef0123456789abcdef', \
             'Old', 1, 'old', 'sha256:one', '{}', '{status}', 1000)",
            node(node_n)
        )
    };
    let mut statements: Vec<String> = (1..=3)
        .map(|n| {
            format!(
                "INSERT INTO nodes (id, name, address, isolated, registered_at_ms, \
                 heartbeat_at_ms) VALUES ('{}', 'host-{n}', 'http://{n}', 1, {n}, 0)",
                node(n)
            )
        })
        .collect();
    // host-1: two live sessions; host-2: one ended; host-3: one live.
    statements.extend([
        session(1, 1, "active"),
        session(2, 1, "active"),
        session(3, 2, "ended"),
        session(4, 3, "active"),
    ]);
    let statements: Vec<&str> = statements.iter().map(String::as_str).collect();
    store
        .migrate_up_to(18, &statements)
        .await
        .expect("an earlier release's database");
    store.migrate().await.expect("migrate");
    let id = environment(&store, "Studio").await;
    build(&store, &id, "sha256:one").await;
    let placed: Vec<String> = place(&store, &new_session(&id), 4)
        .await
        .iter()
        .map(|node| node.as_str().to_owned())
        .collect();
    // 2/0/1 → host-2 → 2/1/1 → host-2 (registered before host-3) → 2/2/1 → host-3 → host-1.
    assert_eq!(placed, vec![node(2), node(2), node(3), node(1)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_live_sessions_count_once_migrated() {
    let dir = tempfile::tempdir().expect("temp dir");
    live_sessions_count_once_migrated(plinth_catalog::testing::sqlite_url(dir.path())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_live_sessions_count_once_migrated() {
    let Some(url) = crate::postgres_url().await else {
        return;
    };
    live_sessions_count_once_migrated(url).await;
}

async fn limits_are_stored_with_the_session_and_its_task(store: Store) {
    let node = store
        .register_node("host-a", "http://a", true, "", "")
        .await
        .expect("register");
    let id = environment(&store, "Studio").await;
    build(&store, &id, "sha256:one").await;
    let limits = SessionLimits {
        memory_mb: Some(2048),
        pids: Some(256),
        cpu_millicores: Some(500),
        disk_mb: None,
        lifetime_ms: Some(86_400_000),
        idle_ms: Some(3_600_000),
    };
    // Placed by the one-statement path, and read back by every way a session is found.
    let session = limited_session(&store, &id, limits).await;
    assert_eq!(session.limits, limits);
    let found = store
        .get_session(&scope("acme"), &session.id)
        .await
        .expect("get");
    assert_eq!(found.limits, limits);
    let listed = store
        .node_sessions(&node, &PageRequest::first())
        .await
        .expect("node sessions")
        .items;
    assert_eq!(listed[0].limits, limits);
    assert_eq!(
        store.node_session_ids(&node).await.expect("ids"),
        vec![session.id.clone()]
    );
    // The transaction path: a task's session.
    let task = store
        .create_task(NewTask {
            input: "go".into(),
            metadata: "{}".into(),
            session: NewSession {
                limits: lifetime(60_000),
                ..new_session(&id)
            },
        })
        .await
        .expect("task");
    assert_eq!(task.session.limits, lifetime(60_000));
    let found = store
        .get_session(&scope("acme"), &task.session.id)
        .await
        .expect("get");
    assert_eq!(found.limits, lifetime(60_000));
    // None at all.
    let unlimited = limited_session(&store, &id, SessionLimits::default()).await;
    let found = store
        .get_session(&scope("acme"), &unlimited.id)
        .await
        .expect("get");
    assert_eq!(found.limits, SessionLimits::default());
}

async fn the_sweep_ends_sessions_past_their_lifetime_and_no_others(store: Store) {
    let node = store
        .register_node("host-a", "http://a", true, "", "")
        .await
        .expect("register");
    let id = environment(&store, "Studio").await;
    build(&store, &id, "sha256:one").await;
    let short = limited_session(&store, &id, lifetime(60_000)).await;
    let long = limited_session(&store, &id, lifetime(3_600_000)).await;
    let unlimited = limited_session(&store, &id, SessionLimits::default()).await;
    let idle_only = limited_session(
        &store,
        &id,
        SessionLimits {
            idle_ms: Some(600_000),
            ..SessionLimits::default()
        },
    )
    .await;

    // Nothing is past its end yet.
    let now = plinth_kit::clock::now_ms();
    assert!(
        store
            .end_sessions_past_their_limits(now, 100)
            .await
            .expect("sweep")
            .is_empty()
    );

    // Two minutes on, only the one-minute session is past its lifetime; it ends as
    // EndSession ends a session, and only once however often the sweep runs.
    let later = short.created_at_ms + 120_000;
    let ended = store
        .end_sessions_past_their_limits(later, 100)
        .await
        .expect("sweep");
    assert_eq!(ended, vec![short.id.clone()]);
    assert!(
        store
            .end_sessions_past_their_limits(later, 100)
            .await
            .expect("sweep again")
            .is_empty()
    );
    let gone = store
        .get_session(&scope("acme"), &short.id)
        .await
        .expect("get");
    assert_eq!(gone.status, SessionStatus::Ended);
    assert_eq!(gone.ended_at_ms, later);
    assert!(matches!(
        store
            .record_turn(&scope("acme"), &short.id, TurnKind::Exec, "true", None)
            .await,
        Err(StoreError::NotFound)
    ));
    for kept in [&long, &unlimited, &idle_only] {
        let kept = store
            .get_session(&scope("acme"), &kept.id)
            .await
            .expect("get");
        assert_eq!(kept.status, SessionStatus::Active, "{:?}", kept.limits);
    }
    let mut live = store.node_session_ids(&node).await.expect("ids");
    live.sort();
    let mut expected = vec![long.id.clone(), unlimited.id.clone(), idle_only.id.clone()];
    expected.sort();
    assert_eq!(
        live, expected,
        "the node is told which sessions are still live"
    );

    // A batch ends at most its size; the next sweep ends the rest.
    let a_day_on = long.created_at_ms + 86_400_000;
    let first = store
        .end_sessions_past_their_limits(a_day_on, 1)
        .await
        .expect("sweep");
    assert_eq!(first.len(), 1);
    let rest = store
        .end_sessions_past_their_limits(a_day_on, 100)
        .await
        .expect("sweep");
    let mut swept: Vec<_> = first.into_iter().chain(rest).collect();
    swept.sort();
    let mut expected = vec![long.id.clone(), idle_only.id.clone()];
    expected.sort();
    assert_eq!(swept, expected);
    let kept = store
        .get_session(&scope("acme"), &unlimited.id)
        .await
        .expect("get");
    assert_eq!(kept.status, SessionStatus::Active, "no limit, no end");
}

async fn idle_time_counts_from_the_last_turn(store: Store) {
    store
        .register_node("host-a", "http://a", true, "", "")
        .await
        .expect("register");
    let id = environment(&store, "Studio").await;
    build(&store, &id, "sha256:one").await;
    let limits = SessionLimits {
        idle_ms: Some(60_000),
        lifetime_ms: Some(600_000),
        ..SessionLimits::default()
    };
    let busy = limited_session(&store, &id, limits).await;
    let quiet = limited_session(&store, &id, limits).await;
    // A turn a little after creation moves the busy session's idle end past the quiet one's.
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    let turn = store
        .record_turn(&scope("acme"), &busy.id, TurnKind::Exec, "true", None)
        .await
        .expect("turn");
    assert!(turn.at_ms >= busy.created_at_ms + 50);

    // Just past the quiet session's idle end: it ends, the busy one does not.
    let quiet_end = quiet.created_at_ms.max(busy.created_at_ms) + 60_000;
    assert!(quiet_end < turn.at_ms + 60_000);
    let ended = store
        .end_sessions_past_their_limits(quiet_end, 100)
        .await
        .expect("sweep");
    assert_eq!(ended, vec![quiet.id.clone()]);
    // Past its own idle end, counted from the turn, the busy one ends too.
    let ended = store
        .end_sessions_past_their_limits(turn.at_ms + 60_000, 100)
        .await
        .expect("sweep");
    assert_eq!(ended, vec![busy.id.clone()]);

    // Turns never move the end past the lifetime: with a lifetime shorter than the idle time
    // left, the lifetime ends the session.
    let capped = limited_session(
        &store,
        &id,
        SessionLimits {
            idle_ms: Some(600_000),
            lifetime_ms: Some(60_000),
            ..SessionLimits::default()
        },
    )
    .await;
    store
        .record_turn(&scope("acme"), &capped.id, TurnKind::Exec, "true", None)
        .await
        .expect("turn");
    let ended = store
        .end_sessions_past_their_limits(capped.created_at_ms + 60_000, 100)
        .await
        .expect("sweep");
    assert_eq!(ended, vec![capped.id]);
}

async fn a_touch_moves_the_idle_end_as_a_turn_does_and_records_none(store: Store) {
    store
        .register_node("host-a", "http://a", true, "", "")
        .await
        .expect("register");
    let id = environment(&store, "Studio").await;
    build(&store, &id, "sha256:one").await;
    let limits = SessionLimits {
        idle_ms: Some(60_000),
        lifetime_ms: Some(600_000),
        ..SessionLimits::default()
    };
    let touched = limited_session(&store, &id, limits).await;
    let quiet = limited_session(&store, &id, limits).await;
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    let before = plinth_kit::database::now_ms();
    store
        .touch_session(&scope("acme"), &touched.id)
        .await
        .expect("touch");
    let quiet_end = quiet.created_at_ms.max(touched.created_at_ms) + 60_000;
    let ended = store
        .end_sessions_past_their_limits(quiet_end, 100)
        .await
        .expect("sweep");
    assert_eq!(
        ended,
        vec![quiet.id.clone()],
        "the touched session ended with the quiet one"
    );
    let session = store
        .get_session(&scope("acme"), &touched.id)
        .await
        .expect("session");
    assert_eq!(session.turns, 0, "a touch records no turn");
    let ended = store
        .end_sessions_past_their_limits(before + 60_000 + 1_000, 100)
        .await
        .expect("sweep");
    assert_eq!(ended, vec![touched.id.clone()]);
    // Another scope cannot touch it, and an ended session cannot be touched.
    for (who, session) in [
        ("globex", &quiet.id),
        ("acme", &quiet.id),
        ("acme", &touched.id),
    ] {
        let refused = store.touch_session(&scope(who), session).await;
        assert!(
            matches!(refused, Err(StoreError::NotFound)),
            "{who}: {refused:?}"
        );
    }
}

/// Reads every page of a list, handing back each `next` as a client does (the opaque string,
/// decoded again), and answers the items in the order seen and how many pages there were.
async fn every_page<T, F, Fut>(limit: u32, mut read: F) -> (Vec<T>, usize)
where
    F: FnMut(PageRequest) -> Fut,
    Fut: std::future::Future<Output = Result<plinth_catalog::model::Page<T>, StoreError>>,
{
    let mut seen = Vec::new();
    let mut page = PageRequest { limit, after: None };
    let mut pages = 0;
    loop {
        let answer = read(page.clone()).await.expect("page");
        pages += 1;
        assert!(answer.items.len() <= limit as usize);
        seen.extend(answer.items);
        match answer.next {
            Some(next) => page.after = Some(Cursor::decode(&next.encode()).expect("its cursor")),
            None => break,
        }
    }
    (seen, pages)
}

async fn pages_of_turns_walk_every_turn_once_in_order(store: Store) {
    store
        .register_node("host-a", "http://a", true, "", "")
        .await
        .expect("register");
    let id = environment(&store, "Studio").await;
    build(&store, &id, "sha256:one").await;
    let session = limited_session(&store, &id, SessionLimits::default()).await;
    let other = limited_session(&store, &id, SessionLimits::default()).await;
    for n in 0..30 {
        store
            .record_turn(
                &scope("acme"),
                &session.id,
                TurnKind::Exec,
                &format!("echo {n}"),
                None,
            )
            .await
            .expect("turn");
    }
    store
        .record_turn(&scope("acme"), &other.id, TurnKind::Exec, "true", None)
        .await
        .expect("turn");
    let (turns, pages) = every_page(7, |page| {
        let store = store.clone();
        let id = session.id.clone();
        async move { store.list_turns(&scope("acme"), &id, &page).await }
    })
    .await;
    assert_eq!(pages, 5, "30 turns in pages of 7");
    assert_eq!(
        turns.iter().map(|turn| turn.sequence).collect::<Vec<_>>(),
        (1..=30).collect::<Vec<_>>(),
        "every turn once, oldest first"
    );
    assert_eq!(turns[29].detail, "echo 29");
    // A page exactly as long as what is left says so: no empty page follows.
    let whole = store
        .list_turns(
            &scope("acme"),
            &session.id,
            &PageRequest {
                limit: 30,
                after: None,
            },
        )
        .await
        .expect("page");
    assert_eq!(whole.items.len(), 30);
    assert!(whole.next.is_none());

    // A cursor from another session's turns, or from a list of sessions, is not this list's.
    let first = store
        .list_turns(
            &scope("acme"),
            &session.id,
            &PageRequest {
                limit: 1,
                after: None,
            },
        )
        .await
        .expect("page");
    let foreign = [
        first.next.expect("more turns"),
        Cursor {
            key: other.created_at_ms,
            id: other.id.as_str().to_owned(),
        },
    ];
    for cursor in foreign {
        let refused = store
            .list_turns(
                &scope("acme"),
                &other.id,
                &PageRequest {
                    limit: 5,
                    after: Some(cursor),
                },
            )
            .await;
        assert!(
            matches!(refused, Err(StoreError::ForeignCursor)),
            "{refused:?}"
        );
    }
}

async fn pages_of_a_nodes_and_an_owners_sessions_walk_each_live_one_once(store: Store) {
    let node = store
        .register_node("host-a", "http://a", true, "", "")
        .await
        .expect("register");
    let id = environment(&store, "Studio").await;
    build(&store, &id, "sha256:one").await;
    // Created faster than the clock ticks: many share a millisecond, and the id breaks ties.
    let mut created = Vec::new();
    for n in 0..23 {
        let owner = if n % 2 == 0 { "brain:a:s:e" } else { "" };
        let session = store
            .create_session(NewSession {
                owner: owner.to_owned(),
                ..new_session(&id)
            })
            .await
            .expect("session");
        created.push(session);
    }
    let ended = created.remove(5);
    store
        .end_session(&scope("acme"), &ended.id)
        .await
        .expect("end");
    created.sort_by(|a, b| (a.created_at_ms, a.id.as_str()).cmp(&(b.created_at_ms, b.id.as_str())));

    let (live, pages) = every_page(5, |page| {
        let store = store.clone();
        let node = node.clone();
        async move { store.node_sessions(&node, &page).await }
    })
    .await;
    assert_eq!(pages, 5, "22 live sessions in pages of 5");
    assert_eq!(
        live.iter().map(|s| s.id.clone()).collect::<Vec<_>>(),
        created.iter().map(|s| s.id.clone()).collect::<Vec<_>>(),
        "every live session of the node once, oldest first; the ended one is not listed"
    );

    let (owned, pages) = every_page(4, |page| {
        let store = store.clone();
        async move {
            store
                .owned_sessions(&scope("acme"), "brain:a:s:e", &page)
                .await
        }
    })
    .await;
    assert_eq!(pages, 3, "11 live owned sessions in pages of 4");
    assert_eq!(
        owned.iter().map(|s| s.id.clone()).collect::<Vec<_>>(),
        created
            .iter()
            .filter(|s| s.owner == "brain:a:s:e")
            .map(|s| s.id.clone())
            .collect::<Vec<_>>()
    );
    let theirs = store
        .owned_sessions(&scope("globex"), "brain:a:s:e", &PageRequest::first())
        .await
        .expect("page");
    assert!(theirs.items.is_empty() && theirs.next.is_none());

    // A cursor from a list of something else (an environment's, a turn's) is refused.
    let foreign = Cursor {
        key: 3,
        id: id.as_str().to_owned(),
    };
    let page = PageRequest {
        limit: 5,
        after: Some(foreign),
    };
    assert!(matches!(
        store.node_sessions(&node, &page).await,
        Err(StoreError::ForeignCursor)
    ));
    assert!(matches!(
        store
            .owned_sessions(&scope("acme"), "brain:a:s:e", &page)
            .await,
        Err(StoreError::ForeignCursor)
    ));
}

/// Limits stored in seconds by an earlier release read back in milliseconds once the store is
/// migrated, and the sweep ends such a session when its lifetime, counted in milliseconds,
/// has passed.
async fn limits_stored_in_seconds_are_migrated_to_milliseconds(url: String) {
    let store = Store::connect(&url, 5, crate::seal_key())
        .await
        .expect("connect");
    let session = "sess_0123456789abcdef0123456789abcdef";
    store
        .migrate_up_to(
            15,
            &[
                "INSERT INTO nodes (id, name, address, isolated, registered_at_ms, heartbeat_at_ms) \
                 VALUES ('node_0123456789abcdef0123456789abcdef', 'host-a', 'http://a', 1, 0, 0)",
                &format!(
                    "INSERT INTO sessions (id, scope, environment_id, environment_name, version, \
                     slug, layer_tree, node_id, status, created_at_ms, limit_memory_mb, \
                     limit_lifetime_s, limit_idle_s, ends_at_ms) \
                     VALUES ('{session}', 'acme', 'henv_0123456789abcdef0123456789abcdef', \
                     'Old', 1, 'old', 'sha256:one', 'node_0123456789abcdef0123456789abcdef', \
                     'active', 1000, 512, 60, NULL, 61000)"
                ),
            ],
        )
        .await
        .expect("an earlier release's database");
    store.migrate().await.expect("migrate");
    let id = plinth_catalog::sessions::SessionId::parse(session).expect("id");
    let found = store
        .get_session(&scope("acme"), &id)
        .await
        .expect("the session");
    assert_eq!(
        found.limits,
        SessionLimits {
            memory_mb: Some(512),
            lifetime_ms: Some(60_000),
            ..SessionLimits::default()
        }
    );
    assert!(
        store
            .end_sessions_past_their_limits(60_999, 10)
            .await
            .expect("sweep")
            .is_empty()
    );
    assert_eq!(
        store
            .end_sessions_past_their_limits(61_000, 10)
            .await
            .expect("sweep"),
        vec![id]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_limits_stored_in_seconds_are_migrated_to_milliseconds() {
    let dir = tempfile::tempdir().expect("temp dir");
    limits_stored_in_seconds_are_migrated_to_milliseconds(plinth_catalog::testing::sqlite_url(
        dir.path(),
    ))
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_limits_stored_in_seconds_are_migrated_to_milliseconds() {
    let Some(url) = crate::postgres_url().await else {
        return;
    };
    limits_stored_in_seconds_are_migrated_to_milliseconds(url).await;
}
