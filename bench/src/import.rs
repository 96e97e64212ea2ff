//! `plinth-bench import`: importing a project-shaped tar.gz (≥ 20,000 files, ≥ 300 MB, like a
//! project with its `.venv` and `node_modules`) into a `plinth serve` running as its own
//! process, side by side with `tar -xzf` of the same archive onto the same disk (the
//! baseline); the service's peak memory during the import; and small-file PUT/GET through
//! the gateway beside plain file writes and reads on the same disk.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::Semaphore;

use crate::service::Service;

/// Import and small-file benchmarks.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Files in the generated project.
    #[arg(long, default_value_t = 20_000)]
    files: usize,
    /// Size of the generated project, MiB (uncompressed).
    #[arg(long, default_value_t = 320)]
    mib: u64,
    /// Rounds of each path, alternating; each round starts a fresh service and data directory.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Small (2 KiB) files to PUT and then GET.
    #[arg(long, default_value_t = 2000)]
    small_files: usize,
    /// Small-file requests in flight at once.
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
}

/// A deterministic generator, so every run imports the same project.
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

/// Writes the project as a tar.gz: source files, a venv's and a node_modules' worth of small
/// files (median ~2 KB), some medium ones, and a few large shared objects. Content is words
/// drawn from a 512-word vocabulary, so it compresses about as source code does, and it is
/// different in every file.
fn generate(path: &Path, files: usize, total: u64) -> anyhow::Result<(u64, usize)> {
    let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
    let mut sizes: Vec<u64> = (0..files)
        .map(|i| match i % 100 {
            0 => 0, // large: filled below
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
    let file = std::fs::File::create(path)?;
    let gz =
        flate2::write::GzEncoder::new(std::io::BufWriter::new(file), flate2::Compression::fast());
    let mut builder = tar::Builder::new(gz);
    let vocabulary: Vec<Vec<u8>> = (0..512)
        .map(|_| {
            let len = 2 + (rng.next() % 9) as usize;
            (0..len).map(|_| b'a' + (rng.next() % 26) as u8).collect()
        })
        .collect();
    let mut bytes = 0u64;
    for (i, size) in sizes.iter().enumerate() {
        let name = match i % 10 {
            0..=5 => format!(
                "studio/.venv/lib/python3.12/site-packages/pkg{}/mod{}.py",
                i % 400,
                i
            ),
            6..=8 => format!("studio/node_modules/lib{}/dist/file{}.js", i % 300, i),
            _ => format!("studio/src/module{}/part{}.py", i % 50, i),
        };
        let mut data = Vec::with_capacity(*size as usize);
        data.extend_from_slice(format!("# {name}\n").as_bytes());
        while (data.len() as u64) < *size {
            let pick = rng.next();
            data.extend_from_slice(&vocabulary[(pick % 512) as usize]);
            data.push(if pick.is_multiple_of(11) { b'\n' } else { b' ' });
        }
        data.truncate(*size as usize);
        let mut header = tar::Header::new_gnu();
        header.set_size(data.len() as u64);
        header.set_mode(if i % 97 == 0 { 0o755 } else { 0o644 });
        header.set_entry_type(tar::EntryType::Regular);
        builder.append_data(&mut header, &name, data.as_slice())?;
        bytes += data.len() as u64;
    }
    let mut writer = builder.into_inner()?.finish()?;
    writer.flush()?;
    Ok((bytes, files))
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let binary = crate::service::binary()?;
    // Everything on one disk: the temporary directory's (PLINTH_BENCH_DIR to choose another).
    let work = crate::fresh_fs::WorkDir::make(false, false)?;
    let archive = work.path().join("project.tar.gz");
    let started = Instant::now();
    let (bytes, files) = generate(&archive, args.files, args.mib * 1024 * 1024)?;
    let archive_bytes = std::fs::metadata(&archive)?.len();
    eprintln!(
        "generated {files} files, {bytes} bytes ({archive_bytes} compressed) in {:.1} s",
        started.elapsed().as_secs_f64()
    );

    let client = reqwest::Client::builder().build()?;
    let mut tar_seconds = Vec::new();
    let mut plinth_seconds = Vec::new();
    let mut peaks = Vec::new();
    for round in 0..args.rounds {
        // Baseline: tar -xzf onto the same disk.
        let target = work.path().join(format!("tar-{round}"));
        std::fs::create_dir_all(&target)?;
        let begun = Instant::now();
        let status = Command::new("tar")
            .arg("-xzf")
            .arg(&archive)
            .arg("-C")
            .arg(&target)
            .status()?;
        anyhow::ensure!(status.success(), "tar failed");
        tar_seconds.push(begun.elapsed().as_secs_f64());
        std::fs::remove_dir_all(&target)?;

        // Plinth: a fresh service and data directory each round, so no blob is already there.
        let data_dir = work.path().join(format!("plinth-{round}"));
        let service = Service::start(&binary, &data_dir, &[]).await?;
        let id = service
            .environment(&client, &format!("Import {round}"))
            .await?;
        let file = tokio::fs::File::open(&archive).await?;
        let body = reqwest::Body::wrap_stream(tokio_util::io::ReaderStream::with_capacity(
            file,
            256 * 1024,
        ));
        let begun = Instant::now();
        let report: serde_json::Value = client
            .post(format!("{}/v1/environments/{id}/import", service.base))
            .header("content-type", "application/gzip")
            .body(body)
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        plinth_seconds.push(begun.elapsed().as_secs_f64());
        anyhow::ensure!(
            report["files"].as_u64() == Some(files as u64),
            "import report: {report}"
        );
        peaks.push(service.peak_mib());
        drop(service);
        std::fs::remove_dir_all(&data_dir)?;
    }

    let small = small_files(&binary, work.path(), &client, &args).await?;

    let (tar, plinth) = (median(tar_seconds.clone()), median(plinth_seconds.clone()));
    println!("plinth-bench import");
    println!("machine: {}", crate::machine());
    println!(
        "project: {files} files, {:.0} MiB uncompressed, {:.0} MiB tar.gz; {} rounds, median shown",
        bytes as f64 / 1048576.0,
        archive_bytes as f64 / 1048576.0,
        args.rounds
    );
    println!(
        "tar -xzf onto the same disk (baseline)   {tar:>7.2} s   {:>8.0} files/s   rounds {tar_seconds:.2?}",
        files as f64 / tar
    );
    println!(
        "plinth import through the gateway        {plinth:>7.2} s   {:>8.0} files/s   rounds {plinth_seconds:.2?}",
        files as f64 / plinth
    );
    println!(
        "ratio: plinth import takes {:.2}x the time of tar -xzf",
        plinth / tar
    );
    println!(
        "service peak memory (VmHWM of plinth serve) during import: max {:.0} MiB over rounds {peaks:.0?} (target < 100 MiB)",
        peaks.iter().cloned().fold(0.0, f64::max)
    );
    println!("{small}");
    Ok(())
}

async fn small_files(
    binary: &Path,
    work: &Path,
    client: &reqwest::Client,
    args: &Args,
) -> anyhow::Result<String> {
    let data_dir = work.join("plinth-small");
    let service = Service::start(binary, &data_dir, &[]).await?;
    let id = service.environment(client, "Small files").await?;
    let contents: Vec<(String, Vec<u8>)> = (0..args.small_files)
        .map(|i| {
            let mut data = format!("file {i}\n").into_bytes();
            data.resize(2048, b'x');
            (format!("dir{}/file{i}.txt", i % 20), data)
        })
        .collect();
    let contents = Arc::new(contents);

    let permits = Arc::new(Semaphore::new(args.concurrency));
    let begun = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..contents.len() {
        let permit = permits.clone().acquire_owned().await?;
        let (client, contents, url) = (
            client.clone(),
            contents.clone(),
            format!("{}/v1/environments/{id}/files", service.base),
        );
        tasks.spawn(async move {
            let _permit = permit;
            let (path, data) = &contents[i];
            client
                .put(format!("{url}/{path}"))
                .body(data.clone())
                .send()
                .await?
                .error_for_status()?;
            anyhow::Ok(())
        });
    }
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    let put_rate = contents.len() as f64 / begun.elapsed().as_secs_f64();

    let begun = Instant::now();
    for i in 0..contents.len() {
        let permit = permits.clone().acquire_owned().await?;
        let (client, contents, url) = (
            client.clone(),
            contents.clone(),
            format!("{}/v1/environments/{id}/files", service.base),
        );
        tasks.spawn(async move {
            let _permit = permit;
            let (path, data) = &contents[i];
            let body = client
                .get(format!("{url}/{path}"))
                .send()
                .await?
                .error_for_status()?
                .bytes()
                .await?;
            anyhow::ensure!(
                body.as_ref() == data.as_slice(),
                "{path} came back different"
            );
            Ok(())
        });
    }
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    let get_rate = contents.len() as f64 / begun.elapsed().as_secs_f64();
    drop(service);

    // Baseline: the same files written (and fsynced, as the service's stores are) and read
    // back with plain file calls on the same disk, the same number at once.
    let plain: PathBuf = work.join("plain");
    let begun = Instant::now();
    for i in 0..contents.len() {
        let permit = permits.clone().acquire_owned().await?;
        let (contents, root) = (contents.clone(), plain.clone());
        tasks.spawn(async move {
            let _permit = permit;
            let (path, data) = &contents[i];
            let target = root.join(path);
            if let Some(parent) = target.parent() {
                tokio::fs::create_dir_all(parent).await?;
            }
            let mut file = tokio::fs::File::create(&target).await?;
            tokio::io::AsyncWriteExt::write_all(&mut file, data).await?;
            file.sync_all().await?;
            anyhow::Ok(())
        });
    }
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    let plain_put = contents.len() as f64 / begun.elapsed().as_secs_f64();
    let begun = Instant::now();
    for i in 0..contents.len() {
        let permit = permits.clone().acquire_owned().await?;
        let (contents, root) = (contents.clone(), plain.clone());
        tasks.spawn(async move {
            let _permit = permit;
            let (path, data) = &contents[i];
            let read = tokio::fs::read(root.join(path)).await?;
            anyhow::ensure!(&read == data, "plain read differs");
            Ok(())
        });
    }
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    let plain_get = contents.len() as f64 / begun.elapsed().as_secs_f64();
    Ok(format!(
        "small files ({} x 2 KiB, {} in flight): PUT {put_rate:.0}/s, GET {get_rate:.0}/s through the gateway; \
         plain fsynced writes {plain_put:.0}/s, reads {plain_get:.0}/s on the same disk (baseline); \
         ratios PUT {:.2}x, GET {:.2}x of the baseline's rate",
        contents.len(),
        args.concurrency,
        put_rate / plain_put,
        get_rate / plain_get,
    ))
}
