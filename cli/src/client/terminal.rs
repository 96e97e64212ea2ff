//! `plinth shell`: an interactive terminal in a session, over the API's terminal WebSocket
//! (`POST /v1/sessions/{id}/exec?pty=true`, upgraded).
//!
//! The local terminal is put in raw mode for as long as the remote one runs, so every key
//! (Ctrl-C, arrows, Tab) reaches the remote shell as typed; it is restored on every way out,
//! errors and panics included, by a guard. Its size is sent at the start and again on each
//! `SIGWINCH`. When standard input is not a terminal (a pipe), nothing is put in raw mode:
//! the piped bytes are typed at the remote terminal, then its end-of-file.
//!
//! tungstenite's own client only sends `GET`; the API's terminal is a `POST` like every exec,
//! so the upgrade is asked for with reqwest (which keeps the profile's URL, token and TLS)
//! and the connection it hands back is framed by tungstenite.

use std::io::{Read as _, Write as _};
use std::os::fd::AsFd;
use std::process::ExitCode;

use anyhow::Context as _;
use futures::{SinkExt as _, StreamExt as _};
use reqwest::{Method, StatusCode, header};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::handshake::{client::generate_key, derive_accept_key};
use tokio_tungstenite::tungstenite::protocol::Role;

use super::api::{Api, ApiFailure};
use super::sessions::start;
use super::{output, shell as quoting};
use crate::client_args::ShellArgs;

/// The exit status of a shell stopped by a signal to `plinth` itself (128 + SIGTERM).
const TERMINATED: u8 = 128 + 15;

pub async fn shell(args: ShellArgs) -> anyhow::Result<ExitCode> {
    let api = Api::from_profile()?;
    let command = (!args.command.is_empty()).then(|| quoting::join(&args.command));
    if args.target.starts_with(plinth_kit::ids::SessionId::PREFIX) {
        return until_stopped(run(&api, &args.target, command.as_deref())).await;
    }
    // A session of our own, ended whatever happens, as `exec` ends its own.
    let session = start(&api, &args.target).await?;
    let id = output::text(&session, "id");
    let ran = until_stopped(run(&api, &id, command.as_deref())).await;
    if let Err(error) = api.delete(["v1", "sessions", &id]).await {
        eprintln!(
            "plinth: could not end session {id}: {error:#}; end it with `plinth session end {id}`"
        );
    }
    ran
}

/// Runs `shell` until it ends or `plinth` is told to stop (Ctrl-C when standard input is not
/// a terminal, SIGTERM, SIGHUP); stopping drops it, which restores the local terminal.
async fn until_stopped(
    shell: impl Future<Output = anyhow::Result<ExitCode>>,
) -> anyhow::Result<ExitCode> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut terminate = signal(SignalKind::terminate()).context("cannot watch for SIGTERM")?;
    let mut hangup = signal(SignalKind::hangup()).context("cannot watch for SIGHUP")?;
    tokio::select! {
        ran = shell => ran,
        _ = tokio::signal::ctrl_c() => Ok(ExitCode::from(super::sessions::INTERRUPTED)),
        _ = terminate.recv() => Ok(ExitCode::from(TERMINATED)),
        _ = hangup.recv() => Ok(ExitCode::from(TERMINATED)),
    }
}

/// The local terminal in raw mode; restored as it was when dropped.
struct RawMode {
    saved: rustix::termios::Termios,
}

impl RawMode {
    fn enter() -> anyhow::Result<Self> {
        let stdin = std::io::stdin();
        let saved = rustix::termios::tcgetattr(stdin.as_fd())
            .context("cannot read the terminal's settings")?;
        let mut raw = saved.clone();
        raw.make_raw();
        rustix::termios::tcsetattr(stdin.as_fd(), rustix::termios::OptionalActions::Now, &raw)
            .context("cannot put the terminal in raw mode")?;
        Ok(RawMode { saved })
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        let _ = rustix::termios::tcsetattr(
            std::io::stdin().as_fd(),
            rustix::termios::OptionalActions::Now,
            &self.saved,
        );
    }
}

/// The local terminal's size (of standard input, else of standard output), if either is one.
fn window_size() -> Option<(u16, u16)> {
    let size = rustix::termios::tcgetwinsize(std::io::stdin().as_fd())
        .or_else(|_| rustix::termios::tcgetwinsize(std::io::stdout().as_fd()))
        .ok()?;
    (size.ws_col > 0 && size.ws_row > 0).then_some((size.ws_col, size.ws_row))
}

/// Reads standard input on a thread of its own (a read of a terminal cannot be cancelled,
/// and the runtime must not wait for one at exit); the channel closes at its end.
fn read_stdin() -> mpsc::Receiver<Vec<u8>> {
    let (sender, receiver) = mpsc::channel(16);
    std::thread::spawn(move || {
        let mut stdin = std::io::stdin().lock();
        let mut buffer = vec![0u8; 8 * 1024];
        loop {
            match stdin.read(&mut buffer) {
                Ok(0) => return,
                Ok(read) => {
                    if sender.blocking_send(buffer[..read].to_vec()).is_err() {
                        return;
                    }
                }
                Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return,
            }
        }
    });
    receiver
}

/// Opens the terminal in session `id` and relays it until the remote command ends; answers
/// its exit status.
async fn run(api: &Api, id: &str, command: Option<&str>) -> anyhow::Result<ExitCode> {
    let interactive = rustix::termios::isatty(std::io::stdin().as_fd());
    let mut url = api.url(["v1", "sessions", id, "exec"]);
    {
        let mut query = url.query_pairs_mut();
        query.append_pair("pty", "true");
        if let Some(command) = command {
            query.append_pair("command", command);
        }
        if let Some((cols, rows)) = window_size() {
            query.append_pair("cols", &cols.to_string());
            query.append_pair("rows", &rows.to_string());
        }
    }
    let key = generate_key();
    let request = api
        .upgrade_request(Method::POST, url)?
        .header(header::CONNECTION, "Upgrade")
        .header(header::UPGRADE, "websocket")
        .header(header::SEC_WEBSOCKET_VERSION, "13")
        .header(header::SEC_WEBSOCKET_KEY, &key);
    let response = request
        .send()
        .await
        .map_err(|error| api.unreachable(error))?;
    if response.status() != StatusCode::SWITCHING_PROTOCOLS {
        if response.status().is_success() {
            anyhow::bail!(
                "the server at {} answered {} instead of opening a terminal; is it a Plinth \
                 server recent enough to have one?",
                api.base(),
                response.status()
            );
        }
        return Err(ApiFailure::from_response(response).await.into());
    }
    let accepted = response
        .headers()
        .get(header::SEC_WEBSOCKET_ACCEPT)
        .and_then(|value| value.to_str().ok());
    if accepted != Some(derive_accept_key(key.as_bytes()).as_str()) {
        anyhow::bail!(
            "the server at {} switched protocols without accepting the terminal's WebSocket \
             key; is something between here and it rewriting the request?",
            api.base()
        );
    }
    let upgraded = response
        .upgrade()
        .await
        .map_err(|error| api.unreachable(error))?;
    let socket = WebSocketStream::from_raw_socket(upgraded, Role::Client, None).await;
    // Raw only once the terminal is open, so refusals above print as usual.
    let raw = if interactive {
        Some(RawMode::enter()?)
    } else {
        None
    };
    let relayed = relay(socket).await;
    drop(raw);
    let code = relayed?;
    Ok(ExitCode::from(u8::try_from(code).unwrap_or(1)))
}

/// Copies standard input to the socket and the socket's bytes to standard output until the
/// remote command's exit status arrives; answers it.
///
/// What the socket brings is what decides: it is read to the server's close (after the exit
/// message), and the closing handshake is answered before the socket is dropped. Input that
/// cannot be sent any more (the server is already closing) stops being sent, but the frames
/// still on their way are read all the same; a connection that drops once the exit message
/// has arrived is the command's end, not an error.
async fn relay<S>(socket: WebSocketStream<S>) -> anyhow::Result<i32>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use tokio::signal::unix::{SignalKind, signal};
    let (mut sink, mut frames) = socket.split();
    let mut stdin = read_stdin();
    let mut stdin_open = true;
    // False once a frame could not be sent; why, for when the reading fails too.
    let mut sending = true;
    let mut send_failed: Option<String> = None;
    let mut resized =
        signal(SignalKind::window_change()).context("cannot watch the terminal's size")?;
    let mut exit_code: Option<i32> = None;
    let lost = |error: &dyn std::fmt::Display| {
        anyhow::anyhow!("the terminal's connection was lost: {error}")
    };
    loop {
        let outgoing = tokio::select! {
            frame = frames.next() => match frame {
                Some(Ok(Message::Binary(bytes))) => {
                    let mut stdout = std::io::stdout().lock();
                    stdout
                        .write_all(&bytes)
                        .and_then(|()| stdout.flush())
                        .context("cannot write the terminal's output")?;
                    continue;
                }
                Some(Ok(Message::Text(text))) => {
                    let control: Value = serde_json::from_str(text.as_str()).unwrap_or_default();
                    if control["type"] == "exit" {
                        exit_code = control["exit_code"].as_i64().and_then(|code| i32::try_from(code).ok());
                    }
                    continue;
                }
                Some(Ok(Message::Close(close))) => {
                    // The server's close, answered (tungstenite queued the reply; this sends it).
                    let _ = tokio::time::timeout(CLOSE_WAIT, sink.close()).await;
                    return exit_code.ok_or_else(|| {
                        let why = close
                            .map(|close| close.reason.to_string())
                            .filter(|reason| !reason.is_empty())
                            .unwrap_or_else(|| "no reason given".to_owned());
                        anyhow::anyhow!("the server closed the terminal before the command ended: {why}")
                    });
                }
                Some(Ok(_)) => continue,
                Some(Err(error)) => {
                    return exit_code.ok_or_else(|| match &send_failed {
                        Some(sent) => lost(&format!("{error} (sending: {sent})")),
                        None => lost(&error),
                    });
                }
                None => {
                    return exit_code.ok_or_else(|| lost(&"the server went away"));
                }
            },
            typed = stdin.recv(), if stdin_open && sending => match typed {
                Some(bytes) => Message::Binary(bytes.into()),
                None => {
                    stdin_open = false;
                    Message::text(json!({ "type": "close_stdin" }).to_string())
                }
            },
            _ = resized.recv(), if sending => match window_size() {
                Some((cols, rows)) => {
                    Message::text(json!({ "type": "resize", "cols": cols, "rows": rows }).to_string())
                }
                None => continue,
            },
        };
        if let Err(error) = sink.send(outgoing).await {
            sending = false;
            send_failed = Some(error.to_string());
        }
    }
}

/// How long the server's close waits for this side's answer to be sent.
const CLOSE_WAIT: std::time::Duration = std::time::Duration::from_secs(2);
