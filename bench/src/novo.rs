//! `plinth-bench novo`: what the agent adapters cost per tool call. The same operations on
//! the same kind of session three ways, against one `plinth serve` (release build, its own
//! process), interleaved call by call so drift hits each:
//!
//! - **Novo**: `POST /v1/workspace-adapters/{id}/novo`, signed (HMAC-SHA256 over the raw
//!   body), with a `Novo-Request-Id`: `readFile`, `editFile` (`create`, the whole file) and
//!   `runCommand` (`true`), in one run's session;
//! - **Brain**: `POST /v1/workspace-adapters/{id}/brain/v1/operations`, an `execute` of the
//!   tools `read_file`, `edit_file` and `run_command` with the same arguments, each its own
//!   sequence, in one workspace Brain session;
//! - **direct** (the baseline): the session API on another session of the same version:
//!   `GET /v1/sessions/{id}/files/{path}`, `PUT /v1/sessions/{id}/files/{path}`,
//!   `POST /v1/sessions/{id}/exec`.
//!
//! Latency is one call at a time (p50, p99); calls/s is `--concurrency` callers at once.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use hmac::{KeyInit, Mac};
use serde_json::{Value, json};

use crate::service::Service;

/// Novo adapter benchmarks.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Calls per operation and path, one at a time.
    #[arg(long, default_value_t = 400)]
    calls: usize,
    /// Callers at once for calls/s.
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    /// Calls per operation and path for calls/s.
    #[arg(long, default_value_t = 800)]
    throughput_calls: usize,
    /// Bytes of the file read and written.
    #[arg(long, default_value_t = 4096)]
    file_bytes: usize,
}

const SECRET: &str = "bench_secret_0123456789abcdef";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Read,
    Edit,
    Run,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Read => "readFile",
            Op::Edit => "editFile",
            Op::Run => "runCommand",
        }
    }

    /// Brain's name for the same tool.
    fn brain(self) -> &'static str {
        match self {
            Op::Read => "read_file",
            Op::Edit => "edit_file",
            Op::Run => "run_command",
        }
    }
}

/// The ways a tool call is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Way {
    Novo,
    Brain,
    Direct,
}

const WAYS: [Way; 3] = [Way::Novo, Way::Brain, Way::Direct];

impl Way {
    fn label(self) -> &'static str {
        match self {
            Way::Novo => "Novo adapter (signed call)",
            Way::Brain => "Brain adapter (execute)",
            Way::Direct => "direct session API (baseline)",
        }
    }
}

#[derive(Clone)]
struct Target {
    client: reqwest::Client,
    base: String,
    adapter_url: String,
    brain_url: String,
    brain_token: String,
    session: String,
    content: String,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

impl Target {
    /// The same arguments for both adapters.
    fn args(&self, op: Op) -> Value {
        match op {
            Op::Read => json!({"path": "bench.txt"}),
            Op::Edit => {
                json!({"path": "bench.txt", "operation": "create", "contents": self.content})
            }
            Op::Run => json!({"command": "true"}),
        }
    }

    /// One tool execution delivered as Brain delivers it, each its own sequence.
    async fn brain(&self, op: Op) -> anyhow::Result<()> {
        let sequence = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 2;
        let request = json!({
            "type": "execute",
            "descriptor": { "kind": "tool", "name": op.brain() },
            "input": self.args(op),
        });
        let receipt = brain_operation(
            &self.client,
            &self.brain_url,
            &self.brain_token,
            sequence,
            request,
        )
        .await?;
        anyhow::ensure!(receipt["type"] == "result", "{}: {receipt}", op.brain());
        if op == Op::Run {
            anyhow::ensure!(receipt["output"]["exit_code"] == 0, "{receipt}");
        }
        Ok(())
    }

    /// One call through the signed adapter endpoint.
    async fn adapter(&self, op: Op) -> anyhow::Result<()> {
        let args = self.args(op);
        let id = format!(
            "req_{}_{}",
            std::process::id(),
            NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        // Each call is its own signed request (the gateway refuses the same one twice), as
        // each of Novo's tool calls is.
        let body = serde_json::to_vec(
            &json!({"method": op.name(), "args": args, "options": {"callId": id}}),
        )?;
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_secs()
            .to_string();
        let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(SECRET.as_bytes())?;
        mac.update(t.as_bytes());
        mac.update(b".");
        mac.update(&body);
        let signature = format!("t={t},v1={}", hex(&mac.finalize().into_bytes()));
        let response = self
            .client
            .post(&self.adapter_url)
            .header("content-type", "application/json")
            .header("Novo-Environment-Id", "env_bench")
            .header("Novo-Workspace-Method", op.name())
            .header("Novo-Signature", signature)
            .header("Novo-Timestamp", &t)
            .header("Novo-Request-Id", id)
            .header("Novo-Org-Id", "org_bench")
            .header("Novo-Agent-Id", "agent_bench")
            .header("Novo-Run-Id", "run_bench")
            .body(body)
            .send()
            .await?;
        let status = response.status();
        let answer: Value = response.json().await?;
        anyhow::ensure!(status.is_success(), "{}: {status} {answer}", op.name());
        if op == Op::Run {
            anyhow::ensure!(answer["exit_code"] == 0, "{answer}");
        }
        Ok(())
    }

    /// The same operation on the session API.
    async fn direct(&self, op: Op) -> anyhow::Result<()> {
        let files = format!("{}/v1/sessions/{}/files/bench.txt", self.base, self.session);
        let response = match op {
            Op::Read => self.client.get(files).send().await?,
            Op::Edit => {
                self.client
                    .put(files)
                    .body(self.content.clone())
                    .send()
                    .await?
            }
            Op::Run => {
                self.client
                    .post(format!("{}/v1/sessions/{}/exec", self.base, self.session))
                    .json(&json!({"command": "true"}))
                    .send()
                    .await?
            }
        };
        let status = response.status();
        let bytes = response.bytes().await?;
        anyhow::ensure!(
            status.is_success(),
            "{}: {status} {}",
            op.name(),
            String::from_utf8_lossy(&bytes)
        );
        Ok(())
    }

    async fn call(&self, op: Op, way: Way) -> anyhow::Result<()> {
        match way {
            Way::Novo => self.adapter(op).await,
            Way::Brain => self.brain(op).await,
            Way::Direct => self.direct(op).await,
        }
    }
}

/// The Brain session every execution runs in.
const BRAIN_SESSION: &str = "ses_bench";

/// Delivers one operation of [`BRAIN_SESSION`]; answers its receipt.
async fn brain_operation(
    client: &reqwest::Client,
    url: &str,
    token: &str,
    sequence: u64,
    request: Value,
) -> anyhow::Result<Value> {
    let answer = client
        .post(url)
        .bearer_auth(token)
        .json(&json!({
            "contract": "environment/v1",
            "operation": {
                "session_id": BRAIN_SESSION,
                "environment": "bench",
                "sequence": sequence,
                "request": request,
                "configuration": { "lifetime": "workspace" },
            }
        }))
        .send()
        .await?;
    let status = answer.status();
    let answer: Value = answer.json().await?;
    anyhow::ensure!(status.is_success(), "{status}: {answer}");
    Ok(answer["receipt"].clone())
}

/// Seconds spent in, and calls of, each gRPC method the server answered and each HTTP route
/// it served, from its `/metrics` (`plinth_grpc_server_request_duration_seconds` by `rpc`,
/// `plinth_http_request_duration_seconds` by `route`, each summed over status codes).
async fn rpc_seconds(
    target: &Target,
) -> anyhow::Result<std::collections::BTreeMap<String, (f64, u64)>> {
    let text = target
        .client
        .get(format!("{}/metrics", target.base))
        .send()
        .await?
        .error_for_status()?
        .text()
        .await?;
    let mut found: std::collections::BTreeMap<String, (f64, u64)> = Default::default();
    for line in text.lines() {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Some((metric, labels)) = series.split_once('{') else {
            continue;
        };
        let (sum, label, prefix) = match metric {
            "plinth_grpc_server_request_duration_seconds_sum" => (true, "rpc=\"", ""),
            "plinth_grpc_server_request_duration_seconds_count" => (false, "rpc=\"", ""),
            "plinth_http_request_duration_seconds_sum" => (true, "route=\"", "HTTP "),
            "plinth_http_request_duration_seconds_count" => (false, "route=\"", "HTTP "),
            _ => continue,
        };
        let Some(name) = labels
            .split(label)
            .nth(1)
            .and_then(|after| after.split('"').next())
        else {
            continue;
        };
        let entry = found.entry(format!("{prefix}{name}")).or_default();
        if sum {
            entry.0 += value.parse::<f64>().unwrap_or(0.0);
        } else {
            entry.1 += value.parse::<f64>().unwrap_or(0.0) as u64;
        }
    }
    Ok(found)
}

fn percentile(values: &[f64], fraction: f64) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let index = ((sorted.len() as f64 - 1.0) * fraction).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

async fn post(client: &reqwest::Client, url: String, body: Value) -> anyhow::Result<Value> {
    let response = client.post(url).json(&body).send().await?;
    let status = response.status();
    let answer: Value = response.json().await?;
    anyhow::ensure!(status.is_success(), "{status}: {answer}");
    Ok(answer)
}

/// `calls` calls by `concurrency` callers at once; calls/s.
async fn throughput(
    target: &Target,
    op: Op,
    way: Way,
    calls: usize,
    concurrency: usize,
) -> anyhow::Result<f64> {
    let begun = Instant::now();
    let mut callers = tokio::task::JoinSet::new();
    for caller in 0..concurrency {
        let target = target.clone();
        let mine = calls / concurrency + usize::from(caller < calls % concurrency);
        callers.spawn(async move {
            for _ in 0..mine {
                target.call(op, way).await?;
            }
            anyhow::Ok(())
        });
    }
    while let Some(done) = callers.join_next().await {
        done??;
    }
    Ok(calls as f64 / begun.elapsed().as_secs_f64())
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let binary = crate::service::binary()?;
    let work = crate::fresh_fs::WorkDir::make(false, false)?;
    let client = reqwest::Client::new();
    println!("machine: {}", crate::machine());
    // Calls per adapter are not limited here: the benchmark measures a call's cost, and its
    // callers at once pass the default rate (`gateway.adapter_rate_limit_per_second`).
    let config = work.path().join("plinth.toml");
    std::fs::write(&config, "[gateway]\nadapter_rate_limit_per_second = 0\n")?;
    let config = config
        .to_str()
        .context("a UTF-8 work directory")?
        .to_owned();
    let service = Service::start(
        &binary,
        &work.path().join("serve"),
        &["--builder-network", "false", "--config", &config],
    )
    .await?;
    let environment = service.environment(&client, "Bench Novo").await?;
    client
        .put(format!(
            "{}/v1/environments/{environment}/files/run.py",
            service.base
        ))
        .body("print('hi')\n")
        .send()
        .await?
        .error_for_status()?;
    post(
        &client,
        format!("{}/v1/environments/{environment}/build", service.base),
        json!({}),
    )
    .await?;
    crate::service::wait_for_build(
        &client,
        &service.base,
        &environment,
        1,
        Duration::from_millis(50),
    )
    .await?;
    let adapter = post(
        &client,
        format!("{}/v1/workspace-adapters", service.base),
        json!({"protocol": "novo", "environment": environment, "secret": SECRET}),
    )
    .await?;
    let brain = post(
        &client,
        format!("{}/v1/workspace-adapters", service.base),
        json!({"protocol": "brain", "environment": environment}),
    )
    .await?;
    let brain_url = format!(
        "{}/v1/operations",
        brain["url"].as_str().context("brain adapter url")?
    );
    let brain_token = brain["token"]
        .as_str()
        .context("brain adapter token")?
        .to_owned();
    let setup = brain_operation(
        &client,
        &brain_url,
        &brain_token,
        1,
        json!({ "type": "setup" }),
    )
    .await?;
    anyhow::ensure!(setup["type"] == "accepted", "Brain setup: {setup}");
    let session = post(
        &client,
        format!("{}/v1/sessions", service.base),
        json!({"environment": environment}),
    )
    .await?;
    let content: String = (0..)
        .map(|i| format!("line {i:05} of the benchmark's file\n"))
        .take_while({
            let mut total = 0;
            move |line: &String| {
                total += line.len();
                total <= args.file_bytes
            }
        })
        .collect();
    let target = Target {
        client: client.clone(),
        base: service.base.clone(),
        adapter_url: format!(
            "{}/v1/workspace-adapters/{}/novo",
            service.base,
            adapter["id"].as_str().context("adapter id")?
        ),
        brain_url,
        brain_token,
        session: session["id"].as_str().context("session id")?.to_owned(),
        content,
    };
    // Every session exists and holds the file before anything is measured.
    for way in WAYS {
        target.call(Op::Edit, way).await?;
        for op in [Op::Read, Op::Edit, Op::Run] {
            for _ in 0..20 {
                target.call(op, way).await?;
            }
        }
    }

    println!(
        "{} calls per operation and way one at a time; {} calls by {} callers at once for calls/s; a {}-byte file",
        args.calls,
        args.throughput_calls,
        args.concurrency,
        target.content.len()
    );
    println!("| operation | way | p50 | p99 | calls/s |\n|---|---|---|---|---|");
    let mut ratios = Vec::new();
    let mut spent = Vec::new();
    for op in [Op::Read, Op::Edit, Op::Run] {
        let mut latencies: [Vec<f64>; 3] = Default::default();
        let before = rpc_seconds(&target).await?;
        for _ in 0..args.calls {
            for (index, way) in WAYS.into_iter().enumerate() {
                let begun = Instant::now();
                target.call(op, way).await?;
                latencies[index].push(begun.elapsed().as_secs_f64() * 1000.0);
            }
        }
        let after = rpc_seconds(&target).await?;
        for (rpc, (seconds, count)) in after {
            let (earlier_seconds, earlier_count) = before.get(&rpc).copied().unwrap_or((0.0, 0));
            let calls = count.saturating_sub(earlier_count);
            // The RPCs a call makes, not the background's (renewals, sweeps, heartbeats).
            if calls >= (args.calls as u64) / 2 {
                let mean_ms = (seconds - earlier_seconds) * 1000.0 / calls as f64;
                spent.push((op, rpc, calls, mean_ms));
            }
        }
        // Each way's calls/s in two halves, in mirrored order, so none always runs on a
        // warmer or busier machine.
        let half = args.throughput_calls / 2;
        let mut rate = [0.0f64; 3];
        for index in [0, 1, 2, 2, 1, 0] {
            let measured = throughput(&target, op, WAYS[index], half, args.concurrency).await?;
            rate[index] += measured / 2.0;
        }
        for (index, way) in WAYS.into_iter().enumerate() {
            println!(
                "| {} | {} | {:.2} ms | {:.2} ms | {:.0} |",
                op.name(),
                way.label(),
                percentile(&latencies[index], 0.5),
                percentile(&latencies[index], 0.99),
                rate[index]
            );
        }
        let direct = (
            percentile(&latencies[2], 0.5),
            percentile(&latencies[2], 0.99),
        );
        for index in [0, 1] {
            ratios.push((
                op,
                WAYS[index],
                percentile(&latencies[index], 0.5) / direct.0,
                percentile(&latencies[index], 0.99) / direct.1,
                rate[2] / rate[index],
            ));
        }
    }
    println!(
        "\nWhere the one-at-a-time calls spent their time, as the server measured it: each HTTP route and internal RPC it answered at least once per two calls, with its count and mean (an RPC's calls are all three ways' together)"
    );
    println!("| operation | route or RPC | calls | mean |\n|---|---|---|---|");
    for (op, rpc, calls, mean_ms) in spent {
        println!("| {} | `{rpc}` | {calls} | {mean_ms:.3} ms |", op.name());
    }
    println!();
    for (op, way, p50, p99, rate) in ratios {
        println!(
            "{} {}: ÷ direct latency p50 {p50:.2}×, p99 {p99:.2}×; direct calls/s ÷ this {rate:.2}×",
            op.name(),
            way.label()
        );
    }
    Ok(())
}
