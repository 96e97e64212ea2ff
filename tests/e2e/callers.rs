//! Commands end with their caller, and run at most once (`plinth serve` with its in-process
//! builder and node agent, over real HTTP and gRPC): a REST client that hangs up, a gRPC call
//! past its deadline or cancelled, and a node call dropped over the network each take the
//! running command's whole process tree with them, leaving nothing behind in the session;
//! and a request retried with the same `Idempotency-Key` gets the first answer without
//! running again (an exec, a session).
//!
//! "Gone" is what the host sees: no process holds the command's marker, looked for every
//! 100 ms for at most 2 s.

use std::time::Duration;

use plinth_proto::public::v1 as public;
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt as _;

use crate::helpers::{
    Server, assert_error, built_environment, exec_in, json as answer, send, start_session_with,
};
use crate::sandbox::{gone_within, host_processes};
use crate::waiting::eventually;

const BUILD_LIMIT: Duration = Duration::from_secs(120);
/// How soon a command whose caller left must be gone.
const GONE_WITHIN: Duration = Duration::from_secs(2);

/// A session on a freshly built environment: its id.
async fn session(server: &Server, name: &str) -> String {
    let environment = built_environment(server, name, BUILD_LIMIT).await;
    let session = start_session_with(server, json!({ "environment": environment })).await;
    session["id"].as_str().expect("session id").to_owned()
}

/// Waits (bounded) until a host process holds `marker`: the command runs.
async fn running(marker: &str) {
    crate::waiting::eventually(Duration::from_secs(10), async || {
        if host_processes(marker).is_empty() {
            Err(format!("no process holds {marker:?}"))
        } else {
            Ok(())
        }
    })
    .await;
}

/// Sends an exec over a connection of its own, waits until its command holds `marker` on the
/// host, then hangs up without reading the answer.
async fn exec_then_hang_up(
    server: &Server,
    session: &str,
    body: &Value,
    key: Option<&str>,
    marker: &str,
) {
    let address = server.base.trim_start_matches("http://").to_owned();
    let mut connection = tokio::net::TcpStream::connect(&address)
        .await
        .expect("connect");
    let body = body.to_string();
    let key = key
        .map(|key| format!("Idempotency-Key: {key}\r\n"))
        .unwrap_or_default();
    let request = format!(
        "POST /v1/sessions/{session}/exec HTTP/1.1\r\nHost: {address}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n{key}\r\n{body}",
        body.len()
    );
    connection
        .write_all(request.as_bytes())
        .await
        .expect("request sent");
    running(marker).await;
    drop(connection);
}

/// What the session itself sees running (`ps` from inside it), one `STAT COMMAND` a line,
/// without the `ps` and its shell.
async fn session_processes(server: &Server, session: &str) -> Vec<String> {
    let listed = exec_in(
        server,
        session,
        json!({ "command": "ps -e -o stat=,comm=" }),
    )
    .await;
    listed["stdout"]
        .as_str()
        .expect("stdout")
        .lines()
        .map(str::trim)
        .filter(|line| !line.ends_with(" ps") && !line.ends_with(" sh"))
        .map(str::to_owned)
        .collect()
}

/// The exec turns of a session: (command, exit code).
async fn exec_turns(server: &Server, session: &str) -> Vec<(String, Value)> {
    let (status, turns) = send(
        server
            .client
            .get(server.url(&format!("/v1/sessions/{session}/turns"))),
    )
    .await;
    assert_eq!(status, 200, "{turns}");
    turns["data"]
        .as_array()
        .expect("turns")
        .iter()
        .filter(|turn| turn["kind"] == "exec")
        .map(|turn| {
            (
                turn["detail"].as_str().expect("detail").to_owned(),
                turn["exit_code"].clone(),
            )
        })
        .collect()
}

#[tokio::test]
async fn a_rest_client_that_hangs_up_takes_its_command_and_its_children_with_it() {
    if !crate::helpers::can_build() {
        return;
    }
    let server = Server::start_with(&["--builder-network", "false"]).await;
    let session = session(&server, "Hang Up").await;

    // The command leaves a child in the background, and one in a session of its own: both go.
    let command = "setsid -f sleep 6011 > /dev/null 2>&1 < /dev/null; sleep 6012 & sleep 6013";
    exec_then_hang_up(
        &server,
        &session,
        &json!({ "command": command, "timeout_ms": 120_000 }),
        None,
        "sleep 6013",
    )
    .await;
    for marker in ["sleep 6011", "sleep 6012", "sleep 6013"] {
        assert_eq!(
            gone_within(marker, GONE_WITHIN).await,
            Vec::<String>::new(),
            "{marker}"
        );
    }
    // Nothing of it is left in the session, not even a zombie.
    assert_eq!(
        session_processes(&server, &session).await,
        Vec::<String>::new()
    );
    // Its turn ends as one whose end was not seen.
    let turns = eventually(Duration::from_secs(2), async || {
        let turns = exec_turns(&server, &session).await;
        if turns.first().is_some_and(|(_, exit)| !exit.is_null()) {
            Ok(turns)
        } else {
            Err(turns)
        }
    })
    .await;
    assert_eq!(
        turns.first(),
        Some(&(command.to_owned(), json!(-1))),
        "{turns:?}"
    );
    // The session goes on.
    let next = exec_in(&server, &session, json!({ "command": "echo still here" })).await;
    assert_eq!(next["stdout"], "still here\n", "{next}");
    server.stop().await;
}

/// The public gRPC API's session client on the gateway's address.
async fn public_sessions(
    server: &Server,
) -> public::session_service_client::SessionServiceClient<tonic::transport::Channel> {
    let channel = tonic::transport::Endpoint::from_shared(server.base.clone())
        .expect("url")
        .connect()
        .await
        .expect("connect");
    public::session_service_client::SessionServiceClient::new(channel)
}

fn public_exec(session: &str, command: &str) -> public::ExecRequest {
    public::ExecRequest {
        session_id: session.to_owned(),
        command: command.to_owned(),
        timeout_ms: Some(120_000),
        ..Default::default()
    }
}

#[tokio::test]
async fn a_grpc_call_past_its_deadline_or_cancelled_takes_its_command_with_it() {
    if !crate::helpers::can_build() {
        return;
    }
    let server = Server::start_with(&["--builder-network", "false"]).await;
    let session = session(&server, "Deadlines").await;
    let mut sessions = public_sessions(&server).await;

    // A 1 s deadline: the call ends DEADLINE_EXCEEDED, and the command is killed.
    let mut request = tonic::Request::new(public_exec(&session, "sleep 6021"));
    request.set_timeout(Duration::from_secs(1));
    let mut events = sessions
        .exec(request)
        .await
        .expect("the call starts")
        .into_inner();
    let ended = loop {
        match events.message().await {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("the stream ended without an error past its deadline"),
            Err(status) => break status,
        }
    };
    assert_eq!(ended.code(), tonic::Code::DeadlineExceeded, "{ended:?}");
    assert_eq!(
        gone_within("sleep 6021", GONE_WITHIN).await,
        Vec::<String>::new()
    );

    // A call the client drops once its command runs.
    let events = sessions
        .exec(public_exec(&session, "sleep 6022 & sleep 6023"))
        .await
        .expect("the call starts")
        .into_inner();
    running("sleep 6023").await;
    drop(events);
    for marker in ["sleep 6022", "sleep 6023"] {
        assert_eq!(
            gone_within(marker, GONE_WITHIN).await,
            Vec::<String>::new(),
            "{marker}"
        );
    }

    // The node's own Exec, dropped by its caller over a real network connection (as a
    // gateway in another process calls it): the node notices and kills the command.
    let node_channel =
        tonic::transport::Endpoint::from_shared(format!("http://{}", server.node_addr()))
            .expect("url")
            .connect()
            .await
            .expect("connect to the node");
    let mut node = plinth_proto::node::v1::node_service_client::NodeServiceClient::with_interceptor(
        node_channel,
        server.interceptor(plinth_kit::auth::Role::Gateway),
    );
    let events = node
        .exec(plinth_proto::node::v1::ExecRequest {
            session: Some(plinth_proto::node::v1::SessionSpec {
                session_id: session.clone(),
                ..Default::default()
            }),
            command: "sleep 6024".into(),
            ..Default::default()
        })
        .await
        .expect("the node runs it")
        .into_inner();
    running("sleep 6024").await;
    drop(events);
    assert_eq!(
        gone_within("sleep 6024", GONE_WITHIN).await,
        Vec::<String>::new()
    );

    assert_eq!(
        session_processes(&server, &session).await,
        Vec::<String>::new()
    );
    // A call with a deadline it meets is answered as any.
    let mut request = tonic::Request::new(public_exec(&session, "echo in time"));
    request.set_timeout(Duration::from_secs(30));
    let mut events = sessions.exec(request).await.expect("the call").into_inner();
    let mut stdout = String::new();
    while let Some(event) = events.message().await.expect("an event") {
        if let Some(public::exec_event::Event::Stdout(text)) = event.event {
            stdout.push_str(&text);
        }
    }
    assert_eq!(stdout, "in time\n");

    // `idempotency-key` metadata is the REST header: one session for two calls with one key.
    let environment = {
        let (_, found) = send(
            server
                .client
                .get(server.url(&format!("/v1/sessions/{session}"))),
        )
        .await;
        found["environment"]["id"]
            .as_str()
            .expect("environment")
            .to_owned()
    };
    let mut created = Vec::new();
    for _ in 0..2 {
        let mut request = tonic::Request::new(public::CreateSessionRequest {
            environment: Some(environment.clone()),
            ..Default::default()
        });
        request
            .metadata_mut()
            .insert("idempotency-key", "grpc-session-1".parse().expect("ascii"));
        created.push(
            sessions
                .create_session(request)
                .await
                .expect("created")
                .into_inner()
                .id,
        );
    }
    assert_eq!(created[0], created[1]);
    let mut request = tonic::Request::new(public_exec(&session, "echo keyed"));
    request
        .metadata_mut()
        .insert("idempotency-key", "grpc-exec-1".parse().expect("ascii"));
    let refused = sessions
        .exec(request)
        .await
        .expect_err("a streamed exec takes no key");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    server.stop().await;
}

/// `POST /v1/sessions/{session}/exec` with `body` and `Idempotency-Key: key`: the answer's
/// status, whether it is a replay, and its body.
async fn keyed_exec(server: &Server, session: &str, key: &str, body: &Value) -> (u16, bool, Value) {
    let response = server
        .client
        .post(server.url(&format!("/v1/sessions/{session}/exec")))
        .header("Idempotency-Key", key)
        .json(body)
        .send()
        .await
        .expect("request");
    let replayed = response
        .headers()
        .get("idempotent-replayed")
        .is_some_and(|value| value == "true");
    let (status, body) = answer(response).await;
    (status, replayed, body)
}

/// How many times the keyed commands of the test ran: the lines of `ran.txt`.
async fn runs(server: &Server, session: &str, file: &str) -> String {
    let counted = exec_in(
        server,
        session,
        json!({ "command": format!("cat {file} 2>/dev/null | wc -l") }),
    )
    .await;
    counted["stdout"]
        .as_str()
        .expect("stdout")
        .trim()
        .to_owned()
}

#[tokio::test]
async fn a_request_retried_with_its_idempotency_key_runs_once_and_gets_the_first_answer() {
    if !crate::helpers::can_build() {
        return;
    }
    let server = Server::start_with(&["--builder-network", "false"]).await;
    let environment = built_environment(&server, "Once", BUILD_LIMIT).await;

    // A session: the retry gets the same one, and no second is started.
    let asked = json!({ "environment": environment });
    let create = |key: &'static str, body: Value| {
        let request = server
            .client
            .post(server.url("/v1/sessions"))
            .header("Idempotency-Key", key)
            .json(&body);
        async move {
            let response = request.send().await.expect("request");
            let replayed = response.headers().contains_key("idempotent-replayed");
            let (status, body) = answer(response).await;
            (status, replayed, body)
        }
    };
    let (status, replayed, first) = create("session-1", asked.clone()).await;
    assert_eq!((status, replayed), (201, false), "{first}");
    let (status, replayed, again) = create("session-1", asked.clone()).await;
    assert_eq!((status, replayed), (201, true), "{again}");
    assert_eq!(again, first);
    let (_, usage) = send(server.client.get(server.url("/v1/usage"))).await;
    assert_eq!(usage["quotas"]["sessions"]["used"], 1, "{usage}");
    let (status, _, other) = create(
        "session-1",
        json!({ "environment": environment, "limits": { "pids": 64 } }),
    )
    .await;
    assert_error(status, &other, 422, "idempotency_key_reused");
    let session = first["id"].as_str().expect("id").to_owned();

    // An exec retried while it runs waits for it, and one retried after gets its answer: the
    // command ran once, and every answer is the first.
    let body =
        json!({ "command": "echo run >> ran.txt; sleep 2.031; echo done", "timeout_ms": 60_000 });
    let first = plinth_kit::tasks::spawn({
        let (client, url, body) = (
            server.client.clone(),
            server.url(&format!("/v1/sessions/{session}/exec")),
            body.clone(),
        );
        async move {
            let response = client
                .post(url)
                .header("Idempotency-Key", "exec-1")
                .json(&body)
                .send()
                .await
                .expect("request");
            answer(response).await
        }
    });
    running("sleep 2.031").await;
    let (status, replayed, during) = keyed_exec(&server, &session, "exec-1", &body).await;
    assert_eq!((status, replayed), (200, true), "{during}");
    let (status, first) = first.await.expect("the first request");
    assert_eq!(status, 200, "{first}");
    assert_eq!(first["stdout"], "done\n", "{first}");
    assert_eq!(during, first);
    let (status, replayed, after) = keyed_exec(&server, &session, "exec-1", &body).await;
    assert_eq!((status, replayed), (200, true), "{after}");
    assert_eq!(after, first);
    assert_eq!(runs(&server, &session, "ran.txt").await, "1");

    // The same key with another body is refused, and runs nothing.
    let (status, _, refused) = keyed_exec(
        &server,
        &session,
        "exec-1",
        &json!({ "command": "echo run >> ran.txt" }),
    )
    .await;
    assert_error(status, &refused, 422, "idempotency_key_reused");
    assert_eq!(runs(&server, &session, "ran.txt").await, "1");
    // A streamed exec cannot be answered again: a key is refused there.
    let (status, refused) = send(
        server
            .client
            .post(server.url(&format!("/v1/sessions/{session}/exec?stream=true")))
            .header("Idempotency-Key", "exec-2")
            .json(&json!({ "command": "echo run >> ran.txt" })),
    )
    .await;
    assert_error(status, &refused, 400, "environment_invalid");

    // A keyed command whose caller hangs up is the key's: it runs to its end, and the retry
    // gets its answer without running it again.
    let body = json!({ "command": "echo run >> lost.txt; sleep 2.032; echo finished", "timeout_ms": 60_000 });
    exec_then_hang_up(&server, &session, &body, Some("exec-3"), "sleep 2.032").await;
    let (status, replayed, retried) = keyed_exec(&server, &session, "exec-3", &body).await;
    assert_eq!((status, replayed), (200, true), "{retried}");
    assert_eq!(retried["stdout"], "finished\n", "{retried}");
    assert_eq!(retried["exit_code"], 0, "{retried}");
    assert_eq!(runs(&server, &session, "lost.txt").await, "1");

    // Keys are per route: the same key on another session's exec is another request.
    let other = start_session_with(&server, json!({ "environment": environment })).await;
    let other = other["id"].as_str().expect("id");
    let (status, replayed, elsewhere) = keyed_exec(&server, other, "exec-3", &body).await;
    assert_eq!((status, replayed), (200, false), "{elsewhere}");
    assert_eq!(runs(&server, other, "lost.txt").await, "1");
    server.stop().await;
}
