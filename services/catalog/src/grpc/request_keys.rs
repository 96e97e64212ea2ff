//! The gRPC face of the tenant API's idempotency keys (`plinth.catalog.v1.RequestKeyService`):
//! the key is checked here, the store applies the ledger's rules.

use plinth_kit::PlinthError;
use plinth_proto::catalog::v1 as pb;
use tonic::{Request, Response, Status};

use crate::domain::model::Scope;
use crate::grpc::adapters::{IDEMPOTENCY_RETENTION_MS, claim_response};
use crate::persistence::{RequestKey, Store, TerminalTicket};

/// The longest `Idempotency-Key`.
pub const MAX_KEY_BYTES: usize = 255;
/// The longest route a key is for (a method and a path).
const MAX_ROUTE_BYTES: usize = 512;
/// The largest message: an exec's answer carries up to 1 MiB of each output stream, which
/// JSON escaping can grow up to six times.
pub const MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;

/// The `plinth.catalog.v1.RequestKeyService` implementation.
pub struct RequestKeys {
    store: Store,
}

impl RequestKeys {
    /// The keys kept in `store`.
    pub fn new(store: Store) -> Self {
        RequestKeys { store }
    }
}

/// A key as sent, checked: a scope, a route, and 1 to 255 visible ASCII characters.
fn request_key(key: Option<pb::RequestKey>) -> Result<RequestKey, PlinthError> {
    let key = key.ok_or_else(|| PlinthError::invalid("key: required"))?;
    let scope = Scope::parse(&key.scope)?;
    if key.route.is_empty() || key.route.len() > MAX_ROUTE_BYTES {
        return Err(PlinthError::invalid(format!(
            "key.route: 1 to {MAX_ROUTE_BYTES} bytes"
        )));
    }
    let visible = key.key.bytes().all(|byte| byte.is_ascii_graphic());
    if key.key.is_empty() || key.key.len() > MAX_KEY_BYTES || !visible {
        return Err(PlinthError::invalid(format!(
            "Idempotency-Key: 1 to {MAX_KEY_BYTES} visible ASCII characters (no spaces)"
        )));
    }
    Ok(RequestKey {
        scope,
        route: key.route,
        key: key.key,
    })
}

#[tonic::async_trait]
impl pb::request_key_service_server::RequestKeyService for RequestKeys {
    #[tracing::instrument(name = "catalog.claim_request_key", skip_all)]
    async fn claim_request_key(
        &self,
        request: Request<pb::ClaimRequestKeyRequest>,
    ) -> Result<Response<pb::ClaimIdempotencyKeyResponse>, Status> {
        let request = request.into_inner();
        let key = request_key(request.key)?;
        let hex = &request.body_sha256;
        if hex.len() != 64 || !hex.bytes().all(|byte| byte.is_ascii_hexdigit()) {
            return Err(PlinthError::invalid("body_sha256: 64 hex digits (a SHA-256)").into());
        }
        let claimed = self
            .store
            .claim_request_key(
                &key,
                &hex.to_ascii_lowercase(),
                request.lease_ms.max(1000),
                IDEMPOTENCY_RETENTION_MS,
            )
            .await
            .map_err(|error| PlinthError::internal(&error))?;
        Ok(Response::new(claim_response(claimed)))
    }

    #[tracing::instrument(name = "catalog.finish_request_key", skip_all)]
    async fn finish_request_key(
        &self,
        request: Request<pb::FinishRequestKeyRequest>,
    ) -> Result<Response<pb::FinishRequestKeyResponse>, Status> {
        let request = request.into_inner();
        let key = request_key(request.key)?;
        let stored = self
            .store
            .finish_request_key(
                &key,
                &request.claim,
                (request.status, &request.response),
                IDEMPOTENCY_RETENTION_MS,
            )
            .await
            .map_err(|error| PlinthError::internal(&error))?;
        Ok(Response::new(pb::FinishRequestKeyResponse { stored }))
    }

    #[tracing::instrument(name = "catalog.release_request_key", skip_all)]
    async fn release_request_key(
        &self,
        request: Request<pb::ReleaseRequestKeyRequest>,
    ) -> Result<Response<pb::ReleaseRequestKeyResponse>, Status> {
        let request = request.into_inner();
        let key = request_key(request.key)?;
        self.store
            .release_request_key(&key, &request.claim)
            .await
            .map_err(|error| PlinthError::internal(&error))?;
        Ok(Response::new(pb::ReleaseRequestKeyResponse {}))
    }

    #[tracing::instrument(name = "catalog.renew_request_key", skip_all)]
    async fn renew_request_key(
        &self,
        request: Request<pb::RenewRequestKeyRequest>,
    ) -> Result<Response<pb::RenewIdempotencyKeyResponse>, Status> {
        let request = request.into_inner();
        let key = request_key(request.key)?;
        let held = self
            .store
            .renew_request_key(&key, &request.claim, request.lease_ms.max(1000))
            .await
            .map_err(|error| PlinthError::internal(&error))?;
        Ok(Response::new(pb::RenewIdempotencyKeyResponse { held }))
    }

    #[tracing::instrument(name = "catalog.issue_terminal_ticket", skip_all)]
    async fn issue_terminal_ticket(
        &self,
        request: Request<pb::IssueTerminalTicketRequest>,
    ) -> Result<Response<pb::IssueTerminalTicketResponse>, Status> {
        let request = request.into_inner();
        let scope = Scope::parse(&request.scope)?;
        if request.session_id.is_empty() || request.session_id.len() > 128 {
            return Err(PlinthError::invalid("session_id: 1 to 128 bytes").into());
        }
        if request.origin.len() > MAX_ORIGIN_BYTES {
            return Err(
                PlinthError::invalid(format!("origin: at most {MAX_ORIGIN_BYTES} bytes")).into(),
            );
        }
        if !(1..=MAX_TICKET_TTL_MS).contains(&request.ttl_ms) {
            return Err(PlinthError::invalid(format!("ttl_ms: 1 to {MAX_TICKET_TTL_MS}")).into());
        }
        let ticket = format!(
            "{}{}",
            uuid::Uuid::new_v4().simple(),
            uuid::Uuid::new_v4().simple()
        );
        let expires_at_ms = plinth_kit::database::now_ms().saturating_add(request.ttl_ms);
        self.store
            .issue_terminal_ticket(
                &ticket_digest(&ticket),
                &TerminalTicket {
                    scope: scope.as_str().to_owned(),
                    session_id: request.session_id,
                    origin: request.origin,
                    expires_at_ms,
                },
            )
            .await
            .map_err(|error| PlinthError::internal(&error))?;
        Ok(Response::new(pb::IssueTerminalTicketResponse {
            ticket,
            expires_at_ms,
        }))
    }

    #[tracing::instrument(name = "catalog.redeem_terminal_ticket", skip_all)]
    async fn redeem_terminal_ticket(
        &self,
        request: Request<pb::RedeemTerminalTicketRequest>,
    ) -> Result<Response<pb::RedeemTerminalTicketResponse>, Status> {
        let ticket = request.into_inner().ticket;
        let unknown = || {
            Status::from(PlinthError::new(
                plinth_kit::ErrorCode::NotFound,
                "no such terminal ticket: it was never issued, was used, or has expired",
            ))
        };
        if !valid_ticket(&ticket) {
            return Err(unknown());
        }
        let redeemed = self
            .store
            .redeem_terminal_ticket(&ticket_digest(&ticket))
            .await
            .map_err(|error| PlinthError::internal(&error))?;
        match redeemed {
            Some(held) if held.expires_at_ms > plinth_kit::database::now_ms() => {
                Ok(Response::new(pb::RedeemTerminalTicketResponse {
                    scope: held.scope,
                    session_id: held.session_id,
                    origin: held.origin,
                }))
            }
            _ => Err(unknown()),
        }
    }
}

/// The longest a terminal ticket lives.
const MAX_TICKET_TTL_MS: i64 = 60_000;
/// The longest origin a ticket is bound to.
const MAX_ORIGIN_BYTES: usize = 512;

/// A ticket as issued: 64 lowercase hex digits (256 random bits).
fn valid_ticket(ticket: &str) -> bool {
    ticket.len() == 64
        && ticket
            .bytes()
            .all(|byte| byte.is_ascii_digit() || (b'a'..=b'f').contains(&byte))
}

/// The stored form of a ticket.
fn ticket_digest(ticket: &str) -> String {
    use sha2::Digest as _;
    sha2::Sha256::digest(ticket.as_bytes())
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(key: &str) -> Option<pb::RequestKey> {
        Some(pb::RequestKey {
            scope: "default".into(),
            route: "POST /v1/sessions".into(),
            key: key.into(),
        })
    }

    #[test]
    fn a_key_is_1_to_255_visible_ascii_characters() {
        assert!(request_key(key("retry-7f3a")).is_ok());
        assert!(request_key(key(&"k".repeat(255))).is_ok());
        for refused in ["", "with space", "tab\there", "é", &"k".repeat(256)] {
            let error = request_key(key(refused)).expect_err(refused);
            assert!(
                error.message.contains("Idempotency-Key"),
                "{}",
                error.message
            );
        }
        assert!(request_key(None).is_err());
    }
}
