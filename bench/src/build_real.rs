//! `plinth-bench build --real`: real public projects fetched as a user would (a Python sdist
//! with `pip download --no-binary :all: --no-deps`, an npm tarball with `npm pack`), each built
//! through Plinth (imported as the archive, the builder reaching the real registries through its
//! egress proxy) and by hand (`uv sync`, or `npm install`, in the unpacked archive), side by
//! side in one run: a first build, then a rebuild after a one-line change to one source file
//! (by hand: the same command again over the existing tree). Both start with an empty download
//! cache that the projects share in the order listed (Plinth's builds of one scope share
//! theirs). This bench reaches PyPI and the npm registry.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::Context as _;

use crate::fresh_fs::WorkDir;
use crate::service::Service;

/// How a project is fetched and installed.
#[derive(Clone, Copy)]
enum Kind {
    /// A sdist from PyPI; installed with `uv sync`.
    Python,
    /// A tarball from the npm registry; installed with `npm install`.
    Npm,
}

struct Project {
    /// `name==version` (PyPI) or `name@version` (npm).
    spec: &'static str,
    kind: Kind,
    /// The source file the rebuild changes, relative to the project's root.
    changed: &'static str,
}

const PROJECTS: [Project; 5] = [
    Project {
        spec: "itsdangerous==2.2.0",
        kind: Kind::Python,
        changed: "src/itsdangerous/__init__.py",
    },
    Project {
        spec: "iniconfig==2.1.0",
        kind: Kind::Python,
        changed: "src/iniconfig/__init__.py",
    },
    Project {
        spec: "more-itertools==10.5.0",
        kind: Kind::Python,
        changed: "more_itertools/__init__.py",
    },
    Project {
        spec: "attrs==24.2.0",
        kind: Kind::Python,
        changed: "src/attr/__init__.py",
    },
    Project {
        spec: "express@4.21.2",
        kind: Kind::Npm,
        changed: "lib/express.js",
    },
];

/// What a change to the changed file adds.
const CHANGE: &str = "\n# changed for the rebuild\n";
const JS_CHANGE: &str = "\n// changed for the rebuild\n";

fn change(kind: Kind) -> &'static str {
    match kind {
        Kind::Python => CHANGE,
        Kind::Npm => JS_CHANGE,
    }
}

/// Fetches `project`'s archive into `dir`, as a user would; answers its path.
fn fetch(project: &Project, dir: &Path) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let before: Vec<PathBuf> = list(dir)?;
    let status = match project.kind {
        Kind::Python => Command::new("python3")
            .args([
                "-m",
                "pip",
                "download",
                "--quiet",
                "--no-deps",
                "--no-binary",
                ":all:",
                project.spec,
                "-d",
            ])
            .arg(dir)
            .status()?,
        Kind::Npm => Command::new("npm")
            .args(["pack", "--silent", project.spec, "--pack-destination"])
            .arg(dir)
            .stdout(std::process::Stdio::null())
            .status()?,
    };
    anyhow::ensure!(status.success(), "fetching {} failed", project.spec);
    list(dir)?
        .into_iter()
        .find(|path| !before.contains(path))
        .with_context(|| format!("fetching {} wrote no archive", project.spec))
}

fn list(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    Ok(std::fs::read_dir(dir)?
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .collect())
}

/// Unpacks a `.tar.gz` into `dir`, stripping its one wrapping directory.
fn unpack(archive: &Path, dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    let status = Command::new("tar")
        .args(["-xzf"])
        .arg(archive)
        .args(["--strip-components=1", "-C"])
        .arg(dir)
        .status()?;
    anyhow::ensure!(status.success(), "unpacking {} failed", archive.display());
    Ok(())
}

/// The by-hand install in `dir` with the download cache `cache`; answers its seconds.
fn by_hand(kind: Kind, uv: &Path, dir: &Path, cache: &Path) -> anyhow::Result<f64> {
    let begun = Instant::now();
    let status = match kind {
        Kind::Python => Command::new(uv)
            .args(["sync", "--quiet", "--python", "/usr/bin/python3"])
            .current_dir(dir)
            .env("UV_CACHE_DIR", cache)
            // As a build does: bytecode for every installed file.
            .env("UV_COMPILE_BYTECODE", "1")
            .env("UV_PYTHON_DOWNLOADS", "never")
            .status()?,
        Kind::Npm => Command::new("npm")
            .args(["install", "--silent", "--no-audit", "--no-fund"])
            .current_dir(dir)
            .env("npm_config_cache", cache)
            .status()?,
    };
    anyhow::ensure!(status.success(), "by hand in {} failed", dir.display());
    Ok(begun.elapsed().as_secs_f64())
}

/// The phase lines of build `version`'s log.
async fn phases(
    client: &reqwest::Client,
    base: &str,
    id: &str,
    version: u64,
) -> anyhow::Result<String> {
    let build: serde_json::Value = client
        .get(format!("{base}/v1/environments/{id}/builds/{version}"))
        .send()
        .await?
        .json()
        .await?;
    Ok(build["log"]
        .as_str()
        .unwrap_or("")
        .lines()
        .filter(|line| line.starts_with("==> "))
        .map(|line| format!("      {line}\n"))
        .collect())
}

struct Row {
    spec: &'static str,
    first_hand: f64,
    first_plinth: f64,
    again_hand: f64,
    again_plinth: f64,
    phases: String,
}

pub async fn run(uv: &Path, fresh_fs: bool, journal: bool) -> anyhow::Result<()> {
    let binary = crate::service::binary()?;
    let work = WorkDir::make(fresh_fs, journal)?;
    let disk = work.describe();
    let client = reqwest::Client::new();
    let service = Service::start(&binary, &work.path().join("plinth"), &[]).await?;
    let mut rows = Vec::new();
    for (index, project) in PROJECTS.iter().enumerate() {
        let archive = fetch(project, &work.path().join("archives"))?;
        let dir = work.path().join(format!("by-hand-{index}"));
        unpack(&archive, &dir)?;
        // One download cache for all, as a user's machine has (and as Plinth's builds of one
        // scope share theirs): projects later in the list find what earlier ones fetched.
        let cache = work.path().join("cache");
        let first_hand = by_hand(project.kind, uv, &dir, &cache)?;
        let original = std::fs::read_to_string(dir.join(project.changed))
            .with_context(|| format!("{} has no {}", project.spec, project.changed))?;
        let changed = format!("{original}{}", change(project.kind));
        std::fs::write(dir.join(project.changed), &changed)?;
        let again_hand = by_hand(project.kind, uv, &dir, &cache)?;

        let id = service
            .environment(&client, &format!("Real {index}"))
            .await?;
        client
            .post(format!("{}/v1/environments/{id}/import", service.base))
            .header("content-type", "application/gzip")
            .body(std::fs::read(&archive)?)
            .send()
            .await?
            .error_for_status()?;
        let (_, first_plinth) = crate::service::build(&client, &service.base, &id, 1).await?;
        client
            .put(format!(
                "{}/v1/environments/{id}/files/{}",
                service.base, project.changed
            ))
            .body(changed)
            .send()
            .await?
            .error_for_status()?;
        let (_, again_plinth) = crate::service::build(&client, &service.base, &id, 2).await?;
        let mut shown = String::new();
        for version in [1, 2] {
            shown.push_str(&format!("    version {version}:\n"));
            shown.push_str(&phases(&client, &service.base, &id, version).await?);
        }
        rows.push(Row {
            spec: project.spec,
            first_hand,
            first_plinth,
            again_hand,
            again_plinth,
            phases: shown,
        });
    }
    drop(service);
    drop(work);
    println!("plinth-bench build --real");
    println!("machine: {}", crate::machine());
    println!("working on {disk}");
    println!(
        "by hand: uv sync (UV_COMPILE_BYTECODE=1) or npm install in the unpacked archive, one download cache for all (empty at the start, as Plinth's); then the same command after the one-file change"
    );
    println!(
        "{:<24} {:>9} {:>9} {:>6}   {:>9} {:>9} {:>6} {:>7}",
        "project", "first/hand", "plinth", "ratio", "again/hand", "plinth", "ratio", "target"
    );
    for row in &rows {
        let target = (row.again_hand * 1.5).max(2.0);
        println!(
            "{:<24} {:>8.2}s {:>8.2}s {:>5.2}x   {:>8.2}s {:>8.2}s {:>5.2}x {:>6.2}s",
            row.spec,
            row.first_hand,
            row.first_plinth,
            row.first_plinth / row.first_hand,
            row.again_hand,
            row.again_plinth,
            row.again_plinth / row.again_hand,
            target
        );
    }
    println!("targets: a first build <= 1.2x by hand; a rebuild <= max(2 s, 1.5x by hand)");
    println!("phases (from the build logs):");
    for row in &rows {
        print!("  {}\n{}", row.spec, row.phases);
    }
    Ok(())
}
