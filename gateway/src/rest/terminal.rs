//! A terminal in a session: `POST` (or, as browsers can only send, `GET`)
//! `/v1/sessions/{id}/exec?pty=true` upgraded to a WebSocket (RFC 6455), relayed to the
//! node's `Pty` stream.
//!
//! axum's own WebSocket extractor refuses anything but `GET` on HTTP/1.1, and the API's exec
//! is a `POST`, so the handshake is done here: the request's headers are checked, `101` is
//! answered with `Sec-WebSocket-Accept`, and the connection hyper hands over after it is
//! framed by tungstenite. Everything that can be refused (the token's scope, the session,
//! a bad `cwd`) is refused before the `101`, as an ordinary JSON error. A handshake that
//! carries an `Origin` (every browser's does) other than the server's own or one in
//! `gateway.allowed_origins` never reaches here: it is `403 origin_not_allowed`
//! (`browsers.rs`), so no other site's page opens a terminal.
//!
//! A browser cannot send an `Authorization` header on a WebSocket, so a page (the console)
//! first asks for a **ticket** with its bearer token (`POST
//! /v1/sessions/{id}/terminal-tickets`) and names it in the WebSocket's URL (`ticket=`): a
//! ticket opens one terminal, of the session it was issued for, from the origin that asked
//! for it, within a few seconds, once. Tokens themselves are never taken from a URL.
//!
//! Frames: binary carries the terminal's bytes both ways; text carries JSON controls, from
//! the client `{"type":"resize","cols":N,"rows":N}` and `{"type":"close_stdin"}`, from the
//! server one `{"type":"exit","exit_code":N}` when the command ends, after which it closes.

use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse as _, Response};
use futures::{SinkExt as _, StreamExt as _};
use plinth_kit::PlinthError;
use plinth_proto::catalog::v1 as pb;
use plinth_proto::node::v1 as node;
use serde::Deserialize;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role};
use utoipa::IntoParams;

use crate::http::auth::Caller;
use crate::http::error::{ApiError, ErrorBody};
use crate::runtime::Runtime;
use crate::runtime::live::{active_session, finish_turn, record, settle, spec};

/// The most columns or rows a terminal may have.
const MAX_CELLS: u32 = 1000;
/// How long a closed terminal waits for the client's half of the closing handshake.
const CLOSE_WAIT: Duration = Duration::from_secs(2);

/// `?pty=true&command=…&cwd=…&cols=…&rows=…`: a terminal (a WebSocket upgrade carries no
/// JSON body, so what it runs is named in the query).
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct TerminalQuery {
    /// Run on a terminal over a WebSocket (the request must be an upgrade); the other
    /// terminal parameters need it.
    #[serde(default, deserialize_with = "crate::http::query::flag")]
    pub pty: Option<bool>,
    /// With pty=true: a shell command (`/bin/sh -c`); absent or empty: an interactive shell
    /// (bash where the environment's system has it, else sh).
    #[serde(default)]
    pub command: Option<String>,
    /// With pty=true: where it starts, as for exec. Default: the working directory.
    #[serde(default)]
    pub cwd: Option<String>,
    /// With pty=true: the terminal's columns, 1 to 1000 (default 80).
    #[serde(default)]
    #[param(minimum = 1, maximum = 1000)]
    pub cols: Option<u32>,
    /// With pty=true: the terminal's rows, 1 to 1000 (default 24).
    #[serde(default)]
    #[param(minimum = 1, maximum = 1000)]
    pub rows: Option<u32>,
    /// With pty=true: a terminal ticket (`POST /v1/sessions/{id}/terminal-tickets`), which
    /// authenticates the request instead of an Authorization header (a web page's WebSocket
    /// cannot send one); it opens one terminal of that session, from the origin that asked
    /// for it, once, within its lifetime.
    #[serde(default)]
    #[param(pattern = "^[0-9a-f]{64}$")]
    pub ticket: Option<String>,
}

impl TerminalQuery {
    /// A command without a terminal takes its command in the JSON body: terminal parameters
    /// without `pty=true` are refused rather than ignored.
    pub(crate) fn refuse_without_pty(&self) -> Result<(), PlinthError> {
        let given = [
            ("command", self.command.is_some()),
            ("cwd", self.cwd.is_some()),
            ("cols", self.cols.is_some()),
            ("rows", self.rows.is_some()),
            ("ticket", self.ticket.is_some()),
        ];
        match given.iter().find(|(_, given)| *given) {
            Some((name, _)) => Err(PlinthError::invalid(format!(
                "query: {name} is for a terminal (pty=true); a command without one names it in \
                 the JSON body"
            ))),
            None => Ok(()),
        }
    }

    /// The terminal's size, checked.
    fn size(&self) -> Result<node::PtySize, PlinthError> {
        let cells = |name: &str, value: Option<u32>, default: u32| match value {
            None => Ok(default),
            Some(value) if (1..=MAX_CELLS).contains(&value) => Ok(value),
            Some(value) => Err(PlinthError::invalid(format!(
                "query: {name} is {value}; a terminal has 1 to {MAX_CELLS}"
            ))),
        };
        Ok(node::PtySize {
            cols: cells("cols", self.cols, 80)?,
            rows: cells("rows", self.rows, 24)?,
        })
    }
}

/// A control a client sends in a text frame.
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
enum Control {
    /// The client's terminal has a new size.
    Resize { cols: u32, rows: u32 },
    /// The client's input ended.
    CloseStdin,
}

/// Open a terminal in the session (`GET` form, for browsers).
///
/// The same terminal as `POST /v1/sessions/{id}/exec?pty=true`, for clients that can only
/// open a WebSocket with `GET`: with `pty=true` and a WebSocket upgrade (`Connection:
/// Upgrade`, `Upgrade: websocket`, `Sec-WebSocket-Version: 13`, `Sec-WebSocket-Key`) the
/// command (or, without `command`, an interactive shell) runs on a terminal and the answer is
/// `101 Switching Protocols` and a WebSocket. Binary frames carry the terminal's bytes both
/// ways; text frames are JSON controls: the client sends `{"type":"resize","cols":N,"rows":N}`
/// when its terminal's size changes and `{"type":"close_stdin"}` at the end of its input; the
/// server sends `{"type":"exit","exit_code":N}` when the command ends, then closes. Ending the
/// session closes the socket the same way. The turn is recorded as an `exec` turn.
#[utoipa::path(
    get,
    path = "/v1/sessions/{id}/exec",
    tag = "sessions",
    params(("id" = String, Path, description = "The session's id"), TerminalQuery),
    responses(
        (status = 101, description = "Switching to the terminal's WebSocket (see the operation's description for its frames)"),
        (status = 400, description = "environment_invalid: no pty=true, a malformed WebSocket handshake (Sec-WebSocket-Version other than 13, no Sec-WebSocket-Key), or a bad command, cwd or size", body = ErrorBody),
        (status = 401, description = "unauthenticated", body = ErrorBody),
        (status = 404, description = "not_found: no such session, or it ended", body = ErrorBody),
        (status = 426, description = "upgrade_required: the request is no WebSocket upgrade (Connection: Upgrade, Upgrade: websocket); the answer's Upgrade header names websocket", body = ErrorBody,
            headers(("Upgrade" = String, description = "websocket"))),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn open_terminal(
    State(state): State<Runtime>,
    caller: Result<Caller, ApiError>,
    Path(id): Path<String>,
    query: Result<Query<TerminalQuery>, axum::extract::rejection::QueryRejection>,
    request: Request,
) -> Result<Response, ApiError> {
    // Who calls is settled first (401 before anything else), unless a ticket says.
    let ticketed = matches!(&query, Ok(Query(query)) if query.ticket.is_some());
    let caller = if ticketed { caller } else { Ok(caller?) };
    let Query(query) = query.map_err(|error| PlinthError::invalid(format!("query: {error}")))?;
    if !query.pty.unwrap_or(false) {
        return Err(PlinthError::invalid(
            "GET of exec opens a terminal: add pty=true and a WebSocket upgrade (a command \
             without a terminal is POST with a JSON body)",
        )
        .into());
    }
    open_with(state, caller, id, query, request).await
}

/// Opens a terminal for the request's caller: the one its Authorization header names, or,
/// with `ticket=`, the one the ticket was issued to (the ticket is spent).
pub(crate) async fn open_with(
    state: Runtime,
    caller: Result<Caller, ApiError>,
    id: String,
    mut query: TerminalQuery,
    request: Request,
) -> Result<Response, ApiError> {
    let caller = match query.ticket.take() {
        Some(ticket) => {
            // Checked before the ticket is spent: a request that is no WebSocket upgrade
            // leaves it for the one that is.
            websocket_key(&request)?;
            redeem(&state, &ticket, &id, request.headers()).await?
        }
        None => caller?,
    };
    open(state, caller, id, query, request).await
}

/// How long a terminal ticket is valid.
const TICKET_TTL: Duration = Duration::from_secs(10);

/// An `Origin` header as tickets compare it: lower case, no final `/`; `""` when absent.
fn request_origin(headers: &HeaderMap) -> String {
    headers
        .get(header::ORIGIN)
        .map(|origin| {
            crate::http::browsers::normalized_origin(&String::from_utf8_lossy(origin.as_bytes()))
        })
        .unwrap_or_default()
}

/// The caller a ticket stands for, once it is spent: refused when it is unknown, used or
/// expired, or was issued for another session or from another origin.
async fn redeem(
    state: &Runtime,
    ticket: &str,
    session: &str,
    headers: &HeaderMap,
) -> Result<Caller, ApiError> {
    let refused = |why: &str| {
        ApiError::from(PlinthError::new(
            plinth_kit::ErrorCode::Unauthenticated,
            format!(
                "the terminal ticket {why}: ask for a new one (POST \
                 /v1/sessions/{session}/terminal-tickets) just before opening the terminal; \
                 a ticket opens one terminal of its session, from the page that asked for it, \
                 within {} seconds",
                TICKET_TTL.as_secs()
            ),
        ))
    };
    let held = match state
        .services
        .request_keys()
        .redeem_terminal_ticket(pb::RedeemTerminalTicketRequest {
            ticket: ticket.to_owned(),
        })
        .await
    {
        Ok(held) => held.into_inner(),
        Err(status) if status.code() == tonic::Code::NotFound => {
            return Err(refused("is unknown, used or expired"));
        }
        Err(status) => return Err(status.into()),
    };
    if held.session_id != session {
        return Err(refused("is for another session"));
    }
    if held.origin != request_origin(headers) {
        return Err(refused("was issued to another origin"));
    }
    Ok(Caller { scope: held.scope })
}

/// `POST /v1/sessions/{id}/terminal-tickets`: a ticket for a web page's terminal.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct TerminalTicketBody {
    /// Goes in the terminal's URL as `ticket=` (`GET
    /// /v1/sessions/{id}/exec?pty=true&ticket=…`); opens one terminal, once.
    pub ticket: String,
    /// The session it opens.
    pub session: String,
    /// When it expires, ms since the epoch.
    pub expires_at: i64,
}

/// Get a terminal ticket.
///
/// A web page cannot send an `Authorization` header on a WebSocket: it asks for a ticket here
/// with its bearer token, then opens `GET /v1/sessions/{id}/exec?pty=true&ticket=…`. The
/// ticket opens one terminal of this session, from the origin that asked (the request's
/// `Origin`; a ticket asked for without one opens only a terminal asked for without one),
/// within 10 seconds, once.
#[utoipa::path(
    post,
    path = "/v1/sessions/{id}/terminal-tickets",
    tag = "sessions",
    params(("id" = String, Path, description = "The session's id")),
    responses(
        (status = 201, description = "The ticket", body = TerminalTicketBody),
        (status = 401, description = "unauthenticated", body = ErrorBody),
        (status = 404, description = "not_found: no such session, or it ended", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn issue_ticket(
    State(state): State<Runtime>,
    caller: Caller,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let session = active_session(&state, &caller.scope, &id).await?;
    let issued = state
        .services
        .request_keys()
        .issue_terminal_ticket(pb::IssueTerminalTicketRequest {
            scope: caller.scope,
            session_id: session.id.clone(),
            origin: request_origin(&headers),
            ttl_ms: TICKET_TTL.as_millis() as i64,
        })
        .await?
        .into_inner();
    let body = TerminalTicketBody {
        ticket: issued.ticket,
        session: session.id.clone(),
        expires_at: issued.expires_at_ms,
    };
    Ok((
        StatusCode::CREATED,
        [(header::CACHE_CONTROL, "no-store")],
        axum::Json(body),
    )
        .into_response())
}

/// The client's `Sec-WebSocket-Key` once the request is checked to be a WebSocket upgrade
/// hyper can hand over.
fn websocket_key(request: &Request) -> Result<String, PlinthError> {
    let needs = |what: &str| {
        PlinthError::invalid(format!(
            "pty=true needs a WebSocket upgrade: {what} (send Connection: Upgrade, Upgrade: \
             websocket, Sec-WebSocket-Version: 13 and a Sec-WebSocket-Key over HTTP/1.1; \
             `plinth shell` does)"
        ))
    };
    let headers: &HeaderMap = request.headers();
    let has_token = |name: header::HeaderName, token: &str| {
        headers.get_all(name).iter().any(|value| {
            value.to_str().is_ok_and(|value| {
                value
                    .split(',')
                    .any(|part| part.trim().eq_ignore_ascii_case(token))
            })
        })
    };
    if !has_token(header::CONNECTION, "upgrade") || !has_token(header::UPGRADE, "websocket") {
        // RFC 9110 §15.5.22: the answer names the protocol to upgrade to.
        return Err(PlinthError::new(
            plinth_kit::ErrorCode::UpgradeRequired,
            needs("the request is not one").message,
        ));
    }
    if headers
        .get(header::SEC_WEBSOCKET_VERSION)
        .and_then(|value| value.to_str().ok())
        != Some("13")
    {
        return Err(needs("Sec-WebSocket-Version must be 13"));
    }
    let key = headers
        .get(header::SEC_WEBSOCKET_KEY)
        .and_then(|value| value.to_str().ok())
        .map(str::trim)
        .filter(|key| !key.is_empty())
        .ok_or_else(|| needs("Sec-WebSocket-Key is missing"))?;
    if request
        .extensions()
        .get::<hyper::upgrade::OnUpgrade>()
        .is_none()
    {
        return Err(needs("this connection cannot be upgraded (HTTP/2?)"));
    }
    Ok(key.to_owned())
}

/// Starts the terminal and answers `101`; the WebSocket is relayed by a task of its own.
pub(crate) async fn open(
    state: Runtime,
    caller: Caller,
    id: String,
    query: TerminalQuery,
    mut request: Request,
) -> Result<Response, ApiError> {
    let size = query.size()?;
    let key = websocket_key(&request)?;
    let session = active_session(&state, &caller.scope, &id).await?;
    let mut client = state.nodes.client(&session.node_address)?;
    let command = query.command.unwrap_or_default();
    let detail = if command.trim().is_empty() {
        "(interactive shell)".to_owned()
    } else {
        command.clone()
    };
    let (inputs, receiver) = mpsc::channel::<node::PtyRequest>(32);
    let start = node::PtyRequest {
        input: Some(node::pty_request::Input::Start(node::PtyStart {
            session: Some(spec(&session)),
            command,
            cwd: query.cwd.unwrap_or_default(),
            env: Default::default(),
            size: Some(size),
            timeout_ms: 0,
        })),
    };
    inputs
        .send(start)
        .await
        .map_err(|_| PlinthError::internal(&std::io::Error::other("terminal input closed")))?;
    let begun = record(
        &state,
        &caller.scope,
        &session,
        pb::TurnKind::Exec,
        &detail,
        None,
    );
    let started = async {
        Ok::<_, ApiError>(
            client
                .pty(ReceiverStream::new(receiver))
                .await?
                .into_inner(),
        )
    };
    let (turn, outputs) = tokio::join!(begun, started);
    let (turn, outputs) = settle(&state, &caller.scope, &session, turn, outputs)?;
    let upgrade = hyper::upgrade::on(&mut request);
    let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes());
    let scope = caller.scope;
    let touch = Toucher::new(&state, &scope, &session);
    plinth_kit::tasks::spawn(async move {
        let exit_code = match upgrade.await {
            Ok(upgraded) => {
                let socket = WebSocketStream::from_raw_socket(
                    hyper_util::rt::TokioIo::new(upgraded),
                    Role::Server,
                    None,
                )
                .await;
                relay(socket, inputs, outputs, touch).await
            }
            Err(error) => {
                tracing::warn!(%error, "a terminal's connection was not upgraded");
                None
            }
        };
        // Dropping the input stream (with `relay`) hangs the terminal up on the node.
        finish_turn(&state, &scope, &turn, exit_code.unwrap_or(-1));
    });
    Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(header::CONNECTION, "upgrade")
        .header(header::UPGRADE, "websocket")
        .header(header::SEC_WEBSOCKET_ACCEPT, accept)
        .body(Body::empty())
        .map_err(|error| PlinthError::internal(&error).into())
}

/// Keeps a session with an open terminal from being ended as idle while the terminal has
/// traffic (keystrokes or output): the idle limit counts from the last turn, and a terminal is
/// one turn however long a person works in it. At most once a quarter of the idle limit (and
/// at least every 30 s), the catalog moves the session's idle end as a turn would. A session
/// without an idle limit is never touched; its lifetime still ends it.
struct Toucher {
    state: Runtime,
    scope: String,
    session_id: String,
    every: Option<Duration>,
    last: Instant,
}

impl Toucher {
    fn new(state: &Runtime, scope: &str, session: &pb::Session) -> Toucher {
        let idle_ms = session.limits.as_ref().map_or(0, |limits| limits.idle_ms);
        Toucher {
            state: state.clone(),
            scope: scope.to_owned(),
            session_id: session.id.clone(),
            every: (idle_ms > 0).then(|| {
                Duration::from_millis(idle_ms / 4).clamp(Duration::from_millis(250), TOUCH_AT_MOST)
            }),
            last: Instant::now(),
        }
    }

    /// The terminal had traffic now.
    fn used(&mut self) {
        let Some(every) = self.every else {
            return;
        };
        if self.last.elapsed() < every {
            return;
        }
        self.last = Instant::now();
        let mut sessions = self.state.sessions();
        let request = pb::TouchSessionRequest {
            scope: self.scope.clone(),
            session_id: self.session_id.clone(),
        };
        plinth_kit::tasks::spawn(async move {
            if let Err(status) = sessions.touch_session(request).await {
                tracing::warn!(error = %status.message(), "keeping a terminal's session from its idle end failed");
            }
        });
    }
}

/// The longest a terminal with traffic goes without telling the catalog its session is used.
const TOUCH_AT_MOST: Duration = Duration::from_secs(30);

/// Relays frames to the node and its output back until the command ends (answers its exit
/// code) or either side leaves (answers none).
///
/// The node ends its call as soon as the command has ended, which closes its input, while
/// its last output and the result may still be on their way here; a frame from the client
/// in that moment (its `close_stdin`, a key, a resize) goes nowhere and is dropped, and the
/// relay goes on to the result. Every way out that knows the client is still there ends with
/// a close frame and waits for the client's, so the client never sees the connection reset
/// where it expects a command's end.
async fn relay<S>(
    socket: WebSocketStream<S>,
    inputs: mpsc::Sender<node::PtyRequest>,
    mut outputs: tonic::Streaming<node::PtyOutput>,
    mut touch: Toucher,
) -> Option<i32>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let (mut sink, mut frames) = socket.split();
    let input = |input: node::pty_request::Input| node::PtyRequest { input: Some(input) };
    // None once the node takes no more input.
    let mut inputs = Some(inputs);
    let (exit_code, close) = loop {
        tokio::select! {
            frame = frames.next() => {
                let message = match frame {
                    Some(Ok(Message::Binary(bytes))) => {
                        touch.used();
                        node::pty_request::Input::Stdin(bytes)
                    }
                    Some(Ok(Message::Text(text))) => {
                        match serde_json::from_str::<Control>(text.as_str()) {
                            Ok(Control::Resize { cols, rows }) => node::pty_request::Input::Resize(node::PtySize {
                                cols: cols.clamp(1, MAX_CELLS),
                                rows: rows.clamp(1, MAX_CELLS),
                            }),
                            Ok(Control::CloseStdin) => node::pty_request::Input::CloseStdin(true),
                            Err(error) => break (None, Some(CloseFrame {
                                code: CloseCode::Invalid,
                                reason: format!(
                                    "a text frame is a JSON control ({{\"type\":\"resize\",\"cols\":N,\"rows\":N}} or {{\"type\":\"close_stdin\"}}): {error}"
                                ).chars().take(120).collect::<String>().into(),
                            })),
                        }
                    }
                    // Pings are answered by tungstenite itself.
                    Some(Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_))) => continue,
                    // The client left: the terminal is hung up (dropping the input stream).
                    // A close frame is answered with one.
                    Some(Ok(Message::Close(_))) => {
                        drop(inputs);
                        let _ = tokio::time::timeout(CLOSE_WAIT, sink.close()).await;
                        return None;
                    }
                    Some(Err(_)) | None => return None,
                };
                if let Some(sender) = &inputs
                    && sender.send(input(message)).await.is_err()
                {
                    // The node's call is over: its result is on its way.
                    inputs = None;
                }
            }
            output = outputs.next() => match output {
                Some(Ok(node::PtyOutput { output: Some(node::pty_output::Output::Data(bytes)) })) => {
                    touch.used();
                    if sink.send(Message::Binary(bytes)).await.is_err() {
                        return None;
                    }
                }
                Some(Ok(node::PtyOutput { output: Some(node::pty_output::Output::Result(result)) })) => {
                    let exit = serde_json::json!({ "type": "exit", "exit_code": result.exit_code });
                    if sink.send(Message::text(exit.to_string())).await.is_err() {
                        plinth_kit::streams::finish(&mut outputs).await;
                        return Some(result.exit_code);
                    }
                    break (Some(result.exit_code), Some(CloseFrame {
                        code: CloseCode::Normal,
                        reason: "the command ended".into(),
                    }));
                }
                Some(Ok(_)) => {}
                Some(Err(status)) => {
                    let error = PlinthError::from_status(&status);
                    tracing::warn!(code = error.code.as_str(), message = %error.message, "a terminal's node stream failed");
                    break (None, Some(CloseFrame {
                        code: CloseCode::Error,
                        reason: "the session's node stopped answering".into(),
                    }));
                }
                None => break (None, Some(CloseFrame {
                    code: CloseCode::Error,
                    reason: "the session's node ended the terminal without a result".into(),
                })),
            },
        }
    };
    drop(inputs);
    if exit_code.is_some() {
        // The node's call ended well: its status follows the result.
        plinth_kit::streams::finish(&mut outputs).await;
    }
    if let Some(close) = close {
        let _ = sink.send(Message::Close(Some(close))).await;
        // The client's half of the closing handshake, so the connection is not closed while
        // the client still reads the last frames.
        let _ = tokio::time::timeout(CLOSE_WAIT, async {
            while let Some(Ok(frame)) = frames.next().await {
                if frame.is_close() {
                    break;
                }
            }
        })
        .await;
    }
    exit_code
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_size_is_80_by_24_unless_given_and_a_terminal_has_1_to_1000_cells_a_side() {
        let size = TerminalQuery::default().size().expect("default");
        assert_eq!((size.cols, size.rows), (80, 24));
        for (cols, rows) in [(0, 24), (80, 1001)] {
            let query = TerminalQuery {
                cols: Some(cols),
                rows: Some(rows),
                ..Default::default()
            };
            let error = query.size().expect_err("refused");
            assert!(error.message.contains("1 to 1000"), "{}", error.message);
        }
    }

    #[test]
    fn terminal_parameters_without_pty_are_refused_naming_one() {
        let query = TerminalQuery {
            cwd: Some("src".to_owned()),
            ..Default::default()
        };
        let error = query.refuse_without_pty().expect_err("refused");
        assert!(error.message.starts_with("query: cwd is for a terminal"));
        assert!(TerminalQuery::default().refuse_without_pty().is_ok());
    }

    #[test]
    fn controls_are_resize_and_close_stdin_and_nothing_else() {
        assert!(matches!(
            serde_json::from_str::<Control>(r#"{"type":"resize","cols":120,"rows":40}"#),
            Ok(Control::Resize {
                cols: 120,
                rows: 40
            })
        ));
        assert!(matches!(
            serde_json::from_str::<Control>(r#"{"type":"close_stdin"}"#),
            Ok(Control::CloseStdin)
        ));
        for refused in [
            r#"{"type":"signal","name":"KILL"}"#,
            r#"{"type":"resize","cols":1}"#,
            "not json",
        ] {
            assert!(
                serde_json::from_str::<Control>(refused).is_err(),
                "{refused}"
            );
        }
    }
}
