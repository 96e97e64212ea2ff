//! `plinth-bench environments`: environment create + get round trips through the REST
//! gateway and through the tenant gRPC API on the same address (`plinth.v1`, answered through
//! the REST operations), side by side with the same calls made directly to the catalog over
//! gRPC (the baseline), in one run against one `plinth serve` (SQLite, local files) in this
//! process. It reports each path's requests/s and latency, and the ratio of each to a direct
//! one: the price of the gateway (HTTP, JSON, auth, the extra gRPC hop), and what the gRPC
//! face adds to it.
//!
//! Phases alternate (gateway, direct, gateway, …) so drift on a shared machine hits both.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Parser as _;
use plinth_proto::catalog::v1::catalog_service_client::CatalogServiceClient;

/// The catalog's channel with the gateway's credential on every call.
type Catalog = tonic::service::interceptor::InterceptedService<
    tonic::transport::Channel,
    plinth_kit::grpc::ClientInterceptor,
>;
use plinth_proto::catalog::v1::{CreateEnvironmentRequest, GetEnvironmentRequest};
use plinth_proto::public::v1 as public;
use plinth_proto::public::v1::environment_service_client::EnvironmentServiceClient;
use tokio::sync::Semaphore;

/// Environment create+get round trips: gateway vs direct gRPC catalog calls.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// create+get pairs per phase.
    #[arg(long, default_value_t = 1000)]
    pairs: usize,
    /// Pairs in flight at once.
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    /// Phases of each path, alternating.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
}

#[derive(Debug, Clone, Copy)]
enum Path {
    Gateway,
    Public,
    Direct,
}

impl Path {
    fn label(self) -> &'static str {
        match self {
            Path::Gateway => "gateway (REST → gRPC catalog)",
            Path::Public => "gateway (plinth.v1 gRPC → REST)",
            Path::Direct => "direct gRPC catalog (baseline)",
        }
    }
}

/// The channels the gRPC paths call over.
struct Channels {
    /// The catalog, with the gateway's credential.
    catalog: Catalog,
    /// The gateway's own address, for `plinth.v1`.
    public: tonic::transport::Channel,
}

struct Phase {
    elapsed: Duration,
    pair_latencies: Vec<Duration>,
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let data_dir = tempfile::tempdir()?;
    let dir = data_dir.path().to_str().context("temp dir is not UTF-8")?;
    let cli = plinth::args::Cli::try_parse_from([
        "plinth",
        "serve",
        "--data-dir",
        dir,
        "--listen",
        "127.0.0.1:0",
    ])?;
    let plinth::args::Command::Serve(serve_args) = &cli.command else {
        anyhow::bail!("parsed serve");
    };
    let mut config = plinth::config::Config::for_serve(serve_args)?;
    // Thousands of environments in one scope: the quota is out of the benchmark's way.
    config.quotas.environments = u64::MAX;
    let listener = tokio::net::TcpListener::bind(config.gateway.listen).await?;
    let running = plinth::serve::start_all(&config, listener).await?;
    let base = format!("http://{}", running.http_addr);
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(64)
        .build()?;
    let channel =
        tonic::transport::Endpoint::from_shared(format!("http://{}", running.catalog_addr))?
            .connect()
            .await?;
    // Direct calls carry the credential serve made for its gateway, as the gateway's do.
    let interceptor = running
        .credentials
        .as_ref()
        .context("serve made no credentials")?
        .gateway
        .interceptor("benchmark")?;
    let channel = tonic::service::interceptor::InterceptedService::new(channel, interceptor);
    let public = tonic::transport::Endpoint::from_shared(base.clone())?
        .connect()
        .await?;
    let channels = Channels {
        catalog: channel,
        public,
    };

    // Warm every path (connections, SQLite pages, allocator).
    run_phase(
        Path::Gateway,
        &http,
        &base,
        &channels,
        50,
        args.concurrency,
        "warm",
    )
    .await?;
    run_phase(
        Path::Direct,
        &http,
        &base,
        &channels,
        50,
        args.concurrency,
        "warm",
    )
    .await?;
    run_phase(
        Path::Public,
        &http,
        &base,
        &channels,
        50,
        args.concurrency,
        "warm",
    )
    .await?;

    let mut gateway = Vec::new();
    let mut public = Vec::new();
    let mut direct = Vec::new();
    for round in 0..args.rounds {
        let tag = format!("r{round}");
        gateway.push(
            run_phase(
                Path::Gateway,
                &http,
                &base,
                &channels,
                args.pairs,
                args.concurrency,
                &tag,
            )
            .await?,
        );
        public.push(
            run_phase(
                Path::Public,
                &http,
                &base,
                &channels,
                args.pairs,
                args.concurrency,
                &tag,
            )
            .await?,
        );
        direct.push(
            run_phase(
                Path::Direct,
                &http,
                &base,
                &channels,
                args.pairs,
                args.concurrency,
                &tag,
            )
            .await?,
        );
    }

    println!("plinth-bench: environment create+get round trips");
    println!("machine: {}", crate::machine());
    println!(
        "setup: plinth serve in-process (SQLite + local files), client in the same process; {} pairs x {} rounds per path, {} in flight",
        args.pairs, args.rounds, args.concurrency
    );
    let gateway_summary = summarize(Path::Gateway, &gateway);
    let public_summary = summarize(Path::Public, &public);
    let direct_summary = summarize(Path::Direct, &direct);
    println!(
        "ratio: a gateway round trip costs {:.2}x a direct gRPC catalog call (median pair latency); direct throughput is {:.2}x the gateway's",
        gateway_summary.p50_ms / direct_summary.p50_ms,
        direct_summary.requests_per_second / gateway_summary.requests_per_second,
    );
    println!(
        "ratio: a plinth.v1 gRPC round trip costs {:.2}x a direct gRPC catalog call and {:.2}x the same REST round trip (median pair latency)",
        public_summary.p50_ms / direct_summary.p50_ms,
        public_summary.p50_ms / gateway_summary.p50_ms,
    );
    running.stop().await?;
    Ok(())
}

struct Summary {
    requests_per_second: f64,
    p50_ms: f64,
}

fn summarize(path: Path, phases: &[Phase]) -> Summary {
    let mut rates: Vec<f64> = phases
        .iter()
        .map(|phase| (2 * phase.pair_latencies.len()) as f64 / phase.elapsed.as_secs_f64())
        .collect();
    rates.sort_by(f64::total_cmp);
    let rate = rates[rates.len() / 2];
    let mut latencies: Vec<Duration> = phases
        .iter()
        .flat_map(|phase| phase.pair_latencies.iter().copied())
        .collect();
    latencies.sort();
    let at = |q: f64| latencies[((latencies.len() - 1) as f64 * q) as usize].as_secs_f64() * 1000.0;
    let (p50, p99) = (at(0.5), at(0.99));
    println!(
        "{:<32} {:>9.0} requests/s (median of {} phases)   pair latency p50 {:>6.2} ms  p99 {:>6.2} ms",
        path.label(),
        rate,
        phases.len(),
        p50,
        p99
    );
    Summary {
        requests_per_second: rate,
        p50_ms: p50,
    }
}

async fn run_phase(
    path: Path,
    http: &reqwest::Client,
    base: &str,
    channels: &Channels,
    pairs: usize,
    concurrency: usize,
    tag: &str,
) -> anyhow::Result<Phase> {
    let permits = Arc::new(Semaphore::new(concurrency));
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..pairs {
        let permit = permits.clone().acquire_owned().await?;
        let name = format!(
            "bench {tag} {} {i}",
            match path {
                Path::Gateway => "g",
                Path::Public => "p",
                Path::Direct => "d",
            }
        );
        let http = http.clone();
        let base = base.to_owned();
        let mut catalog = CatalogServiceClient::new(channels.catalog.clone());
        let mut environments = EnvironmentServiceClient::new(channels.public.clone());
        tasks.spawn(async move {
            let _permit = permit;
            let begun = Instant::now();
            match path {
                Path::Gateway => {
                    let created: serde_json::Value = http
                        .post(format!("{base}/v1/environments"))
                        .json(&serde_json::json!({"name": name}))
                        .send()
                        .await?
                        .error_for_status()?
                        .json()
                        .await?;
                    let id = created["id"].as_str().context("no id")?;
                    http.get(format!("{base}/v1/environments/{id}"))
                        .send()
                        .await?
                        .error_for_status()?
                        .bytes()
                        .await?;
                }
                Path::Public => {
                    let created = environments
                        .create_environment(public::CreateEnvironmentRequest {
                            name,
                            ..Default::default()
                        })
                        .await?
                        .into_inner();
                    environments
                        .get_environment(public::GetEnvironmentRequest {
                            environment_id: created.id,
                        })
                        .await?;
                }
                Path::Direct => {
                    let created = catalog
                        .create_environment(CreateEnvironmentRequest {
                            scope: "default".into(),
                            name,
                            description: String::new(),
                            entry: String::new(),
                            install: None,
                        })
                        .await?
                        .into_inner();
                    catalog
                        .get_environment(GetEnvironmentRequest {
                            scope: "default".into(),
                            id: created.id,
                        })
                        .await?;
                }
            }
            anyhow::Ok(begun.elapsed())
        });
    }
    let mut pair_latencies = Vec::with_capacity(pairs);
    while let Some(joined) = tasks.join_next().await {
        pair_latencies.push(joined??);
    }
    Ok(Phase {
        elapsed: started.elapsed(),
        pair_latencies,
    })
}
