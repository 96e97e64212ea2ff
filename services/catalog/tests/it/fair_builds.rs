//! Builds are claimed fairly across scopes, on every backend: one builder serves the scopes
//! with queued builds in turn (each scope's own builds oldest first), a scope at its cap of
//! running builds waits while other scopes' builds start, and claims racing on one database
//! never take one build twice nor pass the cap.

use std::collections::{HashMap, HashSet};

use plinth_catalog::model::{BuildStatus, Claim, EnvironmentId, NewEnvironment, Outcome};
use plinth_catalog::{LeasePolicy, Store};

use crate::{LEASES, scope};

backend_suite!(
    one_builder_serves_the_scopes_in_turn,
    a_scope_at_its_cap_waits_while_other_scopes_start,
    concurrent_claims_never_share_a_build_nor_pass_the_cap,
);

/// Makes `count` environments in `scope_name` and queues a build of each; their ids.
async fn queue(store: &Store, scope_name: &str, count: usize) -> Vec<EnvironmentId> {
    let mut ids = Vec::new();
    for index in 0..count {
        let environment = store
            .create_environment(
                NewEnvironment::new(
                    scope(scope_name),
                    format!("{scope_name} {index}"),
                    String::new(),
                    "run.sh".to_owned(),
                )
                .expect("valid environment"),
            )
            .await
            .expect("create");
        store
            .start_build(&scope(scope_name), &environment.id, "sha256:tree", false)
            .await
            .expect("start");
        ids.push(environment.id);
    }
    ids
}

fn ended() -> Outcome {
    Outcome::Failed {
        error: "ended by the test".to_owned(),
    }
}

/// A claim that must find work.
async fn claim(store: &Store, policy: LeasePolicy) -> Claim {
    store
        .claim_build("builder", policy)
        .await
        .expect("claim")
        .expect("a build to claim")
}

async fn one_builder_serves_the_scopes_in_turn(store: Store) {
    // acme's backlog is queued first, then globex's and initech's.
    let mut queued: HashMap<&str, Vec<EnvironmentId>> = HashMap::new();
    for (name, count) in [("acme", 4), ("globex", 2), ("initech", 1)] {
        queued.insert(name, queue(&store, name, count).await);
    }
    let mut order: Vec<Claim> = Vec::new();
    while let Some(claim) = store.claim_build("only", LEASES).await.expect("claim") {
        store
            .complete_build(&claim.token, ended())
            .await
            .expect("complete");
        order.push(claim);
    }
    let scopes: Vec<&str> = order.iter().map(|claim| claim.scope.as_str()).collect();
    assert_eq!(
        scopes,
        [
            "acme", "globex", "initech", "acme", "globex", "acme", "acme"
        ],
        "the scopes with queued builds take turns"
    );
    for (name, ids) in &queued {
        let claimed: Vec<&Claim> = order
            .iter()
            .filter(|claim| claim.scope.as_str() == *name)
            .collect();
        let claimed_ids: HashSet<&EnvironmentId> = claimed
            .iter()
            .map(|claim| &claim.build.environment_id)
            .collect();
        assert_eq!(claimed_ids, ids.iter().collect(), "every build of {name}");
        assert!(
            claimed
                .windows(2)
                .all(|pair| pair[0].build.queued_at_ms <= pair[1].build.queued_at_ms),
            "{name}'s own builds are taken oldest first"
        );
    }
}

async fn a_scope_at_its_cap_waits_while_other_scopes_start(store: Store) {
    let capped = LeasePolicy {
        running_per_scope: 2,
        ..LEASES
    };
    queue(&store, "acme", 4).await;
    let first = claim(&store, capped).await;
    let second = claim(&store, capped).await;
    assert_eq!(
        (first.scope.as_str(), second.scope.as_str()),
        ("acme", "acme")
    );
    assert!(
        store
            .claim_build("idle", capped)
            .await
            .expect("claim")
            .is_none(),
        "acme has two builds queued but two running, its cap"
    );
    queue(&store, "globex", 1).await;
    let other = claim(&store, capped).await;
    assert_eq!(
        other.scope.as_str(),
        "globex",
        "another scope starts at once"
    );
    assert!(
        store
            .claim_build("idle", capped)
            .await
            .expect("claim")
            .is_none()
    );
    // One of acme's builds ends: its slot goes to acme's next build.
    store
        .complete_build(&first.token, ended())
        .await
        .expect("complete");
    let third = claim(&store, capped).await;
    assert_eq!(third.scope.as_str(), "acme");
    assert!(
        store
            .claim_build("idle", capped)
            .await
            .expect("claim")
            .is_none()
    );
    // With a higher cap the same queue lets the last one start too.
    let fourth = claim(
        &store,
        LeasePolicy {
            running_per_scope: 3,
            ..LEASES
        },
    )
    .await;
    assert_eq!(fourth.scope.as_str(), "acme");
}

async fn concurrent_claims_never_share_a_build_nor_pass_the_cap(store: Store) {
    let policy = LeasePolicy {
        running_per_scope: 2,
        ..LEASES
    };
    let mut every = HashSet::new();
    for name in ["acme", "globex", "initech"] {
        every.extend(queue(&store, name, 5).await);
    }
    let racing: Vec<_> = (0..12)
        .map(|index| {
            let store = store.clone();
            plinth_kit::tasks::spawn(async move {
                store.claim_build(&format!("builder-{index}"), policy).await
            })
        })
        .collect();
    let mut claims = Vec::new();
    for claim in racing {
        claims.extend(claim.await.expect("task").expect("claim"));
    }
    // A claim that lost a race may come back empty; what it passed over is still there.
    while let Some(claim) = store.claim_build("late", policy).await.expect("claim") {
        claims.push(claim);
    }
    let mut taken = HashSet::new();
    let mut per_scope: HashMap<String, usize> = HashMap::new();
    for claim in &claims {
        assert!(
            taken.insert((claim.build.environment_id.clone(), claim.build.version)),
            "{} was claimed twice",
            claim.build.environment_id
        );
        assert!(every.contains(&claim.build.environment_id));
        *per_scope
            .entry(claim.scope.as_str().to_owned())
            .or_default() += 1;
        let read = store
            .get_build(
                &claim.scope,
                &claim.build.environment_id,
                claim.build.version,
            )
            .await
            .expect("get");
        assert_eq!(read.status, BuildStatus::Building);
        assert_eq!(read.attempt, 1, "one lease, not two");
    }
    assert_eq!(
        per_scope,
        HashMap::from([
            ("acme".to_owned(), 2),
            ("globex".to_owned(), 2),
            ("initech".to_owned(), 2),
        ]),
        "each scope runs up to its cap and no further"
    );
    // Each lease is its own: all of them end, and the queue goes on.
    for claim in &claims {
        store
            .complete_build(&claim.token, ended())
            .await
            .expect("complete");
    }
    let next = claim(&store, policy).await;
    assert!(every.contains(&next.build.environment_id));
}
