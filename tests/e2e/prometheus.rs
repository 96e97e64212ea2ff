//! A real Prometheus server (`PLINTH_TEST_PROMETHEUS`, else `prometheus` on the path; CI
//! unpacks Debian's package) scraping, every second, a `plinth serve` on all three of its
//! metrics addresses (the gateway's, and the catalog's and source service's admin ports, with
//! an `observer` credential) and split `plinth catalog`, `plinth source` and `plinth gateway`
//! processes, with the shipped alert rules loaded. After a little traffic, every expression of
//! the shipped dashboards and alert rules is evaluated through Prometheus' HTTP API: none may
//! fail, every metric they name must have series, every dashboard query must answer something
//! (a ratio with nothing to divide answers 0, not "No data"), and no process may export a
//! series twice. Every Plinth metric has HELP text, `code` labels spell statuses as gRPC
//! does, and public gRPC calls (health included) are counted under their own status.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::StreamExt as _;
use plinth_kit::auth::Role;
use plinth_proto::public::v1::environment_service_client::EnvironmentServiceClient;
use plinth_proto::public::v1::file_service_client::FileServiceClient;
use plinth_proto::public::v1::{GetEnvironmentRequest, WriteFileRequest};
use serde_json::{Value, json};

use crate::credentials::Credentials;
use crate::helpers::send;
use crate::processes::{Process, wait_until_ready};

/// How often Prometheus scrapes and evaluates, and the window `$__rate_interval` becomes.
const SCRAPE_INTERVAL: &str = "1s";
const RATE_INTERVAL: &str = "15s";

/// The Prometheus server binary, or `None` (a failure under CI) when there is none.
fn prometheus_binary() -> Option<PathBuf> {
    crate::helpers::tool(
        "PLINTH_TEST_PROMETHEUS",
        "prometheus",
        "`apt-get download prometheus && dpkg-deb -x prometheus_*.deb root` unpacks it as \
         root/usr/bin/prometheus",
    )
}

/// One scrape job: its name, the process it reads (a `process` label Prometheus adds), and
/// its address.
struct Job {
    name: &'static str,
    process: &'static str,
    target: SocketAddr,
}

/// Prometheus' configuration: every job scraped each second with `token`, the alert rules
/// loaded.
fn prometheus_config(jobs: &[Job], token: &str, rules: &Path) -> String {
    let mut config = format!(
        "global:\n  scrape_interval: {SCRAPE_INTERVAL}\n  scrape_timeout: {SCRAPE_INTERVAL}\n  \
         evaluation_interval: {SCRAPE_INTERVAL}\nrule_files:\n  - {}\nscrape_configs:\n",
        rules.display()
    );
    for job in jobs {
        config.push_str(&format!(
            "  - job_name: {}\n    authorization:\n      credentials: {token}\n    \
             static_configs:\n      - targets: [\"{}\"]\n        labels:\n          process: {}\n",
            job.name, job.target, job.process
        ));
    }
    config
}

/// Prometheus' HTTP API at `base`.
struct Api {
    client: reqwest::Client,
    base: String,
}

impl Api {
    /// `GET /api/v1/<path>` with `query`: the answer's `data`, or what Prometheus said went
    /// wrong.
    async fn get(&self, path: &str, query: &[(&str, &str)]) -> Result<Value, String> {
        let url = reqwest::Url::parse_with_params(&format!("{}/api/v1/{path}", self.base), query)
            .map_err(|error| format!("no URL for {path}: {error}"))?;
        let response = self
            .client
            .get(url)
            .send()
            .await
            .map_err(|error| format!("Prometheus did not answer: {error}"))?;
        let body: Value = response
            .json()
            .await
            .map_err(|error| format!("Prometheus answered no JSON: {error}"))?;
        if body["status"] == "success" {
            Ok(body["data"].clone())
        } else {
            Err(format!("{}: {}", body["errorType"], body["error"]))
        }
    }

    /// An instant query's samples (`data.result`), or Prometheus' error.
    async fn query(&self, expr: &str) -> Result<Vec<Value>, String> {
        let data = self.get("query", &[("query", expr)]).await?;
        Ok(match (data["resultType"].as_str(), &data["result"]) {
            (Some("vector" | "matrix"), Value::Array(samples)) => samples.clone(),
            // A scalar or a string: one sample of that value.
            (_, Value::Null) => Vec::new(),
            (_, other) => vec![json!({ "value": other })],
        })
    }

    /// Polls `expr` until it answers at least one sample, bounded by a minute.
    async fn until_some(&self, expr: &str) -> Vec<Value> {
        crate::waiting::eventually(Duration::from_secs(60), async || {
            match self.query(expr).await {
                Ok(samples) if !samples.is_empty() => Ok(samples),
                last => Err(format!("{expr} answered no sample: {last:?}")),
            }
        })
        .await
    }
}

/// The value of an instant query's one sample.
fn value(sample: &Value) -> f64 {
    sample["value"][1]
        .as_str()
        .and_then(|value| value.parse().ok())
        .unwrap_or(f64::NAN)
}

/// Every query of the shipped dashboards (panels' targets and variables'), `$job` and
/// `$instance` meaning all and `$__rate_interval` the test's, with where each comes from.
fn dashboard_queries(root: &Path) -> Vec<(String, String)> {
    raw_dashboard_queries(root)
        .into_iter()
        .map(|(place, expr)| (place, for_job(&expr, ".*")))
        .collect()
}

/// The same queries as the dashboards hold them, Grafana's variables in place.
fn raw_dashboard_queries(root: &Path) -> Vec<(String, String)> {
    fn panels(file: &str, panel: &Value, out: &mut Vec<(String, String)>) {
        for target in panel["targets"].as_array().into_iter().flatten() {
            if let Some(expr) = target["expr"].as_str() {
                let title = panel["title"].as_str().unwrap_or("untitled");
                out.push((format!("{file}: {title}"), expr.to_owned()));
            }
        }
        for inner in panel["panels"].as_array().into_iter().flatten() {
            panels(file, inner, out);
        }
    }
    let mut out = Vec::new();
    let dir = root.join("deploy/grafana");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("deploy/grafana")
        .map(|entry| entry.expect("an entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "json"))
        .collect();
    files.sort();
    for path in files {
        let file = path
            .file_name()
            .expect("a name")
            .to_string_lossy()
            .into_owned();
        let dashboard: Value =
            serde_json::from_str(&std::fs::read_to_string(&path).expect("a dashboard"))
                .expect("dashboard JSON");
        for panel in dashboard["panels"].as_array().into_iter().flatten() {
            panels(&file, panel, &mut out);
        }
        for variable in dashboard["templating"]["list"]
            .as_array()
            .into_iter()
            .flatten()
        {
            // `label_values(metric{…}, label)`: the series it lists from.
            let query = variable["query"]["query"]
                .as_str()
                .or_else(|| variable["query"].as_str())
                .unwrap_or("");
            if let Some(inner) = query
                .strip_prefix("label_values(")
                .and_then(|rest| rest.rsplit_once(','))
                .map(|(series, _)| series.trim())
            {
                let name = variable["name"].as_str().unwrap_or("?");
                out.push((format!("{file}: variable {name}"), inner.to_owned()));
            }
        }
    }
    out
}

/// A dashboard query as Grafana sends it with `$job` set to `job` (a regular expression),
/// every instance, and the test's `$__rate_interval`.
fn for_job(expr: &str, job: &str) -> String {
    expr.replace("$__rate_interval", RATE_INTERVAL)
        .replace("$job", job)
        .replace("$instance", ".*")
}

/// The divisor of the outermost division in `expr`, if it has one: what a ratio panel
/// divides by.
fn divisor(expr: &str) -> Option<&str> {
    let bytes = expr.as_bytes();
    let (mut depth, mut best): (usize, Option<(usize, usize)>) = (0, None);
    for (at, byte) in bytes.iter().enumerate() {
        match byte {
            b'(' | b'{' | b'[' => depth += 1,
            b')' | b'}' | b']' => depth = depth.saturating_sub(1),
            b'/' if expr[..at].ends_with(' ')
                && expr[at + 1..].starts_with(' ')
                && best.is_none_or(|(shallowest, _)| depth < shallowest) =>
            {
                best = Some((depth, at));
            }
            _ => {}
        }
    }
    let (level, at) = best?;
    let rest = &expr[at + 2..];
    let mut depth = level;
    for (offset, byte) in rest.bytes().enumerate() {
        match byte {
            b'(' | b'{' | b'[' => depth += 1,
            b')' | b'}' | b']' => {
                if depth == level {
                    return Some(rest[..offset].trim());
                }
                depth -= 1;
            }
            _ => {}
        }
    }
    Some(rest.trim())
}

/// Every alert rule's expression, by alert name.
fn alert_queries(root: &Path) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(root.join("deploy/prometheus/alerts.yml")).expect("rules");
    let rules: serde_yaml::Value = serde_yaml::from_str(&text).expect("rules YAML");
    let mut out = Vec::new();
    for group in rules["groups"].as_sequence().into_iter().flatten() {
        for rule in group["rules"].as_sequence().into_iter().flatten() {
            let name = rule["alert"].as_str().unwrap_or("?");
            let expr = rule["expr"].as_str().expect("a rule's expr");
            out.push((format!("alerts.yml: {name}"), expr.to_owned()));
        }
    }
    out
}

/// The metric names `expr` reads: Plinth's own, the process figures, and `up`.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    let mut names = BTreeSet::new();
    let mut rest = expr;
    while !rest.is_empty() {
        // Quoted strings hold label values and regular expressions, never metric names.
        if let Some(after) = rest.strip_prefix('"') {
            rest = after.split_once('"').map_or("", |(_, after)| after);
            continue;
        }
        let end = rest.find(|c: char| !word(c)).unwrap_or(rest.len());
        if end == 0 {
            rest = &rest[rest.chars().next().map_or(1, char::len_utf8)..];
            continue;
        }
        let token = &rest[..end];
        if token.starts_with("plinth_") || token.starts_with("process_") || token == "up" {
            names.insert(token.to_owned());
        }
        rest = &rest[end..];
    }
    names
}

/// `plinth <role>` started alone on port 0, given `credentials`, once ready at `probe`'s
/// address: it, and where it listens.
async fn plinth(
    args: &[&str],
    credentials: &Credentials,
    probe: &str,
) -> (Process, crate::cluster::Bound) {
    crate::cluster::spawn_ready(
        &mut crate::processes::plinth_command(args, credentials),
        probe,
    )
    .await
}

/// A little of everything on the gateway at `base`: an environment made (its id answered), a
/// file written, a call refused.
async fn traffic(client: &reqwest::Client, base: &str) -> String {
    let id = crate::helpers::create_environment_at(client, base, "Scraped").await;
    let (status, written) = send(
        client
            .put(format!("{base}/v1/environments/{id}/files/hello.txt"))
            .body("hello\n"),
    )
    .await;
    assert_eq!(status, 200, "{written}");
    let (status, missing) = send(client.get(format!(
        "{base}/v1/environments/henv_00000000000000000000000000000000"
    )))
    .await;
    assert_eq!(status, 404, "{missing}");
    id
}

#[tokio::test]
async fn a_real_prometheus_finds_every_series_the_dashboards_and_alerts_read_exported_once() {
    let Some(prometheus_bin) = prometheus_binary() else {
        return;
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let credentials = Credentials::new();
    let client = crate::helpers::http_client();
    let data = tempfile::tempdir().expect("data dir");
    let dir = |name: &str| data.path().join(name).to_str().expect("utf-8").to_owned();

    // `plinth serve`, one process, with the catalog's and the source service's admin ports.
    let config = data.path().join("serve.toml");
    std::fs::write(
        &config,
        format!(
            "[internal]\naccept_file = \"{}\"\n\n[catalog]\nadmin_listen = \"127.0.0.1:0\"\n\n\
             [source]\nadmin_listen = \"127.0.0.1:0\"\n",
            credentials.accept_file().display()
        ),
    )
    .expect("serve config");
    std::fs::create_dir_all(dir("serve")).expect("serve data dir");
    let mut command = crate::walkthrough::serve_command("127.0.0.1:0", Path::new(&dir("serve")));
    command.arg("--config").arg(&config);
    let (_serve, serve) = crate::cluster::spawn_ready(&mut command, "listen").await;
    let (serve_http, serve_catalog_admin, serve_source_admin) = (
        serve["listen"],
        serve["catalog_admin_listen"],
        serve["source_admin_listen"],
    );

    // The same services split into processes of their own.
    let (_services, [catalog, source, gateway]) =
        crate::cluster::start_trio(async |mut args, probe| {
            if args[0] != "gateway" {
                let data_dir = dir(&args[0]);
                args.extend(["--standalone".to_owned(), "--data-dir".to_owned(), data_dir]);
            }
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            plinth(&args, &credentials, probe).await
        })
        .await;
    let catalog_admin = catalog["admin_listen"];
    let source_admin = source["admin_listen"];
    let gateway_http = gateway["listen"];

    let jobs = [
        Job {
            name: "plinth-serve",
            process: "serve",
            target: serve_http,
        },
        Job {
            name: "plinth-serve-catalog-admin",
            process: "serve",
            target: serve_catalog_admin,
        },
        Job {
            name: "plinth-serve-source-admin",
            process: "serve",
            target: serve_source_admin,
        },
        Job {
            name: "plinth-gateway",
            process: "gateway",
            target: gateway_http,
        },
        Job {
            name: "plinth-catalog",
            process: "catalog",
            target: catalog_admin,
        },
        Job {
            name: "plinth-source",
            process: "source",
            target: source_admin,
        },
    ];
    let prometheus_dir = tempfile::tempdir().expect("Prometheus' directory");
    let prometheus_config_file = prometheus_dir.path().join("prometheus.yml");
    std::fs::write(
        &prometheus_config_file,
        prometheus_config(
            &jobs,
            credentials.token(Role::Observer),
            &root.join("deploy/prometheus/alerts.yml"),
        ),
    )
    .expect("Prometheus' configuration");
    let mut prometheus = Process(
        std::process::Command::new(&prometheus_bin)
            .arg(format!(
                "--config.file={}",
                prometheus_config_file.display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                prometheus_dir.path().join("data").display()
            ))
            .arg("--web.listen-address=127.0.0.1:0")
            .arg("--log.level=warn")
            .stdin(std::process::Stdio::null())
            .spawn()
            .expect("spawn prometheus"),
    );
    let pid = prometheus.0.id();
    let prometheus_addr = crate::waiting::eventually(Duration::from_secs(30), async || {
        crate::cluster::listening_addresses_of(pid).first().copied()
    })
    .await;
    wait_until_ready(
        &client,
        &format!("http://{prometheus_addr}/-/ready"),
        &mut prometheus,
    )
    .await;
    let api = Api {
        client: client.clone(),
        base: format!("http://{prometheus_addr}"),
    };

    // Every target answers its scrapes; the admin ports of `serve`'s catalog and source
    // service answer with no samples (the gateway's address has the process's metrics).
    let mut failures = Vec::new();
    let up = api.until_some("count(up == 1) == 6").await;
    assert_eq!(value(&up[0]), 6.0, "{up:?}");
    for job in ["plinth-serve-catalog-admin", "plinth-serve-source-admin"] {
        let scraped = api
            .until_some(&format!("scrape_samples_scraped{{job=\"{job}\"}}"))
            .await;
        if value(&scraped[0]) != 0.0 {
            failures.push(format!(
                "{job}: {} samples, where the gateway's address has them",
                value(&scraped[0])
            ));
        }
    }
    let said = client
        .get(format!("http://{serve_catalog_admin}/metrics"))
        .bearer_auth(credentials.token(Role::Observer))
        .send()
        .await
        .expect("the catalog's admin port")
        .text()
        .await
        .expect("its text");
    if !(said.lines().all(|line| line.starts_with('#')) && said.contains(&serve_http.to_string())) {
        failures.push(format!(
            "serve's catalog admin port: /metrics is not a comment naming the gateway's address, \
             {serve_http}: {}",
            said.lines().next().unwrap_or("")
        ));
    }

    // A little traffic on both deployments, REST, and public gRPC on `serve`'s gateway: a
    // health check, a call refused NOT_FOUND and one past its deadline.
    let id = traffic(&client, &format!("http://{serve_http}")).await;
    traffic(&client, &format!("http://{gateway_http}")).await;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{serve_http}"))
        .expect("an endpoint")
        .connect()
        .await
        .expect("gRPC to the gateway");
    let health = tonic_health::pb::health_client::HealthClient::new(channel.clone())
        .check(tonic_health::pb::HealthCheckRequest::default())
        .await
        .expect("the public port's health");
    assert_eq!(health.into_inner().status, 1, "SERVING");
    let mut environments = EnvironmentServiceClient::new(channel);
    let missing = environments
        .get_environment(GetEnvironmentRequest {
            environment_id: "henv_00000000000000000000000000000000".to_owned(),
        })
        .await
        .expect_err("no such environment");
    assert_eq!(missing.code(), tonic::Code::NotFound, "{missing:?}");
    // tonic's own channel would end a call itself at its deadline; a bare HTTP/2 client
    // leaves that to the server.
    let bare = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .http2_only(true)
        .build_http::<tonic::body::Body>();
    let origin: http::Uri = format!("http://{serve_http}").parse().expect("a URI");
    // An upload whose first message comes and the rest never do, due in 300 ms.
    let first = WriteFileRequest {
        environment_id: id,
        path: "late.txt".to_owned(),
        executable: false,
        data: b"begun".to_vec().into(),
    };
    let mut hurried =
        tonic::Request::new(futures::stream::iter([first]).chain(futures::stream::pending()));
    hurried
        .metadata_mut()
        .insert("grpc-timeout", "300m".parse().expect("a timeout"));
    let late = FileServiceClient::with_origin(bare, origin)
        .write_file(hurried)
        .await
        .expect_err("past its deadline");
    assert_eq!(late.code(), tonic::Code::DeadlineExceeded, "{late:?}");

    // Prometheus sees the traffic, public gRPC counted under its own status.
    for (expr, want) in [
        (
            "sum(plinth_http_requests_total{process=\"gateway\", status=\"404\"})",
            1.0,
        ),
        (
            "sum(plinth_http_requests_total{process=\"serve\", route=\"/v1/environments\", method=\"POST\", status=\"201\"})",
            1.0,
        ),
        (
            "sum(plinth_grpc_server_requests_total{process=\"serve\", rpc=\"/grpc.health.v1.Health/Check\", code=\"OK\"})",
            1.0,
        ),
        (
            "sum(plinth_grpc_server_requests_total{process=\"serve\", rpc=\"/plinth.v1.EnvironmentService/GetEnvironment\", code=\"NOT_FOUND\"})",
            1.0,
        ),
        (
            "sum(plinth_grpc_server_requests_total{process=\"serve\", rpc=\"/plinth.v1.FileService/WriteFile\", code=\"DEADLINE_EXCEEDED\"})",
            1.0,
        ),
    ] {
        let samples = api.until_some(&format!("{expr} >= {want}")).await;
        assert!(value(&samples[0]) >= want, "{expr}: {samples:?}");
    }
    // Rates over the traffic need a few scrapes after it.
    let since = api.until_some("vector(time())").await;
    let since = value(&since[0]);
    api.until_some(&format!("vector(time()) > {}", since + 5.0))
        .await;

    // Every expression evaluates; every metric it names has series; every dashboard query
    // answers something.
    let names: BTreeSet<String> = api
        .get("label/__name__/values", &[])
        .await
        .expect("metric names")
        .as_array()
        .expect("a list")
        .iter()
        .filter_map(|name| name.as_str().map(str::to_owned))
        .collect();
    let dashboards = dashboard_queries(&root);
    let alerts = alert_queries(&root);
    assert!(
        dashboards.len() > 100 && alerts.len() >= 10,
        "the kit is read"
    );
    for (place, expr) in dashboards.iter().chain(&alerts) {
        for name in metric_names(expr) {
            let present = names.contains(&name)
                || ["_bucket", "_sum", "_count"]
                    .iter()
                    .any(|suffix| names.contains(&format!("{name}{suffix}")));
            if !present {
                failures.push(format!("{place}: {name} has no series"));
            }
        }
    }
    // A panel's query may need a scrape or two more; a minute bounds them all.
    let patience = std::time::Instant::now() + Duration::from_secs(60);
    for (place, expr) in &dashboards {
        let mut answer = api.query(expr).await;
        while matches!(&answer, Ok(samples) if samples.is_empty())
            && std::time::Instant::now() < patience
        {
            tokio::time::sleep(Duration::from_millis(500)).await;
            answer = api.query(expr).await;
        }
        match answer {
            Ok(samples) if samples.is_empty() => {
                failures.push(format!("{place}: no data from {expr}"));
            }
            Ok(_) => {}
            Err(error) => failures.push(format!("{place}: {expr} fails: {error}")),
        }
    }
    // A ratio shows a value wherever it has something to divide by, on each job alone too:
    // 0 when nothing was divided (no errors, no hits), not "No data".
    for (place, raw) in raw_dashboard_queries(&root) {
        let Some(divisor) = divisor(&raw) else {
            continue;
        };
        for job in &jobs {
            let (expr, divisor) = (for_job(&raw, job.name), for_job(divisor, job.name));
            let Ok(divided) = api.query(&divisor).await else {
                continue;
            };
            if divided.is_empty() {
                continue;
            }
            match api.query(&expr).await {
                Ok(samples) if samples.len() < divided.len() => failures.push(format!(
                    "{place}, job {}: {} values where {} series divide: {expr}",
                    job.name,
                    samples.len(),
                    divided.len()
                )),
                Ok(_) => {}
                Err(error) => failures.push(format!("{place}: {expr} fails: {error}")),
            }
        }
    }
    for (place, expr) in &alerts {
        if let Err(error) = api.query(expr).await {
            failures.push(format!("{place}: {expr} fails: {error}"));
        }
    }
    // The rules Prometheus loaded have been evaluated without error.
    let mut rules_health = BTreeMap::new();
    for _ in 0..100 {
        rules_health.clear();
        let data = api.get("rules", &[]).await.expect("rules");
        for group in data["groups"].as_array().into_iter().flatten() {
            for rule in group["rules"].as_array().into_iter().flatten() {
                rules_health.insert(
                    rule["name"].as_str().unwrap_or("?").to_owned(),
                    (
                        rule["health"].as_str().unwrap_or("?").to_owned(),
                        rule["lastError"].as_str().unwrap_or("").to_owned(),
                    ),
                );
            }
        }
        if !rules_health.is_empty() && rules_health.values().all(|(health, _)| health != "unknown")
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(rules_health.len(), alerts.len(), "{rules_health:?}");
    for (name, (health, error)) in &rules_health {
        if health != "ok" {
            failures.push(format!("rule {name}: {health} {error}"));
        }
    }

    // Every Plinth metric has HELP text; every `code` is a status as gRPC names it.
    let metadata = api.get("metadata", &[]).await.expect("metadata");
    for name in names.iter().filter(|name| name.starts_with("plinth_")) {
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|suffix| name.strip_suffix(suffix))
            .filter(|family| metadata.get(*family).is_some())
            .unwrap_or(name);
        let help = metadata[family][0]["help"].as_str().unwrap_or("");
        if help.trim().is_empty() {
            failures.push(format!("{family} has no HELP text"));
        }
    }
    const GRPC_CODES: [&str; 17] = [
        "OK",
        "CANCELLED",
        "UNKNOWN",
        "INVALID_ARGUMENT",
        "DEADLINE_EXCEEDED",
        "NOT_FOUND",
        "ALREADY_EXISTS",
        "PERMISSION_DENIED",
        "RESOURCE_EXHAUSTED",
        "FAILED_PRECONDITION",
        "ABORTED",
        "OUT_OF_RANGE",
        "UNIMPLEMENTED",
        "INTERNAL",
        "UNAVAILABLE",
        "DATA_LOSS",
        "UNAUTHENTICATED",
    ];
    let codes = api.get("label/code/values", &[]).await.expect("codes");
    for code in codes.as_array().into_iter().flatten() {
        let code = code.as_str().unwrap_or("");
        if !GRPC_CODES.contains(&code) {
            failures.push(format!("code {code:?} is not a gRPC status name"));
        }
    }

    // No process exports a series twice (on two of its addresses, say).
    let series = api
        .query("{__name__=~\"plinth_.+|process_.+\"}")
        .await
        .expect("every series");
    let mut seen: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for sample in &series {
        let mut labels: BTreeMap<String, String> = sample["metric"]
            .as_object()
            .expect("labels")
            .iter()
            .map(|(key, value)| (key.clone(), value.as_str().unwrap_or("").to_owned()))
            .collect();
        let job = labels.remove("job").unwrap_or_default();
        labels.remove("instance");
        seen.entry(format!("{labels:?}")).or_default().push(job);
    }
    let twice: Vec<String> = seen
        .iter()
        .filter(|(_, jobs)| jobs.len() > 1)
        .map(|(labels, jobs)| format!("{labels}, by {jobs:?}"))
        .collect();
    if !twice.is_empty() {
        failures.push(format!(
            "{} series exported twice by one process, such as:\n  {}",
            twice.len(),
            twice[..twice.len().min(10)].join("\n  ")
        ));
    }
    assert!(
        seen.keys().any(|labels| labels.contains("\"serve\""))
            && seen.keys().any(|labels| labels.contains("\"catalog\"")),
        "series of both deployments: {} in all",
        seen.len()
    );

    assert!(
        failures.is_empty(),
        "{} problems with the shipped dashboards and rules against real scrapes:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
