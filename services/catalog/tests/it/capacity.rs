//! What nodes can take, on every backend: placement never commits more sessions or memory
//! than a node said it has, two placements at once never both take a node's last slot, and a
//! node that left on purpose gets nothing and is not counted late until it registers again.

use plinth_catalog::model::{EnvironmentId, NewEnvironment, Outcome, PageRequest, Scope};
use plinth_catalog::sessions::{CacheReport, NodeCapacity, NodeId, SessionLimits};
use plinth_catalog::{NewSession, NewTask, Store, StoreError};

use crate::{LEASES, scope};

backend_suite!(
    placement_never_commits_more_than_a_node_has,
    two_placements_at_once_never_both_take_the_last_slot,
    a_node_that_left_gets_nothing_and_is_not_late_until_it_registers_again,
);

/// An environment of `scope` built to ready.
async fn built(store: &Store, scope: &Scope, name: &str) -> EnvironmentId {
    let id = store
        .create_environment(
            NewEnvironment::new(scope.clone(), name.to_owned(), String::new(), String::new())
                .expect("valid"),
        )
        .await
        .expect("create")
        .id;
    store
        .start_build(scope, &id, "sha256:source", false)
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
                layer_tree: "sha256:one".to_owned(),
                packages: Vec::new(),
                size: 1,
                dependency_key: String::new(),
                toolchains: Vec::new(),
            },
        )
        .await
        .expect("complete");
    id
}

/// A session of `scope` on `environment` with `memory_mb` as its memory limit.
fn wanting(scope: &Scope, environment: &EnvironmentId, memory_mb: Option<u64>) -> NewSession {
    NewSession {
        scope: scope.clone(),
        environment_id: environment.clone(),
        version: None,
        harness_id: String::new(),
        owner: String::new(),
        live_since_ms: 0,
        exclude_node: None,
        workdir_at_placement: true,
        limits: SessionLimits {
            memory_mb,
            ..SessionLimits::default()
        },
    }
}

fn capacity(max_sessions: Option<u64>, memory_mb: Option<u64>) -> NodeCapacity {
    NodeCapacity {
        max_sessions,
        memory_mb,
    }
}

async fn register(store: &Store, name: &str, capacity: NodeCapacity) -> NodeId {
    let node = store
        .register_node_with(name, &format!("http://{name}"), true, "", "", capacity)
        .await
        .expect("register");
    // Registered one after the other, which breaks ties between equally loaded nodes.
    let before = plinth_kit::clock::now_ms();
    while plinth_kit::clock::now_ms() == before {
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    node
}

/// The node the session goes to, or why none.
async fn placed(store: &Store, new: &NewSession) -> Result<NodeId, StoreError> {
    store
        .create_session(new.clone())
        .await
        .map(|session| session.node_id)
}

fn is_full(result: &Result<NodeId, StoreError>, live: u64) -> bool {
    matches!(result, Err(StoreError::NoCapacity { live_nodes, .. }) if *live_nodes == live)
}

async fn placement_never_commits_more_than_a_node_has(store: Store) {
    let acme = scope("acme");
    let id = built(&store, &acme, "Studio").await;
    let gib = wanting(&acme, &id, Some(1024));
    // Two slots and plenty of memory; and room for one GiB session and a half.
    let slots = register(&store, "two-slots", capacity(Some(2), Some(64 * 1024))).await;
    let small = register(&store, "small", capacity(None, Some(1536))).await;

    // Least loaded first: slots, small, slots; then small has 512 MiB left and slots none.
    for expected in [&slots, &small, &slots] {
        assert_eq!(&placed(&store, &gib).await.expect("placed"), expected);
    }
    let refused = placed(&store, &gib).await;
    assert!(is_full(&refused, 2), "{refused:?}");
    match refused {
        Err(StoreError::NoCapacity { memory_mb, .. }) => assert_eq!(memory_mb, Some(1024)),
        other => panic!("{other:?}"),
    }
    // A task's session is refused the same way, and nothing of the task is left.
    let task = store
        .create_task(NewTask {
            input: "go".into(),
            metadata: "{}".into(),
            session: gib.clone(),
        })
        .await;
    assert!(
        matches!(task, Err(StoreError::NoCapacity { live_nodes: 2, .. })),
        "{task:?}"
    );
    // What fits still goes: 512 MiB on small.
    let half = wanting(&acme, &id, Some(512));
    assert_eq!(placed(&store, &half).await.expect("placed"), small);
    // A session without a memory limit commits no memory, only a slot: small, with no
    // memory left but no limit on slots, takes it.
    let unlimited = wanting(&acme, &id, None);
    assert_eq!(placed(&store, &unlimited).await.expect("placed"), small);

    // One of slots' sessions ends: its slot is free again, and its memory.
    let on_slots = store
        .node_sessions(&slots, &PageRequest::first())
        .await
        .expect("sessions")
        .items;
    store
        .end_session(&acme, &on_slots[0].id)
        .await
        .expect("end");
    assert_eq!(placed(&store, &gib).await.expect("placed"), slots);
    assert!(is_full(&placed(&store, &gib).await, 2));

    // A heartbeat saying more memory makes room at once; one saying nothing changes nothing.
    store
        .node_heartbeat(&small, CacheReport::Unchanged { digest: 1 })
        .await
        .expect("heartbeat");
    assert!(is_full(&placed(&store, &gib).await, 2));
    store
        .node_heartbeat_with(
            &small,
            CacheReport::Unchanged { digest: 1 },
            Some(capacity(None, Some(2560))),
            0,
        )
        .await
        .expect("heartbeat");
    assert_eq!(placed(&store, &gib).await.expect("placed"), small);
    assert!(is_full(&placed(&store, &gib).await, 2));

    // A node that says nothing (an earlier release) is unlimited.
    let old = store
        .register_node("old", "http://old", true, "", "")
        .await
        .expect("register");
    for _ in 0..5 {
        assert_eq!(placed(&store, &gib).await.expect("placed"), old);
    }
    // Registering again with a capacity puts it under that capacity: already past it, it
    // gets nothing more (its sessions stay).
    register(&store, "old", capacity(Some(3), None)).await;
    let refused = placed(&store, &gib).await;
    assert!(is_full(&refused, 3), "{refused:?}");
    assert_eq!(
        store
            .node_sessions(&old, &PageRequest::first())
            .await
            .expect("sessions")
            .items
            .len(),
        5
    );
    // And no node alive at all is said apart from every node being full.
    let mut stale = gib.clone();
    stale.live_since_ms = i64::MAX;
    assert!(matches!(
        placed(&store, &stale).await,
        Err(StoreError::NoLiveNode)
    ));
}

/// Creates at once, from as many scopes (so no scope's own lock puts them in turn), on one
/// node with `slots` slots, answer exactly `slots` sessions, round after round.
async fn two_placements_at_once_never_both_take_the_last_slot(store: Store) {
    const CALLERS: usize = 8;
    let scopes: Vec<Scope> = (0..CALLERS).map(|n| scope(&format!("team-{n}"))).collect();
    let mut environments = Vec::new();
    for scope in &scopes {
        environments.push(built(&store, scope, "Studio").await);
    }
    // By slots, then by memory: 3 slots; then 3 GiB of room for 1 GiB sessions.
    for (name, node_capacity) in [
        ("slots", capacity(Some(3), None)),
        ("memory", capacity(None, Some(3 * 1024))),
    ] {
        let node = register(&store, name, node_capacity).await;
        for round in 0..5 {
            let creates = scopes
                .iter()
                .zip(&environments)
                .map(|(scope, environment)| {
                    let (store, new) = (store.clone(), wanting(scope, environment, Some(1024)));
                    plinth_kit::tasks::spawn(async move { store.create_session(new).await })
                });
            let mut made = Vec::new();
            for joined in futures::future::join_all(creates).await {
                match joined.expect("joined") {
                    Ok(session) => made.push(session),
                    Err(StoreError::NoCapacity { .. }) => {}
                    Err(other) => panic!("round {round} on {name}: {other:?}"),
                }
            }
            assert_eq!(
                made.len(),
                3,
                "round {round} on {name}: three sessions fit, and only three were placed"
            );
            assert!(made.iter().all(|session| session.node_id == node));
            for session in made {
                store
                    .end_session(&session.scope, &session.id)
                    .await
                    .expect("end");
            }
        }
        // Done with this node: it leaves, so the next round has only the next one.
        store.leave_node(name).await.expect("leave");
    }
}

async fn a_node_that_left_gets_nothing_and_is_not_late_until_it_registers_again(store: Store) {
    let acme = scope("acme");
    let id = built(&store, &acme, "Studio").await;
    let new = wanting(&acme, &id, Some(1024));
    let leaving = register(&store, "leaving", NodeCapacity::default()).await;
    let staying = register(&store, "staying", NodeCapacity::default()).await;
    let session = store.create_session(new.clone()).await.expect("session");
    assert_eq!(session.node_id, leaving);

    let (left, active) = store.leave_node("leaving").await.expect("leave");
    assert_eq!((left, active), (leaving.clone(), 1));
    assert!(matches!(
        store.leave_node("nobody").await,
        Err(StoreError::NotFound)
    ));
    // It gets no session though it is the emptiest once the other has two, and heartbeats.
    for _ in 0..2 {
        assert_eq!(placed(&store, &new).await.expect("placed"), staying);
    }
    store
        .node_heartbeat(&leaving, CacheReport::Unchanged { digest: 1 })
        .await
        .expect("a node that left may still heartbeat");
    assert_eq!(placed(&store, &new).await.expect("placed"), staying);
    // Its session is kept: it ends as any session does.
    assert_eq!(
        store.node_session_ids(&leaving).await.expect("ids").len(),
        1
    );

    // Counted neither live nor late: as it goes silent, and while it still heartbeats.
    let now = plinth_kit::clock::now_ms();
    let counts = store.counts(now, 0).await.expect("counts");
    assert_eq!((counts.nodes_live, counts.nodes_late), (1, 0));
    let counts = store.counts(now, now + 1).await.expect("counts");
    assert_eq!(
        (counts.nodes_live, counts.nodes_late),
        (0, 1),
        "only the node that stayed is late"
    );
    // With both gone, no node is alive for the session.
    store.leave_node("staying").await.expect("leave");
    assert!(matches!(
        placed(&store, &new).await,
        Err(StoreError::NoLiveNode)
    ));
    let counts = store.counts(now, now + 1).await.expect("counts");
    assert_eq!((counts.nodes_live, counts.nodes_late), (0, 0));

    // Registering again under its name brings it back, with its id.
    let back = register(&store, "leaving", NodeCapacity::default()).await;
    assert_eq!(back, leaving);
    assert_eq!(placed(&store, &new).await.expect("placed"), leaving);
    let counts = store
        .counts(plinth_kit::clock::now_ms(), 0)
        .await
        .expect("counts");
    assert_eq!((counts.nodes_live, counts.nodes_late), (1, 0));
}

/// Memory committed by sessions live when a database of the previous release is migrated
/// counts towards their nodes from then on.
async fn committed_memory_counts_once_migrated(url: String) {
    let store = Store::connect(&url, 5, crate::seal_key())
        .await
        .expect("connect");
    let node = "node_00000000000000000000000000000001";
    let session = |n: u8, memory: &str, status: &str| {
        format!(
            "INSERT INTO sessions (id, scope, environment_id, environment_name, version, \
             slug, layer_tree, node_id, status, created_at_ms, limit_memory_mb) \
             VALUES ('sess_{n:032x}', 'acme', 'henv_0123456789abcdef0123456789abcdef', \
             'Old', 1, 'old', 'sha256:one', '{node}', '{status}', 1000, {memory})"
        )
    };
    let statements = [
        format!(
            "INSERT INTO nodes (id, name, address, isolated, registered_at_ms, \
             heartbeat_at_ms) VALUES ('{node}', 'host-1', 'http://1', 1, 1, 0)"
        ),
        // 2 GiB committed: two live sessions of a GiB, one without a limit; one ended.
        session(1, "1024", "active"),
        session(2, "1024", "active"),
        session(3, "NULL", "active"),
        session(4, "4096", "ended"),
    ];
    let statements: Vec<&str> = statements.iter().map(String::as_str).collect();
    store
        .migrate_up_to(20, &statements)
        .await
        .expect("an earlier release's database");
    store.migrate().await.expect("migrate");
    let acme = scope("acme");
    let id = built(&store, &acme, "Studio").await;
    // 3 GiB: one more GiB session fits, then none.
    register(&store, "host-1", capacity(None, Some(3 * 1024))).await;
    let gib = wanting(&acme, &id, Some(1024));
    assert_eq!(placed(&store, &gib).await.expect("placed").as_str(), node);
    assert!(is_full(&placed(&store, &gib).await, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_committed_memory_counts_once_migrated() {
    let dir = tempfile::tempdir().expect("temp dir");
    committed_memory_counts_once_migrated(plinth_catalog::testing::sqlite_url(dir.path())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_committed_memory_counts_once_migrated() {
    let Some(url) = crate::postgres_url().await else {
        return;
    };
    committed_memory_counts_once_migrated(url).await;
}
