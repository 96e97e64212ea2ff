//! `plinth-bench build`: a Python project with 20+ real dependencies (downloaded once from
//! PyPI into a local wheelhouse, shipped inside the project so the build needs no network)
//! built through Plinth, side by side with plain `uv pip install` of the same requirements
//! from the same wheelhouse into a fresh venv with bytecode compiled (the baseline), each
//! round with cold caches; then a rebuild after changing one source file, and the time
//! `POST …/build` takes to answer.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::Context as _;

use crate::fresh_fs::WorkDir;
use crate::service::{Service, build};

/// Build benchmark.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Rounds of each path, alternating; each Plinth round has a fresh service and data.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Run on a fresh ext4 file system (a sparse image on a loop device, removed afterwards)
    /// rather than on the disk as earlier runs left it. Needs root.
    #[arg(long)]
    fresh_fs: bool,
    /// With `--fresh-fs`: give the new file system a journal (mkfs's default). Without, it
    /// has none, like the disk the figures in bench/README.md come from.
    #[arg(long)]
    journal: bool,
    /// Real public projects from PyPI and npm instead (see `build_real`): each built through
    /// Plinth and by hand, first and after a one-file change. Reaches the registries.
    #[arg(long)]
    real: bool,
}

/// The project's top-level requirements; with their dependencies, 20+ distributions.
pub(crate) const REQUIREMENTS: &str =
    "flask\nrequests\npyyaml\npytest\nrich\npython-dateutil\npytz\nattrs\n";

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn uv_binary() -> anyhow::Result<PathBuf> {
    let output = Command::new("python3")
        .args(["-c", "import uv; print(uv.find_uv_bin())"])
        .output()
        .context("python3 runs")?;
    anyhow::ensure!(
        output.status.success(),
        "uv is not installed: python3 -m pip install uv"
    );
    Ok(PathBuf::from(
        String::from_utf8_lossy(&output.stdout).trim(),
    ))
}

pub(crate) fn wheelhouse(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("requirements.txt"), REQUIREMENTS)?;
    let status = Command::new("python3")
        .args([
            "-m",
            "pip",
            "download",
            "--quiet",
            "--only-binary=:all:",
            "-d",
        ])
        .arg(dir)
        .arg("-r")
        .arg(dir.join("requirements.txt"))
        .status()?;
    anyhow::ensure!(status.success(), "pip download failed (it needs PyPI once)");
    let mut wheels: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .filter(|path| path.extension().is_some_and(|ext| ext == "whl"))
        .collect();
    wheels.sort();
    Ok(wheels)
}

/// Builds a one-file project and waits for it, so the measured build finds the builder running
/// (at start it places uv and asks each tool its version, a few hundred ms) as it would in a
/// deployment. Nothing it makes is shared with the measured project: it has no manifests, so
/// no installer runs and no download cache is filled.
async fn warm_up(client: &reqwest::Client, base: &str) -> anyhow::Result<()> {
    let created: serde_json::Value = client
        .post(format!("{base}/v1/environments"))
        .json(&serde_json::json!({"name": "Warm-up"}))
        .send()
        .await?
        .json()
        .await?;
    let id = created["id"].as_str().context("no id")?;
    client
        .put(format!("{base}/v1/environments/{id}/files/hello.py"))
        .body("print('hello')\n")
        .send()
        .await?
        .error_for_status()?;
    build(client, base, id, 1).await?;
    Ok(())
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    if args.real {
        return crate::build_real::run(&uv_binary()?, args.fresh_fs, args.journal).await;
    }
    let binary = crate::service::binary()?;
    let uv = uv_binary()?;
    let work = WorkDir::make(args.fresh_fs, args.journal)?;
    let disk = work.describe();
    let wheels = wheelhouse(&work.path().join("wheelhouse"))?;
    let requirements = format!("--no-index\n--find-links wheels\n{REQUIREMENTS}");

    let client = reqwest::Client::new();
    let (mut baseline, mut plinth, mut rebuild, mut posts) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut packages = 0;
    let mut phases = String::new();
    for round in 0..args.rounds {
        // Baseline: a fresh venv and a cold uv cache, the same wheels, bytecode compiled.
        let venv = work.path().join(format!("venv-{round}"));
        let cache = work.path().join(format!("uv-cache-{round}"));
        let begun = Instant::now();
        let status = Command::new(&uv)
            .args(["venv", "--quiet", "--python", "/usr/bin/python3"])
            .arg(&venv)
            .env("UV_CACHE_DIR", &cache)
            .status()?;
        anyhow::ensure!(status.success(), "uv venv failed");
        let status = Command::new(&uv)
            .args([
                "pip",
                "install",
                "--quiet",
                "--offline",
                "--compile-bytecode",
                "--python",
            ])
            .arg(venv.join("bin/python"))
            .args(["--no-index", "--find-links"])
            .arg(work.path().join("wheelhouse"))
            .arg("-r")
            .arg(work.path().join("wheelhouse/requirements.txt"))
            .env("UV_CACHE_DIR", &cache)
            .status()?;
        anyhow::ensure!(status.success(), "uv pip install failed");
        baseline.push(begun.elapsed().as_secs_f64());

        // Plinth: a fresh service, the project uploaded, then POST …/build until ready.
        let data_dir = work.path().join(format!("plinth-{round}"));
        let service = Service::start(&binary, &data_dir, &["--builder-network", "false"]).await?;
        warm_up(&client, &service.base).await?;
        let created: serde_json::Value = client
            .post(format!("{}/v1/environments", service.base))
            .json(&serde_json::json!({"name": format!("Bench {round}")}))
            .send()
            .await?
            .json()
            .await?;
        let id = created["id"].as_str().context("no id")?.to_owned();
        let files = format!("{}/v1/environments/{id}/files", service.base);
        for wheel in &wheels {
            let name = wheel
                .file_name()
                .context("wheel name")?
                .to_string_lossy()
                .into_owned();
            client
                .put(format!("{files}/wheels/{name}"))
                .body(std::fs::read(wheel)?)
                .send()
                .await?
                .error_for_status()?;
        }
        client
            .put(format!("{files}/requirements.txt"))
            .body(requirements.clone())
            .send()
            .await?
            .error_for_status()?;
        client
            .put(format!("{files}/app.py"))
            .body("print('v1')\n")
            .send()
            .await?
            .error_for_status()?;
        let (post, full) = build(&client, &service.base, &id, 1).await?;
        posts.push(post);
        plinth.push(full);
        client
            .put(format!("{files}/app.py"))
            .body("print('v2')\n")
            .send()
            .await?
            .error_for_status()?;
        let (post, again) = build(&client, &service.base, &id, 2).await?;
        posts.push(post);
        rebuild.push(again);
        phases.clear();
        for version in [1, 2] {
            let build: serde_json::Value = client
                .get(format!(
                    "{}/v1/environments/{id}/builds/{version}",
                    service.base
                ))
                .send()
                .await?
                .json()
                .await?;
            phases.push_str(&format!("  version {version}:\n"));
            for line in build["log"].as_str().unwrap_or("").lines() {
                if line.starts_with("==> ") && (line.contains(" in ") || line.contains("reusing")) {
                    phases.push_str(&format!("    {line}\n"));
                }
            }
        }
        let record: serde_json::Value = client
            .get(format!("{}/v1/environments/{id}", service.base))
            .send()
            .await?
            .json()
            .await?;
        packages = record["packages"].as_array().map_or(0, Vec::len);
        drop(service);
    }
    // Every round's files stay until the end: deleting thousands of files just before the next
    // path runs slows that path's file creation (ext4 without a journal, as on the machine the
    // figures come from, skips inodes freed in the last few seconds when allocating).
    drop(work);
    let (base, full, again) = (
        median(baseline.clone()),
        median(plinth.clone()),
        median(rebuild.clone()),
    );
    println!("plinth-bench build");
    println!("machine: {}", crate::machine());
    println!("working on {disk}");
    println!(
        "project: {} wheels ({packages} packages installed) from a local wheelhouse, cold caches, {} rounds, median",
        wheels.len(),
        args.rounds
    );
    println!(
        "uv venv + uv pip install --compile-bytecode (baseline)  {base:>6.2} s   rounds {baseline:.2?}"
    );
    println!(
        "plinth build, POST to ready                              {full:>6.2} s   rounds {plinth:.2?}"
    );
    println!(
        "ratio: a Plinth build takes {:.2}x the baseline (target <= 1.3)",
        full / base
    );
    println!(
        "rebuild after changing one source file                   {again:>6.2} s   rounds {rebuild:.2?} (target < 2 s)"
    );
    print!("phases of the last round (from the build logs):\n{phases}");
    println!(
        "POST …/build answered in median {:.1} ms (max {:.1} ms)",
        median(posts.clone()) * 1000.0,
        posts.iter().cloned().fold(0.0, f64::max) * 1000.0
    );
    Ok(())
}
