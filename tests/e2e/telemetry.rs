//! What an operator sees: metrics whose labels no caller can grow, streams timed to their end,
//! every metric the metrics table (`docs/operating/telemetry.md`) names, and traces in OpenTelemetry's conventions received
//! by an OTLP collector (over gRPC and over HTTP) from real processes.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{KeyValue, any_value};
use opentelemetry_proto::tonic::trace::v1::Span;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use opentelemetry_proto::tonic::trace::v1::status::StatusCode;
use prost::Message as _;
use serde_json::json;

use crate::credentials::Credentials;
use crate::helpers::{Server, build_ready, put_file, send};
use crate::processes::Process;
use crate::waiting::eventually;

/// The whole `/metrics` text of the in-process server.
async fn scrape(server: &Server) -> String {
    let response = server
        .client
        .get(server.url("/metrics"))
        .send()
        .await
        .expect("scrape");
    assert_eq!(response.status(), 200);
    response.text().await.expect("metrics text")
}

/// The value of the one sample `series` (name and labels, exactly as rendered).
pub(crate) fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics.lines().find_map(|line| {
        let value = line.strip_prefix(series)?.strip_prefix(' ')?;
        value.trim().parse().ok()
    })
}

#[tokio::test]
async fn junk_rpc_paths_and_invented_http_methods_add_no_series() {
    let server = Server::start().await;

    for n in 0..25 {
        let method = reqwest::Method::from_bytes(format!("JUNK{n}").as_bytes()).expect("method");
        let response = server
            .client
            .request(method, server.url("/v1/environments"))
            .send()
            .await
            .expect("request");
        assert_eq!(response.status(), 405);
    }
    let channel =
        tonic::transport::Endpoint::from_shared(format!("http://{}", server.catalog_addr()))
            .expect("endpoint")
            .connect()
            .await
            .expect("catalog");
    for n in 0..25 {
        let mut grpc = tonic::client::Grpc::new(channel.clone());
        grpc.ready().await.expect("ready");
        let path =
            http::uri::PathAndQuery::try_from(format!("/junk{n}.Service/Call{n}")).expect("path");
        let answer = grpc
            .unary::<(), (), _>(
                tonic::Request::new(()),
                path,
                tonic_prost::ProstCodec::default(),
            )
            .await;
        let code = answer.expect_err("nobody serves it").code();
        assert_eq!(code, tonic::Code::Unauthenticated, "refused before routing");
    }

    let after = scrape(&server).await;
    assert!(
        !after.contains("junk") && !after.contains("JUNK"),
        "{after}"
    );
    assert!(
        sample(
            &after,
            "plinth_grpc_server_requests_total{rpc=\"other\",code=\"UNAUTHENTICATED\"}"
        ) >= Some(25.0),
        "refused calls are counted, under `other`: {after}"
    );
    assert!(
        sample(
            &after,
            "plinth_http_requests_total{route=\"/v1/environments\",method=\"other\",status=\"405\"}"
        ) == Some(25.0),
        "{after}"
    );
    // Twenty-five invented methods and twenty-five junk paths made one series each.
    let series = |name: &str, label: &str| {
        after
            .lines()
            .filter(|line| line.starts_with(&format!("{name}{{")) && line.contains(label))
            .count()
    };
    assert_eq!(
        series("plinth_http_requests_total", "method=\"other\""),
        1,
        "{after}"
    );
    assert_eq!(
        series("plinth_grpc_server_requests_total", "rpc=\"other\""),
        1,
        "{after}"
    );

    // The admin routes say what they answer instead of an empty 405.
    let response = server
        .client
        .post(server.url("/metrics"))
        .send()
        .await
        .expect("post");
    assert_eq!(response.status(), 405);
    assert_eq!(response.headers()["allow"], "GET, HEAD");
    server.stop().await;
}

#[tokio::test]
async fn every_metric_the_docs_name_is_exported_and_a_streamed_exec_is_timed_to_its_end() {
    if !crate::helpers::can_build() {
        return;
    }
    let server =
        Server::start_with(&["--builder-network", "false", "--gc-interval-seconds", "1"]).await;
    let id = crate::helpers::create_environment(&server, "Observed").await;
    put_file(&server, &id, "hello.txt", "hello\n").await;
    build_ready(&server, &id, 1, Duration::from_secs(120)).await;
    let session = crate::helpers::start_session_with(&server, json!({"environment": id})).await;
    let session_id = session["id"].as_str().expect("session id").to_owned();

    // A streamed exec whose headers come at once and whose body lasts three seconds.
    let started = std::time::Instant::now();
    let response = server
        .client
        .post(server.url(&format!("/v1/sessions/{session_id}/exec?stream=true")))
        .json(&json!({"command": "echo start; sleep 3; echo end"}))
        .send()
        .await
        .expect("exec");
    assert_eq!(response.status(), 200);
    let headers_after = started.elapsed();
    let body = response.text().await.expect("body");
    assert!(body.contains("end"), "{body}");
    assert!(
        headers_after < Duration::from_secs(2),
        "the answer streams: headers came after {headers_after:?}"
    );

    // Collection runs every second; the node's gauges come with its heartbeats.
    let metrics = eventually(Duration::from_secs(20), async || {
        let metrics = scrape(&server).await;
        if metrics.contains("plinth_blob_store_bytes")
            && metrics.contains("plinth_node_disk_free_bytes")
        {
            Ok(metrics)
        } else {
            Err(metrics)
        }
    })
    .await;

    let exec = "route=\"/v1/sessions/{id}/exec\",method=\"POST\",status=\"200\"";
    let sum = sample(
        &metrics,
        &format!("plinth_http_request_duration_seconds_sum{{{exec}}}"),
    );
    let count = sample(
        &metrics,
        &format!("plinth_http_request_duration_seconds_count{{{exec}}}"),
    );
    assert_eq!(count, Some(1.0), "{metrics}");
    assert!(
        sum >= Some(3.0),
        "timed to the stream's end, not its headers: {sum:?}"
    );

    let exported: BTreeSet<&str> = metrics
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| line.split(['{', ' ']).next())
        .collect();
    let mut missing = Vec::new();
    for (name, kind) in crate::operators_kit::metrics_table() {
        let present = if kind == crate::operators_kit::Kind::Histogram {
            exported.contains(format!("{name}_bucket").as_str())
                && exported.contains(format!("{name}_count").as_str())
        } else {
            exported.contains(name.as_str())
        };
        if !present {
            missing.push(name);
        }
    }
    assert!(
        missing.is_empty(),
        "named in docs/operating/telemetry.md but not exported: {missing:?}\n{metrics}"
    );
    server.stop().await;
}

/// Every `plinth_` series the dashboards and alert rules query, by the names a scrape shows.
fn queried_series() -> BTreeSet<String> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut texts = Vec::new();
    for dir in ["deploy/grafana", "deploy/prometheus"] {
        let dir = root.join(dir);
        for entry in std::fs::read_dir(&dir).expect("listing the operators' kit") {
            let path = entry.expect("an entry").path();
            texts.push(std::fs::read_to_string(&path).expect("reading the operators' kit"));
        }
    }
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    texts
        .iter()
        .flat_map(|text| text.split(|c: char| !word(c)))
        .filter(|token| token.starts_with("plinth_") && token.len() > "plinth_".len())
        .map(str::to_owned)
        .collect()
}

#[tokio::test]
async fn every_series_the_dashboards_and_alerts_query_exists_from_the_start() {
    // Nothing has happened yet: no build, no session, no collection pass (the first is an
    // hour away), yet every panel and rule has a series to show, at zero.
    let server = Server::start().await;
    let metrics = scrape(&server).await;
    let exported: BTreeSet<&str> = metrics
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| line.split(['{', ' ']).next())
        .collect();
    let missing: Vec<String> = queried_series()
        .into_iter()
        .filter(|name| !exported.contains(name.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "queried by a dashboard or alert but not exported at start: {missing:?}\n{metrics}"
    );
    // Each with its HELP text.
    let described: BTreeSet<&str> = metrics
        .lines()
        .filter_map(|line| line.strip_prefix("# HELP "))
        .filter(|help| {
            help.split_once(' ')
                .is_some_and(|(_, text)| !text.trim().is_empty())
        })
        .filter_map(|help| help.split(' ').next())
        .collect();
    let undescribed: Vec<&str> = metrics
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|kind| kind.split(' ').next())
        .filter(|name| name.starts_with("plinth_") && !described.contains(name))
        .collect();
    assert!(undescribed.is_empty(), "no HELP text: {undescribed:?}");
    server.stop().await;
}

/// Spans received, with the `service.name` of the process that sent them.
#[derive(Clone, Default)]
pub(crate) struct Collector(Arc<Mutex<Vec<(String, Span)>>>);

impl Collector {
    fn take(&self, request: ExportTraceServiceRequest) {
        let mut spans = self.0.lock().expect("collector");
        for resource_spans in request.resource_spans {
            let service = resource_spans
                .resource
                .as_ref()
                .and_then(|resource| text(&resource.attributes, "service.name"))
                .unwrap_or_default();
            for scope in resource_spans.scope_spans {
                for span in scope.spans {
                    spans.push((service.clone(), span));
                }
            }
        }
    }

    pub(crate) fn spans(&self) -> Vec<(String, Span)> {
        self.0.lock().expect("collector").clone()
    }

    /// An OTLP/gRPC collector on loopback.
    async fn serve_grpc(&self) -> SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let address = listener.local_addr().expect("address");
        let service = TraceServiceServer::new(self.clone());
        plinth_kit::tasks::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener))
                .await
        });
        address
    }

    /// An OTLP/HTTP (protobuf) collector on loopback.
    pub(crate) async fn serve_http(&self) -> SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let address = listener.local_addr().expect("address");
        let collector = self.clone();
        let app = axum::Router::new().route(
            "/v1/traces",
            axum::routing::post(move |body: bytes::Bytes| {
                let collector = collector.clone();
                async move {
                    match ExportTraceServiceRequest::decode(body) {
                        Ok(request) => {
                            collector.take(request);
                            let answer = ExportTraceServiceResponse {
                                partial_success: None,
                            };
                            (
                                http::StatusCode::OK,
                                [("content-type", "application/x-protobuf")],
                                answer.encode_to_vec(),
                            )
                        }
                        Err(_) => (
                            http::StatusCode::BAD_REQUEST,
                            [("content-type", "text/plain")],
                            b"not an ExportTraceServiceRequest".to_vec(),
                        ),
                    }
                }
            }),
        );
        plinth_kit::tasks::spawn(async move { axum::serve(listener, app).await });
        address
    }
}

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        self.take(request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

fn attribute<'a>(attributes: &'a [KeyValue], key: &str) -> Option<&'a any_value::Value> {
    attributes
        .iter()
        .find(|attribute| attribute.key == key)?
        .value
        .as_ref()?
        .value
        .as_ref()
}

pub(crate) fn text(attributes: &[KeyValue], key: &str) -> Option<String> {
    match attribute(attributes, key)? {
        any_value::Value::StringValue(value) => Some(value.clone()),
        _ => None,
    }
}

pub(crate) fn integer(attributes: &[KeyValue], key: &str) -> Option<i64> {
    match attribute(attributes, key)? {
        any_value::Value::IntValue(value) => Some(*value),
        _ => None,
    }
}

pub(crate) fn span_status(span: &Span) -> StatusCode {
    span.status
        .as_ref()
        .map(|status| status.code())
        .unwrap_or(StatusCode::Unset)
}

/// `plinth <role>` exporting spans as `otel` says.
/// `plinth` with `args` (on port 0) exporting to `otel`, once ready at `probe`'s address:
/// it, and where it listens.
async fn plinth(
    args: &[&str],
    credentials: &Credentials,
    otel: &[(&str, String)],
    probe: &str,
) -> (Process, crate::cluster::Bound) {
    let mut command = crate::processes::plinth_command(args, credentials);
    exporting(&mut command, otel);
    crate::cluster::spawn_ready(&mut command, probe).await
}

/// Sets `command`'s OpenTelemetry variables to `otel` alone (none of the test's own), with a
/// 100 ms batch delay so spans arrive quickly.
pub(crate) fn exporting(command: &mut Command, otel: &[(&str, String)]) {
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("OTEL_") {
            command.env_remove(name);
        }
    }
    command.env("OTEL_BSP_SCHEDULE_DELAY", "100");
    for (name, value) in otel {
        command.env(name, value);
    }
}

/// Waits until `done` holds of the spans received, or fails with what came.
pub(crate) async fn until(
    collector: &Collector,
    what: &str,
    done: impl Fn(&[(String, Span)]) -> bool,
) {
    eventually(Duration::from_secs(20), async || {
        let spans = collector.spans();
        if done(&spans) {
            return Ok(());
        }
        let seen: Vec<_> = spans
            .iter()
            .map(|(service, span)| format!("{service}: {} ({:?})", span.name, span.kind()))
            .collect();
        Err(format!("{what}; received {seen:#?}"))
    })
    .await;
}

#[tokio::test]
async fn split_services_export_server_and_client_spans_over_grpc_and_http() {
    let over_grpc = Collector::default();
    let over_http = Collector::default();
    let grpc_collector = over_grpc.serve_grpc().await;
    let http_collector = over_http.serve_http().await;

    let credentials = Credentials::new();
    let data = tempfile::tempdir().expect("data dir");
    let dir = |name: &str| data.path().join(name).to_str().expect("utf-8").to_owned();

    // The catalog over gRPC with a name of the operator's; the gateway over HTTP (the default
    // protocol) with only the traces endpoint set, under its own name.
    let (services, [catalog, _, gateway]) = crate::cluster::start_trio(async |mut args, probe| {
        let otel = match args[0].as_str() {
            "catalog" => vec![
                (
                    "OTEL_EXPORTER_OTLP_ENDPOINT",
                    format!("http://{grpc_collector}"),
                ),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc".to_owned()),
                ("OTEL_SERVICE_NAME", "catalog-of-the-test".to_owned()),
            ],
            "gateway" => vec![(
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                format!("http://{http_collector}/v1/traces"),
            )],
            _ => Vec::new(),
        };
        if args[0] != "gateway" {
            let data_dir = dir(&args[0]);
            args.extend(["--standalone".to_owned(), "--data-dir".to_owned(), data_dir]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        plinth(&args, &credentials, &otel, probe).await
    })
    .await;
    let http = gateway["listen"];
    let client = crate::helpers::http_client();

    let base = format!("http://{http}");
    let trace = "0af7651916cd43dd8448eb211c80319c";
    let (status, created) = send(
        client
            .post(format!("{base}/v1/environments"))
            .header("traceparent", format!("00-{trace}-b7ad6b7169203331-01"))
            .json(&json!({"name": "Traced Across Processes"})),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    let (status, missing) = send(client.get(format!(
        "{base}/v1/environments/henv_00000000000000000000000000000000"
    )))
    .await;
    assert_eq!(status, 404, "{missing}");

    let create = "plinth.catalog.v1.CatalogService/CreateEnvironment";
    let get = "plinth.catalog.v1.CatalogService/GetEnvironment";
    until(
        &over_grpc,
        "the catalog's server spans over gRPC",
        |spans| {
            [create, get].iter().all(|name| {
                spans
                    .iter()
                    .any(|(_, span)| span.name == *name && span.kind() == SpanKind::Server)
            })
        },
    )
    .await;
    until(
        &over_http,
        "the gateway's server and client spans over HTTP",
        |spans| {
            spans
                .iter()
                .any(|(_, span)| span.name == "POST /v1/environments")
                && [create, get].iter().all(|name| {
                    spans
                        .iter()
                        .any(|(_, span)| span.name == *name && span.kind() == SpanKind::Client)
                })
        },
    )
    .await;
    let catalog_spans = over_grpc.spans();
    let gateway_spans = over_http.spans();
    let find = |spans: &[(String, Span)], name: &str, kind: SpanKind| -> (String, Span) {
        spans
            .iter()
            .find(|(_, span)| span.name == name && span.kind() == kind)
            .cloned()
            .unwrap_or_else(|| panic!("no {kind:?} span {name}"))
    };

    // The gateway's server span: HTTP conventions, in the caller's trace, under its own name.
    let (service, server_span) = find(&gateway_spans, "POST /v1/environments", SpanKind::Server);
    assert_eq!(service, "plinth-gateway");
    assert_eq!(hex(&server_span.trace_id), trace);
    assert_eq!(
        text(&server_span.attributes, "http.request.method").as_deref(),
        Some("POST")
    );
    assert_eq!(
        text(&server_span.attributes, "http.route").as_deref(),
        Some("/v1/environments")
    );
    assert_eq!(
        integer(&server_span.attributes, "http.response.status_code"),
        Some(201)
    );
    assert_eq!(span_status(&server_span), StatusCode::Unset);
    assert_eq!(
        text(&server_span.attributes, "url.scheme").as_deref(),
        Some("http")
    );
    assert_eq!(
        text(&server_span.attributes, "server.address").as_deref(),
        Some("127.0.0.1")
    );
    assert_eq!(
        integer(&server_span.attributes, "server.port"),
        Some(i64::from(http.port())),
        "{:?}",
        server_span.attributes
    );

    // Its client span and the catalog's server span: one call, seen from both ends.
    let (_, client_span) = find(&gateway_spans, create, SpanKind::Client);
    assert_eq!(
        text(&client_span.attributes, "server.address").as_deref(),
        Some("127.0.0.1"),
        "the client span names the replica it called"
    );
    assert_eq!(
        integer(&client_span.attributes, "server.port"),
        Some(i64::from(catalog["listen"].port()))
    );
    let (service, catalog_span) = find(&catalog_spans, create, SpanKind::Server);
    assert_eq!(
        service, "catalog-of-the-test",
        "OTEL_SERVICE_NAME names the service"
    );
    assert_eq!(hex(&client_span.trace_id), trace);
    assert_eq!(catalog_span.parent_span_id, client_span.span_id);
    for span in [&client_span, &catalog_span] {
        assert_eq!(
            text(&span.attributes, "rpc.system").as_deref(),
            Some("grpc")
        );
        assert_eq!(
            text(&span.attributes, "rpc.service").as_deref(),
            Some("plinth.catalog.v1.CatalogService")
        );
        assert_eq!(
            text(&span.attributes, "rpc.method").as_deref(),
            Some("CreateEnvironment")
        );
        assert_eq!(integer(&span.attributes, "rpc.grpc.status_code"), Some(0));
        assert_eq!(span_status(span), StatusCode::Unset);
    }

    // A NotFound is the client's failure, and no fault of the server's.
    let (_, failed_client) = find(&gateway_spans, get, SpanKind::Client);
    let (_, failed_server) = find(&catalog_spans, get, SpanKind::Server);
    assert_eq!(
        integer(&failed_client.attributes, "rpc.grpc.status_code"),
        Some(5)
    );
    assert_eq!(span_status(&failed_client), StatusCode::Error);
    assert_eq!(
        text(&failed_client.attributes, "error.type").as_deref(),
        Some("NOT_FOUND")
    );
    assert_eq!(
        integer(&failed_server.attributes, "rpc.grpc.status_code"),
        Some(5)
    );
    assert_eq!(span_status(&failed_server), StatusCode::Unset);
    let (_, not_found) = find(
        &gateway_spans,
        "GET /v1/environments/{id}",
        SpanKind::Server,
    );
    assert_eq!(
        integer(&not_found.attributes, "http.response.status_code"),
        Some(404)
    );
    assert_eq!(
        text(&not_found.attributes, "error.type"),
        None,
        "a 4xx is not the server's error"
    );
    drop(services);
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// A `plinth serve` process exporting its spans to `collector` over OTLP/HTTP, ready.
pub(crate) struct TracedServe {
    pub(crate) base: String,
    pub(crate) client: reqwest::Client,
    _serve: Process,
    _data: tempfile::TempDir,
}

impl TracedServe {
    pub(crate) async fn start(collector: &Collector) -> Self {
        let endpoint = collector.serve_http().await;
        let data = tempfile::tempdir().expect("data dir");
        let mut command = crate::walkthrough::serve_command("127.0.0.1:0", data.path());
        exporting(
            &mut command,
            &[("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://{endpoint}"))],
        );
        let (serve, address) = crate::cluster::spawn_serve(&mut command).await;
        let client = crate::helpers::http_client();
        let base = format!("http://{address}");
        TracedServe {
            base,
            client,
            _serve: serve,
            _data: data,
        }
    }
}

#[tokio::test]
async fn an_idle_serve_exports_no_spans() {
    let collector = Collector::default();
    let TracedServe {
        base,
        client,
        _serve,
        _data,
    } = TracedServe::start(&collector).await;
    // Whatever starting up traced has been sent once no span came for 3 s (a busy host may
    // take a while over the node's registration and the first export). A serve that traces
    // something every few seconds never gets there.
    let settling = std::time::Instant::now();
    let (mut at_rest, mut quiet_since) = (collector.spans().len(), std::time::Instant::now());
    while quiet_since.elapsed() < Duration::from_secs(3) {
        let spans = collector.spans();
        assert!(
            settling.elapsed() < Duration::from_secs(60),
            "spans kept coming a minute after the serve was ready: {:?}",
            spans[at_rest..]
                .iter()
                .map(|(_, span)| span.name.clone())
                .collect::<Vec<_>>()
        );
        if spans.len() != at_rest {
            (at_rest, quiet_since) = (spans.len(), std::time::Instant::now());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    // Idle, but probed and scraped every second, as a kubelet and a Prometheus would: over
    // HTTP, and the public port's gRPC health check.
    let mut health = tonic_health::pb::health_client::HealthClient::new(
        tonic::transport::Endpoint::from_shared(base.clone())
            .expect("endpoint")
            .connect_lazy(),
    );
    for _ in 0..30 {
        for path in ["/healthz", "/readyz", "/metrics"] {
            let response = client
                .get(format!("{base}{path}"))
                .send()
                .await
                .expect("probe");
            assert_eq!(response.status(), 200, "{path}");
        }
        health
            .check(tonic_health::pb::HealthCheckRequest::default())
            .await
            .expect("a gRPC health check");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let idle: Vec<String> = collector.spans()[at_rest..]
        .iter()
        .map(|(_, span)| span.name.clone())
        .collect();
    assert!(
        idle.is_empty(),
        "an idle serve exported {} spans: {idle:?}",
        idle.len()
    );

    // The same process does export what it is asked to do.
    let response = client
        .get(format!("{base}/v1/environments"))
        .send()
        .await
        .expect("list");
    assert_eq!(response.status(), 200);
    until(&collector, "a request's spans", |spans| {
        spans
            .iter()
            .any(|(_, span)| span.name == "GET /v1/environments")
    })
    .await;
}

#[tokio::test]
async fn serve_answers_on_the_catalogs_and_the_source_services_admin_addresses() {
    let server = Server::start_with_config(
        "[catalog]\nadmin_listen = \"127.0.0.1:0\"\n\n[source]\nadmin_listen = \"127.0.0.1:0\"\n",
        &[],
    )
    .await;
    let (catalog_admin, source_admin) = (
        server.bound("catalog_admin_listen"),
        server.bound("source_admin_listen"),
    );
    for address in [catalog_admin, source_admin] {
        let health = server
            .client
            .get(format!("http://{address}/healthz"))
            .send()
            .await
            .unwrap_or_else(|error| panic!("{address} is not served: {error}"));
        assert_eq!(health.status(), 200);
        // Metrics there need a credential the services accept, as on a split deployment.
        let metrics = server
            .client
            .get(format!("http://{address}/metrics"))
            .send()
            .await
            .expect("metrics");
        assert_eq!(metrics.status(), 401);
    }
    server.stop().await;
}
