//! The session sandbox, tested as the attacker: from inside a real session of a really built
//! environment (`plinth serve` with its in-process builder and node agent, over real HTTP),
//! try what must fail, and check that it failed and that nothing changed for the victim.
//! Traffic goes only to loopback and to the session's own network namespace.

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::{Value, json};

use crate::helpers::{Server, built_environment, exec_in, send, start_session_with};

const BUILD_LIMIT: Duration = Duration::from_secs(120);

async fn session(server: &Server, environment: &str) -> Value {
    start_session_with(server, json!({ "environment": environment })).await
}

async fn exec_with(server: &Server, session: &Value, body: Value) -> Value {
    exec_in(server, session["id"].as_str().expect("session id"), body).await
}

async fn exec(server: &Server, session: &Value, command: &str) -> Value {
    exec_with(
        server,
        session,
        json!({ "command": command, "timeout_ms": 60_000 }),
    )
    .await
}

async fn end(server: &Server, session: &Value) {
    let id = session["id"].as_str().expect("session id");
    let (status, ended) = send(
        server
            .client
            .delete(server.url(&format!("/v1/sessions/{id}"))),
    )
    .await;
    assert_eq!(status, 200, "{ended}");
}

/// Host processes whose command line holds `marker`, as the host sees them.
pub(crate) fn host_processes(marker: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Some(pid) = entry.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        if !pid.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) {
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            if cmdline.contains(marker) && !cmdline.contains("::") {
                found.push(format!("{pid}: {cmdline}"));
            }
        }
    }
    found
}

/// How many processes session `id`'s cgroup holds, as the kernel counts them for its
/// limit (`pids.current` of its group, v1 or v2).
pub(crate) fn processes_of(id: &str) -> usize {
    fn find(dir: &std::path::Path, id: &str, depth: usize) -> Option<std::path::PathBuf> {
        if depth == 0 {
            return None;
        }
        for entry in std::fs::read_dir(dir).ok()?.flatten() {
            let path = entry.path();
            if !entry.file_type().is_ok_and(|kind| kind.is_dir()) {
                continue;
            }
            if entry.file_name() == id && path.join("pids.current").exists() {
                return Some(path);
            }
            if let Some(found) = find(&path, id, depth - 1) {
                return Some(found);
            }
        }
        None
    }
    find(std::path::Path::new("/sys/fs/cgroup"), id, 7)
        .and_then(|group| std::fs::read_to_string(group.join("pids.current")).ok())
        .and_then(|count| count.trim().parse().ok())
        .unwrap_or(0)
}

/// Every cgroup directory of session `id`, in any hierarchy (v1 or v2), as the host sees them.
pub(crate) fn session_cgroup_dirs(id: &str) -> Vec<std::path::PathBuf> {
    fn walk(dir: &std::path::Path, id: &str, depth: usize, out: &mut Vec<std::path::PathBuf>) {
        if depth == 0 {
            return;
        }
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            if entry.file_type().is_ok_and(|kind| kind.is_dir()) {
                if entry.file_name() == id {
                    out.push(entry.path());
                } else {
                    walk(&entry.path(), id, depth - 1, out);
                }
            }
        }
    }
    let mut found = Vec::new();
    walk(std::path::Path::new("/sys/fs/cgroup"), id, 8, &mut found);
    found
}

/// Waits (bounded) until no host process holds `marker`; answers those still there.
pub(crate) async fn gone(marker: &str) -> Vec<String> {
    gone_within(marker, Duration::from_secs(5)).await
}

/// Looks every 100 ms, `limit` long at most, for no host process holding `marker`; answers
/// those still there at the last look.
pub(crate) async fn gone_within(marker: &str, limit: Duration) -> Vec<String> {
    for _ in 0..limit.as_millis() / 100 {
        let left = host_processes(marker);
        if left.is_empty() {
            return left;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    host_processes(marker)
}

#[tokio::test]
async fn a_session_sees_its_own_processes_and_files_and_nothing_of_the_node() {
    if !crate::helpers::can_build() {
        return;
    }
    let server = Server::start_with(&["--builder-network", "false"]).await;
    let id = built_environment(&server, "Sandbox View", BUILD_LIMIT).await;
    let first = session(&server, &id).await;
    let data_dir = server.data_dir();
    let ran = exec(
        &server,
        &first,
        &format!(
            "sleep 30 & ps -e -o pid=,comm= | sort -n; echo ---; ls /; echo ---; \
             ls {data} 2>&1; ls /root 2>&1; ls /var 2>&1; cat /proc/1/cmdline 2>&1; \
             echo ---; grep -E '^(CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs|Seccomp):' /proc/self/status; \
             unshare --mount true 2>&1; echo unshare=$?; kill %1",
            data = data_dir.display()
        ),
    )
    .await;
    let stdout = ran["stdout"].as_str().expect("stdout");
    let sections: Vec<&str> = stdout.split("---\n").collect();
    assert_eq!(sections.len(), 4, "{ran}");
    // Only its own processes: the shell, the sleep, ps and sort.
    let processes: Vec<&str> = sections[0].lines().collect();
    assert!(processes.len() <= 4, "{ran}");
    assert!(
        processes.iter().all(|line| ["sh", "sleep", "ps", "sort"]
            .contains(&line.split_whitespace().nth(1).unwrap_or(""))),
        "{ran}"
    );
    // An allow-listed root: the system, the environment, the working directory.
    let root: BTreeSet<&str> = sections[1].lines().collect();
    for absent in ["root", "srv", "mnt", "run", "sys", "work"] {
        assert!(!root.contains(absent), "/{absent} is visible: {ran}");
    }
    for present in ["env", "home", "tmp", "usr", "proc", "dev", "etc"] {
        assert!(root.contains(present), "/{present} is missing: {ran}");
    }
    let hidden = sections[2];
    assert_eq!(
        hidden.matches("No such file or directory").count(),
        3,
        "the data directory, /root or the keeper is visible: {ran}"
    );
    // /var holds only the link to /tmp.
    assert!(hidden.lines().any(|line| line == "tmp"), "{ran}");
    let status = sections[3];
    for line in [
        "CapInh:\t0000000000000000",
        "CapPrm:\t0000000000000000",
        "CapEff:\t0000000000000000",
        "CapBnd:\t0000000000000000",
        "CapAmb:\t0000000000000000",
        "NoNewPrivs:\t1",
        "Seccomp:\t2",
    ] {
        assert!(status.contains(line), "{line:?} missing: {ran}");
    }
    assert!(status.contains("Operation not permitted"), "{ran}");
    assert!(status.contains("unshare=1"), "{ran}");
}

#[tokio::test]
async fn a_session_reaches_no_port_of_the_host() {
    if !crate::helpers::can_build() {
        return;
    }
    // The catalog's and the source service's admin addresses too (metrics, readiness).
    let server = Server::start_with_config(
        "[catalog]\nadmin_listen = \"127.0.0.1:0\"\n\n[source]\nadmin_listen = \"127.0.0.1:0\"\n",
        &["--builder-network", "false"],
    )
    .await;
    let (catalog_admin, source_admin) = (
        server.bound("catalog_admin_listen"),
        server.bound("source_admin_listen"),
    );
    let id = built_environment(&server, "Sandbox Ports", BUILD_LIMIT).await;
    let attacker = session(&server, &id).await;
    // Every port serve listens on (gateway, catalog, source, node, admin addresses) and
    // anything else on the host, straight and through the session's proxy.
    let ports = crate::helpers::host_listening_ports();
    for admin in [catalog_admin, source_admin] {
        assert!(ports.contains(&admin.port()), "{admin}: {ports:?}");
    }
    let gateway_port = server
        .base
        .rsplit(':')
        .next()
        .and_then(|port| port.parse::<u16>().ok())
        .expect("gateway port");
    assert!(ports.contains(&gateway_port), "{ports:?}");
    let list = ports
        .iter()
        .map(u16::to_string)
        .collect::<Vec<_>>()
        .join(" ");
    let ran = exec(
        &server,
        &attacker,
        &format!(
            r#"python3 - <<'EOF'
import socket
reached = []
for port in [{ports}]:
    for host in ['127.0.0.1', '::1']:
        try:
            socket.create_connection((host, port), timeout=1).close()
            reached.append((host, port))
        except OSError:
            pass
print('reached', reached)
EOF
for port in {list}; do curl -s -m 3 --noproxy '' -x "$HTTP_PROXY" -o /dev/null -w '%{{http_code}} ' http://127.0.0.1:$port/; done"#,
            ports = ports.iter().map(u16::to_string).collect::<Vec<_>>().join(", "),
        ),
    )
    .await;
    let stdout = ran["stdout"].as_str().expect("stdout");
    assert!(stdout.starts_with("reached []\n"), "{ran}");
    let codes: Vec<&str> = stdout
        .lines()
        .nth(1)
        .unwrap_or("")
        .split_whitespace()
        .collect();
    assert_eq!(codes.len(), ports.len(), "{ran}");
    assert!(codes.iter().all(|code| *code == "403"), "{ran}");
    // The gateway still serves its own callers.
    let (status, _) = send(server.client.get(server.url("/v1/capabilities"))).await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn sessions_share_no_tmp_shm_or_processes_and_nothing_they_started_outlives_them() {
    if !crate::helpers::can_build() {
        return;
    }
    let server = Server::start_with(&["--builder-network", "false"]).await;
    let id = built_environment(&server, "Sandbox Neighbours", BUILD_LIMIT).await;
    let victim = session(&server, &id).await;
    let attacker = session(&server, &id).await;
    let wrote = exec(
        &server,
        &victim,
        "echo secret > /tmp/victim-secret && echo shm > /dev/shm/victim-shm && \
         setsid -f sleep 1001 > /dev/null 2>&1 < /dev/null && \
         setsid -f sh -c '(sleep 1002 > /dev/null 2>&1 < /dev/null &)' && sleep 0.3 && echo started",
    )
    .await;
    assert_eq!(wrote["stdout"], "started\n", "{wrote}");
    let peek = exec(
        &server,
        &attacker,
        "cat /tmp/victim-secret /dev/shm/victim-shm 2>&1; ps -e -o comm= | grep -c sleep; \
         ls /tmp /dev/shm",
    )
    .await;
    let said = peek["stdout"].as_str().expect("stdout");
    assert!(
        !said.contains("secret\n") && !said.contains("shm\n"),
        "{peek}"
    );
    assert!(
        said.contains("\n0\n"),
        "the victim's daemons are visible: {peek}"
    );
    // The victim's /tmp is not the host's either.
    assert!(!std::path::Path::new("/tmp/victim-secret").exists());
    assert_eq!(host_processes("sleep 1001").len(), 1, "the daemon runs");
    assert_eq!(host_processes("sleep 1002").len(), 1, "the daemon runs");

    // Ending the session ends both daemons; the next session's uid has no process.
    let victim_uid = exec(&server, &victim, "id -u").await["stdout"]
        .as_str()
        .expect("uid")
        .trim()
        .to_owned();
    end(&server, &victim).await;
    assert_eq!(gone("sleep 1001").await, Vec::<String>::new());
    assert_eq!(gone("sleep 1002").await, Vec::<String>::new());
    let next = session(&server, &id).await;
    let next_uid = exec(&server, &next, "id -u").await["stdout"]
        .as_str()
        .expect("uid")
        .trim()
        .to_owned();
    let others = exec(&server, &next, "ps -e -o comm=").await;
    let names: BTreeSet<&str> = others["stdout"].as_str().expect("stdout").lines().collect();
    assert!(
        names.iter().all(|name| ["ps", "sh"].contains(name)),
        "{next_uid} (was {victim_uid}): {others}"
    );

    // A command that times out takes its whole tree with it, daemons included.
    let timed = exec_with(
        &server,
        &attacker,
        json!({
            "command": "setsid -f sleep 1003 > /dev/null 2>&1 < /dev/null; setsid -f sh -c '(sleep 1004 > /dev/null 2>&1 < /dev/null &)'; sleep 60",
            "timeout_ms": 1000,
        }),
    )
    .await;
    assert_eq!(timed["timed_out"], true, "{timed}");
    assert_eq!(gone("sleep 1003").await, Vec::<String>::new());
    assert_eq!(gone("sleep 1004").await, Vec::<String>::new());
    let still = exec(&server, &attacker, "echo alive").await;
    assert_eq!(still["stdout"], "alive\n", "{still}");
}

#[tokio::test]
async fn memory_and_process_limits_hold_inside_the_session_only() {
    if !crate::helpers::can_build() {
        return;
    }
    let server = Server::start_with(&["--builder-network", "false"]).await;
    let id = built_environment(&server, "Sandbox Limits", BUILD_LIMIT).await;
    let hog = start_session_with(
        &server,
        json!({ "environment": id, "limits": { "memory_mb": 128, "pids": 64 } }),
    )
    .await;
    assert_eq!(hog["limits"]["memory_mb"], 128, "{hog}");
    let ran = exec(
        &server,
        &hog,
        "python3 -c \"b = bytearray(512 * 1024 * 1024); b[::4096] = b'x' * len(b[::4096]); print('allocated')\"",
    )
    .await;
    assert_eq!(ran["oom_killed"], true, "{ran}");
    assert_eq!(ran["exit_code"], 137, "{ran}");
    assert!(
        !ran["stdout"].as_str().unwrap_or("").contains("allocated"),
        "{ran}"
    );
    let echo = exec(&server, &hog, "echo still here").await;
    assert_eq!(echo["stdout"], "still here\n", "{echo}");

    // A fork storm stops at the limit: counted from the host while it runs.
    let hog_id = hog["id"].as_str().expect("id").to_owned();
    let storm = exec_with(
        &server,
        &hog,
        json!({
            "command": "python3 -c \"\nimport os, time\nstarted = 0\nfor _ in range(300):\n    try:\n        if os.fork() == 0:\n            os.execvp('sleep', ['sleep', '30'])\n        started += 1\n    except OSError:\n        pass\nprint(started, flush=True)\ntime.sleep(2)\n\"",
            "timeout_ms": 10_000,
        }),
    );
    let count = async {
        let mut most = 0;
        for _ in 0..20 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            most = most.max(processes_of(&hog_id));
        }
        most
    };
    let (storm, most) = tokio::join!(storm, count);
    assert!(most <= 64, "{most} processes: {storm}");
    assert!(
        most >= 32,
        "the storm never started ({most} processes): {storm}"
    );
    // Another session is untouched by the first's limits being hit.
    let other = session(&server, &id).await;
    let fine = exec(&server, &other, "for i in 1 2 3; do echo $i; done").await;
    assert_eq!(fine["stdout"], "1\n2\n3\n", "{fine}");
}

#[tokio::test]
async fn egress_reaches_only_what_policy_allows_and_none_reaches_nothing() {
    if !crate::helpers::can_build() {
        return;
    }
    // "The internet" for this test: a server on the host's loopback, explicitly allowed.
    let internet = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let internet_addr = internet.local_addr().expect("addr");
    let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = accepted.clone();
    plinth_kit::tasks::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        while let Ok((mut stream, _)) = internet.accept().await {
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let mut buffer = [0u8; 4096];
            let _ = stream.read(&mut buffer).await;
            let _ = stream
                .write_all(
                    b"HTTP/1.1 200 OK\r\nContent-Length: 8\r\nConnection: close\r\n\r\ninternet",
                )
                .await;
        }
    });
    let config = tempfile::NamedTempFile::new().expect("config");
    std::fs::write(
        config.path(),
        format!("[builder]\nnetwork = false\n[node]\negress_allow = [\"{internet_addr}\"]\n"),
    )
    .expect("write config");
    let path = config.path().to_str().expect("utf-8").to_owned();
    let server = Server::start_with(&["--config", &path]).await;
    let id = built_environment(&server, "Sandbox Egress", BUILD_LIMIT).await;
    let agent = session(&server, &id).await;
    let gateway = server.base.trim_start_matches("http://").to_owned();
    let ran = exec(
        &server,
        &agent,
        &format!(
            "for url in http://{internet_addr}/ http://{gateway}/v1/capabilities http://10.1.2.3/ http://169.254.169.254/latest/meta-data; do \
             curl -s -m 5 --noproxy '' -x \"$HTTP_PROXY\" -w ' %{{http_code}}' \"$url\" | tr '\\n' ' '; echo; done"
        ),
    )
    .await;
    let lines: Vec<&str> = ran["stdout"].as_str().expect("stdout").lines().collect();
    assert_eq!(lines.len(), 4, "{ran}");
    assert_eq!(lines[0].trim(), "internet 200", "{ran}");
    for refused in &lines[1..] {
        assert!(refused.trim().ends_with(" 403"), "{ran}");
        assert!(refused.contains("plinth egress"), "{ran}");
    }
    assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 1);

    // With no network, nothing is reached: not even the allowed server.
    let config = tempfile::NamedTempFile::new().expect("config");
    std::fs::write(
        config.path(),
        format!("[builder]\nnetwork = false\n[node]\nnetwork = \"none\"\negress_allow = [\"{internet_addr}\"]\n"),
    )
    .expect("write config");
    let path = config.path().to_str().expect("utf-8").to_owned();
    let closed = Server::start_with(&["--config", &path]).await;
    let id = built_environment(&closed, "Sandbox None", BUILD_LIMIT).await;
    let agent = session(&closed, &id).await;
    let ran = exec(
        &closed,
        &agent,
        &format!(
            "env | grep -ci proxy; curl -s -m 3 http://{internet_addr}/ ; echo direct=$?; \
             curl -s -m 3 -x http://127.0.0.1:3128 http://{internet_addr}/ ; echo proxied=$?"
        ),
    )
    .await;
    let stdout = ran["stdout"].as_str().expect("stdout");
    assert!(stdout.starts_with("0\n"), "{ran}");
    assert!(stdout.contains("direct=7"), "{ran}");
    assert!(stdout.contains("proxied=7"), "{ran}");
    assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_working_directory_cannot_grow_past_its_disk_limit() {
    if !crate::helpers::can_build() {
        return;
    }
    let server = Server::start_with(&["--builder-network", "false"]).await;
    let id = built_environment(&server, "Sandbox Disk", BUILD_LIMIT).await;
    let filler = start_session_with(
        &server,
        json!({ "environment": id, "limits": { "disk_mb": 64 } }),
    )
    .await;
    let ran = exec(
        &server,
        &filler,
        "dd if=/dev/zero of=big bs=1M count=200 2>&1; echo dd=$?; \
         stat -c %s big; rm big; echo small > small.txt && cat small.txt",
    )
    .await;
    let stdout = ran["stdout"].as_str().expect("stdout");
    assert!(stdout.contains("No space left on device"), "{ran}");
    assert!(stdout.contains("dd=1\n"), "{ran}");
    let size: u64 = stdout
        .lines()
        .find_map(|line| line.parse().ok())
        .expect("the file's size");
    assert!(size <= 64 * 1024 * 1024, "{size} bytes: {ran}");
    assert!(stdout.ends_with("small\n"), "{ran}");
    // The node's disk is untouched by the attempt, and ending the session leaves no mount.
    let data = server.data_dir();
    let mounted = |needle: &std::path::Path| {
        std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap_or_default()
            .contains(&needle.display().to_string())
    };
    assert!(mounted(&data), "the limited working directory is a mount");
    end(&server, &filler).await;
    assert!(!mounted(&data), "a mount is left after the session ended");
}

/// A client whose requests carry `token` (a request's own `Authorization` still wins).
fn client_of(token: &str) -> reqwest::Client {
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert(
        reqwest::header::AUTHORIZATION,
        format!("Bearer {token}").parse().expect("header"),
    );
    crate::helpers::http_client();
    reqwest::Client::builder()
        .default_headers(headers)
        .build()
        .expect("client")
}

/// The processes of session `id`'s memory cgroup (and the groups below it), as the host
/// numbers them.
fn memory_group_processes(id: &str) -> Vec<i32> {
    fn walk(dir: &std::path::Path, id: &str, inside: bool, depth: usize, out: &mut Vec<i32>) {
        if depth == 0 {
            return;
        }
        if inside && let Ok(procs) = std::fs::read_to_string(dir.join("cgroup.procs")) {
            out.extend(
                procs
                    .lines()
                    .filter_map(|line| line.trim().parse::<i32>().ok()),
            );
        }
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            if entry.file_type().is_ok_and(|kind| kind.is_dir()) {
                let below = inside || entry.file_name() == id;
                walk(&entry.path(), id, below, depth - 1, out);
            }
        }
    }
    let mut found = Vec::new();
    for root in ["/sys/fs/cgroup/memory", "/sys/fs/cgroup"] {
        let root = std::path::Path::new(root);
        if root.join("cgroup.procs").exists() {
            walk(root, id, false, 9, &mut found);
            if !found.is_empty() {
                break;
            }
        }
    }
    found.sort_unstable();
    found.dedup();
    found
}

#[tokio::test]
async fn filling_tmp_shm_or_a_memfd_past_the_memory_limit_hurts_only_the_filling_session() {
    if !crate::helpers::can_build() {
        return;
    }
    let mut server = Server::start_with_tokens(
        &[("tok-acme", "acme"), ("tok-globex", "globex")],
        &["--builder-network", "false"],
    )
    .await;
    let (acme, globex) = (client_of("tok-acme"), client_of("tok-globex"));
    // The victim: another tenant's session, answering before and after each attack.
    server.client = globex.clone();
    let victim_env = built_environment(&server, "Memory Victim", BUILD_LIMIT).await;
    let victim = session(&server, &victim_env).await;
    server.client = acme.clone();
    let id = built_environment(&server, "Memory Filler", BUILD_LIMIT).await;
    let node = std::fs::read_link("/proc/self/exe").expect("own executable");
    for (what, command) in [
        ("/tmp", "dd if=/dev/zero of=/tmp/fill bs=1M count=200"),
        (
            "/dev/shm",
            "dd if=/dev/zero of=/dev/shm/fill bs=1M count=200",
        ),
        (
            "a memfd",
            "python3 -c \"import os\nfd = os.memfd_create('fill')\nfor _ in range(1300): os.write(fd, bytes(1 << 20))\nprint('filled')\"",
        ),
    ] {
        server.client = acme.clone();
        let filler = start_session_with(
            &server,
            json!({ "environment": id, "limits": { "memory_mb": 64 } }),
        )
        .await;
        let filler_id = filler["id"].as_str().expect("id").to_owned();
        // Nothing in the session's limited cgroup is the node (the process hosting serve):
        // no helper of the sandbox runs the node's program or shares its memory.
        let members = memory_group_processes(&filler_id);
        assert!(
            !members.is_empty(),
            "{what}: no process in the session's cgroup"
        );
        for pid in &members {
            let exe = std::fs::read_link(format!("/proc/{pid}/exe"));
            assert!(
                exe.as_ref().map_or(true, |exe| *exe != node),
                "{what}: process {pid} of the session's cgroup runs the node's program {exe:?}"
            );
        }
        let ran = exec(&server, &filler, command).await;
        let stderr = ran["stderr"].as_str().unwrap_or("");
        assert_ne!(ran["exit_code"], 0, "{what}: {ran}");
        assert!(
            ran["oom_killed"] == true || stderr.contains("No space left on device"),
            "{what}: the fill must be refused or OOM-killed: {ran}"
        );
        assert!(
            !ran["stdout"].as_str().unwrap_or("").contains("filled"),
            "{what}: {ran}"
        );
        // The serve process (this one) is alive and answers; the filling session still runs
        // commands, and the other tenant's session is untouched.
        let again = exec(&server, &filler, "echo ok").await;
        assert_eq!(again["stdout"], "ok\n", "{what}: {again}");
        server.client = globex.clone();
        let fine = exec(&server, &victim, "echo fine").await;
        assert_eq!(fine["stdout"], "fine\n", "{what}: {fine}");
        server.client = acme.clone();
        end(&server, &filler).await;
    }
}

/// Removes a file planted on the host when the test ends, however it ends.
struct Planted(std::path::PathBuf);

impl Drop for Planted {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[tokio::test]
async fn a_session_sees_only_the_allowed_part_of_etc_and_cannot_open_vsock_or_other_families() {
    if !crate::helpers::can_build() {
        return;
    }
    // A secret in the host's /etc, as a global npmrc or pip.conf with credentials would be.
    let name = format!(
        "plinth-test-secret-{}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_nanos()
    );
    let planted = Planted(std::path::Path::new("/etc").join(&name));
    std::fs::write(&planted.0, "registry-token=s3cret\n").expect("plant a file in /etc");
    let server = Server::start_with(&["--builder-network", "false"]).await;
    let id = built_environment(&server, "Sandbox Etc", BUILD_LIMIT).await;
    let agent = session(&server, &id).await;
    let ran = exec(
        &server,
        &agent,
        &format!(
            "cat /etc/{name} 2>&1; ls -a /etc | grep -c plinth-test-secret; echo ---; ls -a /etc; echo ---; \
             grep -c '^session:' /etc/passwd; test -s /etc/resolv.conf && echo resolv; \
             test -r /etc/hosts && echo hosts"
        ),
    )
    .await;
    let stdout = ran["stdout"].as_str().expect("stdout");
    let parts: Vec<&str> = stdout.split("---\n").collect();
    assert_eq!(parts.len(), 3, "{ran}");
    assert!(!parts[0].contains("s3cret"), "{ran}");
    assert!(
        parts[0].ends_with("0\n"),
        "the planted file is listed: {ran}"
    );
    let seen: BTreeSet<&str> = parts[1].lines().collect();
    for hidden in [
        "npmrc",
        "pip.conf",
        "gitconfig",
        "shadow",
        "environment",
        "ssh",
        "machine-id",
    ] {
        assert!(!seen.contains(hidden), "/etc/{hidden} is shown: {ran}");
    }
    for shown in ["passwd", "group", "hosts", "nsswitch.conf", "ld.so.cache"] {
        if std::path::Path::new("/etc").join(shown).exists() {
            assert!(seen.contains(shown), "/etc/{shown} is missing: {ran}");
        }
    }
    assert_eq!(parts[2], "1\nresolv\nhosts\n", "{ran}");

    // TLS roots are there (Python's default context loads them), and tools run as before.
    let tools = exec(
        &server,
        &agent,
        "python3 -c \"import ssl; print(len(ssl.create_default_context().get_ca_certs()) > 0)\"; \
         git --version >/dev/null && echo git; bash -c 'echo bash'; id -un; date +%Z >/dev/null && echo date",
    )
    .await;
    assert_eq!(
        tools["stdout"], "True\ngit\nbash\nsession\ndate\n",
        "{tools}"
    );

    // Socket families no session needs are refused by the filter (EPERM), whatever the kernel
    // would have answered; local, IP and netlink sockets still open.
    let sockets = exec(
        &server,
        &agent,
        "python3 -c \"\nimport socket\nfor name in ['AF_VSOCK', 'AF_PACKET', 'AF_ALG', 'AF_KEY', 'AF_BLUETOOTH', 'AF_UNIX', 'AF_INET', 'AF_INET6', 'AF_NETLINK']:\n    family = getattr(socket, name, None)\n    if family is None:\n        continue\n    kind = socket.SOCK_RAW if name in ('AF_PACKET', 'AF_KEY', 'AF_NETLINK', 'AF_BLUETOOTH') else (socket.SOCK_SEQPACKET if name == 'AF_ALG' else socket.SOCK_STREAM)\n    try:\n        socket.socket(family, kind).close()\n        print(name, 'opened')\n    except OSError as error:\n        print(name, error.errno)\n\"",
    )
    .await;
    let answers: BTreeSet<&str> = sockets["stdout"]
        .as_str()
        .expect("stdout")
        .lines()
        .collect();
    for refused in ["AF_VSOCK 1", "AF_PACKET 1", "AF_ALG 1", "AF_KEY 1"] {
        assert!(answers.contains(refused), "{refused}: {sockets}");
    }
    for opened in [
        "AF_UNIX opened",
        "AF_INET opened",
        "AF_INET6 opened",
        "AF_NETLINK opened",
    ] {
        assert!(answers.contains(opened), "{opened}: {sockets}");
    }
    drop(planted);
}
