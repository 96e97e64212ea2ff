//! HTTP errors. Every error the gateway answers is a [`PlinthError`] rendered here, with the
//! status from the one table in `plinth_kit::error`, as `{"error": {"code", "message",
//! "detail"?}}`.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use plinth_kit::{ErrorCode, PlinthError};
use serde::Serialize;
use utoipa::ToSchema;

/// An error on its way to the client.
#[derive(Debug)]
pub struct ApiError(pub PlinthError);

impl From<PlinthError> for ApiError {
    fn from(error: PlinthError) -> Self {
        ApiError(error)
    }
}

/// A service answered an enum value this gateway does not know (unset, or from a newer
/// contract): the gateway's fault or a mixed deployment, never the client's. The log says
/// which enum and value came.
impl From<plinth_proto::UnknownValue> for ApiError {
    fn from(error: plinth_proto::UnknownValue) -> Self {
        ApiError(PlinthError::internal(&error))
    }
}

impl From<tonic::Status> for ApiError {
    fn from(status: tonic::Status) -> Self {
        ApiError(PlinthError::from_status(&status))
    }
}

/// The body of every error answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorBody {
    /// What went wrong.
    pub error: ErrorObject,
}

/// One error.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorObject {
    /// A code from the error table: `environment_invalid`, `invalid_request`,
    /// `environment_not_found`, `environment_exists`, `environment_busy`,
    /// `environment_not_ready`, `file_too_large`, `unauthenticated`, `not_found`,
    /// `method_not_allowed`, `rate_limited` (429, with `Retry-After`), `unavailable` (503,
    /// with `Retry-After`), `remote_unreachable` (502: a git import's repository server could
    /// not be reached; with `Retry-After`), `remote_timeout` (504: it did not answer within
    /// `source.git_fetch_timeout_seconds`; with `Retry-After`), `insufficient_storage` (507: a disk the server writes to is full;
    /// `detail.store` names it; with `Retry-After`), `internal`,
    /// `workspace_path_invalid`, `workspace_invalid_request`, `workspace_contents_required`,
    /// `workspace_read_only`, `workspace_not_found`, `workspace_find_not_unique`,
    /// `workspace_find_not_found`, `workspace_run_ended`, `idempotency_key_reused`,
    /// `idempotency_in_progress`, `outcome_unknown` (409: an idempotent call was cut off after
    /// it was dispatched; it is not run again), `quota_exceeded` (429, with `detail`
    /// `{quota, limit, used}`), `precondition_failed` (412: an `If-Match` or `If-None-Match`
    /// that does not hold; `detail.etag` is the file's current tag), `range_not_satisfiable`
    /// (416, with `Content-Range: bytes */<size>`), `unsupported_media_type` (415: a JSON
    /// endpoint's body not declared `application/json`), `host_not_allowed` (421: a `Host`
    /// that is not one of the server's names), `origin_not_allowed` (403: a state-changing
    /// request or a terminal from a web page whose origin is not allowed), `conflict` (409: a
    /// well-formed request that does not fit what is there, such as a file where a directory
    /// is), `upgrade_required` (426: a terminal asked for without a WebSocket upgrade).
    #[schema(example = "environment_invalid")]
    pub code: &'static str,
    /// What went wrong, for a person; names the field or path at fault.
    pub message: String,
    /// Particulars a program can act on, such as `max_bytes` or `retry_after_ms`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub detail: Option<serde_json::Value>,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let PlinthError {
            code,
            message,
            detail,
        } = self.0;
        let retry_after = detail
            .as_ref()
            .and_then(|detail| detail.get(RETRY_AFTER_MS))
            .and_then(serde_json::Value::as_u64)
            .map(|ms| ms.div_ceil(1000).max(1));
        let status =
            StatusCode::from_u16(code.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = ErrorBody {
            error: ErrorObject {
                code: code.as_str(),
                message,
                detail,
            },
        };
        let mut response = (status, axum::Json(body)).into_response();
        if code == ErrorCode::Unauthenticated {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"plinth\""),
            );
        }
        if code == ErrorCode::UpgradeRequired {
            let headers = response.headers_mut();
            headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
            headers.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
        }
        if let Some(seconds) = retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}

/// The `detail` key that says when to try again; the answer carries it as `Retry-After` too.
pub use plinth_kit::error::RETRY_AFTER_MS;

/// An error a client should retry after `seconds`: `detail.retry_after_ms` and the
/// `Retry-After` header (whole seconds, as HTTP counts them) say so.
pub fn retry_after(code: ErrorCode, message: impl Into<String>, seconds: u64) -> ApiError {
    ApiError(
        PlinthError::new(code, message).with_detail(
            serde_json::json!({ RETRY_AFTER_MS: seconds.max(1).saturating_mul(1000) }),
        ),
    )
}

/// Any route this server does not have.
pub async fn no_such_route(method: axum::http::Method, uri: axum::http::Uri) -> ApiError {
    ApiError(PlinthError::new(
        ErrorCode::NotFound,
        format!("no such endpoint: {method} {}", uri.path()),
    ))
}

/// A route this server has, with a method it does not take.
pub async fn method_not_allowed(method: axum::http::Method, uri: axum::http::Uri) -> ApiError {
    ApiError(PlinthError::new(
        ErrorCode::MethodNotAllowed,
        format!("{} does not take {method}", uri.path()),
    ))
}
