//! The session runtime the REST handlers, the workspace adapters (Novo, Brain) and terminals
//! share: placing and attaching a session, the cache of live sessions, the node's view of a
//! session, and recording turns. The REST shapes of sessions stay in `rest::sessions`.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use plinth_kit::{ErrorCode, PlinthError};
use plinth_proto::catalog::v1 as pb;
use plinth_proto::node::v1 as node;

use crate::http::error::ApiError;
use crate::runtime::Runtime;

/// Active sessions this gateway started or looked up, so that a command or file call needs no
/// catalog lookup before it goes to the node. Nothing depends on an entry being current: a
/// session ended through another gateway is refused by its node (which detaches a session
/// before the catalog ends it) and by the catalog when the turn is recorded.
#[derive(Debug, Default)]
pub struct LiveSessions {
    inner: Mutex<LiveInner>,
}

#[derive(Debug, Default)]
struct LiveInner {
    sessions: HashMap<(String, String), Arc<pb::Session>>,
    /// Oldest first; may name entries forgotten since.
    order: VecDeque<(String, String)>,
}

impl LiveSessions {
    /// Entries kept; the oldest go first.
    const CAP: usize = 10_000;

    fn lock(&self) -> std::sync::MutexGuard<'_, LiveInner> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The entry of a session, unless it is past its lifetime: that one the catalog has
    /// ended or is about to, so the caller asks it rather than run anything.
    fn get(&self, scope: &str, id: &str) -> Option<Arc<pb::Session>> {
        let key = (scope.to_owned(), id.to_owned());
        let mut inner = self.lock();
        let session = inner.sessions.get(&key)?;
        let lifetime_ms = session
            .limits
            .map(|limits| limits.lifetime_ms)
            .filter(|&ms| ms > 0)
            .and_then(|ms| i64::try_from(ms).ok());
        if let Some(lifetime_ms) = lifetime_ms
            && plinth_kit::clock::now_ms() >= session.created_at_ms.saturating_add(lifetime_ms)
        {
            inner.sessions.remove(&key);
            return None;
        }
        Some(session.clone())
    }

    fn put(&self, scope: &str, session: &pb::Session) {
        if session.status() != pb::SessionStatus::Active || session.workdir.is_empty() {
            return;
        }
        let key = (scope.to_owned(), session.id.clone());
        let mut inner = self.lock();
        if inner
            .sessions
            .insert(key.clone(), Arc::new(session.clone()))
            .is_none()
        {
            inner.order.push_back(key);
        }
        while inner.sessions.len() > Self::CAP {
            match inner.order.pop_front() {
                Some(oldest) => {
                    inner.sessions.remove(&oldest);
                }
                None => break,
            }
        }
        if inner.order.len() > 2 * Self::CAP {
            let LiveInner { sessions, order } = &mut *inner;
            order.retain(|key| sessions.contains_key(key));
        }
    }

    /// The session ended (or its entry is in doubt).
    pub(crate) fn forget(&self, scope: &str, id: &str) {
        self.lock()
            .sessions
            .remove(&(scope.to_owned(), id.to_owned()));
    }
}

/// Places and attaches a session; answers it as the catalog has it after attaching.
pub(crate) async fn start_session(
    state: &Runtime,
    scope: &str,
    session: pb::Session,
) -> Result<pb::Session, ApiError> {
    attach(state, scope, session)
        .await
        .map_err(AttachFailure::into_error)
}

/// Why a placed session could not be attached; it has been ended in the catalog either way.
enum AttachFailure {
    /// The node could not be reached (dead, or not answering): another node may do.
    NodeUnreachable(ApiError),
    /// Anything else, which another node would answer alike.
    Other(ApiError),
}

impl AttachFailure {
    fn into_error(self) -> ApiError {
        match self {
            AttachFailure::NodeUnreachable(error) | AttachFailure::Other(error) => error,
        }
    }
}

/// Attaches a placed session on its node and records where its working directory is.
async fn attach(
    state: &Runtime,
    scope: &str,
    session: pb::Session,
) -> Result<pb::Session, AttachFailure> {
    let attached = match state.nodes.client(&session.node_address) {
        Ok(mut client) => client
            .attach(node::AttachRequest {
                session: Some(spec(&session)),
            })
            .await
            .map_err(|status| {
                // Refused connections and resets are `unavailable`, as is a node shutting
                // down: the node is not there to run the session.
                if status.code() == tonic::Code::Unavailable {
                    AttachFailure::NodeUnreachable(status.into())
                } else {
                    AttachFailure::Other(status.into())
                }
            }),
        Err(error) => Err(AttachFailure::NodeUnreachable(error)),
    };
    let attached = match attached {
        Ok(attached) => attached.into_inner(),
        Err(failure) => {
            // A session that never got its working directory is ended, not left dangling.
            let _ = state
                .sessions()
                .end_session(pb::EndSessionRequest {
                    scope: scope.to_owned(),
                    id: session.id.clone(),
                })
                .await;
            return Err(failure);
        }
    };
    // The catalog records the working directory when it places the session on a node that
    // says where it keeps sessions; only a node that does not, or disagrees, needs a write.
    let session = if attached.workdir == session.workdir && attached.isolated == session.isolated {
        session
    } else {
        state
            .sessions()
            .mark_attached(pb::MarkAttachedRequest {
                scope: scope.to_owned(),
                id: session.id,
                workdir: attached.workdir,
                isolated: attached.isolated,
            })
            .await
            .map_err(|status| AttachFailure::Other(status.into()))?
            .into_inner()
    };
    state.live.put(scope, &session);
    Ok(session)
}

/// Places a session and attaches it; when the node it was placed on cannot be reached (it
/// died since its last heartbeat, within the catalog's node TTL), places it once more on
/// another node, so that a dead node costs the caller a little time rather than a failed
/// create. A second unreachable node is the caller's answer: nodes are failing faster than
/// one retry can hide.
pub(crate) async fn place_and_attach(
    state: &Runtime,
    scope: &str,
    mut request: pb::CreateSessionRequest,
) -> Result<pb::Session, ApiError> {
    let session = state
        .sessions()
        .create_session(request.clone())
        .await?
        .into_inner();
    let node = session.node_id.clone();
    match attach(state, scope, session).await {
        Ok(session) => Ok(session),
        Err(AttachFailure::NodeUnreachable(error)) => {
            tracing::warn!(%node, error = %error.0.message, "the session's node cannot be reached; placing the session on another node");
            metrics::counter!("plinth_session_placement_retries_total").increment(1);
            request.exclude_node = node;
            let session = state.sessions().create_session(request).await?.into_inner();
            start_session(state, scope, session).await
        }
        Err(AttachFailure::Other(error)) => Err(error),
    }
}

pub(crate) fn spec(session: &pb::Session) -> node::SessionSpec {
    node::SessionSpec {
        session_id: session.id.clone(),
        environment_id: session.environment_id.clone(),
        version: session.version,
        slug: session.slug.clone(),
        layer_tree: session.layer_tree.clone(),
        // The catalog's message is the node's: the limits go as the catalog stored them.
        limits: session.limits,
        scope: session.scope.clone(),
    }
}

/// An active session of the caller, or why not.
pub(crate) async fn active_session(
    state: &Runtime,
    scope: &str,
    id: &str,
) -> Result<Arc<pb::Session>, ApiError> {
    if let Some(session) = state.live.get(scope, id) {
        return Ok(session);
    }
    let session = state
        .sessions()
        .get_session(pb::GetSessionRequest {
            scope: scope.to_owned(),
            id: id.to_owned(),
        })
        .await?
        .into_inner();
    if pb::SessionStatus::from_wire(session.status)? != pb::SessionStatus::Active {
        return Err(
            PlinthError::new(ErrorCode::NotFound, format!("session {id} has ended")).into(),
        );
    }
    state.live.put(scope, &session);
    Ok(Arc::new(session))
}

pub(crate) async fn record(
    state: &Runtime,
    scope: &str,
    session: &pb::Session,
    kind: pb::TurnKind,
    detail: &str,
    exit_code: Option<i32>,
) -> Result<pb::Turn, ApiError> {
    Ok(state
        .sessions()
        .record_turn(turn(scope, session, kind, detail, exit_code))
        .await?
        .into_inner())
}

/// A turn to record: by RecordTurn at once, or with an idempotent call's stored answer
/// (FinishIdempotencyKey's `turn`), in the same catalog write.
pub(crate) fn turn(
    scope: &str,
    session: &pb::Session,
    kind: pb::TurnKind,
    detail: &str,
    exit_code: Option<i32>,
) -> pb::RecordTurnRequest {
    pb::RecordTurnRequest {
        scope: scope.to_owned(),
        turn: Some(pb::Turn {
            session_id: session.id.clone(),
            kind: kind.into(),
            detail: detail.to_owned(),
            exit_code,
            ..Default::default()
        }),
    }
}

/// A command's turn and its run, each begun beside the other: both, or the first error. A
/// turn whose command never ran is finished as -1 (could not start); a session either refused
/// is forgotten, so the next call asks the catalog.
pub(crate) fn settle<T>(
    state: &Runtime,
    scope: &str,
    session: &pb::Session,
    turn: Result<pb::Turn, ApiError>,
    ran: Result<T, ApiError>,
) -> Result<(pb::Turn, T), ApiError> {
    match (turn, ran) {
        (Ok(turn), Ok(ran)) => Ok((turn, ran)),
        (Ok(turn), Err(error)) => {
            finish_turn(state, scope, &turn, -1);
            state.live.forget(scope, &session.id);
            Err(error)
        }
        (Err(error), _) => {
            state.live.forget(scope, &session.id);
            Err(error)
        }
    }
}

/// Records how a command's turn ended, after the answer has gone: the caller does not wait
/// for the write. (Until it lands, the turn lists without an exit code, as a running one
/// does.)
pub(crate) fn finish_turn(state: &Runtime, scope: &str, turn: &pb::Turn, exit_code: i32) {
    let mut sessions = state.sessions();
    let request = pb::FinishTurnRequest {
        scope: scope.to_owned(),
        session_id: turn.session_id.clone(),
        sequence: turn.sequence,
        exit_code,
    };
    plinth_kit::tasks::spawn(async move {
        if let Err(status) = sessions.finish_turn(request).await {
            tracing::warn!(error = %status.message(), "recording how a command ended failed");
        }
    });
}
