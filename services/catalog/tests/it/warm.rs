//! The versions nodes hold warm and the read orders of versions, in the store, every backend:
//! each test below runs against SQLite and against PostgreSQL (`PLINTH_TEST_POSTGRES_URL`;
//! required under CI).

use plinth_catalog::model::{EnvironmentId, NewEnvironment, Outcome};
use plinth_catalog::sessions::{CacheReport, HeartbeatAnswer, NodeId, SessionLimits};
use plinth_catalog::warm::ReadOrder;
use plinth_catalog::{NewSession, RetentionPolicy, Store, StoreError};

use crate::{LEASES, scope};

backend_suite!(
    an_activation_is_on_the_warm_list_of_the_next_heartbeat_that_lists_active_versions,
    the_warm_list_holds_at_most_the_configured_number_of_versions,
    a_read_order_is_the_first_recorded_and_goes_with_its_version,
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

/// Builds the next version of `id`, ready with layer `layer` (and so active) or failed.
async fn build(store: &Store, id: &EnvironmentId, layer: Option<&str>) -> u32 {
    let queued = store
        .start_build(&scope("acme"), id, "sha256:source", false)
        .await
        .expect("start");
    let claim = store
        .claim_build("builder", LEASES)
        .await
        .expect("claim")
        .expect("work");
    let outcome = match layer {
        Some(layer) => Outcome::Ready {
            layer_tree: layer.to_owned(),
            packages: Vec::new(),
            size: 1,
            dependency_key: String::new(),
            toolchains: Vec::new(),
        },
        None => Outcome::Failed {
            error: "it failed".to_owned(),
        },
    };
    store
        .complete_build(&claim.token, outcome)
        .await
        .expect("complete");
    // Activations a millisecond apart, so "most recently activated" is one order.
    let now = plinth_kit::clock::now_ms();
    while plinth_kit::clock::now_ms() == now {
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    queued.version
}

/// The warm list of an answer as (environment, slug, version, layer tree), in its order.
fn warm(answer: &HeartbeatAnswer) -> Vec<(EnvironmentId, String, u32, String)> {
    answer
        .warm
        .iter()
        .map(|warm| {
            (
                warm.environment_id.clone(),
                warm.slug.clone(),
                warm.version,
                warm.layer_tree.clone(),
            )
        })
        .collect()
}

fn entry(
    id: &EnvironmentId,
    slug: &str,
    version: u32,
    layer: &str,
) -> (EnvironmentId, String, u32, String) {
    (id.clone(), slug.to_owned(), version, layer.to_owned())
}

/// A node whose cache set the catalog holds (digest 31), and a heartbeat of it naming the
/// epoch of the list it holds.
async fn node(store: &Store) -> NodeId {
    let node = store
        .register_node("host-a", "http://a", true, "", "")
        .await
        .expect("register");
    store
        .node_heartbeat(
            &node,
            CacheReport::Whole {
                digest: Some(31),
                versions: Vec::new(),
            },
        )
        .await
        .expect("heartbeat");
    node
}

async fn heartbeat(store: &Store, node: &NodeId, known_epoch: u64) -> HeartbeatAnswer {
    store
        .node_heartbeat_with(
            node,
            CacheReport::Unchanged { digest: 31 },
            None,
            known_epoch,
        )
        .await
        .expect("heartbeat")
}

async fn an_activation_is_on_the_warm_list_of_the_next_heartbeat_that_lists_active_versions(
    store: Store,
) {
    let node = node(&store).await;
    let first = heartbeat(&store, &node, 0).await;
    assert!(first.active.is_some());
    assert_eq!(warm(&first), vec![], "nothing is active yet");

    // A build that becomes active is on the next list, named as its sessions name it.
    let studio = environment(&store, "Studio").await;
    build(&store, &studio, Some("sha256:one")).await;
    let built = heartbeat(&store, &node, first.epoch).await;
    assert!(built.epoch > first.epoch);
    assert_eq!(
        warm(&built),
        vec![entry(&studio, "studio", 1, "sha256:one")]
    );
    let session = store
        .create_session(NewSession {
            scope: scope("acme"),
            environment_id: studio.clone(),
            version: None,
            harness_id: String::new(),
            owner: String::new(),
            live_since_ms: 0,
            exclude_node: None,
            workdir_at_placement: true,
            limits: SessionLimits::default(),
        })
        .await
        .expect("session");
    assert_eq!(
        (&built.warm[0].slug, &built.warm[0].layer_tree),
        (&session.slug, &session.layer_tree),
        "a warm version is named as a session on it is"
    );

    // Unchanged: the answer omits the list, as it omits the active versions.
    let quiet = heartbeat(&store, &node, built.epoch).await;
    assert!(quiet.active_unchanged);
    assert_eq!(warm(&quiet), vec![]);

    // Most recently activated first.
    let lab = environment(&store, "Lab").await;
    build(&store, &lab, Some("sha256:two")).await;
    let two = heartbeat(&store, &node, built.epoch).await;
    assert_eq!(
        warm(&two),
        vec![
            entry(&lab, "lab", 1, "sha256:two"),
            entry(&studio, "studio", 1, "sha256:one"),
        ]
    );
    build(&store, &studio, Some("sha256:three")).await;
    let newer = heartbeat(&store, &node, two.epoch).await;
    assert_eq!(
        warm(&newer),
        vec![
            entry(&studio, "studio", 2, "sha256:three"),
            entry(&lab, "lab", 1, "sha256:two"),
        ]
    );

    // A rollback changes the list: the older version, activated last.
    store
        .activate(&scope("acme"), &lab, 1)
        .await
        .expect("activating the active version changes nothing");
    assert!(heartbeat(&store, &node, newer.epoch).await.active_unchanged);
    store
        .activate(&scope("acme"), &studio, 1)
        .await
        .expect("rollback");
    let rolled = heartbeat(&store, &node, newer.epoch).await;
    assert!(rolled.epoch > newer.epoch);
    assert_eq!(
        warm(&rolled),
        vec![
            entry(&studio, "studio", 1, "sha256:one"),
            entry(&lab, "lab", 1, "sha256:two"),
        ]
    );

    // An environment with nothing active is not on it; a deleted one leaves it.
    let empty = environment(&store, "Empty").await;
    build(&store, &empty, None).await;
    store
        .end_session(&scope("acme"), &session.id)
        .await
        .expect("end");
    store
        .delete_environment(&scope("acme"), &lab)
        .await
        .expect("delete");
    let deleted = heartbeat(&store, &node, rolled.epoch).await;
    assert_eq!(
        warm(&deleted),
        vec![entry(&studio, "studio", 1, "sha256:one")]
    );

    // A node whose set the catalog does not hold is answered neither list.
    let stale = store
        .node_heartbeat_with(&node, CacheReport::Unchanged { digest: 7 }, None, 0)
        .await
        .expect("heartbeat");
    assert_eq!((stale.active.clone(), warm(&stale)), (None, vec![]));
}

async fn the_warm_list_holds_at_most_the_configured_number_of_versions(store: Store) {
    let mut environments = Vec::new();
    for name in ["One", "Two", "Three"] {
        let id = environment(&store, name).await;
        build(&store, &id, Some(&format!("sha256:{name}"))).await;
        environments.push(id);
    }
    let node = node(&store).await;
    let all = heartbeat(&store, &node, 0).await;
    assert_eq!(all.warm.len(), 3);

    let two = store.clone().with_prewarm_versions(2);
    let bounded = heartbeat(&two, &node, 0).await;
    assert_eq!(
        warm(&bounded),
        vec![
            entry(&environments[2], "three", 1, "sha256:Three"),
            entry(&environments[1], "two", 1, "sha256:Two"),
        ],
        "the two most recently activated"
    );

    let none = store.clone().with_prewarm_versions(0);
    let off = heartbeat(&none, &node, 0).await;
    assert!(off.active.is_some(), "the active versions are still listed");
    assert_eq!(warm(&off), vec![]);
}

fn order(paths: &[&str]) -> ReadOrder {
    ReadOrder::new(paths.iter().map(|path| (*path).to_owned()).collect()).expect("valid")
}

async fn a_read_order_is_the_first_recorded_and_goes_with_its_version(store: Store) {
    let node = node(&store).await;
    let studio = environment(&store, "Studio").await;
    build(&store, &studio, Some("sha256:one")).await;
    assert_eq!(store.read_order(&studio, 1).await.expect("read"), None);

    // The first recording is kept; later ones are answered false and change nothing.
    let first = order(&["bin/python3", "lib/python3.12/os.py", "new\nline\\"]);
    assert!(
        store
            .record_read_order(&node, &studio, 1, &first)
            .await
            .expect("record")
    );
    assert!(
        !store
            .record_read_order(&node, &studio, 1, &order(&["etc/other"]))
            .await
            .expect("record")
    );
    assert_eq!(
        store.read_order(&studio, 1).await.expect("read"),
        Some(first.clone())
    );

    // A version that is not a ready build of the environment has none.
    let failed = build(&store, &studio, None).await;
    let lab = environment(&store, "Lab").await;
    for (environment, version) in [(&studio, failed), (&studio, 9), (&lab, 1)] {
        assert!(
            matches!(
                store
                    .record_read_order(&node, environment, version, &first)
                    .await,
                Err(StoreError::NotFound)
            ),
            "{environment} {version}"
        );
        assert_eq!(
            store.read_order(environment, version).await.expect("read"),
            None
        );
    }

    // An empty recording stores nothing: a later one is still the first.
    let second = build(&store, &studio, Some("sha256:two")).await;
    assert!(
        !store
            .record_read_order(&node, &studio, second, &order(&[]))
            .await
            .expect("record")
    );
    assert_eq!(store.read_order(&studio, second).await.expect("read"), None);
    assert!(
        store
            .record_read_order(&node, &studio, second, &order(&["bin/sh"]))
            .await
            .expect("record")
    );

    // A retired version's read order goes with it, and a deleted environment's.
    store
        .apply_retention(RetentionPolicy {
            keep_versions: 1,
            ..RetentionPolicy::default()
        })
        .await
        .expect("retention");
    assert_eq!(store.read_order(&studio, 1).await.expect("read"), None);
    assert_eq!(
        store.read_order(&studio, second).await.expect("read"),
        Some(order(&["bin/sh"]))
    );
    store
        .delete_environment(&scope("acme"), &studio)
        .await
        .expect("delete");
    assert_eq!(store.read_order(&studio, second).await.expect("read"), None);
}
