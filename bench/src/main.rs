//! `plinth-bench`: Plinth's benchmarks, each beside a named baseline measured in the same run.
//! See bench/README.md for what each measures and the figures measured here.

mod build;
mod build_real;
mod environments;
mod failover;
mod fleet;
mod fresh_fs;
mod http1;
mod import;
mod novo;
mod push;
mod service;
mod sessions;
mod sessions_cold;
mod shared;
mod soak;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "plinth-bench",
    about = "Plinth's benchmarks, each beside a named baseline"
)]
struct Cli {
    /// Install logging and tracing as `plinth serve` does (log at `warn`, spans kept for
    /// OpenTelemetry, exported if `OTEL_EXPORTER_OTLP_ENDPOINT` says so). Without it the
    /// server runs with no trace subscriber, as every figure in bench/README.md was taken
    /// unless it says otherwise.
    #[arg(long, global = true)]
    telemetry: bool,
    #[command(subcommand)]
    bench: Bench,
}

#[derive(Debug, Subcommand)]
enum Bench {
    /// Environment create+get round trips: gateway vs direct gRPC catalog calls.
    Environments(environments::Args),
    /// A Python project with 20+ dependencies built through Plinth vs `uv pip install`,
    /// a one-file rebuild, and how fast `POST …/build` answers.
    Build(build::Args),
    /// Importing a project-shaped tar.gz vs `tar -xzf`, the service's peak memory, and
    /// small-file PUT/GET through the gateway.
    Import(import::Args),
    /// Session create + first exec vs a bare namespace + read-only bind + exec; first
    /// materialization vs `tar -x`; a one-file version; 200 sessions at once. With `--cold`:
    /// the first session on a node whose cache is empty, beside the same once warm.
    Sessions(sessions::Args),
    /// readFile, editFile and runCommand through the signed Novo adapter endpoint vs the
    /// same operations on the session API.
    Novo(novo::Args),
    /// `plinth push` of a 20,000-file directory vs `tar -czf - | curl -T -` of the same
    /// directory into the same import.
    Push(push::Args),
    /// Sessions, builds of environments then deleted, and Brain sessions with short retention
    /// and grace: the data directory's bytes, every table's rows and the service's memory at
    /// the start, the peak and after the last collection pass.
    Soak(soak::Args),
    /// Across catalog replicas on PostgreSQL: queued→started of a build queued through one
    /// catalog with the builder waiting on another, vs on the same one; and a killed
    /// builder's build taken over, vs one stopped gracefully.
    Failover(failover::Args),
    /// Many nodes heartbeating to catalog replicas on PostgreSQL with their cached versions:
    /// heartbeats per second sustained against the rate offered, their latency, and the
    /// latency of placing a session among them with many sessions live.
    Fleet(fleet::Args),
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    plinth_blobs::install_tls_provider();
    let cli = Cli::parse();
    let _telemetry = if cli.telemetry {
        let log = plinth_kit::telemetry::LogConfig {
            filter: "warn".to_owned(),
            ..Default::default()
        };
        Some(plinth_kit::telemetry::init("plinth-bench", &log)?)
    } else {
        None
    };
    match cli.bench {
        Bench::Environments(args) => environments::run(args).await,
        Bench::Import(args) => import::run(args).await,
        Bench::Build(args) => build::run(args).await,
        Bench::Sessions(args) => sessions::run(args).await,
        Bench::Novo(args) => novo::run(args).await,
        Bench::Push(args) => push::run_bench(args).await,
        Bench::Soak(args) => soak::run(args).await,
        Bench::Failover(args) => failover::run(args).await,
        Bench::Fleet(args) => fleet::run(args).await,
    }
}

/// The machine, for the report: cores, CPU model, memory.
pub fn machine() -> String {
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find(|line| line.starts_with("model name"))
        .and_then(|line| line.split_once(':'))
        .map_or("unknown CPU", |(_, model)| model.trim())
        .to_owned();
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let memory_gib = meminfo
        .lines()
        .find(|line| line.starts_with("MemTotal:"))
        .and_then(|line| line.split_whitespace().nth(1))
        .and_then(|kib| kib.parse::<f64>().ok())
        .map_or(0.0, |kib| kib / 1024.0 / 1024.0);
    format!("{cores} cores, {model}, {memory_gib:.0} GiB")
}
