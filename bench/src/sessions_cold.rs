//! `plinth-bench sessions --cold`: the first session on a node that never saw the version,
//! beside the same on the same node once it holds the version.
//!
//! Through the real services (a release `plinth serve`, its own process), once per blob store
//! (files on the local disk, then a bucket on the S3-protocol server):
//!
//! 1. The version: the venv-shaped tree the materialize part of `plinth-bench sessions`
//!    generates (20,000 files, 320 MiB by default) under `tree/`, beside a `run.py`, imported
//!    as a tar through `POST …/import` and built (no manifests, so no installer runs): the
//!    build stores its layer and activates the version, as any build does. Beside it, the build
//!    bench's project (its wheelhouse, downloaded once from PyPI as `plinth-bench build` does,
//!    built with `--builder-network false`: 25 distributions), and a one-file probe.
//! 2. Each round: the service stopped (`SIGTERM`), the node's state directory (its version
//!    cache with it) removed, the service started again; a session on the probe (so the node
//!    is registered and has made its first sandbox, and only the version is new to it); then,
//!    timed with the lean client, create + first `exec true` on the big version (cold), the
//!    same again (warm: the node now holds it), and create + `python -c 'import …'` of every
//!    top-level module of the 25 distributions, cold and then warm; the project first in every
//!    other round, and `sync` before each (a fetch's writes are not left to the next
//!    measurement).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::Context as _;

use crate::http1::Http1;
use crate::service::Service;
use crate::shared::percentile;

/// Where the version's blobs are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Store {
    /// Files under the service's data directory (`file://`).
    File,
    /// A new bucket on the S3-protocol server at `--s3-endpoint`.
    S3,
}

impl Store {
    fn describe(self) -> &'static str {
        match self {
            Store::File => "local files",
            Store::S3 => "S3 protocol (moto)",
        }
    }
}

/// `--cold` settings.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// With `--cold`: rounds, each on a node whose cache was emptied.
    #[arg(long, default_value_t = 10)]
    rounds: usize,
    /// With `--cold`: the blob stores measured, in turn.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "file,s3")]
    stores: Vec<Store>,
    /// With `--cold`: the S3-protocol server (a loopback one: the bench makes a bucket there).
    #[arg(long, default_value = "http://127.0.0.1:5055")]
    s3_endpoint: String,
}

/// One round's figures, milliseconds.
#[derive(Debug, Clone, Copy)]
struct Round {
    cold_create: f64,
    cold: f64,
    warm: f64,
    python_cold: f64,
    python_cold_exec: f64,
    python_warm: f64,
    python_warm_exec: f64,
    /// The project's pair came first, straight after the node started.
    project_first: bool,
}

/// One blob store's figures.
struct Pass {
    store: Store,
    /// Import and build of the big version, seconds.
    import_seconds: f64,
    build_seconds: f64,
    packages: usize,
    rounds: Vec<Round>,
}

/// Writes back every dirty page, so a measurement does not pay for an earlier one's writes.
fn sync() {
    let _ = Command::new("sync").status();
}

/// A create + one command: how long the create took and the whole, milliseconds.
struct Timed {
    create: f64,
    total: f64,
}

fn ms(begun: Instant) -> f64 {
    begun.elapsed().as_secs_f64() * 1000.0
}

/// Creates a session on `environment`, runs `command` in it and ends it; the end is not timed.
fn create_exec(lean: &mut Http1, environment: &str, command: &str) -> anyhow::Result<Timed> {
    let create_body = serde_json::json!({"environment": environment});
    let exec_body = serde_json::json!({"command": command});
    let begun = Instant::now();
    let (status, session) = lean.request("POST", "/v1/sessions", Some(&create_body))?;
    let create = ms(begun);
    anyhow::ensure!(status == 201, "create: {status}: {session}");
    let id = session["id"].as_str().context("session id")?.to_owned();
    let (status, ran) =
        lean.request("POST", &format!("/v1/sessions/{id}/exec"), Some(&exec_body))?;
    let total = ms(begun);
    anyhow::ensure!(
        status == 200 && ran["exit_code"] == 0,
        "`{command}` failed: {status}: {ran}"
    );
    let (status, answer) = lean.request("DELETE", &format!("/v1/sessions/{id}"), None)?;
    anyhow::ensure!(status < 300, "end: {status}: {answer}");
    Ok(Timed { create, total })
}

/// Every top-level module the wheels install, except private ones (`_yaml`, `_pytest`): from
/// each wheel's `top_level.txt`, or its file list when it has none. Read with the host's
/// Python, as the build bench's wheelhouse is made.
fn import_names(wheels: &[PathBuf]) -> anyhow::Result<Vec<String>> {
    const SCRIPT: &str = r#"
import sys, zipfile
names = set()
for path in sys.argv[1:]:
    with zipfile.ZipFile(path) as wheel:
        members = wheel.namelist()
        top = [m for m in members if m.endswith(".dist-info/top_level.txt")]
        found = set()
        if top:
            found = set(wheel.read(top[0]).decode().split())
        for member in members if not found else []:
            first = member.split("/")[0]
            if first.endswith(".dist-info") or first.endswith(".data"):
                continue
            if "/" in member:
                found.add(first)
            elif member.endswith(".py"):
                found.add(first[:-3])
        names.update(n for n in found if n.isidentifier() and not n.startswith("_"))
print(" ".join(sorted(names)))
"#;
    let output = Command::new("python3")
        .arg("-c")
        .arg(SCRIPT)
        .args(wheels)
        .output()
        .context("python3 runs")?;
    anyhow::ensure!(
        output.status.success(),
        "reading the wheels failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let names: Vec<String> = String::from_utf8_lossy(&output.stdout)
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    anyhow::ensure!(!names.is_empty(), "no module found in the wheels");
    Ok(names)
}

/// A new bucket on the S3-protocol server; answers the blob store URL naming it.
async fn fresh_bucket(client: &reqwest::Client, endpoint: &str) -> anyhow::Result<String> {
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_millis();
    let bucket = format!("plinth-bench-{}-{stamp}", std::process::id());
    client
        .put(format!("{endpoint}/{bucket}"))
        .send()
        .await
        .with_context(|| format!("cannot reach the S3-protocol server at {endpoint}"))?
        .error_for_status()?;
    Ok(format!(
        "s3://{bucket}/plinth?endpoint={endpoint}&allow_http=true&region=us-east-1&access_key_id=test&secret_access_key=test"
    ))
}

/// Waits (at most a minute) for the service to have stored a version's pack; says whether it
/// did.
async fn wait_for_pack(client: &reqwest::Client, base: &str) -> anyhow::Result<&'static str> {
    let begun = Instant::now();
    while begun.elapsed() < Duration::from_secs(60) {
        let metrics = client
            .get(format!("{base}/metrics"))
            .send()
            .await?
            .error_for_status()?
            .text()
            .await?;
        let written = metrics
            .lines()
            .filter(|line| line.starts_with("plinth_node_packs_written_total"))
            .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>();
        if written >= 1.0 {
            return Ok("the project's pack stored");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    eprintln!("no pack was stored within a minute of the project's first session");
    Ok("no pack stored")
}

async fn put(client: &reqwest::Client, url: String, body: Vec<u8>) -> anyhow::Result<()> {
    client
        .put(url)
        .body(body)
        .send()
        .await?
        .error_for_status()?;
    Ok(())
}

/// Builds the environment's next version, `version`, and waits until it is active.
async fn build(
    client: &reqwest::Client,
    base: &str,
    environment: &str,
    version: u64,
) -> anyhow::Result<f64> {
    let begun = Instant::now();
    client
        .post(format!("{base}/v1/environments/{environment}/build"))
        .send()
        .await?
        .error_for_status()?;
    crate::service::wait_for_build(
        client,
        base,
        environment,
        version,
        Duration::from_millis(100),
    )
    .await?;
    Ok(begun.elapsed().as_secs_f64())
}

/// Until a session on the probe runs `true`: the restarted node is registered and places
/// sessions. Up to a minute.
async fn wait_for_node(base: &str, probe: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let tried = tokio::task::block_in_place(|| {
            let mut lean = Http1::connect(base)?;
            create_exec(&mut lean, probe, "true")
        });
        match tried {
            Ok(_) => return Ok(()),
            Err(error) if Instant::now() > deadline => {
                return Err(error.context("the restarted node took no session within 60 s"));
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// Everything a pass needs that does not depend on the store.
struct Inputs<'a> {
    binary: &'a Path,
    work: &'a Path,
    tarball: &'a Path,
    files: usize,
    wheels: &'a [PathBuf],
    python: &'a str,
}

async fn pass(args: &Args, store: Store, inputs: &Inputs<'_>) -> anyhow::Result<Pass> {
    let client = reqwest::Client::new();
    let data_dir = inputs.work.join(format!("serve-{store:?}").to_lowercase());
    // A cold attach today fetches the whole version before answering: the attach deadline
    // is lifted so a slow store is measured rather than placed again.
    // The node fetches nothing before a session asks (no pre-warm): what is measured is the
    // first session on a node that lacks the version.
    let config = inputs
        .work
        .join(format!("plinth-{store:?}.toml").to_lowercase());
    std::fs::write(&config, "[node]\nprewarm = []\n")?;
    let mut flags = vec![
        "--config".to_owned(),
        config.display().to_string(),
        "--builder-network".to_owned(),
        "false".to_owned(),
        "--node-attach-timeout-ms".to_owned(),
        "600000".to_owned(),
    ];
    if store == Store::S3 {
        flags.push("--blob-url".to_owned());
        flags.push(fresh_bucket(&client, &args.s3_endpoint).await?);
    }
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let mut service = Service::start(inputs.binary, &data_dir, &flags).await?;
    let base = service.base.clone();

    // The big version: imported as a tar, built, active.
    let big = service.environment(&client, "Cold version").await?;
    let file = tokio::fs::File::open(inputs.tarball).await?;
    let body = reqwest::Body::wrap_stream(tokio_util::io::ReaderStream::with_capacity(
        file,
        256 * 1024,
    ));
    let begun = Instant::now();
    let report: serde_json::Value = client
        .post(format!("{base}/v1/environments/{big}/import"))
        .header("content-type", "application/x-tar")
        .body(body)
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    let import_seconds = begun.elapsed().as_secs_f64();
    anyhow::ensure!(
        report["files"].as_u64() == Some(inputs.files as u64 + 1),
        "import report: {report}"
    );
    let build_seconds = build(&client, &base, &big, 1).await?;

    // The build bench's project, from its wheelhouse.
    let python = service.environment(&client, "Cold python").await?;
    let files = format!("{base}/v1/environments/{python}/files");
    for wheel in inputs.wheels {
        let name = wheel.file_name().context("wheel name")?.to_string_lossy();
        put(
            &client,
            format!("{files}/wheels/{name}"),
            std::fs::read(wheel)?,
        )
        .await?;
    }
    let requirements = format!(
        "--no-index\n--find-links wheels\n{}",
        crate::build::REQUIREMENTS
    );
    put(
        &client,
        format!("{files}/requirements.txt"),
        requirements.into(),
    )
    .await?;
    put(
        &client,
        format!("{files}/app.py"),
        b"print('v1')\n".to_vec(),
    )
    .await?;
    build(&client, &base, &python, 1).await?;
    let record: serde_json::Value = client
        .get(format!("{base}/v1/environments/{python}"))
        .send()
        .await?
        .json()
        .await?;
    let packages = record["packages"].as_array().map_or(0, Vec::len);

    let probe = service.environment(&client, "Cold probe").await?;
    put(
        &client,
        format!("{base}/v1/environments/{probe}/files/hello.py"),
        b"print('hello')\n".to_vec(),
    )
    .await?;
    build(&client, &base, &probe, 1).await?;
    // The import runs as measured (and fails here, before any round, if it cannot).
    tokio::task::block_in_place(|| {
        let mut lean = Http1::connect(&base)?;
        create_exec(&mut lean, &python, inputs.python)
    })?;
    // The node that ran the project's first session tells what it read and stores the
    // version's pack a few seconds after (as a node that stays up does): the rounds start
    // once it has.
    let packed = wait_for_pack(&client, &base).await?;
    println!(
        "\n{}: version imported in {import_seconds:.1} s, built and active in {build_seconds:.1} s; \
         the project: {packages} packages; {packed}",
        store.describe()
    );
    println!(
        "| round | cold: create + `exec true` | of which create | warm | python cold | of which create | python warm | first |"
    );
    println!("|---|---|---|---|---|---|---|---|");

    let mut rounds = Vec::with_capacity(args.rounds);
    for round in 0..args.rounds {
        service.stop().await?;
        // The node's whole state directory (its version cache, and whatever else it keeps of
        // versions): it starts as a new node would.
        plinth_node::cache::remove_tree(&data_dir.join("node"));
        service = Service::start(inputs.binary, &data_dir, &flags).await?;
        wait_for_node(&service.base, &probe).await?;
        let figures = tokio::task::block_in_place(|| {
            let mut lean = Http1::connect(&service.base)?;
            // Every other round the project goes first, so neither pair always finds the
            // node busy with what the other left running (a fetch in the background, say).
            let mut pair = |environment: &str, command: &str| {
                // What an earlier fetch left to write back is written first, as before each
                // materialization in `plinth-bench sessions`.
                sync();
                let cold = create_exec(&mut lean, environment, command)?;
                sync();
                let warm = create_exec(&mut lean, environment, command)?;
                anyhow::Ok((cold, warm))
            };
            let ((cold, warm), (python_cold, python_warm)) = if round % 2 == 0 {
                let big = pair(&big, "true")?;
                (big, pair(&python, inputs.python)?)
            } else {
                let project = pair(&python, inputs.python)?;
                (pair(&big, "true")?, project)
            };
            anyhow::Ok(Round {
                cold_create: cold.create,
                cold: cold.total,
                warm: warm.total,
                python_cold: python_cold.total,
                python_cold_exec: python_cold.total - python_cold.create,
                python_warm: python_warm.total,
                python_warm_exec: python_warm.total - python_warm.create,
                project_first: round % 2 == 1,
            })
        })?;
        println!(
            "| {} | {:.0} ms | {:.0} ms | {:.1} ms | {:.0} ms | {:.0} ms | {:.0} ms | {} |",
            round + 1,
            figures.cold,
            figures.cold_create,
            figures.warm,
            figures.python_cold,
            figures.python_cold - figures.python_cold_exec,
            figures.python_warm,
            if figures.project_first {
                "project"
            } else {
                "version"
            }
        );
        rounds.push(figures);
    }
    service.stop().await?;
    plinth_node::cache::remove_tree(&data_dir);
    Ok(Pass {
        store,
        import_seconds,
        build_seconds,
        packages,
        rounds,
    })
}

pub async fn run(
    args: &Args,
    files: usize,
    mib: u64,
    fresh_fs: bool,
    journal: bool,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        rustix::process::geteuid().is_root(),
        "the session benchmark needs root (mount namespaces, session uids)"
    );
    anyhow::ensure!(args.rounds > 0, "--rounds must be at least 1");
    let binary = crate::service::binary()?;
    let work = crate::fresh_fs::WorkDir::make(fresh_fs, journal)?;
    println!("plinth-bench sessions --cold");
    println!("machine: {}", crate::machine());
    println!("working on {}", work.describe());

    // The version: the materialize part's tree, under `tree/` so its `.venv` and
    // `node_modules` are the project's own (a build drops them only at the top level).
    let source = work.path().join("source");
    let (paths, bytes) = crate::shared::generate(&source.join("tree"), files, mib * 1024 * 1024)?;
    std::fs::write(source.join("run.py"), "print('hi')\n")?;
    let tarball = work.path().join("version.tar");
    let status = Command::new("tar")
        .arg("-cf")
        .arg(&tarball)
        .arg("-C")
        .arg(&source)
        .args(["run.py", "tree"])
        .status()?;
    anyhow::ensure!(status.success(), "tar -c failed");
    plinth_node::cache::remove_tree(&source);

    // The build bench's project: its wheelhouse, from PyPI once, as `plinth-bench build`.
    let wheels = crate::build::wheelhouse(&work.path().join("wheelhouse"))?;
    let modules = import_names(&wheels)?;
    let python = format!("python -c 'import {}'", modules.join(", "));
    println!(
        "version: {} files, {:.0} MiB; the build bench's project: {} wheels; {python}",
        paths.len(),
        bytes as f64 / 1024.0 / 1024.0,
        wheels.len()
    );

    let inputs = Inputs {
        binary: &binary,
        work: work.path(),
        tarball: &tarball,
        files: paths.len(),
        wheels: &wheels,
        python: &python,
    };
    let mut passes = Vec::new();
    for store in &args.stores {
        passes.push(pass(args, *store, &inputs).await?);
    }

    println!(
        "\ncold start: {} files, {:.0} MiB; {} rounds, each on a node started with an empty state \
         directory (its cache with it); warm: the same node straight after",
        paths.len(),
        bytes as f64 / 1024.0 / 1024.0,
        args.rounds
    );
    println!(
        "| blob store | cold: create + first `exec true`, p50 (p99) | of which create | warm, p50 (p99) | cold / warm |"
    );
    println!("|---|---|---|---|---|");
    for pass in &passes {
        let pick = |f: fn(&Round) -> f64| pass.rounds.iter().map(f).collect::<Vec<f64>>();
        let (cold, create, warm) = (pick(|r| r.cold), pick(|r| r.cold_create), pick(|r| r.warm));
        println!(
            "| {} | {:.0} ms ({:.0}) | {:.0} ms | {:.2} ms ({:.2}) | {:.0}× |",
            pass.store.describe(),
            percentile(&cold, 0.5),
            percentile(&cold, 0.99),
            percentile(&create, 0.5),
            percentile(&warm, 0.5),
            percentile(&warm, 0.99),
            percentile(&cold, 0.5) / percentile(&warm, 0.5)
        );
    }
    println!("\ncreate + `python -c 'import …'` of the build bench's project, same rounds");
    println!(
        "| blob store | packages | cold, p50 (p99) | of which the command | warm, p50 (p99) | of which the command | cold / warm (target ≤ 2×) | cold p50 as the first session after start; after the big version |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for pass in &passes {
        let pick = |f: fn(&Round) -> f64| pass.rounds.iter().map(f).collect::<Vec<f64>>();
        let (cold, cold_exec, warm, warm_exec) = (
            pick(|r| r.python_cold),
            pick(|r| r.python_cold_exec),
            pick(|r| r.python_warm),
            pick(|r| r.python_warm_exec),
        );
        let first: Vec<f64> = pass
            .rounds
            .iter()
            .filter(|r| r.project_first)
            .map(|r| r.python_cold)
            .collect();
        let after: Vec<f64> = pass
            .rounds
            .iter()
            .filter(|r| !r.project_first)
            .map(|r| r.python_cold)
            .collect();
        let median = |values: &[f64]| {
            if values.is_empty() {
                "-".to_owned()
            } else {
                format!("{:.0} ms", percentile(values, 0.5))
            }
        };
        println!(
            "| {} | {} | {:.0} ms ({:.0}) | {:.0} ms | {:.0} ms ({:.0}) | {:.0} ms | {:.2}× | {}; {} |",
            pass.store.describe(),
            pass.packages,
            percentile(&cold, 0.5),
            percentile(&cold, 0.99),
            percentile(&cold_exec, 0.5),
            percentile(&warm, 0.5),
            percentile(&warm, 0.99),
            percentile(&warm_exec, 0.5),
            percentile(&cold, 0.5) / percentile(&warm, 0.5),
            median(&first),
            median(&after)
        );
    }
    for pass in &passes {
        println!(
            "{}: the version's import took {:.1} s and its build {:.1} s (once, before the rounds)",
            pass.store.describe(),
            pass.import_seconds,
            pass.build_seconds
        );
    }
    Ok(())
}
