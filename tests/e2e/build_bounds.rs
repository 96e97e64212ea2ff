//! What a build wrote is never trusted, and a build is bounded, tested as the attacker from
//! inside real builds (`plinth serve` with its in-process builder): a build that plants a link
//! in its download cache gets nothing of the link's target into its log, now or in the scope's
//! next build; a build over its memory, process or disk limit fails naming it. A scope's disk
//! (on by default) keeps its download cache between builds and is shared by its builds
//! running at once.

use std::os::unix::fs::PermissionsExt as _;
use std::time::Duration;

use crate::helpers::{Server, create_environment, put_file, queue_and_wait_build, send};

const BUILD_LIMIT: Duration = Duration::from_secs(180);

/// Queues the next build of `id` and waits for it to end; answers its record.
async fn build(server: &Server, id: &str, version: u64) -> serde_json::Value {
    queue_and_wait_build(server, id, version, BUILD_LIMIT).await
}

#[tokio::test]
async fn a_link_planted_in_the_npm_cache_leaks_nothing_into_the_build_log() {
    if !crate::helpers::can_build() {
        return;
    }
    // The victim: a root-only directory on the host whose newest file is a secret.
    let victim = tempfile::Builder::new()
        .prefix("plinth-victim-")
        .tempdir_in("/var/tmp")
        .expect("tempdir");
    let secret = "victim-secret-4b1d7e";
    std::fs::write(victim.path().join("older.log"), "victim-older\n").expect("write");
    std::thread::sleep(Duration::from_millis(20));
    std::fs::write(victim.path().join("newest.log"), format!("{secret}\n")).expect("write");
    std::fs::set_permissions(victim.path(), std::fs::Permissions::from_mode(0o700)).expect("chmod");

    let server = Server::start().await;
    let attacker = create_environment(&server, "Npm Cache Link").await;
    // npm runs the project's own `preinstall` as the build's uid; it swaps npm's log directory
    // in the download cache (which outlives the build) for a link to the victim, then fails,
    // so the builder looks for npm's debug log.
    let planted = format!(
        "rm -rf \"$npm_config_cache/_logs\" && ln -s {} \"$npm_config_cache/_logs\" && \
         echo attack: planted && exit 1",
        victim.path().display()
    );
    let package = serde_json::json!({
        "name": "attacker",
        "version": "0.0.0",
        "scripts": { "preinstall": planted },
    });
    put_file(&server, &attacker, "package.json", package.to_string()).await;
    let first = build(&server, &attacker, 1).await;
    assert_eq!(first["status"], "failed", "{first}");
    let log = first["log"].as_str().expect("log");
    assert!(log.contains("attack: planted"), "the preinstall ran: {log}");
    assert!(
        !log.contains(secret) && !log.contains("victim-older"),
        "{log}"
    );
    assert!(!first.to_string().contains(secret), "{first}");

    // The scope's next build takes the same cache in and fails in npm again, without planting
    // anything: the link left there is not followed either.
    let package = serde_json::json!({
        "name": "attacker",
        "version": "0.0.1",
        "scripts": { "preinstall": "echo attack: second && exit 1" },
    });
    put_file(&server, &attacker, "package.json", package.to_string()).await;
    let second = build(&server, &attacker, 2).await;
    assert_eq!(second["status"], "failed", "{second}");
    let log = second["log"].as_str().expect("log");
    assert!(log.contains("attack: second"), "{log}");
    assert!(!second.to_string().contains(secret), "{second}");

    // The victim is unchanged, and the builder goes on building.
    assert_eq!(
        std::fs::read_to_string(victim.path().join("newest.log")).expect("read"),
        format!("{secret}\n")
    );
    let mut names: Vec<_> = std::fs::read_dir(victim.path())
        .expect("list")
        .map(|entry| entry.expect("entry").file_name())
        .collect();
    names.sort();
    assert_eq!(names, ["newest.log", "older.log"]);
    put_file(
        &server,
        &attacker,
        "package.json",
        r#"{"name": "attacker", "version": "0.0.2"}"#,
    )
    .await;
    let third = build(&server, &attacker, 3).await;
    assert_eq!(third["status"], "ready", "{third}");
}

/// A server whose builds are held to small bounds.
async fn bounded_server() -> Server {
    Server::start_with_config("[builder.limits]\nmemory_mb = 96\npids = 64\n", &[]).await
}

#[tokio::test]
async fn a_build_over_its_memory_or_process_limit_fails_naming_it_and_the_next_build_succeeds() {
    if !crate::helpers::can_build() {
        return;
    }
    let server = bounded_server().await;
    // Memory: the build's shell holds 300 MB in a variable.
    let memory = create_environment(&server, "Memory Hog Build").await;
    put_file(
        &server,
        &memory,
        "setup.sh",
        "echo attack: start\nx=$(head -c 300000000 /dev/zero | tr '\\0' a)\necho attack: held ${#x}\n",
    )
    .await;
    // Processes: more sleepers at once than the build may run.
    let pids = create_environment(&server, "Fork Hog Build").await;
    put_file(
        &server,
        &pids,
        "setup.sh",
        "echo attack: start\nfor i in $(seq 100); do sleep 5 & done\nwait\necho attack: survived\n",
    )
    .await;
    // The neighbour, queued behind both.
    let normal = create_environment(&server, "Normal Build").await;
    put_file(&server, &normal, "setup.sh", "echo built > built.txt\n").await;

    let (memory_build, pids_build, normal_build) = tokio::join!(
        build(&server, &memory, 1),
        build(&server, &pids, 1),
        build(&server, &normal, 1),
    );
    assert_eq!(memory_build["status"], "failed", "{memory_build}");
    let error = memory_build["error"].as_str().expect("error");
    assert!(
        error.contains("more than its 96 MiB memory limit (builder.limits.memory_mb)"),
        "{memory_build}"
    );
    let log = memory_build["log"].as_str().expect("log");
    assert!(
        log.contains("attack: start") && !log.contains("attack: held"),
        "{log}"
    );

    assert_eq!(pids_build["status"], "failed", "{pids_build}");
    let error = pids_build["error"].as_str().expect("error");
    assert!(
        error.contains("more than its 64 processes at once (builder.limits.pids)"),
        "{pids_build}"
    );

    assert_eq!(normal_build["status"], "ready", "{normal_build}");
    // And the builder goes on: the hog's next build, fixed, is ready too.
    put_file(&server, &memory, "setup.sh", "echo fixed > fixed.txt\n").await;
    let fixed = build(&server, &memory, 2).await;
    assert_eq!(fixed["status"], "ready", "{fixed}");
}

#[tokio::test]
async fn behind_an_upstream_proxy_a_build_still_reaches_no_host_port() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    if !crate::helpers::can_build() {
        return;
    }
    // A victim listener on the host, which must see nothing.
    let victim = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let victim_port = victim.local_addr().expect("addr").port();
    let victim_seen = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = victim_seen.clone();
    plinth_kit::tasks::spawn(async move {
        while let Ok((_stream, _)) = victim.accept().await {
            seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    });
    // The host's upstream proxy, on loopback: it records each request line, accepts every
    // CONNECT and says hello through the tunnel; it never connects anywhere.
    let upstream = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let upstream_port = upstream.local_addr().expect("addr").port();
    let requests = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let recorded = requests.clone();
    plinth_kit::tasks::spawn(async move {
        while let Ok((mut stream, _)) = upstream.accept().await {
            let recorded = recorded.clone();
            plinth_kit::tasks::spawn(async move {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && head.len() < 16 * 1024 {
                    match stream.read(&mut byte).await {
                        Ok(1) => head.push(byte[0]),
                        _ => return,
                    }
                }
                let line = String::from_utf8_lossy(&head)
                    .lines()
                    .next()
                    .unwrap_or_default()
                    .to_owned();
                recorded.lock().expect("lock").push(line);
                let _ = stream
                    .write_all(b"HTTP/1.1 200 Connection established\r\n\r\nhello-from-upstream\n")
                    .await;
            });
        }
    });

    let config = format!("[builder]\nhttps_proxy = \"http://127.0.0.1:{upstream_port}\"\n");
    let server = Server::start_with_config(&config, &["--builder-network", "true"]).await;
    let gateway_port = server
        .base
        .rsplit(':')
        .next()
        .and_then(|port| port.parse::<u16>().ok())
        .expect("gateway port");
    let script = format!(
        r#"for port in {gateway_port} {victim_port} {upstream_port}; do
  if timeout 5 bash -c "exec 3<>/dev/tcp/127.0.0.1/$port" 2>/dev/null; then echo "attack: reached $port"; fi
  tunnel=$(curl -s -m 10 --noproxy '' -p -x "$HTTPS_PROXY" -o /dev/null -w '%{{http_connect}}' "http://127.0.0.1:$port/")
  echo "attack: proxy $port $tunnel"
done
echo "attack: proxy is $HTTPS_PROXY"
exec 3<>/dev/tcp/127.0.0.1/3128
printf 'CONNECT 1.1.1.1:443 HTTP/1.1\r\nHost: 1.1.1.1:443\r\n\r\n' >&3
timeout 10 cat <&3 | tr -d '\r' | sed 's/^/attack: public /'
"#
    );
    let attacker = create_environment(&server, "Behind Upstream").await;
    put_file(&server, &attacker, "setup.sh", script).await;
    let built = build(&server, &attacker, 1).await;
    assert_eq!(built["status"], "ready", "{built}");
    let log = built["log"].as_str().expect("log");
    let said: Vec<&str> = log
        .lines()
        .filter_map(|line| line.strip_prefix("attack: "))
        .collect();
    assert!(
        !said.iter().any(|line| line.starts_with("reached ")),
        "{log}"
    );
    for port in [gateway_port, victim_port, upstream_port] {
        assert!(
            said.contains(&format!("proxy {port} 403").as_str()),
            "{port}: {log}"
        );
    }
    // The build's proxy is its own egress proxy, never the upstream one…
    assert!(said.contains(&"proxy is http://127.0.0.1:3128"), "{log}");
    // …which chains what it permits to the upstream proxy.
    assert!(
        said.contains(&"public HTTP/1.1 200 Connection established"),
        "{log}"
    );
    assert!(said.contains(&"public hello-from-upstream"), "{log}");
    let requests = requests.lock().expect("lock").clone();
    assert_eq!(requests, ["CONNECT 1.1.1.1:443 HTTP/1.1"], "{log}");
    assert_eq!(
        victim_seen.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "the victim listener saw a connection"
    );
}

#[tokio::test]
async fn builds_running_at_once_never_share_a_uid() {
    if !crate::helpers::can_build() {
        return;
    }
    let server = Server::start_with(&["--builders", "2"]).await;
    // Each build holds its builder long enough for the other builder to claim the other one.
    let script = "echo \"attack: uid $(id -u)\"\nsleep 4\n";
    let first = create_environment(&server, "Slot One").await;
    let second = create_environment(&server, "Slot Two").await;
    put_file(&server, &first, "setup.sh", script).await;
    put_file(&server, &second, "setup.sh", script).await;
    let (one, two) = tokio::join!(build(&server, &first, 1), build(&server, &second, 1));
    let uid = |built: &serde_json::Value| {
        assert_eq!(built["status"], "ready", "{built}");
        built["log"]
            .as_str()
            .expect("log")
            .lines()
            .find_map(|line| line.strip_prefix("attack: uid "))
            .expect("the uid line")
            .to_owned()
    };
    let (one, two) = (uid(&one), uid(&two));
    assert_ne!(one, two, "two builds at once ran as one uid");
    assert_ne!(one, "0");
    assert_ne!(two, "0");
}

/// The bytes the files under `dir` take on its file system (allocated blocks), not counting
/// what is on other file systems mounted beneath it (a build's disk image, whose own file is
/// counted where it lies) nor reading anything through a link.
fn allocated_bytes(dir: &std::path::Path) -> u64 {
    use std::os::unix::fs::MetadataExt as _;
    let Ok(top) = std::fs::symlink_metadata(dir) else {
        return 0;
    };
    let mut total = 0;
    let mut pending = vec![dir.to_owned()];
    while let Some(path) = pending.pop() {
        // Files come and go while a build runs: whatever vanished is not counted.
        let Ok(metadata) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if metadata.dev() != top.dev() {
            continue;
        }
        total += metadata.blocks() * 512;
        if metadata.is_dir()
            && let Ok(entries) = std::fs::read_dir(&path)
        {
            pending.extend(entries.flatten().map(|entry| entry.path()));
        }
    }
    total
}

/// A client of one scope of a server started with client tokens.
struct Tenant<'a> {
    server: &'a Server,
    token: &'a str,
}

impl Tenant<'_> {
    /// An environment of the scope whose source is this `setup.sh`.
    async fn environment(&self, name: &str, setup: &str) -> String {
        let (status, created) = send(
            self.server
                .client
                .post(self.server.url("/v1/environments"))
                .bearer_auth(self.token)
                .json(&serde_json::json!({ "name": name })),
        )
        .await;
        assert_eq!(status, 201, "{created}");
        let id = created["id"].as_str().expect("id").to_owned();
        self.setup(&id, setup).await;
        id
    }

    async fn setup(&self, id: &str, setup: &str) {
        let (status, answer) = send(
            self.server
                .client
                .put(
                    self.server
                        .url(&format!("/v1/environments/{id}/files/setup.sh")),
                )
                .bearer_auth(self.token)
                .body(setup.to_owned()),
        )
        .await;
        assert_eq!(status, 200, "{answer}");
    }

    /// Queues the next build of `id` and waits for it to end; answers its record.
    async fn build(&self, id: &str, version: u64) -> serde_json::Value {
        let (status, queued) = send(
            self.server
                .client
                .post(self.server.url(&format!("/v1/environments/{id}/build")))
                .bearer_auth(self.token),
        )
        .await;
        assert_eq!(status, 202, "{queued}");
        let url = self
            .server
            .url(&format!("/v1/environments/{id}/builds/{version}"));
        for _ in 0..BUILD_LIMIT.as_millis() / 200 {
            let (_, build) = send(self.server.client.get(&url).bearer_auth(self.token)).await;
            if build["status"] == "ready" || build["status"] == "failed" {
                return build;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        panic!("build {version} of {id} did not end within {BUILD_LIMIT:?}");
    }
}

/// Where a builder keeps the disk of `scope` (its name in the work directory).
fn scope_dir(work_dir: &std::path::Path, scope: &str) -> std::path::PathBuf {
    work_dir
        .join("scopes")
        .join(&plinth_blobs::Digest::of(scope.as_bytes()).to_hex()[..16])
}

#[tokio::test]
async fn a_build_over_its_disk_limit_fails_naming_it_and_takes_no_more_of_the_host_nor_a_neighbours()
 {
    if !crate::helpers::can_build() {
        return;
    }
    const MIB: u64 = 1024 * 1024;
    // Two builders check the work directory's disk limits at once, and both build.
    let config = format!(
        "{}[builder.limits]\ndisk_mb = 64\n",
        crate::helpers::tokens_toml(&[("tok-acme", "acme"), ("tok-globex", "globex")])
    );
    let server = Server::start_with_config(&config, &["--builders", "2"]).await;
    let (acme, globex) = (
        Tenant {
            server: &server,
            token: "tok-acme",
        },
        Tenant {
            server: &server,
            token: "tok-globex",
        },
    );
    let work_dir = server.data_dir().join("builder");
    let acme_disk = scope_dir(&work_dir, "acme");
    // The attack leaves 24 MiB in its scope's download cache, then writes 200 MiB each in the
    // build's /tmp, its HOME and the project tree; the last file stays while the build
    // waits, so a watcher on the host would see it.
    let attacker = acme
        .environment(
            "Disk Hog Build",
            "echo attack: start\n\
             dd if=/dev/zero of=\"$XDG_CACHE_HOME/download\" bs=1M count=24 2>&1 && echo attack: cached\n\
             for dir in /tmp \"$HOME\"; do\n\
               dd if=/dev/zero of=\"$dir/big\" bs=1M count=200 2>&1 && echo \"attack: wrote $dir\"\n\
               rm -f \"$dir/big\"\n\
             done\n\
             dd if=/dev/zero of=big bs=1M count=200 2>&1 && echo attack: wrote project\n\
             sleep 2\n\
             echo attack: end\n\
             exit 1\n",
        )
        .await;
    // Another scope's build at the same time writes 40 MiB: its disk is its own.
    let neighbour = globex
        .environment(
            "Neighbour Build",
            "dd if=/dev/zero of=some bs=1M count=40 2>&1 && sleep 1 && echo neighbour: done\n",
        )
        .await;
    // While it runs, the host side of the attacker's scope disk is watched.
    let watching = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let watcher = {
        let (acme_disk, watching) = (acme_disk.clone(), watching.clone());
        std::thread::spawn(move || {
            let mut most = 0;
            while watching.load(std::sync::atomic::Ordering::SeqCst) {
                most = most.max(allocated_bytes(&acme_disk));
                std::thread::sleep(Duration::from_millis(100));
            }
            most
        })
    };
    let (hog, next_door) = tokio::join!(acme.build(&attacker, 1), globex.build(&neighbour, 1));
    watching.store(false, std::sync::atomic::Ordering::SeqCst);
    let most = watcher.join().expect("watcher");
    assert_eq!(hog["status"], "failed", "{hog}");
    let error = hog["error"].as_str().expect("error");
    assert!(
        error.contains("more than its 64 MiB disk limit (builder.limits.disk_mb)"),
        "{hog}"
    );
    let log = hog["log"].as_str().expect("log");
    assert!(
        log.contains("attack: start")
            && log.contains("attack: cached")
            && log.contains("attack: end"),
        "{log}"
    );
    assert!(log.contains("No space left on device"), "{log}");
    assert!(!log.contains("attack: wrote"), "{log}");
    assert_eq!(next_door["status"], "ready", "{next_door}");
    assert!(
        next_door["log"]
            .as_str()
            .is_some_and(|log| log.contains("neighbour: done")),
        "{next_door}"
    );
    // The host's file system took no more than the limit (and the builder's own few files).
    assert!(
        most < 64 * MIB + 16 * MIB,
        "the scope's disk took {} MiB at most",
        most / MIB
    );
    // Afterwards the scope's disk is unmounted, and gave back what the build wrote and the
    // cache it filled (sparse and discarded).
    crate::helpers::until_unmounted(&work_dir).await;
    assert!(acme_disk.join("work.ext4").is_file());
    // The blocks go back by the time the disk is unmounted, not when the kernel gets to them.
    let allocated = allocated_bytes(&acme_disk);
    assert!(
        allocated < 4 * MIB,
        "the scope's disk still holds {} KiB after the build",
        allocated / 1024
    );

    // The builder goes on: the scope's next build, within its limit once the 24 MiB cache is
    // gone, is ready.
    acme.setup(
        &attacker,
        "dd if=/dev/zero of=/tmp/some bs=1M count=8 && dd if=/dev/zero of=some bs=1M count=40\n",
    )
    .await;
    let fixed = acme.build(&attacker, 2).await;
    assert_eq!(fixed["status"], "ready", "{fixed}");
    let log = fixed["log"].as_str().expect("log");
    assert!(log.contains("==> download cache: empty"), "{log}");
}

#[tokio::test]
async fn by_default_a_scopes_next_build_finds_what_its_last_left_in_the_download_cache() {
    if !crate::helpers::can_build() {
        return;
    }
    let server = Server::start().await;
    let work_dir = server.data_dir().join("builder");
    let first = create_environment(&server, "Cache Filler").await;
    put_file(
        &server,
        &first,
        "setup.sh",
        "echo from-the-first-build > \"$XDG_CACHE_HOME/marker\"\n",
    )
    .await;
    let built = build(&server, &first, 1).await;
    assert_eq!(built["status"], "ready", "{built}");
    let log = built["log"].as_str().expect("log");
    assert!(log.contains("==> download cache: empty"), "{log}");

    // Another environment of the scope, built after it.
    let second = create_environment(&server, "Cache Reader").await;
    put_file(
        &server,
        &second,
        "setup.sh",
        "echo \"seen: $(cat \"$XDG_CACHE_HOME/marker\")\"\n",
    )
    .await;
    let built = build(&server, &second, 1).await;
    assert_eq!(built["status"], "ready", "{built}");
    let log = built["log"].as_str().expect("log");
    assert!(
        log.contains("==> download cache: this scope's, from its earlier builds on this builder"),
        "{log}"
    );
    assert!(log.contains("seen: from-the-first-build"), "{log}");

    // The cache lives on the scope's disk, of the default limit and sparse, unmounted
    // between builds.
    let images = crate::helpers::scope_images(&work_dir);
    assert_eq!(images.len(), 1, "{images:?}");
    let image = std::fs::metadata(&images[0]).expect("image");
    assert_eq!(image.len(), 8192 * 1024 * 1024);
    assert!(
        std::os::unix::fs::MetadataExt::blocks(&image) * 512 < 64 * 1024 * 1024,
        "{} bytes taken",
        std::os::unix::fs::MetadataExt::blocks(&image) * 512
    );
    crate::helpers::until_unmounted(&work_dir).await;
}

#[tokio::test]
async fn two_builds_of_one_scope_at_once_share_its_disk_and_both_succeed() {
    if !crate::helpers::can_build() {
        return;
    }
    let server = Server::start_with(&["--builders", "2"]).await;
    let work_dir = server.data_dir().join("builder");
    // Each build writes a file, and another in the scope's download cache (if it holds the
    // cache), waits while the other does the same, and checks both read back whole.
    let script = "head -c 8388608 /dev/urandom > data\n\
                  cp data \"$XDG_CACHE_HOME/data-$$\"\n\
                  before=$(sha256sum < data)\n\
                  echo seen: started\n\
                  sleep 4\n\
                  if [ \"$(sha256sum < data)\" = \"$before\" ] && \
                     [ \"$(sha256sum < \"$XDG_CACHE_HOME/data-$$\")\" = \"$before\" ]; then\n\
                    echo seen: intact\n\
                  fi\n";
    let first = create_environment(&server, "Same Scope One").await;
    let second = create_environment(&server, "Same Scope Two").await;
    put_file(&server, &first, "setup.sh", script).await;
    put_file(&server, &second, "setup.sh", script).await;
    let watch = async {
        // Once both builds run their setup.sh, they hold the scope's disk together: one
        // mount, one loop device.
        for _ in 0..600 {
            let mut started = 0;
            for id in [&first, &second] {
                let (_, build) = send(
                    server
                        .client
                        .get(server.url(&format!("/v1/environments/{id}/builds/1"))),
                )
                .await;
                if build["log"]
                    .as_str()
                    .is_some_and(|log| log.contains("seen: started"))
                {
                    started += 1;
                }
            }
            if started == 2 {
                return (
                    crate::helpers::mounts_under(&work_dir),
                    crate::helpers::loop_devices_under(&work_dir),
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("the two builds never ran at once");
    };
    let (one, two, (mounts, devices)) =
        tokio::join!(build(&server, &first, 1), build(&server, &second, 1), watch);
    assert_eq!(mounts.len(), 1, "{mounts:?}");
    assert_eq!(devices, 1);
    for built in [&one, &two] {
        assert_eq!(built["status"], "ready", "{built}");
        let log = built["log"].as_str().expect("log");
        assert!(log.contains("seen: intact"), "{log}");
    }
    crate::helpers::until_unmounted(&work_dir).await;
}
