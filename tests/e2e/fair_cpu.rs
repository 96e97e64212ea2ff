//! Scopes share a node's CPU evenly however many sessions each runs: through a real `plinth
//! serve`, one tenant runs three busy sessions and another one, all on the same CPU; the lone
//! session gets about as much CPU as the three together, not a quarter of it.

use std::time::Duration;

use serde_json::{Value, json};

use crate::helpers::{Server, can_build, queue_first_build, send, tokens_toml};
use crate::waiting::eventually;

const ACME: &str = "tok-acme-cpu";
const GLOBEX: &str = "tok-globex-cpu";

/// Spins on CPU 0 for two seconds of wall time, then prints the CPU seconds it got.
const SPIN: &str = "python3 -c 'import os, time\n\
os.sched_setaffinity(0, {0})\n\
end = time.monotonic() + 2\n\
while time.monotonic() < end: pass\n\
print(time.process_time())'";

/// A built environment of the tenant of `token`: its id.
async fn built(server: &Server, token: &str, name: &str) -> String {
    let id = queue_first_build(server, token, name, "run.py", "print('hi')\n").await;
    eventually(Duration::from_secs(300), async || {
        let (status, build) = send(
            server
                .client
                .get(server.url(&format!("/v1/environments/{id}/builds/1")))
                .bearer_auth(token),
        )
        .await;
        assert_eq!(status, 200, "{build}");
        assert_ne!(build["status"], "failed", "{build}");
        (build["status"] == "ready").then_some(()).ok_or(build)
    })
    .await;
    id
}

async fn session(server: &Server, token: &str, environment: &str) -> String {
    let (status, session) = send(
        server
            .client
            .post(server.url("/v1/sessions"))
            .bearer_auth(token)
            .json(&json!({ "environment": environment })),
    )
    .await;
    assert_eq!(status, 201, "{session}");
    session["id"].as_str().expect("id").to_owned()
}

/// Runs `command` in `session` as the tenant of `token`; answers its result.
async fn exec(server: &Server, token: &str, session: &str, command: &str) -> Value {
    let (status, ran) = send(
        server
            .client
            .post(server.url(&format!("/v1/sessions/{session}/exec")))
            .bearer_auth(token)
            .json(&json!({ "command": command, "timeout_ms": 60_000 })),
    )
    .await;
    assert_eq!(status, 200, "{ran}");
    ran
}

fn cpu_seconds(ran: &Value) -> f64 {
    assert_eq!(ran["exit_code"], 0, "{ran}");
    ran["stdout"]
        .as_str()
        .and_then(|text| text.trim().parse().ok())
        .unwrap_or_else(|| panic!("CPU seconds: {ran}"))
}

#[tokio::test]
async fn a_tenant_with_one_session_gets_as_much_cpu_as_one_with_three() {
    if !can_build() {
        return;
    }
    let config = tokens_toml(&[(ACME, "acme"), (GLOBEX, "globex")]);
    let server = Server::start_with_config(&config, &["--builder-network", "false"]).await;
    let (acme_env, globex_env) = tokio::join!(
        built(&server, ACME, "Acme spinners"),
        built(&server, GLOBEX, "Globex spinner")
    );
    let mut acme = Vec::new();
    for _ in 0..3 {
        acme.push(session(&server, ACME, &acme_env).await);
    }
    let globex = session(&server, GLOBEX, &globex_env).await;
    // Warm: each session's first command pays for its start.
    for id in &acme {
        exec(&server, ACME, id, "true").await;
    }
    exec(&server, GLOBEX, &globex, "true").await;

    let spins = acme
        .iter()
        .map(|id| exec(&server, ACME, id, SPIN))
        .collect::<Vec<_>>();
    let (acme_ran, globex_ran) = tokio::join!(
        futures::future::join_all(spins),
        exec(&server, GLOBEX, &globex, SPIN)
    );
    let acme_cpu: Vec<f64> = acme_ran.iter().map(cpu_seconds).collect();
    let globex_cpu = cpu_seconds(&globex_ran);
    let acme_total: f64 = acme_cpu.iter().sum();
    // Evenly by scope, Globex's one session gets about what Acme's three get together (half
    // the CPU each: three times any one of Acme's). By session, it would get a quarter: the
    // same as each of Acme's.
    let most_of_one = acme_cpu.iter().copied().fold(0.0, f64::max);
    assert!(
        globex_cpu > 2.0 * most_of_one,
        "Globex's lone session got {globex_cpu:.2} CPU s, Acme's three {acme_cpu:?}"
    );
    assert!(
        globex_cpu > 0.6 * acme_total,
        "Globex's lone session got {globex_cpu:.2} CPU s, Acme's three {acme_total:.2} together"
    );
    server.stop().await;
}
