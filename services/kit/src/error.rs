//! The one error vocabulary of Plinth, and its one mapping to gRPC and to HTTP.
//!
//! Services raise [`PlinthError`]s; gRPC servers send them as a `tonic::Status` whose
//! `google.rpc.ErrorInfo` carries the code as its `reason`; the gateway turns a received
//! `Status` back into a [`PlinthError`] and from there into an HTTP status and a JSON body.
//! No other place maps codes.

use std::collections::HashMap;
use std::fmt;

pub use serde_json::{Map, Value};
use tonic_types::{ErrorDetails, StatusExt};

/// The `domain` of every `ErrorInfo` Plinth sends.
pub const ERROR_DOMAIN: &str = "plinth";

/// The status for a gRPC message larger than a server takes: `RESOURCE_EXHAUSTED`, with an
/// `ErrorInfo` (reason `message_too_large`) whose metadata names the limit (`max_bytes`) and
/// the message's size (`bytes`).
pub fn message_too_large(bytes: u64, max_bytes: usize) -> tonic::Status {
    let metadata = HashMap::from([
        ("max_bytes".to_owned(), max_bytes.to_string()),
        ("bytes".to_owned(), bytes.to_string()),
    ]);
    tonic::Status::with_error_details(
        tonic::Code::ResourceExhausted,
        format!(
            "a message of {bytes} bytes is larger than this server takes ({max_bytes} bytes a \
             message); send a file's bytes over several messages of a stream (WriteFile, \
             ImportArchive)"
        ),
        ErrorDetails::with_error_info("message_too_large", ERROR_DOMAIN, metadata),
    )
}

/// Every error code a Plinth API can answer with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// The request is malformed or breaks a rule; the message names what.
    EnvironmentInvalid,
    /// A request's value is outside what the server allows of it (a session limit past its
    /// maximum, zero, of the wrong type, or unknown); the message and `detail` name the value
    /// and what is allowed.
    InvalidRequest,
    /// The object does not exist, or belongs to another scope.
    EnvironmentNotFound,
    /// The slug (and so the mount path) is already taken in the scope.
    EnvironmentExists,
    /// Another operation (a build) holds the environment.
    EnvironmentBusy,
    /// The environment or version has nothing usable built.
    EnvironmentNotReady,
    /// A body exceeds a size limit; `detail.max_bytes` states it.
    FileTooLarge,
    /// No valid credentials.
    Unauthenticated,
    /// A builder's lease expired or was handed to another builder; its write was refused.
    LeaseLost,
    /// The route does not exist on this server, or an object that is not an environment (a
    /// harness) does not exist in the caller's scope.
    NotFound,
    /// The route exists but not with this method.
    MethodNotAllowed,
    /// A service this one depends on did not answer; retrying later may succeed.
    Unavailable,
    /// A server outside Plinth that the request names (a git import's repository) could not
    /// be reached: its name does not resolve, it refuses or drops connections, or it answered
    /// with a server error. Not the caller's fault; `Retry-After` says when to try again.
    RemoteUnreachable,
    /// A server outside Plinth that the request names did not finish answering within its
    /// deadline; `Retry-After` says when to try again.
    RemoteTimeout,
    /// A disk the server writes to (the database's, the blob store's, the node cache's, the
    /// spool's) is full; the message and `detail.store` name which. Nothing was written; reads
    /// still work, and writes resume by themselves once space is freed.
    InsufficientStorage,
    /// Anything else; details are logged, never sent.
    Internal,
    /// A workspace path is malformed or outside the workspace root (and not a readable path
    /// under the environment's mount).
    WorkspacePathInvalid,
    /// A workspace call would write beneath the read-only environment mount.
    WorkspaceReadOnly,
    /// A workspace file, directory, rollback token or command output does not exist.
    WorkspaceNotFound,
    /// A workspace call's arguments are malformed or contradict each other.
    WorkspaceInvalidRequest,
    /// An edit's `find` text occurs more than once and `replace_all` was not asked for.
    WorkspaceFindNotUnique,
    /// An edit's `find` text does not occur in the file.
    WorkspaceFindNotFound,
    /// A mutating edit arrived without `contents`.
    WorkspaceContentsRequired,
    /// The run's session ended (idle too long); its workspace is gone.
    WorkspaceRunEnded,
    /// An idempotency key was used again with a different request body.
    IdempotencyKeyReused,
    /// The first request with this idempotency key is still running.
    IdempotencyInProgress,
    /// The caller sent more requests than its rate allows; `detail.retry_after_ms` (and the
    /// `Retry-After` header, in whole seconds) say when to try again.
    RateLimited,
    /// The scope is at one of its quotas (environments, stored bytes, sessions, queued
    /// builds); `detail` is `{quota, limit, used}`.
    QuotaExceeded,
    /// A call with this idempotency key may or may not have taken effect and never will be
    /// known: its first attempt was cut off after it was dispatched. It is not run again.
    OutcomeUnknown,
    /// A conditional request's precondition (`If-Match`, `If-None-Match` on a write) does not
    /// hold: the file changed since the caller read it, or exists where a create-only write
    /// was asked for. Nothing was written; `detail.etag` is the file's current entity tag
    /// (null when there is no file).
    PreconditionFailed,
    /// A `Range` names no byte of the file (it starts at or past the end); the answer's
    /// `Content-Range: bytes */<size>` gives the size.
    RangeNotSatisfiable,
    /// A body-carrying JSON endpoint got a body that is not declared `application/json`
    /// (another type, or none): a web page can send `text/plain` and form types to any
    /// address without asking first, so they are never read as JSON.
    UnsupportedMediaType,
    /// The request's `Host` is not one of the server's own names (a page whose name was
    /// pointed at the server, DNS rebinding); the message names the setting that adds one.
    HostNotAllowed,
    /// A state-changing request or a terminal came from a web page whose origin is not
    /// allowed; the message names the setting that allows one.
    OriginNotAllowed,
    /// The request is well formed but does not fit what is there now: a file read or written
    /// where a directory is (or a directory where a file is), callback origins given to an
    /// adapter whose protocol takes none. Nothing changed; the message says what is there.
    Conflict,
    /// The operation is a protocol upgrade (a terminal is a WebSocket) and the request is
    /// not one; the answer's `Upgrade` header names the protocol to ask for.
    UpgradeRequired,
}

impl ErrorCode {
    /// Every code, for documentation and exhaustive tests.
    pub const ALL: [ErrorCode; 36] = [
        ErrorCode::EnvironmentInvalid,
        ErrorCode::InvalidRequest,
        ErrorCode::EnvironmentNotFound,
        ErrorCode::EnvironmentExists,
        ErrorCode::EnvironmentBusy,
        ErrorCode::EnvironmentNotReady,
        ErrorCode::FileTooLarge,
        ErrorCode::Unauthenticated,
        ErrorCode::LeaseLost,
        ErrorCode::NotFound,
        ErrorCode::MethodNotAllowed,
        ErrorCode::Unavailable,
        ErrorCode::RemoteUnreachable,
        ErrorCode::RemoteTimeout,
        ErrorCode::InsufficientStorage,
        ErrorCode::Internal,
        ErrorCode::WorkspacePathInvalid,
        ErrorCode::WorkspaceReadOnly,
        ErrorCode::WorkspaceNotFound,
        ErrorCode::WorkspaceInvalidRequest,
        ErrorCode::WorkspaceFindNotUnique,
        ErrorCode::WorkspaceFindNotFound,
        ErrorCode::WorkspaceContentsRequired,
        ErrorCode::WorkspaceRunEnded,
        ErrorCode::IdempotencyKeyReused,
        ErrorCode::IdempotencyInProgress,
        ErrorCode::RateLimited,
        ErrorCode::QuotaExceeded,
        ErrorCode::OutcomeUnknown,
        ErrorCode::PreconditionFailed,
        ErrorCode::RangeNotSatisfiable,
        ErrorCode::UnsupportedMediaType,
        ErrorCode::HostNotAllowed,
        ErrorCode::OriginNotAllowed,
        ErrorCode::Conflict,
        ErrorCode::UpgradeRequired,
    ];

    /// The code as it appears on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::EnvironmentInvalid => "environment_invalid",
            ErrorCode::InvalidRequest => "invalid_request",
            ErrorCode::EnvironmentNotFound => "environment_not_found",
            ErrorCode::EnvironmentExists => "environment_exists",
            ErrorCode::EnvironmentBusy => "environment_busy",
            ErrorCode::EnvironmentNotReady => "environment_not_ready",
            ErrorCode::FileTooLarge => "file_too_large",
            ErrorCode::Unauthenticated => "unauthenticated",
            ErrorCode::LeaseLost => "lease_lost",
            ErrorCode::NotFound => "not_found",
            ErrorCode::MethodNotAllowed => "method_not_allowed",
            ErrorCode::Unavailable => "unavailable",
            ErrorCode::RemoteUnreachable => "remote_unreachable",
            ErrorCode::RemoteTimeout => "remote_timeout",
            ErrorCode::InsufficientStorage => "insufficient_storage",
            ErrorCode::Internal => "internal",
            ErrorCode::WorkspacePathInvalid => "workspace_path_invalid",
            ErrorCode::WorkspaceReadOnly => "workspace_read_only",
            ErrorCode::WorkspaceNotFound => "workspace_not_found",
            ErrorCode::WorkspaceInvalidRequest => "workspace_invalid_request",
            ErrorCode::WorkspaceFindNotUnique => "workspace_find_not_unique",
            ErrorCode::WorkspaceFindNotFound => "workspace_find_not_found",
            ErrorCode::WorkspaceContentsRequired => "workspace_contents_required",
            ErrorCode::WorkspaceRunEnded => "workspace_run_ended",
            ErrorCode::IdempotencyKeyReused => "idempotency_key_reused",
            ErrorCode::IdempotencyInProgress => "idempotency_in_progress",
            ErrorCode::RateLimited => "rate_limited",
            ErrorCode::QuotaExceeded => "quota_exceeded",
            ErrorCode::OutcomeUnknown => "outcome_unknown",
            ErrorCode::PreconditionFailed => "precondition_failed",
            ErrorCode::RangeNotSatisfiable => "range_not_satisfiable",
            ErrorCode::UnsupportedMediaType => "unsupported_media_type",
            ErrorCode::HostNotAllowed => "host_not_allowed",
            ErrorCode::OriginNotAllowed => "origin_not_allowed",
            ErrorCode::Conflict => "conflict",
            ErrorCode::UpgradeRequired => "upgrade_required",
        }
    }

    /// Parses a wire code.
    pub fn parse(code: &str) -> Option<ErrorCode> {
        ErrorCode::ALL.into_iter().find(|c| c.as_str() == code)
    }

    /// The HTTP status the gateway answers with.
    pub fn http_status(self) -> u16 {
        match self {
            ErrorCode::EnvironmentInvalid
            | ErrorCode::InvalidRequest
            | ErrorCode::WorkspacePathInvalid
            | ErrorCode::WorkspaceInvalidRequest
            | ErrorCode::WorkspaceContentsRequired => 400,
            ErrorCode::EnvironmentNotFound | ErrorCode::NotFound | ErrorCode::WorkspaceNotFound => {
                404
            }
            ErrorCode::EnvironmentExists
            | ErrorCode::EnvironmentBusy
            | ErrorCode::EnvironmentNotReady
            | ErrorCode::LeaseLost
            | ErrorCode::WorkspaceFindNotUnique
            | ErrorCode::WorkspaceFindNotFound
            | ErrorCode::IdempotencyInProgress
            | ErrorCode::OutcomeUnknown => 409,
            ErrorCode::WorkspaceReadOnly => 403,
            ErrorCode::WorkspaceRunEnded => 410,
            ErrorCode::IdempotencyKeyReused => 422,
            ErrorCode::FileTooLarge => 413,
            ErrorCode::PreconditionFailed => 412,
            ErrorCode::RangeNotSatisfiable => 416,
            ErrorCode::UnsupportedMediaType => 415,
            ErrorCode::HostNotAllowed => 421,
            ErrorCode::OriginNotAllowed => 403,
            ErrorCode::Conflict => 409,
            ErrorCode::UpgradeRequired => 426,
            ErrorCode::RateLimited | ErrorCode::QuotaExceeded => 429,
            ErrorCode::Unauthenticated => 401,
            ErrorCode::MethodNotAllowed => 405,
            ErrorCode::Unavailable => 503,
            ErrorCode::RemoteUnreachable => 502,
            ErrorCode::RemoteTimeout => 504,
            ErrorCode::InsufficientStorage => 507,
            ErrorCode::Internal => 500,
        }
    }

    /// The gRPC code a service answers with.
    pub fn grpc_code(self) -> tonic::Code {
        match self {
            ErrorCode::EnvironmentInvalid
            | ErrorCode::InvalidRequest
            | ErrorCode::WorkspacePathInvalid
            | ErrorCode::WorkspaceInvalidRequest
            | ErrorCode::WorkspaceContentsRequired
            | ErrorCode::UnsupportedMediaType => tonic::Code::InvalidArgument,
            ErrorCode::EnvironmentNotFound | ErrorCode::NotFound | ErrorCode::WorkspaceNotFound => {
                tonic::Code::NotFound
            }
            ErrorCode::WorkspaceReadOnly
            | ErrorCode::HostNotAllowed
            | ErrorCode::OriginNotAllowed => tonic::Code::PermissionDenied,
            ErrorCode::WorkspaceFindNotUnique
            | ErrorCode::WorkspaceFindNotFound
            | ErrorCode::WorkspaceRunEnded
            | ErrorCode::IdempotencyKeyReused => tonic::Code::FailedPrecondition,
            ErrorCode::IdempotencyInProgress => tonic::Code::Aborted,
            ErrorCode::EnvironmentExists => tonic::Code::AlreadyExists,
            ErrorCode::EnvironmentBusy => tonic::Code::Aborted,
            ErrorCode::EnvironmentNotReady
            | ErrorCode::LeaseLost
            | ErrorCode::PreconditionFailed
            | ErrorCode::Conflict
            | ErrorCode::UpgradeRequired => tonic::Code::FailedPrecondition,
            ErrorCode::FileTooLarge | ErrorCode::RangeNotSatisfiable => tonic::Code::OutOfRange,
            ErrorCode::RateLimited | ErrorCode::QuotaExceeded | ErrorCode::InsufficientStorage => {
                tonic::Code::ResourceExhausted
            }
            ErrorCode::OutcomeUnknown => tonic::Code::Unknown,
            ErrorCode::Unauthenticated => tonic::Code::Unauthenticated,
            ErrorCode::MethodNotAllowed => tonic::Code::Unimplemented,
            ErrorCode::Unavailable | ErrorCode::RemoteUnreachable => tonic::Code::Unavailable,
            ErrorCode::RemoteTimeout => tonic::Code::DeadlineExceeded,
            ErrorCode::Internal => tonic::Code::Internal,
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The `detail.reason` of a node's `not_found` for a session it does not hold.
pub const SESSION_LOST: &str = "session_lost";

/// An error as a caller sees it: a code, a message for a person, optional particulars.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct PlinthError {
    /// What kind of error.
    pub code: ErrorCode,
    /// What went wrong and, where it helps, what to do; never internals.
    pub message: String,
    /// Particulars a program can act on, such as `{"max_bytes": 67108864}`.
    pub detail: Option<Value>,
}

impl PlinthError {
    /// An error without particulars.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        PlinthError {
            code,
            message: message.into(),
            detail: None,
        }
    }

    /// `not_found` for a session a node does not hold (it ended there, or its working
    /// directory was lost), marked `detail.reason` [`SESSION_LOST`] so a caller tells it from
    /// a missing file without reading the message.
    pub fn session_lost(id: &str) -> Self {
        PlinthError::new(
            ErrorCode::NotFound,
            format!(
                "session {id:?} is not on this node: it ended, or its working directory was lost"
            ),
        )
        .with_detail(serde_json::json!({ "reason": SESSION_LOST }))
    }

    /// Whether this is [`PlinthError::session_lost`]'s error (also after a gRPC hop).
    pub fn is_session_lost(&self) -> bool {
        self.code == ErrorCode::NotFound
            && self
                .detail
                .as_ref()
                .and_then(|detail| detail.get("reason"))
                .and_then(Value::as_str)
                == Some(SESSION_LOST)
    }

    /// Adds particulars.
    pub fn with_detail(mut self, detail: Value) -> Self {
        self.detail = Some(detail);
        self
    }

    /// `environment_invalid` with a message.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::EnvironmentInvalid, message)
    }

    /// `environment_not_found` for an id.
    pub fn not_found(what: impl fmt::Display) -> Self {
        Self::new(
            ErrorCode::EnvironmentNotFound,
            format!("{what} was not found"),
        )
    }

    /// An internal error. The cause is logged here, where it is handled, and never sent.
    /// A cause that may pass (a database that did not answer in time or dropped the
    /// connection, a network error) is `unavailable` instead, with a time to retry: the caller
    /// retries, on another replica when there is one, rather than taking the fault for its
    /// own. A full disk (`ENOSPC`, `EDQUOT`, SQLite's "database or disk is full",
    /// PostgreSQL's `53100`) is `insufficient_storage`; a database error names the database,
    /// any other names no store (see [`PlinthError::internal_in`]).
    pub fn internal(cause: &(dyn std::error::Error + 'static)) -> Self {
        Self::classified(None, cause)
    }

    /// [`PlinthError::internal`] for a fault in writing to `store`: a full disk names it.
    pub fn internal_in(store: Store, cause: &(dyn std::error::Error + 'static)) -> Self {
        Self::classified(Some(store), cause)
    }

    /// `unavailable` because `what` did not answer, with a second to wait before retrying.
    pub fn unavailable(what: &str, cause: &(dyn std::error::Error + 'static)) -> Self {
        tracing::warn!(error = %DisplayChain(cause), "unavailable: {what}");
        Self::new(
            ErrorCode::Unavailable,
            format!("{what}; retry shortly (another replica may answer)"),
        )
        .with_detail(serde_json::json!({ RETRY_AFTER_MS: 1000 }))
    }

    /// `insufficient_storage` naming `store`.
    pub fn storage_full(store: Store) -> Self {
        crate::storage::mark_full(store);
        Self::new(
            ErrorCode::InsufficientStorage,
            format!(
                "{} is full; nothing was written. Reads still work; free space (delete files \
                 or sessions, let collection run, or grow the disk) and writes resume by \
                 themselves",
                store.description()
            ),
        )
        .with_detail(serde_json::json!({
            "store": store.as_str(),
            RETRY_AFTER_MS: FULL_RETRY_AFTER_MS,
        }))
    }

    fn classified(store: Option<Store>, cause: &(dyn std::error::Error + 'static)) -> Self {
        match fault(cause) {
            Some(Fault::Full { database }) => {
                let store = store.unwrap_or(if database {
                    Store::Database
                } else {
                    Store::Unnamed
                });
                tracing::error!(error = %DisplayChain(cause), store = store.as_str(), "a store is full");
                Self::storage_full(store)
            }
            Some(Fault::Passing(what)) => Self::unavailable(what, cause),
            None => {
                tracing::error!(error = %DisplayChain(cause), "internal error");
                Self::new(
                    ErrorCode::Internal,
                    "internal error; the server log has the cause",
                )
            }
        }
    }

    /// The gRPC status a server sends for this error.
    pub fn to_status(&self) -> tonic::Status {
        let mut metadata = HashMap::new();
        if let Some(detail) = &self.detail {
            metadata.insert("detail".to_owned(), detail.to_string());
        }
        let details = ErrorDetails::with_error_info(self.code.as_str(), ERROR_DOMAIN, metadata);
        tonic::Status::with_error_details(self.code.grpc_code(), self.message.clone(), details)
    }

    /// Reads a status received from a Plinth service (or from the transport) back into an
    /// error. Statuses without a Plinth `ErrorInfo` come from the transport or a foreign
    /// server: an unreachable service is `unavailable`, anything else `internal`, and
    /// their messages are not passed on.
    pub fn from_status(status: &tonic::Status) -> Self {
        let info = status
            .get_error_details()
            .error_info()
            .filter(|info| info.domain == ERROR_DOMAIN)
            .cloned();
        if let Some(code) = info
            .as_ref()
            .and_then(|info| ErrorCode::parse(&info.reason))
        {
            let detail = info
                .as_ref()
                .and_then(|info| info.metadata.get("detail"))
                .and_then(|raw| serde_json::from_str(raw).ok());
            return PlinthError {
                code,
                message: status.message().to_owned(),
                detail,
            };
        }
        match status.code() {
            // A status no Plinth server made (every one of theirs names its code): the call
            // did not get an answer. `Unknown` and `Internal` without one are what a
            // connection reset or a stream cut by a crashing server looks like to a client.
            tonic::Code::Unavailable
            | tonic::Code::DeadlineExceeded
            | tonic::Code::Cancelled
            | tonic::Code::Unknown
            | tonic::Code::Internal => {
                tracing::warn!(grpc.code = ?status.code(), grpc.message = status.message(), "dependency did not answer");
                Self::new(
                    ErrorCode::Unavailable,
                    "a Plinth service this request needs did not answer; retry shortly",
                )
                .with_detail(serde_json::json!({ RETRY_AFTER_MS: 1000 }))
            }
            tonic::Code::Unauthenticated => {
                tracing::error!(
                    grpc.message = status.message(),
                    "internal token refused between services"
                );
                Self::new(
                    ErrorCode::Internal,
                    "internal error; the server log has the cause",
                )
            }
            _ => {
                tracing::error!(grpc.code = ?status.code(), grpc.message = status.message(), "unexpected status from a service");
                Self::new(
                    ErrorCode::Internal,
                    "internal error; the server log has the cause",
                )
            }
        }
    }
}

/// The `detail` key that says when to try again, in milliseconds like every duration in the
/// API; the HTTP answer carries it as `Retry-After` too, rounded up to whole seconds as HTTP
/// counts them.
pub const RETRY_AFTER_MS: &str = "retry_after_ms";

impl From<PlinthError> for tonic::Status {
    fn from(error: PlinthError) -> Self {
        error.to_status()
    }
}

/// Displays an error with its chain of causes, `a: b: c`.
pub struct DisplayChain<'a>(pub &'a (dyn std::error::Error + 'static));

impl fmt::Display for DisplayChain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(cause) = source {
            write!(f, ": {cause}")?;
            source = cause.source();
        }
        Ok(())
    }
}

/// How long a client waits before writing to a full store again: space comes back when
/// someone frees it, not in a second.
const FULL_RETRY_AFTER_MS: u64 = 30_000;

pub use crate::storage::Store;

/// What a cause is, when it is more than a fault of the server's own.
enum Fault {
    /// A disk is full; `database` when a database said so.
    Full { database: bool },
    /// It may pass; what did not answer.
    Passing(&'static str),
}

/// Whether an I/O error is a full disk or quota: `ENOSPC` (28) or `EDQUOT` (122).
pub fn is_storage_full(io: &std::io::Error) -> bool {
    use std::io::ErrorKind;
    matches!(io.kind(), ErrorKind::StorageFull | ErrorKind::QuotaExceeded)
        || matches!(io.raw_os_error(), Some(28 | 122))
}

/// What a fault that may pass, or a full disk, is, when `cause` (or an error it wraps) is one.
fn fault(cause: &(dyn std::error::Error + 'static)) -> Option<Fault> {
    let mut next = Some(cause);
    while let Some(error) = next {
        #[cfg(feature = "database")]
        if let Some(error) = error.downcast_ref::<sqlx::Error>() {
            match error {
                sqlx::Error::Io(io) if is_storage_full(io) => {
                    return Some(Fault::Full { database: true });
                }
                sqlx::Error::PoolTimedOut
                | sqlx::Error::PoolClosed
                | sqlx::Error::Io(_)
                | sqlx::Error::Tls(_)
                | sqlx::Error::WorkerCrashed => {
                    return Some(Fault::Passing("the database did not answer"));
                }
                sqlx::Error::Database(database) => {
                    let code = database.code().unwrap_or_default();
                    // SQLITE_FULL (13, "database or disk is full"); PostgreSQL's disk_full
                    // (53100) and out_of_memory's neighbours in class 53 are its server's.
                    if code == "13"
                        || code == "53100"
                        || database.message().contains("database or disk is full")
                    {
                        return Some(Fault::Full { database: true });
                    }
                    // SQLSTATE classes 08 (connection), 53 (insufficient resources), 57
                    // (operator intervention: a shutting-down server); 40001/40P01 (a
                    // serialization failure or deadlock: the transaction may simply be run
                    // again).
                    if ["08", "53", "57"]
                        .iter()
                        .any(|class| code.starts_with(class))
                        || code == "40001"
                        || code == "40P01"
                    {
                        return Some(Fault::Passing("the database is not answering normally"));
                    }
                }
                _ => {}
            }
        }
        if let Some(io) = error.downcast_ref::<std::io::Error>() {
            use std::io::ErrorKind;
            if is_storage_full(io) {
                return Some(Fault::Full { database: false });
            }
            if matches!(
                io.kind(),
                ErrorKind::ConnectionRefused
                    | ErrorKind::ConnectionReset
                    | ErrorKind::ConnectionAborted
                    | ErrorKind::TimedOut
                    | ErrorKind::BrokenPipe
                    | ErrorKind::NotConnected
            ) {
                return Some(Fault::Passing("a service behind this one did not answer"));
            }
        }
        next = error.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fault_that_may_pass_is_unavailable_and_any_other_internal() {
        #[derive(Debug, thiserror::Error)]
        #[error("database error: {0}")]
        struct Wrapped(#[source] Box<dyn std::error::Error + Send + Sync>);

        #[cfg(feature = "database")]
        {
            let timed_out = PlinthError::internal(&Wrapped(Box::new(sqlx::Error::PoolTimedOut)));
            assert_eq!(timed_out.code, ErrorCode::Unavailable);
            assert!(timed_out.message.contains("retry"), "{}", timed_out.message);
            let bug = PlinthError::internal(&Wrapped(Box::new(sqlx::Error::RowNotFound)));
            assert_eq!(bug.code, ErrorCode::Internal);
        }
        let refused = PlinthError::internal(&Wrapped(Box::new(std::io::Error::from(
            std::io::ErrorKind::ConnectionRefused,
        ))));
        assert_eq!(refused.code, ErrorCode::Unavailable);
        assert_eq!(
            refused.detail,
            Some(serde_json::json!({ RETRY_AFTER_MS: 1000 }))
        );
        let other = PlinthError::internal(&std::io::Error::other("a bug"));
        assert_eq!(other.code, ErrorCode::Internal);
        assert_eq!(
            other.message,
            "internal error; the server log has the cause"
        );
    }

    #[test]
    fn a_full_disk_is_insufficient_storage_naming_the_store() {
        let full = std::io::Error::from_raw_os_error(28);
        let blobs = PlinthError::internal_in(Store::Blobs, &full);
        assert_eq!(blobs.code, ErrorCode::InsufficientStorage);
        assert_eq!(blobs.code.http_status(), 507);
        assert!(blobs.message.contains("blob store"), "{}", blobs.message);
        assert_eq!(blobs.detail.as_ref().expect("detail")["store"], "blobs");
        let quota = PlinthError::internal(&std::io::Error::from_raw_os_error(122));
        assert_eq!(quota.code, ErrorCode::InsufficientStorage);
        assert_eq!(quota.detail.as_ref().expect("detail")["store"], "other");
    }

    #[test]
    fn every_code_survives_a_grpc_round_trip_with_its_detail() {
        for code in ErrorCode::ALL {
            let sent = PlinthError::new(code, format!("message of {code}"))
                .with_detail(serde_json::json!({"max_bytes": 42}));
            let received = PlinthError::from_status(&sent.to_status());
            assert_eq!(received, sent);
            assert_eq!(ErrorCode::parse(code.as_str()), Some(code));
        }
    }

    #[test]
    fn a_lost_session_is_told_apart_from_a_missing_file_across_grpc() {
        let lost = PlinthError::from_status(&PlinthError::session_lost("sess_1").into());
        assert!(lost.is_session_lost(), "{lost:?}");
        assert_eq!(lost.code.http_status(), 404);
        let missing = PlinthError::from_status(
            &PlinthError::new(ErrorCode::NotFound, "session \"x\" is not on this node").into(),
        );
        assert!(!missing.is_session_lost(), "only the marked error is");
    }

    #[test]
    fn a_foreign_status_does_not_leak_its_message() {
        let received = PlinthError::from_status(&tonic::Status::internal("db password is hunter2"));
        assert!(!received.message.contains("hunter2"));
        let denied = PlinthError::from_status(&tonic::Status::permission_denied("hunter2"));
        assert_eq!(denied.code, ErrorCode::Internal);
        assert!(!denied.message.contains("hunter2"));
    }

    #[test]
    fn a_call_that_got_no_answer_is_unavailable_with_a_time_to_retry() {
        // What a refused connection, a deadline, and a stream cut by a crashing server look
        // like to a client: none carries a Plinth code.
        for status in [
            tonic::Status::unavailable("connection refused"),
            tonic::Status::deadline_exceeded("timeout"),
            tonic::Status::cancelled("h2 protocol error: stream no longer needed"),
            tonic::Status::unknown("transport error"),
            tonic::Status::internal("h2 protocol error: error reading a body from connection"),
        ] {
            let down = PlinthError::from_status(&status);
            assert_eq!(down.code, ErrorCode::Unavailable, "{status:?}");
            assert_eq!(down.code.http_status(), 503);
            assert_eq!(
                down.detail,
                Some(serde_json::json!({ RETRY_AFTER_MS: 1000 })),
                "{status:?}"
            );
        }
        // A Plinth server's own internal error stays one.
        let own = PlinthError::from_status(
            &PlinthError::new(ErrorCode::Internal, "internal error").to_status(),
        );
        assert_eq!(own.code, ErrorCode::Internal);
    }

    #[test]
    fn conditional_and_range_refusals_have_their_http_and_grpc_statuses() {
        assert_eq!(
            ErrorCode::PreconditionFailed.as_str(),
            "precondition_failed"
        );
        assert_eq!(ErrorCode::PreconditionFailed.http_status(), 412);
        assert_eq!(
            ErrorCode::PreconditionFailed.grpc_code(),
            tonic::Code::FailedPrecondition
        );
        assert_eq!(
            ErrorCode::RangeNotSatisfiable.as_str(),
            "range_not_satisfiable"
        );
        assert_eq!(ErrorCode::RangeNotSatisfiable.http_status(), 416);
        assert_eq!(
            ErrorCode::RangeNotSatisfiable.grpc_code(),
            tonic::Code::OutOfRange
        );
    }
}
