//! The idempotency records of the tenant API's own requests (`Idempotency-Key`), every
//! backend: a key is its scope's for one route; the first request claims it, a repeat with
//! the same body waits and then gets the stored answer, another body is refused; a released
//! key runs again; a claim whose holder vanished is settled as `outcome_unknown` and its
//! holder cannot overwrite that; retention forgets an answer past its time, and the key is
//! free again.

use plinth_catalog::Store;
use plinth_catalog::persistence::{Claimed, RequestKey, RetentionPolicy, TerminalTicket};

use crate::scope;

backend_suite!(
    a_key_is_its_scopes_for_one_route_and_answers_its_first_request,
    a_released_key_runs_again_and_an_abandoned_one_is_unknown_for_good,
    an_answer_past_its_time_is_forgotten_and_the_key_is_free_again,
    a_terminal_ticket_is_redeemed_once_and_what_it_was_issued_for_comes_back,
);

const DAY_MS: i64 = 24 * 60 * 60 * 1000;
const LEASE_MS: i64 = 60_000;

fn key(owner: &str, route: &str, key: &str) -> RequestKey {
    RequestKey {
        scope: scope(owner),
        route: route.to_owned(),
        key: key.to_owned(),
    }
}

fn digest(byte: char) -> String {
    byte.to_string().repeat(64)
}

async fn claimed(store: &Store, key: &RequestKey, body: &str, lease_ms: i64) -> String {
    match store
        .claim_request_key(key, body, lease_ms, DAY_MS)
        .await
        .expect("claim")
    {
        Claimed::Claimed(claim) => claim,
        other => panic!("{key:?}: expected a claim, got {other:?}"),
    }
}

async fn a_key_is_its_scopes_for_one_route_and_answers_its_first_request(store: Store) {
    let exec = key("acme", "POST /v1/sessions/sess_1/exec", "k-1");
    let claim = claimed(&store, &exec, &digest('a'), LEASE_MS).await;
    // While it runs: the same body waits, another is refused and changes nothing.
    let again = store
        .claim_request_key(&exec, &digest('a'), LEASE_MS, DAY_MS)
        .await;
    assert_eq!(again.expect("retry"), Claimed::InFlight);
    let other = store
        .claim_request_key(&exec, &digest('b'), LEASE_MS, DAY_MS)
        .await;
    assert_eq!(other.expect("another body"), Claimed::Mismatch);
    // The same key on another route, or of another scope, is another request.
    claimed(
        &store,
        &key("acme", "POST /v1/sessions/sess_2/exec", "k-1"),
        &digest('a'),
        LEASE_MS,
    )
    .await;
    claimed(
        &store,
        &key("globex", "POST /v1/sessions/sess_1/exec", "k-1"),
        &digest('a'),
        LEASE_MS,
    )
    .await;
    assert!(
        store
            .renew_request_key(&exec, &claim, LEASE_MS)
            .await
            .expect("renew")
    );
    let answer = r#"{"exit_code":0,"stdout":"once\n"}"#;
    assert!(
        store
            .finish_request_key(&exec, &claim, (200, answer), DAY_MS)
            .await
            .expect("finish")
    );
    for body in ['a', 'a'] {
        assert_eq!(
            store
                .claim_request_key(&exec, &digest(body), LEASE_MS, DAY_MS)
                .await
                .expect("retry"),
            Claimed::Done {
                status: 200,
                response: answer.to_owned()
            }
        );
    }
    assert_eq!(
        store
            .claim_request_key(&exec, &digest('b'), LEASE_MS, DAY_MS)
            .await
            .expect("another body"),
        Claimed::Mismatch
    );
    // Nothing is held any more; a second finish stores nothing.
    assert!(
        !store
            .renew_request_key(&exec, &claim, LEASE_MS)
            .await
            .expect("renew")
    );
    assert!(
        !store
            .finish_request_key(&exec, &claim, (500, "{}"), DAY_MS)
            .await
            .expect("finish again")
    );
}

async fn a_released_key_runs_again_and_an_abandoned_one_is_unknown_for_good(store: Store) {
    let session = key("acme", "POST /v1/sessions", "k-2");
    let claim = claimed(&store, &session, &digest('c'), LEASE_MS).await;
    store
        .release_request_key(&session, &claim)
        .await
        .expect("release");
    // Its holder dies this time: no renewal, no answer. The next retry settles it.
    let claim = claimed(&store, &session, &digest('c'), 1).await;
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    let settled = store
        .claim_request_key(&session, &digest('c'), LEASE_MS, DAY_MS)
        .await
        .expect("retry");
    let Claimed::Done { status, response } = &settled else {
        panic!("a retry after the lease gets a definite answer: {settled:?}");
    };
    assert_eq!(*status, 409);
    let body: serde_json::Value = serde_json::from_str(response).expect("json");
    assert_eq!(body["error"]["code"], "outcome_unknown", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|message| message.contains("Idempotency-Key")),
        "{body}"
    );
    // The holder, back, can neither renew nor overwrite what the retry was told.
    assert!(
        !store
            .renew_request_key(&session, &claim, LEASE_MS)
            .await
            .expect("renew")
    );
    assert!(
        !store
            .finish_request_key(&session, &claim, (201, "{}"), DAY_MS)
            .await
            .expect("finish")
    );
    assert_eq!(
        store
            .claim_request_key(&session, &digest('c'), LEASE_MS, DAY_MS)
            .await
            .expect("retry"),
        settled
    );
}

async fn an_answer_past_its_time_is_forgotten_and_the_key_is_free_again(store: Store) {
    let session = key("acme", "POST /v1/sessions", "k-3");
    let claim = claimed(&store, &session, &digest('d'), LEASE_MS).await;
    assert!(
        store
            .finish_request_key(&session, &claim, (201, r#"{"id":"sess_1"}"#), 0)
            .await
            .expect("finish")
    );
    let kept = key("acme", "POST /v1/sessions", "k-4");
    let claim = claimed(&store, &kept, &digest('d'), LEASE_MS).await;
    assert!(
        store
            .finish_request_key(&kept, &claim, (201, r#"{"id":"sess_2"}"#), DAY_MS)
            .await
            .expect("finish")
    );
    let retired = store
        .apply_retention(RetentionPolicy::default())
        .await
        .expect("retention");
    assert_eq!(retired.request_keys, 1, "{retired:?}");
    // The forgotten key runs anew, with any body; the kept one still answers.
    claimed(&store, &session, &digest('e'), LEASE_MS).await;
    assert!(matches!(
        store
            .claim_request_key(&kept, &digest('d'), LEASE_MS, DAY_MS)
            .await
            .expect("retry"),
        Claimed::Done { status: 201, .. }
    ));
}

async fn a_terminal_ticket_is_redeemed_once_and_what_it_was_issued_for_comes_back(store: Store) {
    let now = plinth_kit::database::now_ms();
    let issued = TerminalTicket {
        scope: "acme".to_owned(),
        session_id: "sess_1".to_owned(),
        origin: "http://127.0.0.1:8080".to_owned(),
        expires_at_ms: now + 10_000,
    };
    store
        .issue_terminal_ticket(&digest('a'), &issued)
        .await
        .expect("issued");
    // An expired one, a minute and more ago: the next issue takes it away.
    let stale = TerminalTicket {
        expires_at_ms: now - 120_000,
        ..issued.clone()
    };
    store
        .issue_terminal_ticket(&digest('b'), &stale)
        .await
        .expect("issued");
    assert_eq!(
        store
            .redeem_terminal_ticket(&digest('c'))
            .await
            .expect("asked"),
        None,
        "never issued"
    );
    store
        .issue_terminal_ticket(&digest('d'), &issued)
        .await
        .expect("issued");
    assert_eq!(
        store
            .redeem_terminal_ticket(&digest('b'))
            .await
            .expect("asked"),
        None,
        "swept when the next was issued"
    );
    assert_eq!(
        store
            .redeem_terminal_ticket(&digest('a'))
            .await
            .expect("redeemed"),
        Some(issued.clone())
    );
    assert_eq!(
        store
            .redeem_terminal_ticket(&digest('a'))
            .await
            .expect("asked"),
        None,
        "once"
    );
    // Two redemptions at once: one finds it.
    let ticket = digest('d');
    let (first, second) = tokio::join!(
        store.redeem_terminal_ticket(&ticket),
        store.redeem_terminal_ticket(&ticket)
    );
    let found = [first.expect("asked"), second.expect("asked")]
        .into_iter()
        .flatten()
        .count();
    assert_eq!(found, 1);
}
