//! Idempotency keys of the tenant API's own requests (`Idempotency-Key` on `POST
//! /v1/sessions` and on a session's exec). What is durable here and why: a request retried
//! because its answer was lost must not start a second session or run its command twice, on
//! whichever gateway replica the retry lands, across restarts; so its key, the digest of its
//! body and its answer are kept in the `request_keys` table, by the ledger's rules
//! (`super::ledger`, the same as an adapter's keys): a key is claimed by an insert, a repeat
//! is answered from the record, a claim whose lease ran out with no answer is settled as
//! `outcome_unknown` and never run again, and only a record past its retention is taken over.

use plinth_kit::database::now_ms;

use super::adapters::{Claimed, OUTCOME_UNKNOWN_STATUS, claim_in};
use super::ledger::{Table, Value};
use super::{Store, StoreError};
use crate::domain::model::Scope;

/// A key: its scope's, for one route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestKey {
    /// The caller's scope.
    pub scope: Scope,
    /// The method and path (`POST /v1/sessions/sess_…/exec`).
    pub route: String,
    /// The `Idempotency-Key` header.
    pub key: String,
}

impl RequestKey {
    fn values(&self) -> [Value<'_>; 3] {
        [
            Value::Text(self.scope.as_str()),
            Value::Text(&self.route),
            Value::Text(&self.key),
        ]
    }
}

/// The ledger's columns.
const KEYS: Table = Table {
    name: "request_keys",
    key: &["scope", "route", "key"],
    digest: "body_sha256",
    holder: "claim",
    state: "state",
    running: "running",
    done: "done",
    answer: &["status", "response"],
    stamp: "expires_at_ms",
};

/// The answer stored for a claim whose holder stopped before storing one.
fn outcome_unknown_answer() -> String {
    let code = plinth_kit::ErrorCode::OutcomeUnknown;
    debug_assert_eq!(u32::from(code.http_status()), OUTCOME_UNKNOWN_STATUS);
    serde_json::json!({
        "error": {
            "code": code.as_str(),
            "message": "the first request with this Idempotency-Key was started, then its \
                server stopped before recording its answer (it was stopped, or lost the \
                catalog for longer than its claim's lease): it may or may not have taken \
                effect, and it is not run again under this key. Check the session (its \
                turns), then send the request with a new key if it is still wanted",
        }
    })
    .to_string()
}

impl Store {
    /// Claims `key` for a request with this body (see [`Claimed`]), in one transaction.
    pub async fn claim_request_key(
        &self,
        key: &RequestKey,
        body_sha256: &str,
        lease_ms: i64,
        retention_ms: i64,
    ) -> Result<Claimed, StoreError> {
        let now = now_ms();
        let claim = uuid::Uuid::new_v4().simple().to_string();
        let lease_until = now.saturating_add(lease_ms);
        let keep_until = now.saturating_add(retention_ms);
        let record = key.values();
        let unknown = outcome_unknown_answer();
        let mut tx = self.db.begin_write().await?;
        let (claimed, settled) = claim_in(
            &mut tx,
            &KEYS,
            &record,
            (
                &[
                    "scope",
                    "route",
                    "key",
                    "body_sha256",
                    "claim",
                    "lease_until_ms",
                    "expires_at_ms",
                ],
                &[
                    record[0],
                    record[1],
                    record[2],
                    Value::Text(body_sha256),
                    Value::Text(&claim),
                    Value::Int(lease_until),
                    Value::Int(keep_until),
                ],
            ),
            &[
                ("body_sha256", Value::Text(body_sha256)),
                ("claim", Value::Text(&claim)),
                ("lease_until_ms", Value::Int(lease_until)),
                ("status", Value::Int(0)),
                ("response", Value::Text("")),
                ("expires_at_ms", Value::Int(keep_until)),
            ],
            (&claim, body_sha256),
            (now, keep_until),
            &unknown,
        )
        .await?;
        if settled {
            tracing::warn!(route = %key.route, "a request's idempotency claim ran out with no answer; settled as outcome unknown");
        }
        tx.commit().await?;
        Ok(claimed)
    }

    /// Extends a running claim's lease to `lease_ms` from now; false once the claim has an
    /// answer, was settled, or is another's.
    pub async fn renew_request_key(
        &self,
        key: &RequestKey,
        claim: &str,
        lease_ms: i64,
    ) -> Result<bool, StoreError> {
        let mut connection = self.db.writer.acquire().await?;
        let renewed = KEYS
            .renew(
                &mut connection,
                &key.values(),
                claim,
                now_ms().saturating_add(lease_ms),
                "",
            )
            .await?;
        Ok(renewed.is_some())
    }

    /// Stores a claimed request's answer, kept `retention_ms`; false when the claim was
    /// settled (its lease ran out first) or taken over: the answer a retry was given stays.
    pub async fn finish_request_key(
        &self,
        key: &RequestKey,
        claim: &str,
        answer: (u32, &str),
        retention_ms: i64,
    ) -> Result<bool, StoreError> {
        let (status, response) = answer;
        let mut connection = self.db.writer.acquire().await?;
        KEYS.answer(
            &mut connection,
            &key.values(),
            claim,
            &[Value::Int(i64::from(status)), Value::Text(response)],
            now_ms().saturating_add(retention_ms),
            None,
        )
        .await
    }

    /// Gives a claim up, so a retry runs the request: only for one that certainly did
    /// nothing.
    pub async fn release_request_key(
        &self,
        key: &RequestKey,
        claim: &str,
    ) -> Result<(), StoreError> {
        let mut connection = self.db.writer.acquire().await?;
        KEYS.release(&mut connection, &key.values(), claim).await?;
        Ok(())
    }
}
