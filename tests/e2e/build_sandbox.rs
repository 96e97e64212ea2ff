//! The build sandbox, tested as the attacker: the `setup.sh` of a real build (`plinth serve`
//! with its in-process builder, the network on as by default, so through the build's egress
//! proxy) tries to reach the services the host listens on, and to read Plinth's data, another
//! environment and a session; the test checks each attempt failed. Traffic goes only to
//! loopback and to the build's own network namespace.

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::json;

use crate::helpers::{Server, build_ready, exec_in, put_file, send, wait_for_build};

const BUILD_LIMIT: Duration = Duration::from_secs(180);

#[tokio::test]
async fn a_build_with_the_network_reaches_no_host_port_and_sees_nothing_of_plinth() {
    if !crate::helpers::can_build() {
        return;
    }
    let server = Server::start_with(&["--builder-network", "true"]).await;
    // The victims: another environment, built, and a session of it with a file of its own.
    let victim = crate::helpers::create_environment(&server, "Build Sandbox Victim").await;
    put_file(&server, &victim, "run.py", "print('victim')\n").await;
    build_ready(&server, &victim, 1, BUILD_LIMIT).await;
    let (status, session) = send(
        server
            .client
            .post(server.url("/v1/sessions"))
            .json(&json!({ "environment": victim })),
    )
    .await;
    assert_eq!(status, 201, "{session}");
    let session_id = session["id"].as_str().expect("session id").to_owned();
    let ran = exec_in(
        &server,
        &session_id,
        json!({ "command": "echo session-secret > mine.txt", "timeout_ms": 60_000 }),
    )
    .await;
    assert_eq!(ran["exit_code"], 0, "{ran}");

    // Every port serve listens on (gateway, catalog, source, node) and anything else on the
    // host, straight and through the build's proxy, plain and tunnelled.
    let ports = crate::helpers::host_listening_ports();
    let gateway_port = server
        .base
        .rsplit(':')
        .next()
        .and_then(|port| port.parse::<u16>().ok())
        .expect("gateway port");
    for port in [
        gateway_port,
        server.catalog_addr().port(),
        server.source_addr().port(),
    ] {
        assert!(ports.contains(&port), "{port} is not in {ports:?}");
    }
    let data = server.data_dir();
    let data = data.display();
    let probes = ports
        .iter()
        .map(|port| format!("probe {port}"))
        .collect::<Vec<_>>()
        .join("\n");
    let script = format!(
        r#"probe() {{
  for host in 127.0.0.1 ::1; do
    if timeout 5 bash -c "exec 3<>/dev/tcp/$host/$1" 2>/dev/null; then echo "attack: reached $host $1"; fi
  done
  plain=$(curl -s -m 10 --noproxy '' -x "$HTTP_PROXY" -o /dev/null -w '%{{http_code}}' "http://127.0.0.1:$1/")
  tunnel=$(curl -s -m 10 --noproxy '' -p -x "$HTTPS_PROXY" -o /dev/null -w '%{{http_connect}}' "http://127.0.0.1:$1/")
  echo "attack: proxy $1 $plain $tunnel"
}}
{probes}
for path in '{data}' '{data}/catalog.db' '{data}/blobs' '{data}/builder' '{data}/node' \
    '{data}/node/sessions/{session_id}/work/mine.txt' /home/session; do
  if ls -A "$path" >/dev/null 2>&1; then echo "attack: listed $path"; fi
done
echo "attack: env $(ls -A /env | tr '\n' ' ')"
grep -E '^(CapEff|CapBnd|NoNewPrivs|Seccomp):' /proc/self/status | sed 's/^/attack: status /'
"#
    );
    let attacker = crate::helpers::create_environment(&server, "Build Sandbox Attacker").await;
    put_file(&server, &attacker, "setup.sh", script).await;
    let (status, queued) = send(
        server
            .client
            .post(server.url(&format!("/v1/environments/{attacker}/build"))),
    )
    .await;
    assert_eq!(status, 202, "{queued}");
    let build = wait_for_build(&server, &attacker, 1, BUILD_LIMIT).await;
    assert_eq!(build["status"], "ready", "{build}");
    let log = build["log"].as_str().expect("log");
    let said: Vec<&str> = log
        .lines()
        .filter_map(|line| line.strip_prefix("attack: "))
        .collect();

    assert!(
        !said.iter().any(|line| line.starts_with("reached ")),
        "{log}"
    );
    let answers: Vec<&str> = said
        .iter()
        .copied()
        .filter(|line| line.starts_with("proxy "))
        .collect();
    assert_eq!(answers.len(), ports.len(), "{log}");
    for answer in &answers {
        assert!(answer.ends_with(" 403 403"), "{answer}\n{log}");
    }
    assert!(
        !said.iter().any(|line| line.starts_with("listed ")),
        "{log}"
    );
    let slug = said
        .iter()
        .find_map(|line| line.strip_prefix("env "))
        .expect("the /env listing");
    let env: BTreeSet<&str> = slug.split_whitespace().collect();
    assert_eq!(env.len(), 2, "only its own environment and HOME: {log}");
    assert!(env.contains(".home"), "{log}");
    let status: BTreeSet<&str> = said
        .iter()
        .filter_map(|line| line.strip_prefix("status "))
        .collect();
    assert_eq!(
        status,
        BTreeSet::from([
            "CapEff:\t0000000000000000",
            "CapBnd:\t0000000000000000",
            "NoNewPrivs:\t1",
            "Seccomp:\t2",
        ]),
        "{log}"
    );

    // Nothing changed for the victims: the session still reads its file, the gateway serves.
    let ran = exec_in(
        &server,
        &session_id,
        json!({ "command": "cat mine.txt", "timeout_ms": 60_000 }),
    )
    .await;
    assert_eq!(ran["stdout"], "session-secret\n", "{ran}");
}
