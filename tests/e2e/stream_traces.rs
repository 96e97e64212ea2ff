//! A streamed call as an operator sees it, from a real `plinth serve` exporting to an OTLP
//! receiver: a streamed exec (over REST and over the public gRPC face), a download and a
//! followed build log are each one trace that lasts as long as the stream, with no span
//! marked as an error, and counted `OK`, as is a terminal whose shell exits; a client that
//! leaves mid-stream is counted `CANCELLED`.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::{SinkExt as _, StreamExt as _};
use opentelemetry_proto::tonic::trace::v1::Span;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use opentelemetry_proto::tonic::trace::v1::status::StatusCode;
use plinth_proto::public::v1 as public;
use serde_json::{Value, json};

use crate::helpers::{can_build, send};
use crate::telemetry::{Collector, TracedServe, hex, integer, sample, span_status, until};
use crate::waiting::eventually;

const NODE_EXEC: &str = "plinth.node.v1.NodeService/Exec";
const NODE_PTY: &str = "plinth.node.v1.NodeService/Pty";
const SOURCE_READ: &str = "plinth.source.v1.SourceService/ReadFile";
const LOG_READ: &str = "plinth.catalog.v1.CatalogService/ReadBuildLog";

/// The spans received, by trace.
fn traces(spans: &[(String, Span)]) -> BTreeMap<String, Vec<Span>> {
    let mut traces: BTreeMap<String, Vec<Span>> = BTreeMap::new();
    for (_, span) in spans {
        traces
            .entry(hex(&span.trace_id))
            .or_default()
            .push(span.clone());
    }
    traces
}

fn seconds(span: &Span) -> f64 {
    span.end_time_unix_nano
        .saturating_sub(span.start_time_unix_nano) as f64
        / 1e9
}

fn describe(trace: &[Span]) -> Vec<String> {
    trace
        .iter()
        .map(|span| {
            format!(
                "{} ({:?}, {:?}, {:.3} s, grpc status {:?})",
                span.name,
                span.kind(),
                span_status(span),
                seconds(span),
                integer(&span.attributes, "rpc.grpc.status_code")
            )
        })
        .collect()
}

/// The one trace whose root is the server span named `name`, checked: a single root, and no
/// span in it marked as an error.
fn one_trace<'a>(traces: &'a BTreeMap<String, Vec<Span>>, name: &str) -> &'a [Span] {
    let found: Vec<&Vec<Span>> = traces
        .values()
        .filter(|trace| {
            trace
                .iter()
                .any(|span| span.name == name && span.kind() == SpanKind::Server)
        })
        .collect();
    assert_eq!(found.len(), 1, "one trace for {name}: {found:#?}");
    let trace = found[0];
    let roots: Vec<&Span> = trace
        .iter()
        .filter(|span| span.parent_span_id.is_empty())
        .collect();
    assert_eq!(
        roots.len(),
        1,
        "{name}: one root span: {:#?}",
        describe(trace)
    );
    assert_eq!(roots[0].name, name, "{:#?}", describe(trace));
    for span in trace {
        assert_ne!(
            span_status(span),
            StatusCode::Error,
            "{name}: no span is an error: {:#?}",
            describe(trace)
        );
    }
    trace
}

/// The gRPC status the span recorded, of the span named `rpc` of `kind` in `trace`.
fn grpc_codes(trace: &[Span], rpc: &str, kind: SpanKind) -> Vec<Option<i64>> {
    trace
        .iter()
        .filter(|span| span.name == rpc && span.kind() == kind)
        .map(|span| integer(&span.attributes, "rpc.grpc.status_code"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_calls_are_one_trace_each_and_are_counted_as_they_ended() {
    if !can_build() {
        return;
    }
    let collector = Collector::default();
    let serve = TracedServe::start(&collector).await;
    let (base, client) = (serve.base.clone(), serve.client.clone());

    let (status, created) = send(
        client
            .post(format!("{base}/v1/environments"))
            .json(&json!({"name": "Streamed"})),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().expect("id").to_owned();
    // Large enough to come from the source in many messages.
    let big: Vec<u8> = (0..3 * 1024 * 1024u32).map(|i| (i % 251) as u8).collect();
    let put = client
        .put(format!("{base}/v1/environments/{id}/files/big.bin"))
        .body(big.clone())
        .send()
        .await
        .expect("put");
    assert_eq!(put.status(), 200);

    // A followed build log, read to its end.
    let (status, queued) = send(
        client
            .post(format!("{base}/v1/environments/{id}/build"))
            .json(&json!({})),
    )
    .await;
    assert_eq!(status, 202, "{queued}");
    let log = client
        .get(format!(
            "{base}/v1/environments/{id}/builds/1/log?follow=true"
        ))
        .send()
        .await
        .expect("log");
    assert_eq!(log.status(), 200);
    log.text().await.expect("the log to its end");
    let (_, build) = send(client.get(format!("{base}/v1/environments/{id}/builds/1"))).await;
    assert_eq!(build["status"], "ready", "{build}");

    // A download of many messages.
    let download = client
        .get(format!("{base}/v1/environments/{id}/files/big.bin"))
        .send()
        .await
        .expect("download");
    assert_eq!(download.status(), 200);
    assert_eq!(
        download.bytes().await.expect("bytes").len(),
        big.len(),
        "the whole file"
    );

    let (status, session) = send(
        client
            .post(format!("{base}/v1/sessions"))
            .json(&json!({"environment": id})),
    )
    .await;
    assert_eq!(status, 201, "{session}");
    let session_id = session["id"].as_str().expect("session id").to_owned();

    // A streamed exec over REST, lasting a second.
    let exec = client
        .post(format!("{base}/v1/sessions/{session_id}/exec?stream=true"))
        .json(&json!({"command": "sleep 1; echo rest"}))
        .send()
        .await
        .expect("exec");
    assert_eq!(exec.status(), 200);
    let lines = exec.text().await.expect("the exec to its end");
    let last: Value =
        serde_json::from_str(lines.lines().last().expect("a result line")).expect("the result");
    assert_eq!(last["exit_code"], 0, "{lines}");

    // The same over the public gRPC face.
    let mut sessions = public::session_service_client::SessionServiceClient::connect(base.clone())
        .await
        .expect("gRPC connects");
    let mut events = sessions
        .exec(public::ExecRequest {
            session_id: session_id.clone(),
            command: "sleep 1; echo grpc".to_owned(),
            ..Default::default()
        })
        .await
        .expect("gRPC exec")
        .into_inner();
    let mut ended = None;
    while let Some(event) = events.message().await.expect("an event") {
        if let Some(public::exec_event::Event::Result(result)) = event.event {
            ended = Some(result.exit_code);
        }
    }
    assert_eq!(ended, Some(0));

    // A terminal whose shell exits.
    let mut socket = crate::terminal::open_socket_at(
        &base,
        "any",
        reqwest::Method::POST,
        &session_id,
        "pty=true",
    )
    .await
    .expect("a terminal");
    socket
        .send(tokio_tungstenite::tungstenite::Message::Binary(
            "exit 7\r".into(),
        ))
        .await
        .expect("typed");
    let (_, exit, closed) = crate::terminal::read_socket(&mut socket, |_| false).await;
    assert_eq!((exit, closed), (Some(7), true));

    // A client that leaves after the first line of a long command.
    let left = client
        .post(format!("{base}/v1/sessions/{session_id}/exec?stream=true"))
        .json(&json!({"command": "echo begun; sleep 60"}))
        .send()
        .await
        .expect("exec");
    assert_eq!(left.status(), 200);
    let mut chunks = left.bytes_stream();
    let first = chunks.next().await.expect("a first line").expect("bytes");
    assert!(String::from_utf8_lossy(&first).contains("begun"));
    drop(chunks);

    // Counted as they ended.
    let exec_series = |code: &str| {
        format!("plinth_grpc_server_requests_total{{rpc=\"/{NODE_EXEC}\",code=\"{code}\"}}")
    };
    let metrics = eventually(Duration::from_secs(30), async || {
        let metrics = client
            .get(format!("{base}/metrics"))
            .send()
            .await
            .expect("scrape")
            .text()
            .await
            .expect("metrics");
        match sample(&metrics, &exec_series("CANCELLED")) {
            Some(_) => Ok(metrics),
            None => Err(metrics),
        }
    })
    .await;
    let counted = |series: String| sample(&metrics, &series).unwrap_or(0.0);
    assert_eq!(counted(exec_series("OK")), 2.0, "{metrics}");
    assert_eq!(counted(exec_series("CANCELLED")), 1.0, "{metrics}");
    let read_series = |code: &str| {
        format!("plinth_grpc_server_requests_total{{rpc=\"/{SOURCE_READ}\",code=\"{code}\"}}")
    };
    assert!(counted(read_series("OK")) >= 1.0, "{metrics}");
    let pty = format!("plinth_grpc_server_requests_total{{rpc=\"/{NODE_PTY}\",code=\"OK\"}}");
    assert_eq!(counted(pty), 1.0, "the terminal's call ended OK: {metrics}");
    assert_eq!(counted(read_series("CANCELLED")), 0.0, "{metrics}");

    // One trace each.
    until(&collector, "the streamed calls' spans", |spans| {
        let node_execs = spans
            .iter()
            .filter(|(_, span)| span.name == NODE_EXEC && span.kind() == SpanKind::Server)
            .count();
        node_execs >= 3
            && spans
                .iter()
                .any(|(_, span)| span.name == "GET /v1/environments/{id}/files/{*path}")
            && spans
                .iter()
                .any(|(_, span)| span.name == "GET /v1/environments/{id}/builds/{version}/log")
    })
    .await;
    // Spans still being exported settle.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let spans = collector.spans();
    let traces = traces(&spans);

    let download = one_trace(&traces, "GET /v1/environments/{id}/files/{*path}");
    assert_eq!(
        grpc_codes(download, SOURCE_READ, SpanKind::Server),
        [Some(0)],
        "{:#?}",
        describe(download)
    );
    assert_eq!(
        grpc_codes(download, SOURCE_READ, SpanKind::Client),
        [Some(0)],
        "{:#?}",
        describe(download)
    );

    let followed = one_trace(&traces, "GET /v1/environments/{id}/builds/{version}/log");
    let polls = grpc_codes(followed, LOG_READ, SpanKind::Client);
    assert!(!polls.is_empty(), "{:#?}", describe(followed));
    assert!(polls.iter().all(|code| *code == Some(0)), "{polls:?}");
    let stray: Vec<Vec<String>> = traces
        .values()
        .filter(|trace| !std::ptr::eq(trace.as_slice(), followed))
        // A poll made outside its request starts a trace of its own.
        .filter(|trace| {
            trace
                .iter()
                .any(|span| span.name == LOG_READ && span.parent_span_id.is_empty())
        })
        .map(|trace| describe(trace))
        .collect();
    assert!(
        stray.is_empty(),
        "every poll of the followed log is in its trace ({:#?}); these are not: {stray:#?}",
        describe(followed)
    );

    // Each node exec in a trace of its own call, whole: the REST ones under their request,
    // lasting as long as the command.
    let execs: Vec<&Vec<Span>> = traces
        .values()
        .filter(|trace| {
            trace
                .iter()
                .any(|span| span.name == NODE_EXEC && span.kind() == SpanKind::Server)
        })
        .collect();
    assert_eq!(execs.len(), 3, "three execs, three traces");
    let mut ok = 0;
    for trace in execs {
        let roots: Vec<&Span> = trace
            .iter()
            .filter(|span| span.parent_span_id.is_empty())
            .collect();
        assert_eq!(roots.len(), 1, "{:#?}", describe(trace));
        let codes = grpc_codes(trace, NODE_EXEC, SpanKind::Server);
        if codes == [Some(0)] {
            ok += 1;
            assert!(
                seconds(roots[0]) >= 1.0,
                "the request's span covers the command: {:#?}",
                describe(trace)
            );
            assert_eq!(
                grpc_codes(trace, NODE_EXEC, SpanKind::Client),
                [Some(0)],
                "{:#?}",
                describe(trace)
            );
            for span in trace {
                assert_ne!(
                    span_status(span),
                    StatusCode::Error,
                    "{:#?}",
                    describe(trace)
                );
            }
        } else {
            assert_eq!(
                codes,
                [Some(1)],
                "the one left: CANCELLED {:#?}",
                describe(trace)
            );
        }
    }
    assert_eq!(ok, 2);
    drop(serve);
}
