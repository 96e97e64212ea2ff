//! `plinth-bench push`: `plinth push` of a 20,000-file project directory beside the same
//! import done by hand, `tar -czf - … | curl -T - …` (the baseline): both stream one tar.gz
//! made while the directory is read into `POST /v1/environments/{id}/import?replace=true` of
//! a `plinth serve` running as its own process, each round on a fresh data directory so no
//! blob is already stored. What differs is only the client: the walk (honouring ignore
//! files), the compression and the upload.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use crate::service::Service;

/// Push benchmark.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Files in the generated project.
    #[arg(long, default_value_t = 20_000)]
    files: usize,
    /// Size of the generated project, MiB (at least what its small and medium files take:
    /// about 320 MiB for 20,000 files).
    #[arg(long, default_value_t = 320)]
    mib: u64,
    /// Rounds of each path, alternating; each round starts a fresh service and data directory.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
}

/// A deterministic generator, so every run pushes the same project.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
}

/// Writes a project of `files` files totalling about `total` bytes under `root`: mostly
/// small source-like files (0.2–4 KB) in a few hundred directories, some of 8–200 KB and a
/// few large ones; word-like content, different in every file, that compresses as source
/// does.
fn generate(root: &Path, files: usize, total: u64) -> anyhow::Result<u64> {
    let mut rng = XorShift(0x2545_f491_4f6c_dd1d);
    let mut sizes: Vec<u64> = (0..files)
        .map(|i| match i % 100 {
            0 => 0,
            1..=14 => 8 * 1024 + rng.next() % (192 * 1024),
            _ => 200 + rng.next() % 3800,
        })
        .collect();
    let small: u64 = sizes.iter().sum();
    let large_count = sizes.iter().filter(|size| **size == 0).count().max(1) as u64;
    let large_each = total.saturating_sub(small) / large_count;
    for size in &mut sizes {
        if *size == 0 {
            *size = large_each;
        }
    }
    let vocabulary: Vec<Vec<u8>> = (0..512)
        .map(|_| {
            let len = 2 + (rng.next() % 9) as usize;
            (0..len).map(|_| b'a' + (rng.next() % 26) as u8).collect()
        })
        .collect();
    let mut bytes = 0u64;
    for (i, size) in sizes.iter().enumerate() {
        let name = match i % 10 {
            0..=5 => format!("vendor/pkg{}/mod{}.py", i % 400, i),
            6..=8 => format!("web/lib{}/dist/file{}.js", i % 300, i),
            _ => format!("src/module{}/part{}.py", i % 50, i),
        };
        let mut data = Vec::with_capacity(*size as usize);
        data.extend_from_slice(format!("# {name}\n").as_bytes());
        while (data.len() as u64) < *size {
            let pick = rng.next();
            data.extend_from_slice(&vocabulary[(pick % 512) as usize]);
            data.push(if pick.is_multiple_of(11) { b'\n' } else { b' ' });
        }
        data.truncate(*size as usize);
        let path = root.join(&name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&path, &data)?;
        bytes += data.len() as u64;
    }
    Ok(bytes)
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// Runs `command` to its end off the runtime; answers its stdout, failing on a bad status.
async fn run(mut command: Command) -> anyhow::Result<String> {
    let output = tokio::task::spawn_blocking(move || {
        command.stdin(Stdio::null()).stderr(Stdio::piped()).output()
    })
    .await??;
    anyhow::ensure!(
        output.status.success(),
        "{:?}: {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// The same import by hand: `tar` streams a tar.gz (with `gzip`'s flags from `level`) into
/// `curl`, which streams it to the server.
fn tar_curl(project: &Path, url: &str, level: &str) -> anyhow::Result<Command> {
    let parent = project
        .parent()
        .ok_or_else(|| anyhow::anyhow!("no parent"))?;
    let name = project
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| anyhow::anyhow!("no name"))?;
    let script = format!(
        "set -o pipefail; tar -C '{}' -I 'gzip {level}' -cf - '{name}' | curl -sS --fail -X POST \
         -H 'content-type: application/gzip' -T - '{url}'",
        parent.display()
    );
    let mut command = Command::new("bash");
    command.arg("-c").arg(script);
    Ok(command)
}

pub async fn run_bench(args: Args) -> anyhow::Result<()> {
    let binary = crate::service::binary()?;
    let work = crate::fresh_fs::WorkDir::make(false, false)?;
    let project = work.path().join("project");
    let started = Instant::now();
    let bytes = generate(&project, args.files, args.mib * 1024 * 1024)?;
    eprintln!(
        "generated {} files, {bytes} bytes in {:.1} s",
        args.files,
        started.elapsed().as_secs_f64()
    );
    let client = reqwest::Client::builder().build()?;
    // Name, then per round seconds.
    let mut paths: Vec<(&str, Vec<f64>)> = vec![
        ("tar -czf (gzip -6) | curl -T - (baseline)", Vec::new()),
        ("tar (gzip -1) | curl -T -", Vec::new()),
        ("plinth push", Vec::new()),
    ];
    for round in 0..args.rounds {
        for (index, (_, seconds)) in paths.iter_mut().enumerate() {
            let data_dir = work.path().join(format!("plinth-{round}-{index}"));
            let service = Service::start(&binary, &data_dir, &[]).await?;
            let id = service
                .environment(&client, &format!("Push {round} {index}"))
                .await?;
            let url = format!("{}/v1/environments/{id}/import?replace=true", service.base);
            let command = match index {
                0 => tar_curl(&project, &url, "-6")?,
                1 => tar_curl(&project, &url, "-1")?,
                _ => {
                    let mut command = Command::new(&binary);
                    command
                        .args(["push", &id])
                        .arg(&project)
                        .args(["--output", "json"])
                        .env("PLINTH_URL", &service.base)
                        .env_remove("PLINTH_TOKEN");
                    command
                }
            };
            let begun = Instant::now();
            let answer = run(command).await?;
            seconds.push(begun.elapsed().as_secs_f64());
            let report: serde_json::Value = serde_json::from_str(answer.trim())?;
            anyhow::ensure!(
                report["files"].as_u64() == Some(args.files as u64),
                "import report: {report}"
            );
            drop(service);
            std::fs::remove_dir_all(&data_dir)?;
        }
    }
    let baseline = median(paths[0].1.clone());
    println!("plinth-bench push");
    println!("machine: {}", crate::machine());
    println!(
        "project: {} files, {:.0} MiB in a directory; {} rounds, median shown",
        args.files,
        bytes as f64 / 1048576.0,
        args.rounds
    );
    for (name, seconds) in &paths {
        let median = median(seconds.clone());
        println!(
            "{name:<44} {median:>7.2} s   {:>5.2}x   rounds {seconds:.2?}",
            median / baseline
        );
    }
    Ok(())
}
