//! `GET /v1/usage`: what the caller's scope uses of each of its quotas, and their limits. The
//! catalog counts environments, active sessions and builds queued or running; the source
//! service counts stored bytes. Only the JSON shape lives here.

use axum::Json;
use axum::extract::State;
use plinth_proto::catalog::v1 as catalog;
use plinth_proto::source::v1 as source;
use serde::Serialize;
use std::sync::Arc;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::http::auth::Caller;
use crate::http::auth::Tokens;
use crate::http::error::{ApiError, ErrorBody};
use crate::runtime::Services;
use axum::extract::FromRef;

/// The usage route.
pub fn routes<S>() -> OpenApiRouter<S>
where
    S: Clone + Send + Sync + 'static,
    Services: FromRef<S>,
    Arc<Tokens>: FromRef<S>,
{
    OpenApiRouter::new().routes(routes!(usage))
}

/// One quota of the scope.
#[derive(Debug, Serialize, ToSchema)]
pub struct QuotaUse {
    /// What the scope has now.
    pub used: u64,
    /// The most it may have; a create that would pass it is `429 quota_exceeded`.
    pub limit: u64,
}

/// Each quota of the scope.
#[derive(Debug, Serialize, ToSchema)]
pub struct Quotas {
    /// Environments that exist.
    pub environments: QuotaUse,
    /// Bytes of the distinct blobs the scope's sources and build layers hold: a blob counts
    /// once however many files, environments and versions hold it.
    pub stored_bytes: QuotaUse,
    /// Sessions that are active (workspace adapters' runs and tasks included).
    pub sessions: QuotaUse,
    /// Builds queued or running.
    pub queued_builds: QuotaUse,
}

/// `GET /v1/usage`.
#[derive(Debug, Serialize, ToSchema)]
pub struct UsageBody {
    /// Always `usage`.
    #[schema(example = "usage")]
    pub object: &'static str,
    /// The caller's scope.
    pub scope: String,
    /// Each quota, used and limit.
    pub quotas: Quotas,
}

fn quota(found: Option<catalog::QuotaUse>) -> QuotaUse {
    let found = found.unwrap_or_default();
    QuotaUse {
        used: found.used,
        limit: found.limit,
    }
}

/// What the caller's scope uses of each of its quotas.
#[utoipa::path(
    get,
    path = "/v1/usage",
    tag = "discovery",
    responses(
        (status = 200, description = "The scope's use of each quota, and its limits", body = UsageBody),
        (status = 401, description = "unauthenticated", body = ErrorBody),
        (status = 503, description = "unavailable: the catalog or the source service did not answer", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
async fn usage(State(state): State<Services>, caller: Caller) -> Result<Json<UsageBody>, ApiError> {
    let mut quotas = state.quotas();
    let mut sources = state.source();
    let (counted, stored) = tokio::join!(
        quotas.get_usage(catalog::GetUsageRequest {
            scope: caller.scope.clone(),
        }),
        sources.usage(source::UsageRequest {
            scope: caller.scope.clone(),
        }),
    );
    let counted = counted?.into_inner();
    let stored = stored?.into_inner();
    Ok(Json(UsageBody {
        object: "usage",
        scope: caller.scope,
        quotas: Quotas {
            environments: quota(counted.environments),
            stored_bytes: QuotaUse {
                used: stored.stored_bytes,
                limit: stored.limit,
            },
            sessions: quota(counted.sessions),
            queued_builds: quota(counted.queued_builds),
        },
    }))
}
