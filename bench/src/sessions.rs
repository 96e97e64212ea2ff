//! `plinth-bench sessions`: what a session costs, beside the floors of the same machine.
//!
//! 1. Session create + first `exec true` on a cached version, through the gateway of a
//!    `plinth serve` (release build, its own process; the whole sandbox: its own namespaces,
//!    allow-listed root, cgroup limits, seccomp, egress proxy), p50 and p99; beside two
//!    floors with raw system calls in this process: the sandbox floor (a cgroup with the same
//!    limits made and joined, then the same namespaces — mount, PID, IPC, UTS, network,
//!    cgroup — a read-only bind, a fork into the PID namespace, exec of `true`, the cgroup
//!    removed), and the earlier mount-only floor (fork + `unshare(CLONE_NEWNS)` + read-only
//!    bind + exec of `true`).
//! 2. First materialization of a version of ≥ 20,000 files and ≥ 300 MB into a cold node
//!    cache (the node's own `VersionCache` over a `file://` blob store), beside `tar -x` of the
//!    same files onto the same disk; then a version that differs by one file.
//! 3. 200 sessions on one version created at once: attach rate, then one `exec true` in each
//!    at once, and the service's memory per session.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use plinth_blobs::tree::{Tree, TreeEntry};
use plinth_blobs::{BlobStore, Digest};

use crate::shared::{generate, percentile};

use crate::service::Service;

/// Session benchmarks.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Session create + first exec pairs measured (and floor runs).
    #[arg(long, default_value_t = 200)]
    attaches: usize,
    /// Files in the materialized version.
    #[arg(long, default_value_t = 20_000)]
    files: usize,
    /// Its size, MiB.
    #[arg(long, default_value_t = 320)]
    mib: u64,
    /// Sessions created at once.
    #[arg(long, default_value_t = 200)]
    concurrent: usize,
    /// Run on a fresh ext4 file system (a sparse image on a loop device, removed afterwards)
    /// rather than on the disk as earlier runs left it.
    #[arg(long)]
    fresh_fs: bool,
    /// With `--fresh-fs`: give the new file system a journal (mkfs's default). Without, it
    /// has none, like the disk the figures in bench/README.md come from.
    #[arg(long)]
    journal: bool,
    /// Instead: the first session on a node that never saw the version (its cache emptied),
    /// beside the same on the node once warm (see `sessions_cold`).
    #[arg(long)]
    cold: bool,
    #[command(flatten)]
    cold_args: crate::sessions_cold::Args,
}

/// In a new mount namespace: makes its mounts private and binds `version` read-only over
/// `target`. Raw system calls, for a child between fork and exec.
fn bind_read_only(version: &CString, target: &CString) -> std::io::Result<()> {
    rustix::mount::mount_change(
        c"/",
        rustix::mount::MountPropagationFlags::PRIVATE | rustix::mount::MountPropagationFlags::REC,
    )?;
    rustix::mount::mount_bind(&**version, &**target)?;
    rustix::mount::mount_remount(
        &**target,
        rustix::mount::MountFlags::BIND | rustix::mount::MountFlags::RDONLY,
        c"",
    )?;
    Ok(())
}

/// The floor: fork, a private mount namespace, a read-only bind of `version` over `target`,
/// exec `/bin/true`, wait. Raw system calls, like the node's own.
fn floor_once(version: &CString, target: &CString) -> anyhow::Result<f64> {
    let (version, target) = (version.clone(), target.clone());
    let begun = Instant::now();
    let mut command = Command::new("/bin/true");
    // SAFETY: only raw system calls on C strings made before the fork.
    #[allow(unsafe_code)]
    unsafe {
        command.pre_exec(move || {
            rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::NEWNS)?;
            bind_read_only(&version, &target)?;
            Ok(())
        });
    }
    let status = command.status()?;
    anyhow::ensure!(status.success(), "the floor command failed: {status}");
    Ok(begun.elapsed().as_secs_f64() * 1000.0)
}

/// The sandbox floor: what a session's sandbox is made of, with nothing else: a cgroup
/// with the session's limits made and joined, the same namespaces, a read-only bind, the
/// first process of the PID namespace forked, `/bin/true` executed there, the cgroup
/// removed.
fn sandbox_floor_once(
    cgroups: &plinth_sandbox::cgroup::Cgroups,
    run: usize,
    version: &CString,
    target: &CString,
) -> anyhow::Result<f64> {
    let (version, target) = (version.clone(), target.clone());
    let begun = Instant::now();
    let limits = plinth_sandbox::cgroup::Limits {
        memory_bytes: Some(2048 * 1024 * 1024),
        pids: Some(1024),
        cpu_millicores: Some(2000),
    };
    let cgroup = cgroups.create(&format!("floor-{run}"), &limits)?;
    let join: Vec<i32> = cgroup
        .join_fds()
        .iter()
        .map(std::os::fd::AsRawFd::as_raw_fd)
        .collect();
    let mut command = Command::new("/bin/true");
    // SAFETY: only raw system calls on descriptors and C strings made before the fork; the
    // forked process only waits and exits.
    #[allow(unsafe_code)]
    unsafe {
        command.pre_exec(move || {
            for fd in &join {
                let fd = std::os::fd::BorrowedFd::borrow_raw(*fd);
                plinth_sandbox::cgroup::join(&[fd])?;
            }
            rustix::thread::unshare_unsafe(
                rustix::thread::UnshareFlags::NEWNS
                    | rustix::thread::UnshareFlags::NEWPID
                    | rustix::thread::UnshareFlags::NEWIPC
                    | rustix::thread::UnshareFlags::NEWUTS
                    | rustix::thread::UnshareFlags::NEWNET
                    | rustix::thread::UnshareFlags::NEWCGROUP,
            )?;
            bind_read_only(&version, &target)?;
            // The PID namespace's first process is the next child: it executes `true`.
            let pid = libc::syscall(
                libc::SYS_clone,
                libc::c_long::from(libc::SIGCHLD),
                0,
                0,
                0,
                0,
            );
            if pid > 0 {
                let mut status = 0;
                libc::waitpid(pid as i32, &mut status, 0);
                libc::_exit(if libc::WIFEXITED(status) {
                    libc::WEXITSTATUS(status)
                } else {
                    1
                });
            }
            Ok(())
        });
    }
    let status = command.status()?;
    cgroup.remove()?;
    anyhow::ensure!(
        status.success(),
        "the sandbox floor command failed: {status}"
    );
    Ok(begun.elapsed().as_secs_f64() * 1000.0)
}

/// Stores every file as a blob and the tree naming them; answers the tree's digest.
async fn store_layer(
    blobs: &BlobStore,
    dir: &Path,
    paths: &[String],
    change: Option<(&str, &[u8])>,
) -> anyhow::Result<String> {
    use futures::StreamExt as _;
    let entries: Vec<anyhow::Result<TreeEntry>> =
        futures::stream::iter(paths.iter().map(|path| async move {
            let bytes = match change {
                Some((changed, content)) if changed == path => content.to_vec(),
                _ => tokio::fs::read(dir.join(path)).await?,
            };
            let digest = Digest::of(&bytes);
            let size = bytes.len() as u64;
            if !blobs.contains(&digest).await? {
                blobs.put_bytes(bytes.into()).await?;
            }
            Ok(TreeEntry::file(path.clone(), digest, size, false))
        }))
        .buffer_unordered(32)
        .collect()
        .await;
    let entries = entries.into_iter().collect::<anyhow::Result<Vec<_>>>()?;
    let tree = Tree::new(entries).encode()?;
    Ok(blobs.put_bytes(tree.into()).await?.digest.to_string())
}

fn resident_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find(|line| line.starts_with("VmRSS:"))
        .and_then(|line| line.split_whitespace().nth(1))
        .and_then(|kib| kib.parse::<f64>().ok())
        .map_or(0.0, |kib| kib / 1024.0)
}

async fn post(
    client: &reqwest::Client,
    url: String,
    body: serde_json::Value,
) -> anyhow::Result<serde_json::Value> {
    let response = client.post(url).json(&body).send().await?;
    let status = response.status();
    let answer: serde_json::Value = response.json().await?;
    anyhow::ensure!(status.is_success(), "{status}: {answer}");
    Ok(answer)
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    if args.cold {
        return crate::sessions_cold::run(
            &args.cold_args,
            args.files,
            args.mib,
            args.fresh_fs,
            args.journal,
        )
        .await;
    }
    anyhow::ensure!(
        rustix::process::geteuid().is_root(),
        "the session benchmark needs root (mount namespaces, session uids)"
    );
    let binary = crate::service::binary()?;
    let work = crate::fresh_fs::WorkDir::make(args.fresh_fs, args.journal)?;
    let client = reqwest::Client::new();
    println!("machine: {}", crate::machine());
    println!("working on {}", work.describe());

    // 1. Attach + first exec beside the floor.
    let service = Service::start(
        &binary,
        &work.path().join("serve"),
        &["--builder-network", "false"],
    )
    .await?;
    let environment = service.environment(&client, "Bench Sessions").await?;
    for (path, body) in [("run.py", "print('hi')\n"), ("data/a.txt", "a\n")] {
        client
            .put(format!(
                "{}/v1/environments/{environment}/files/{path}",
                service.base
            ))
            .body(body)
            .send()
            .await?
            .error_for_status()?;
    }
    post(
        &client,
        format!("{}/v1/environments/{environment}/build", service.base),
        serde_json::json!({}),
    )
    .await
    .ok();
    crate::service::wait_for_build(
        &client,
        &service.base,
        &environment,
        1,
        Duration::from_millis(50),
    )
    .await?;
    // The version is cached by the first session.
    post(
        &client,
        format!("{}/v1/sessions", service.base),
        serde_json::json!({"environment": environment}),
    )
    .await?;

    let floor_source = work.path().join("floor-version");
    let floor_target = work.path().join("floor-mount");
    std::fs::create_dir_all(floor_source.join("lib"))?;
    std::fs::write(floor_source.join("run.py"), "print('hi')\n")?;
    std::fs::create_dir_all(&floor_target)?;
    let floor_source = CString::new(floor_source.as_os_str().as_bytes())?;
    let floor_target = CString::new(floor_target.as_os_str().as_bytes())?;

    // The figure uses a lean client (one keep-alive connection, blocking calls on this
    // thread); the same pairs through reqwest, alternated with it, show what an async client
    // adds on top.
    let (mut plinth, mut create, mut exec, mut floor, mut pooled) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut sandbox_floor = Vec::new();
    let floor_cgroups = plinth_sandbox::cgroup::Cgroups::detect("plinth-bench-floor")?;
    let mut lean = crate::http1::Http1::connect(&service.base)?;
    let create_body = serde_json::json!({"environment": environment});
    let exec_body = serde_json::json!({"command": "true"});
    for _ in 0..args.attaches {
        let (id, created, total) = tokio::task::block_in_place(|| {
            let begun = Instant::now();
            let (status, session) = lean.request("POST", "/v1/sessions", Some(&create_body))?;
            let created = begun.elapsed().as_secs_f64() * 1000.0;
            anyhow::ensure!(status == 201, "{status}: {session}");
            let id = session["id"].as_str().context("session id")?.to_owned();
            let (status, ran) =
                lean.request("POST", &format!("/v1/sessions/{id}/exec"), Some(&exec_body))?;
            let total = begun.elapsed().as_secs_f64() * 1000.0;
            anyhow::ensure!(
                status == 200 && ran["exit_code"] == 0,
                "exec true failed: {ran}"
            );
            Ok((id, created, total))
        })?;
        plinth.push(total);
        create.push(created);
        exec.push(total - created);
        floor.push(floor_once(&floor_source, &floor_target)?);
        sandbox_floor.push(sandbox_floor_once(
            &floor_cgroups,
            sandbox_floor.len(),
            &floor_source,
            &floor_target,
        )?);
        client
            .delete(format!("{}/v1/sessions/{id}", service.base))
            .send()
            .await?;

        let begun = Instant::now();
        let session = post(
            &client,
            format!("{}/v1/sessions", service.base),
            create_body.clone(),
        )
        .await?;
        let id = session["id"].as_str().context("session id")?;
        let ran = post(
            &client,
            format!("{}/v1/sessions/{id}/exec", service.base),
            exec_body.clone(),
        )
        .await?;
        anyhow::ensure!(ran["exit_code"] == 0, "exec true failed: {ran}");
        pooled.push(begun.elapsed().as_secs_f64() * 1000.0);
        client
            .delete(format!("{}/v1/sessions/{id}", service.base))
            .send()
            .await?;
    }
    let p50 = percentile(&plinth, 0.5);
    let floor50 = percentile(&floor, 0.5);
    let sandbox50 = percentile(&sandbox_floor, 0.5);
    println!(
        "\nsession create + first `exec true` on a cached version ({} runs, alternating with the floor)",
        args.attaches
    );
    println!("| path | p50 | p99 |\n|---|---|---|");
    println!(
        "| plinth: POST /v1/sessions + POST …/exec (lean HTTP/1.1 client) | {:.2} ms | {:.2} ms |",
        p50,
        percentile(&plinth, 0.99)
    );
    println!(
        "| (of which create) | {:.2} ms | {:.2} ms |",
        percentile(&create, 0.5),
        percentile(&create, 0.99)
    );
    println!(
        "| (of which exec) | {:.2} ms | {:.2} ms |",
        percentile(&exec, 0.5),
        percentile(&exec, 0.99)
    );
    println!(
        "| sandbox floor: cgroup made + joined, mount/PID/IPC/UTS/net/cgroup namespaces, ro bind, fork, exec true | {:.2} ms | {:.2} ms |",
        sandbox50,
        percentile(&sandbox_floor, 0.99)
    );
    println!(
        "| mount-only floor: fork + unshare + ro bind + exec true | {:.2} ms | {:.2} ms |",
        floor50,
        percentile(&floor, 0.99)
    );
    println!(
        "ratio (p50): {:.2}× the sandbox floor, {:.2}× the mount-only floor",
        p50 / sandbox50,
        p50 / floor50
    );
    println!(
        "the same pairs through reqwest (an async, pooled client), alternated with these: p50 {:.2} ms, p99 {:.2} ms",
        percentile(&pooled, 0.5),
        percentile(&pooled, 0.99)
    );

    // 3. Many sessions at once. Each asks for 64 MiB (`true` needs no more): the node admits
    // sessions by the memory they may use, and 200 at the default 1 GiB would not fit here.
    let pid = service.pid();
    let before = resident_mib(pid);
    let begun = Instant::now();
    let created = futures::future::join_all((0..args.concurrent).map(|_| {
        post(
            &client,
            format!("{}/v1/sessions", service.base),
            serde_json::json!({"environment": environment, "limits": {"memory_mb": 64}}),
        )
    }))
    .await;
    let attach_seconds = begun.elapsed().as_secs_f64();
    let ids: Vec<String> = created
        .into_iter()
        .map(|session| Ok(session?["id"].as_str().context("id")?.to_owned()))
        .collect::<anyhow::Result<_>>()?;
    let begun = Instant::now();
    let ran = futures::future::join_all(ids.iter().map(|id| {
        post(
            &client,
            format!("{}/v1/sessions/{id}/exec", service.base),
            serde_json::json!({"command": "true"}),
        )
    }))
    .await;
    let exec_seconds = begun.elapsed().as_secs_f64();
    for result in ran {
        anyhow::ensure!(result?["exit_code"] == 0, "an exec failed");
    }
    let after = resident_mib(pid);
    println!(
        "\n{} sessions on one version, created at once",
        args.concurrent
    );
    println!(
        "- attach: {:.2} s, {:.0} sessions/s",
        attach_seconds,
        args.concurrent as f64 / attach_seconds
    );
    println!(
        "- one `exec true` in each, at once: {:.2} s, {:.0} execs/s",
        exec_seconds,
        args.concurrent as f64 / exec_seconds
    );
    println!(
        "- service memory: {before:.1} MiB before, {after:.1} MiB after: {:.1} KiB per session",
        (after - before).max(0.0) * 1024.0 / args.concurrent as f64
    );
    drop(service);

    // 2. Materialization beside tar -x.
    let source = work.path().join("source");
    let (paths, bytes) = generate(&source, args.files, args.mib * 1024 * 1024)?;
    let tarball = work.path().join("version.tar");
    let status = Command::new("tar")
        .arg("-cf")
        .arg(&tarball)
        .arg("-C")
        .arg(&source)
        .arg(".")
        .status()?;
    anyhow::ensure!(status.success(), "tar -c failed");
    let blobs = BlobStore::open(
        &format!("file://{}", work.path().join("blobs").display()),
        work.path().join("spool"),
    )?;
    let v1 = store_layer(&blobs, &source, &paths, None).await?;
    let changed = format!("# changed\n{}", paths[17]);
    let v2 = store_layer(
        &blobs,
        &source,
        &paths,
        Some((&paths[17], changed.as_bytes())),
    )
    .await?;
    let sync = || {
        let _ = Command::new("sync").status();
    };
    let (mut tar_times, mut first_times, mut one_file_times) = (Vec::new(), Vec::new(), Vec::new());
    let mut limits = Vec::new();
    for round in 0..3 {
        let target = work.path().join(format!("tar-{round}"));
        std::fs::create_dir_all(&target)?;
        sync();
        let begun = Instant::now();
        let status = Command::new("tar")
            .arg("-xf")
            .arg(&tarball)
            .arg("-C")
            .arg(&target)
            .status()?;
        anyhow::ensure!(status.success(), "tar -x failed");
        tar_times.push(begun.elapsed().as_secs_f64());
        let _ = std::fs::remove_dir_all(&target);

        let cache_dir = work.path().join(format!("cache-{round}"));
        // As a node that isolates sessions runs it: a one-file version is a layer.
        let cache =
            plinth_node::VersionCache::open(&cache_dir, blobs.clone(), u64::MAX)?.with_layers(true);
        sync();
        let first = cache.materialize("henv_bench", 1, &v1).await?;
        anyhow::ensure!(first.fetched > 0, "nothing fetched");
        first_times.push(first.took.as_secs_f64());
        limits.push(cache.fetch_limit());
        sync();
        let second = cache.materialize("henv_bench", 2, &v2).await?;
        anyhow::ensure!(
            second.fetched == 1,
            "a one-file change fetched {}",
            second.fetched
        );
        one_file_times.push(second.took.as_secs_f64());
        plinth_node::cache::remove_tree(&cache_dir);
    }
    let (tar_median, first_median, one_median) = (
        percentile(&tar_times, 0.5),
        percentile(&first_times, 0.5),
        percentile(&one_file_times, 0.5),
    );
    println!(
        "\nmaterializing a version: {} files, {:.0} MiB, cold cache, 3 rounds, median",
        paths.len(),
        bytes as f64 / 1024.0 / 1024.0
    );
    println!("| path | time |\n|---|---|");
    println!("| baseline: tar -xf of the same files | {tar_median:.2} s |");
    println!("| plinth: first materialization | {first_median:.2} s |");
    println!(
        "| plinth: a version differing by one file | {:.3} s |",
        one_median
    );
    println!(
        "ratio first / tar: {:.2}×; one-file / first: {:.1}%",
        first_median / tar_median,
        one_median / first_median * 100.0
    );
    println!(
        "background fetches let run at once as each first materialization ended (at most 64, \
         fewer while the store slows under them): {limits:?}"
    );
    Ok(())
}
