//! Tasks (UHP §5): `POST /v1/tasks` is refused before anything starts unless the task's
//! environment (its own, else its harness's) is ready.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use plinth_kit::{ErrorCode, PlinthError};
use plinth_proto::catalog::v1 as pb;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::http::auth::Caller;
use crate::http::auth::Tokens;
use crate::http::error::{ApiError, ErrorBody};
use crate::http::json::JsonBody;
use crate::rest::sessions::{
    SessionBody, SessionEnvironment, TestCommands, harness_environment, shown,
};
use crate::runtime::Runtime;
use crate::runtime::live::start_session;
use axum::extract::FromRef;

/// The routes.
pub fn routes<S>() -> OpenApiRouter<S>
where
    S: Clone + Send + Sync + 'static,
    Runtime: FromRef<S>,
    TestCommands: FromRef<S>,
    Arc<Tokens>: FromRef<S>,
{
    OpenApiRouter::new().routes(routes!(create_task))
}

/// `POST /v1/tasks`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateTask {
    /// What the task is to do.
    pub input: String,
    /// `{harness_id}` and anything else the caller keeps with the task.
    #[serde(default)]
    pub metadata: Option<serde_json::Map<String, serde_json::Value>>,
    /// The environment the task reads; overrides its harness's.
    #[serde(default)]
    pub environment: Option<String>,
}

/// A task and the session it runs in.
#[derive(Debug, Serialize, ToSchema)]
pub struct TaskBody {
    /// `task_` + 32 lowercase hex.
    pub id: String,
    /// Always `task`.
    pub object: &'static str,
    /// Its input.
    pub input: String,
    /// Its metadata as given.
    #[schema(value_type = Object)]
    pub metadata: serde_json::Value,
    /// The environment it reads.
    pub environment: SessionEnvironment,
    /// The version it reads.
    pub version: u32,
    /// Its session.
    pub session: SessionBody,
    /// Milliseconds since the Unix epoch.
    #[serde(rename = "createdAt")]
    pub created_at: i64,
}

/// Create a task: refused before anything starts unless its environment is ready.
#[utoipa::path(
    post,
    path = "/v1/tasks",
    tag = "tasks",
    request_body = CreateTask,
    responses(
        (status = 201, description = "Created, with its session", body = TaskBody),
        (status = 400, description = "environment_invalid: malformed body", body = ErrorBody),
        (status = 401, description = "unauthenticated", body = ErrorBody),
        (status = 404, description = "environment_not_found: no environment (the task's, or its harness's), or not there", body = ErrorBody),
        (status = 409, description = "environment_not_ready: nothing built yet", body = ErrorBody),
        (status = 429, description = "quota_exceeded: the task's session would pass the scope's active-sessions quota (detail: quota, limit, used). Also rate_limited, with Retry-After", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
async fn create_task(
    State(state): State<Runtime>,
    State(tests): State<TestCommands>,
    caller: Caller,
    JsonBody(body): JsonBody<CreateTask>,
) -> Result<(StatusCode, Json<TaskBody>), ApiError> {
    let metadata = body.metadata.unwrap_or_default();
    let harness_id = match metadata.get("harness_id") {
        None | Some(serde_json::Value::Null) => String::new(),
        Some(serde_json::Value::String(id)) => id.clone(),
        Some(_) => {
            return Err(PlinthError::invalid("metadata.harness_id: expected a string").into());
        }
    };
    let environment = match body.environment {
        Some(environment) => environment,
        None if !harness_id.is_empty() => {
            harness_environment(&state, &caller.scope, &harness_id).await?
        }
        None => {
            return Err(PlinthError::new(
                ErrorCode::EnvironmentNotFound,
                "the task names no environment, and no harness (metadata.harness_id) that does",
            )
            .into());
        }
    };
    let metadata = serde_json::Value::Object(metadata);
    let task = state
        .sessions()
        .create_task(pb::CreateTaskRequest {
            scope: caller.scope.clone(),
            input: body.input,
            environment_id: environment,
            harness_id,
            metadata_json: metadata.to_string(),
            limits: Some(state.session_limits.defaults().to_catalog()),
        })
        .await?
        .into_inner();
    let session = task
        .session
        .ok_or_else(|| PlinthError::new(ErrorCode::Internal, "the task has no session"))?;
    let session = start_session(&state, &caller.scope, session).await?;
    let session = shown(&state.services, &tests, session).await?;
    Ok((
        StatusCode::CREATED,
        Json(TaskBody {
            id: task.id,
            object: "task",
            input: task.input,
            metadata,
            environment: SessionEnvironment {
                id: session.environment.id.clone(),
                version: session.environment.version,
                mount: session.environment.mount.clone(),
            },
            version: session.environment.version,
            session,
            created_at: task.created_at_ms,
        }),
    ))
}
