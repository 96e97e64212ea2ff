//! Workspace adapters in the store, every backend: each test below runs against SQLite and
//! against PostgreSQL (`PLINTH_TEST_POSTGRES_URL`; required under CI).

use plinth_catalog::adapters::{AdapterId, Credential, NewAdapter, Protocol, token_digest};
use plinth_catalog::model::{Environment, NewEnvironment};
use plinth_catalog::{Store, StoreError};

use crate::scope;

backend_suite!(
    an_adapter_names_an_environment_of_its_scope,
    rotation_keeps_the_previous_credential_for_the_grace_window,
    brain_adapters_keep_only_the_tokens_digest,
    delete_stops_the_credential_at_once,
    a_rotation_without_grace_drops_the_previous_credential_in_the_same_write,
    callback_origins_are_kept_and_replaced,
    signed_calls_are_remembered_once_per_adapter_within_each_adapters_bound,
);

async fn environment(store: &Store, scope_name: &str, name: &str) -> Environment {
    store
        .create_environment(
            NewEnvironment::new(
                scope(scope_name),
                name.to_owned(),
                String::new(),
                String::new(),
            )
            .expect("valid"),
        )
        .await
        .expect("created")
}

async fn novo(
    store: &Store,
    scope_name: &str,
    environment: &Environment,
    secret: &str,
) -> AdapterId {
    store
        .create_adapter(NewAdapter {
            scope: scope(scope_name),
            protocol: Protocol::Novo,
            environment_id: environment.id.clone(),
            stored_credential: secret.to_owned(),
            callback_origins: Vec::new(),
        })
        .await
        .expect("created")
        .id
}

async fn an_adapter_names_an_environment_of_its_scope(store: Store) {
    let mine = environment(&store, "acme", "Mine").await;
    let theirs = environment(&store, "globex", "Theirs").await;
    let id = novo(&store, "acme", &mine, "first-secret-0123456789").await;
    let adapter = store.get_adapter(&scope("acme"), &id).await.expect("found");
    assert_eq!(adapter.environment_id, mine.id);
    assert_eq!(adapter.protocol, Protocol::Novo);
    assert_eq!(adapter.rotated_at_ms, 0);
    assert_eq!(adapter.previous_expires_at_ms, 0);
    assert!(matches!(
        store.get_adapter(&scope("globex"), &id).await,
        Err(StoreError::NotFound)
    ));
    let refused = store
        .create_adapter(NewAdapter {
            scope: scope("acme"),
            protocol: Protocol::Novo,
            environment_id: theirs.id.clone(),
            stored_credential: "x".repeat(20),
            callback_origins: Vec::new(),
        })
        .await;
    assert!(matches!(refused, Err(StoreError::NoSuchEnvironment)));
    let credentials = store.adapter_credentials(&id).await.expect("by id alone");
    assert_eq!(credentials.adapter.scope, scope("acme"));
    assert_eq!(credentials.current, "first-secret-0123456789");
    assert_eq!(credentials.previous, None);
}

async fn rotation_keeps_the_previous_credential_for_the_grace_window(store: Store) {
    let env = environment(&store, "acme", "Rotating").await;
    let id = novo(&store, "acme", &env, "first-secret-0123456789").await;
    let rotated = store
        .rotate_adapter(&scope("acme"), &id, "second-secret-0123456789", 60_000)
        .await
        .expect("rotated");
    assert!(rotated.rotated_at_ms > 0);
    assert_eq!(
        rotated.previous_expires_at_ms - rotated.rotated_at_ms,
        60_000
    );
    let credentials = store.adapter_credentials(&id).await.expect("found");
    assert_eq!(credentials.current, "second-secret-0123456789");
    assert_eq!(
        credentials.previous.as_deref(),
        Some("first-secret-0123456789")
    );

    // A window that is over: the previous secret is no longer handed out.
    store
        .rotate_adapter(&scope("acme"), &id, "third-secret-0123456789", 1)
        .await
        .expect("rotated");
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    let credentials = store.adapter_credentials(&id).await.expect("found");
    assert_eq!(credentials.current, "third-secret-0123456789");
    assert_eq!(credentials.previous, None);
    assert_eq!(credentials.adapter.previous_expires_at_ms, 0);

    assert!(matches!(
        store
            .rotate_adapter(&scope("globex"), &id, "x".repeat(20).as_str(), 1000)
            .await,
        Err(StoreError::NotFound)
    ));
}

async fn brain_adapters_keep_only_the_tokens_digest(store: Store) {
    let env = environment(&store, "acme", "Brainy").await;
    let credential = Credential::new(Protocol::Brain, "").expect("generated");
    let adapter = store
        .create_adapter(NewAdapter {
            scope: scope("acme"),
            protocol: Protocol::Brain,
            environment_id: env.id.clone(),
            stored_credential: credential.stored.clone(),
            callback_origins: vec!["https://brain.internal:8443".to_owned()],
        })
        .await
        .expect("created");
    let credentials = store.adapter_credentials(&adapter.id).await.expect("found");
    assert_eq!(credentials.adapter.protocol, Protocol::Brain);
    assert_eq!(credentials.current, token_digest(&credential.shown));
    assert_ne!(credentials.current, credential.shown);
}

async fn delete_stops_the_credential_at_once(store: Store) {
    let env = environment(&store, "acme", "Deleting").await;
    let id = novo(&store, "acme", &env, "first-secret-0123456789").await;
    assert!(matches!(
        store.delete_adapter(&scope("globex"), &id).await,
        Err(StoreError::NotFound)
    ));
    store
        .delete_adapter(&scope("acme"), &id)
        .await
        .expect("deleted");
    assert!(matches!(
        store.adapter_credentials(&id).await,
        Err(StoreError::NotFound)
    ));
    assert!(matches!(
        store.delete_adapter(&scope("acme"), &id).await,
        Err(StoreError::NotFound)
    ));
}

async fn a_rotation_without_grace_drops_the_previous_credential_in_the_same_write(store: Store) {
    let env = environment(&store, "acme", "Revoking").await;
    let id = novo(&store, "acme", &env, "first-secret-0123456789").await;
    store
        .rotate_adapter(&scope("acme"), &id, "second-secret-0123456789", 60_000)
        .await
        .expect("rotated with grace");
    let revoked = store
        .rotate_adapter(&scope("acme"), &id, "third-secret-0123456789", 0)
        .await
        .expect("rotated without grace");
    assert_eq!(revoked.previous_expires_at_ms, 0);
    let credentials = store.adapter_credentials(&id).await.expect("found");
    assert_eq!(credentials.current, "third-secret-0123456789");
    assert_eq!(
        credentials.previous, None,
        "neither the rotated-out secret nor the one in its window before is accepted"
    );
}

async fn callback_origins_are_kept_and_replaced(store: Store) {
    let env = environment(&store, "acme", "Called Back").await;
    let credential = Credential::new(Protocol::Brain, "").expect("generated");
    let adapter = store
        .create_adapter(NewAdapter {
            scope: scope("acme"),
            protocol: Protocol::Brain,
            environment_id: env.id.clone(),
            stored_credential: credential.stored,
            callback_origins: vec!["https://brain.internal:8443".to_owned()],
        })
        .await
        .expect("created");
    assert_eq!(
        store
            .get_adapter(&scope("acme"), &adapter.id)
            .await
            .expect("found")
            .callback_origins,
        ["https://brain.internal:8443"]
    );
    let replaced = store
        .set_callback_origins(
            &scope("acme"),
            &adapter.id,
            &[
                "http://127.0.0.1:9000".to_owned(),
                "https://b.example".to_owned(),
            ],
        )
        .await
        .expect("replaced");
    assert_eq!(
        replaced.callback_origins,
        ["http://127.0.0.1:9000", "https://b.example"]
    );
    let credentials = store.adapter_credentials(&adapter.id).await.expect("found");
    assert_eq!(
        credentials.adapter.callback_origins,
        replaced.callback_origins
    );
    assert!(matches!(
        store
            .set_callback_origins(&scope("globex"), &adapter.id, &[])
            .await,
        Err(StoreError::NotFound)
    ));
    let cleared = store
        .set_callback_origins(&scope("acme"), &adapter.id, &[])
        .await
        .expect("cleared");
    assert!(cleared.callback_origins.is_empty());
}

/// Admits a signed call with this signature (one hex digit, repeated) into `adapter`'s
/// replay memory of at most `bound` live entries.
async fn admit(
    store: &Store,
    adapter: &AdapterId,
    digit: char,
    (run, request): (&str, &str),
    expires_at_ms: i64,
    bound: i64,
) -> plinth_catalog::persistence::SignedCallSeen {
    let signature = digit.to_string().repeat(64);
    store
        .admit_signed_call(
            plinth_catalog::persistence::SignedCall {
                adapter,
                signature: &signature,
                run_id: run,
                request_id: request,
                expires_at_ms,
                claimed_next: false,
            },
            bound,
        )
        .await
        .expect("admit")
}

async fn signed_calls_are_remembered_once_per_adapter_within_each_adapters_bound(store: Store) {
    use plinth_catalog::persistence::SignedCallSeen::{First, Full, Replayed, SameRequest};
    let env = environment(&store, "acme", "Signed").await;
    let first = novo(&store, "acme", &env, "first-secret-0123456789").await;
    let second = novo(&store, "acme", &env, "second-secret-0123456789").await;
    let now = plinth_kit::database::now_ms();
    let live = now + 300_000;
    let s = &store;
    assert_eq!(
        admit(s, &first, 'a', ("run-1", "req-1"), live, 2).await,
        First
    );
    // The same call retried; then the same signature with another request, run, or none.
    assert_eq!(
        admit(s, &first, 'a', ("run-1", "req-1"), live, 2).await,
        SameRequest
    );
    for call in [("run-1", "req-2"), ("run-2", "req-1"), ("run-1", "")] {
        assert_eq!(
            admit(s, &first, 'a', call, live, 2).await,
            Replayed,
            "{call:?}"
        );
    }
    // A call without a request id is remembered too, and never a retry.
    assert_eq!(admit(s, &first, 'b', ("run-1", ""), live, 2).await, First);
    assert_eq!(
        admit(s, &first, 'b', ("run-1", ""), live, 2).await,
        Replayed
    );
    // Full at its bound of 2: refused until its oldest expires, never forgetting one early.
    assert_eq!(
        admit(s, &first, 'c', ("run-1", "req-3"), live, 2).await,
        Full { until_ms: live }
    );
    // Another adapter has its own memory and its own bound, the same bytes included.
    assert_eq!(
        admit(s, &second, 'a', ("run-1", "req-1"), live, 2).await,
        First
    );
    assert_eq!(
        admit(s, &second, 'c', ("run-1", "req-3"), live, 2).await,
        First
    );
    // Expired entries do not count against the bound.
    assert_eq!(admit(s, &first, 'd', ("r", "q"), now - 1, 5).await, First);
    assert_eq!(admit(s, &first, 'e', ("r", "q"), live, 3).await, First);
    assert_eq!(
        admit(s, &first, 'f', ("r", "q"), live, 3).await,
        Full { until_ms: live },
        "three live ones: a, b, e"
    );
    // An expired signature arriving again (a clock behind) is admitted anew, not a replay.
    assert_eq!(admit(s, &first, 'd', ("r", "q2"), live, 9).await, First);
    // The sweep removes what expired, and only that.
    assert_eq!(store.purge_signatures().await.expect("purge"), 0);
    assert_eq!(admit(s, &second, '0', ("r", "q"), now - 1, 9).await, First);
    assert_eq!(store.purge_signatures().await.expect("purge"), 1);
    assert_eq!(
        admit(s, &second, 'a', ("run-9", "req-9"), live, 9).await,
        Replayed
    );
}
