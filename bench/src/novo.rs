//! `plinth-bench novo`: what the Novo adapter costs per tool call. The same operations on the
//! same kind of session two ways, against one `plinth serve` (release build, its own
//! process), interleaved call by call so drift hits both:
//!
//! - **adapter**: `POST /v1/workspace-adapters/{id}/novo`, signed (HMAC-SHA256 over the raw
//!   body), with a `Novo-Request-Id`: `readFile`, `editFile` (`create`, the whole file) and
//!   `runCommand` (`true`), in one run's session;
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
}

#[derive(Clone)]
struct Target {
    client: reqwest::Client,
    base: String,
    adapter_url: String,
    session: String,
    content: String,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

impl Target {
    /// One call through the signed adapter endpoint.
    async fn adapter(&self, op: Op) -> anyhow::Result<()> {
        let args = match op {
            Op::Read => json!({"path": "bench.txt"}),
            Op::Edit => {
                json!({"path": "bench.txt", "operation": "create", "contents": self.content})
            }
            Op::Run => json!({"command": "true"}),
        };
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

    async fn call(&self, op: Op, adapter: bool) -> anyhow::Result<()> {
        if adapter {
            self.adapter(op).await
        } else {
            self.direct(op).await
        }
    }
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
    adapter: bool,
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
                target.call(op, adapter).await?;
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
    let service = Service::start(
        &binary,
        &work.path().join("serve"),
        &["--builder-network", "false"],
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
        session: session["id"].as_str().context("session id")?.to_owned(),
        content,
    };
    // Both sessions exist and hold the file before anything is measured.
    for adapter in [true, false] {
        target.call(Op::Edit, adapter).await?;
        for op in [Op::Read, Op::Edit, Op::Run] {
            for _ in 0..20 {
                target.call(op, adapter).await?;
            }
        }
    }

    println!(
        "{} calls per operation and path one at a time; {} calls by {} callers at once for calls/s; a {}-byte file",
        args.calls,
        args.throughput_calls,
        args.concurrency,
        target.content.len()
    );
    println!("| operation | path | p50 | p99 | calls/s |\n|---|---|---|---|---|");
    let mut ratios = Vec::new();
    for op in [Op::Read, Op::Edit, Op::Run] {
        let (mut through, mut direct) = (Vec::new(), Vec::new());
        for _ in 0..args.calls {
            for adapter in [true, false] {
                let begun = Instant::now();
                target.call(op, adapter).await?;
                let ms = begun.elapsed().as_secs_f64() * 1000.0;
                if adapter {
                    through.push(ms);
                } else {
                    direct.push(ms);
                }
            }
        }
        // Alternate halves so neither path always runs on a warmer or busier machine.
        let half = args.throughput_calls / 2;
        let mut rate = [0.0f64; 2];
        for adapter in [true, false, false, true] {
            let measured = throughput(&target, op, adapter, half, args.concurrency).await?;
            rate[usize::from(!adapter)] += measured / 2.0;
        }
        let rows = [
            ("adapter (signed Novo call)", &through, rate[0]),
            ("direct session API (baseline)", &direct, rate[1]),
        ];
        for (path, values, rate) in rows {
            println!(
                "| {} | {path} | {:.2} ms | {:.2} ms | {rate:.0} |",
                op.name(),
                percentile(values, 0.5),
                percentile(values, 0.99)
            );
        }
        ratios.push((
            op,
            percentile(&through, 0.5) / percentile(&direct, 0.5),
            percentile(&through, 0.99) / percentile(&direct, 0.99),
            rate[1] / rate[0],
        ));
    }
    println!();
    for (op, p50, p99, rate) in ratios {
        println!(
            "{}: adapter/direct latency p50 {p50:.2}×, p99 {p99:.2}×; direct/adapter calls/s {rate:.2}×",
            op.name()
        );
    }
    Ok(())
}
