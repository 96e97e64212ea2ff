//! A node the gateway cannot reach although the catalog still hears its heartbeats, with real
//! processes (`plinth catalog`, `source`, `gateway`, `builder` and two `plinth node`s): the
//! gateway reaches node B through a loopback forwarder advertised as B's address, and the
//! forwarder goes silent (requests still reach B, nothing B answers comes back; new
//! connections are taken and held the same way), as a partition behind a proxy or sidecar
//! looks. Under a few concurrent creates and commands, every request answers (success, or
//! `503` with `Retry-After` naming the node) instead of hanging; creates succeed, the one
//! first placed on B placed again on A; once a call to B has timed out no session goes to B;
//! the half-made session B was handed is detached and its working directory removed; and
//! once the forwarder heals, B is given sessions again.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use plinth_kit::auth::Role;
use plinth_proto::catalog::v1 as pb;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};

use crate::helpers::{create_environment_at, send};
use crate::node_restart::{Core, command, spawn, start_core, strings};
use crate::processes::wait_until_ready;
use crate::waiting::eventually;

/// The gateway's deadlines in this test (`gateway.node_call_timeout_ms`,
/// `gateway.node_attach_timeout_ms`), small so the test is quick.
const CALL_TIMEOUT_MS: u64 = 1500;
const ATTACH_TIMEOUT_MS: u64 = 8000;
/// Far longer than any answer may take: a request that takes this long hung.
const ANSWER_BOUND: Duration = Duration::from_secs(45);

/// Forwards loopback connections to `upstream`. While silent, what the client sends still
/// reaches the upstream, but nothing the upstream answers comes back, on the connections it
/// holds and on new ones alike. Healing closes the connections that lived through the
/// silence (their streams lost frames), so clients connect afresh.
struct Partition {
    addr: SocketAddr,
    /// Where it forwards to, once known (the node behind it listens on port 0, and learns the
    /// address it advertises, this one, first); until then it hangs up.
    upstream: Arc<std::sync::OnceLock<SocketAddr>>,
    silent: Arc<AtomicBool>,
    open: Arc<Mutex<Vec<tokio::task::AbortHandle>>>,
    accepting: tokio::task::JoinHandle<()>,
}

impl Partition {
    async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("address");
        let upstream: Arc<std::sync::OnceLock<SocketAddr>> = Arc::default();
        let silent = Arc::new(AtomicBool::new(false));
        let open: Arc<Mutex<Vec<tokio::task::AbortHandle>>> = Arc::default();
        let accepting = {
            let (silent, open, upstream) = (silent.clone(), open.clone(), upstream.clone());
            plinth_kit::tasks::spawn(async move {
                while let Ok((client, _)) = listener.accept().await {
                    let silent = silent.clone();
                    let upstream = upstream.get().copied();
                    let task = plinth_kit::tasks::spawn(async move {
                        let Some(upstream) = upstream else {
                            return;
                        };
                        let Ok(server) = TcpStream::connect(upstream).await else {
                            return;
                        };
                        let (mut client_read, mut client_write) = client.into_split();
                        let (mut server_read, mut server_write) = server.into_split();
                        let requests = async {
                            let _ = tokio::io::copy(&mut client_read, &mut server_write).await;
                            let _ = server_write.shutdown().await;
                        };
                        let answers = async {
                            let mut buffer = vec![0u8; 64 * 1024];
                            loop {
                                match server_read.read(&mut buffer).await {
                                    Ok(0) | Err(_) => break,
                                    Ok(n) => {
                                        if silent.load(Ordering::SeqCst) {
                                            continue;
                                        }
                                        if client_write.write_all(&buffer[..n]).await.is_err() {
                                            break;
                                        }
                                    }
                                }
                            }
                        };
                        tokio::select! {
                            () = requests => {}
                            () = answers => {}
                        }
                    });
                    open.lock().expect("lock").push(task.abort_handle());
                }
            })
        };
        Partition {
            addr,
            upstream,
            silent,
            open,
            accepting,
        }
    }

    /// Forwards to `upstream` from now on.
    fn forward_to(&self, upstream: SocketAddr) {
        self.upstream.set(upstream).expect("set once");
    }

    fn silence(&self) {
        self.silent.store(true, Ordering::SeqCst);
    }

    fn heal(&self) {
        self.silent.store(false, Ordering::SeqCst);
        for task in self.open.lock().expect("lock").drain(..) {
            task.abort();
        }
    }
}

impl Drop for Partition {
    fn drop(&mut self) {
        self.accepting.abort();
        self.heal();
    }
}

/// When a request of the load began, its answer, and the session it created (if any).
type Seen = (Instant, Answer, Option<String>);

/// One request as its client saw it.
#[derive(Debug, Clone)]
struct Answer {
    what: String,
    status: u16,
    retry_after: Option<String>,
    body: Value,
    took: Duration,
}

impl Answer {
    /// Success, or `503 unavailable` with `Retry-After`.
    fn acceptable(&self) -> bool {
        (200..300).contains(&self.status)
            || (self.status == 503
                && self.retry_after.is_some()
                && self.body["error"]["code"] == "unavailable")
    }
}

async fn answer(what: String, request: reqwest::RequestBuilder) -> Answer {
    let started = Instant::now();
    let response = request.send().await.expect("the gateway answers");
    let status = response.status().as_u16();
    let retry_after = response
        .headers()
        .get("retry-after")
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned);
    let text = response.text().await.expect("body");
    let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
    Answer {
        what,
        status,
        retry_after,
        body,
        took: started.elapsed(),
    }
}

async fn create(client: &reqwest::Client, base: &str, environment: &str) -> Answer {
    answer(
        "create".to_owned(),
        client
            .post(format!("{base}/v1/sessions"))
            .json(&json!({ "environment": environment })),
    )
    .await
}

async fn exec(client: &reqwest::Client, base: &str, session: &str) -> Answer {
    answer(
        format!("exec in {session}"),
        client
            .post(format!("{base}/v1/sessions/{session}/exec"))
            .json(&json!({ "command": "echo hi" })),
    )
    .await
}

/// The node address the catalog records for a session (any status).
async fn node_of(catalog: &str, session: &str) -> String {
    let channel = tonic::transport::Endpoint::from_shared(catalog.to_owned())
        .expect("url")
        .connect()
        .await
        .expect("connect");
    pb::session_service_client::SessionServiceClient::with_interceptor(
        channel,
        crate::credentials::shared().interceptor(Role::Gateway),
    )
    .get_session(pb::GetSessionRequest {
        scope: "default".into(),
        id: session.into(),
    })
    .await
    .expect("the catalog has the session")
    .into_inner()
    .node_address
}

/// The sessions a node holds on disk.
fn on_disk(state: &Path) -> BTreeSet<String> {
    std::fs::read_dir(state.join("node").join("sessions"))
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|entry| entry.file_name().to_string_lossy().into_owned())
                .filter(|name| name.starts_with("sess_"))
                .collect()
        })
        .unwrap_or_default()
}

/// The gateway's `/metrics`, read as an operator's scraper does.
async fn metrics(client: &reqwest::Client, base: &str) -> String {
    client
        .get(format!("{base}/metrics"))
        .bearer_auth(crate::credentials::shared().token(Role::Observer))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics")
}

/// A counter's value in a Prometheus text page (0 when absent).
fn counter(page: &str, name: &str) -> f64 {
    page.lines()
        .filter(|line| line.starts_with(name))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_partitioned_node_costs_callers_a_deadline_and_gets_no_sessions_until_it_answers() {
    if !crate::helpers::can_build() {
        return;
    }
    let data = tempfile::tempdir().expect("data");
    let config = crate::failover::write_config(
        data.path(),
        &format!(
            "[gateway]\nnode_call_timeout_ms = {CALL_TIMEOUT_MS}\n\
             node_attach_timeout_ms = {ATTACH_TIMEOUT_MS}\nnode_suspect_ms = 10000\n"
        ),
    );
    let log = data.path().join("services.log");
    plinth_blobs::install_tls_provider();
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .expect("client");
    let blob_url = format!("file://{}/blobs", data.path().display());
    let (mut services, core) = start_core(&client, &config, &log, &blob_url).await;
    let Core { catalog, http, .. } = core;
    let catalog_url = format!("http://{catalog}");
    services.push(spawn(
        &strings(&[
            "builder",
            "--standalone",
            "--name",
            "builder",
            "--catalog-url",
            &catalog_url,
            "--blob-url",
            &blob_url,
        ]),
        &config,
        &log,
    ));
    // Node A, reached directly; node B, reached through the partition.
    let partition = Partition::start().await;
    let b_address = format!("http://{}", partition.addr);
    let mut states: Vec<PathBuf> = Vec::new();
    for (name, advertise, base_uid) in [
        ("node-a", None, "200000"),
        ("node-b", Some(b_address.clone()), "300000"),
    ] {
        let state = data.path().join(name);
        let mut args = strings(&[
            "node",
            "--standalone",
            "--name",
            name,
            "--data-dir",
            &state.display().to_string(),
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
            "--catalog-url",
            &catalog_url,
            "--blob-url",
            &blob_url,
            "--session-base-uid",
            base_uid,
        ]);
        if let Some(advertise) = advertise {
            args.extend(strings(&["--advertise-url", &advertise]));
        }
        let log = data.path().join(format!("{name}.log"));
        let (mut process, bound) = crate::cluster::spawn_reporting(
            &mut command(&args, &config, &log),
            &data.path().join(format!("{name}.ready")),
            Some(&log),
        )
        .await;
        if name == "node-b" {
            partition.forward_to(bound["listen"]);
        }
        let admin = bound["admin_listen"];
        wait_until_ready(&client, &format!("http://{admin}/readyz"), &mut process).await;
        services.push(process);
        states.push(state);
    }
    let b_state = states[1].clone();
    let base = format!("http://{http}");
    let logs = || {
        let mut text = String::new();
        for file in ["services.log", "node-a.log", "node-b.log"] {
            text.push_str(&std::fs::read_to_string(data.path().join(file)).unwrap_or_default());
        }
        text
    };

    let environment = create_environment_at(&client, &base, "Partition").await;
    let (status, _) = send(
        client
            .put(format!(
                "{base}/v1/environments/{environment}/files/hello.txt"
            ))
            .body("hello\n"),
    )
    .await;
    assert_eq!(status, 200);
    send(client.post(format!("{base}/v1/environments/{environment}/build"))).await;
    let build = crate::helpers::wait_for_build_at(
        &client,
        &base,
        &environment,
        1,
        Duration::from_secs(120),
    )
    .await;
    assert_eq!(build["status"], "ready", "{build}");

    // Two sessions on A and one on B (each node has the version and a connection), so the
    // next placement, the least-loaded node, is B.
    let (mut on_a, mut on_b) = (Vec::<String>::new(), Vec::<String>::new());
    let arranged = Instant::now();
    while on_a.len() < 2 || on_b.is_empty() {
        assert!(
            arranged.elapsed() < Duration::from_secs(60),
            "both nodes take sessions: {on_a:?} {on_b:?}\n{}",
            logs()
        );
        let created = create(&client, &base, &environment).await;
        if created.status == 503 {
            // A node not registered yet.
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        }
        assert_eq!(created.status, 201, "{created:?}");
        let id = created.body["id"].as_str().expect("id").to_owned();
        let ran = exec(&client, &base, &id).await;
        assert_eq!(ran.status, 200, "{ran:?}");
        if node_of(&catalog_url, &id).await == b_address {
            if on_b.is_empty() {
                on_b.push(id);
            } else {
                let (status, _) = send(client.delete(format!("{base}/v1/sessions/{id}"))).await;
                assert_eq!(status, 200);
            }
        } else {
            on_a.push(id);
        }
    }
    let session_on_b = on_b[0].clone();
    let before = on_disk(&b_state);
    let retries_before = counter(
        &metrics(&client, &base).await,
        "plinth_session_placement_retries_total",
    );

    // The partition. A create now goes to B first; its attach reaches B, the answer does not
    // come back.
    partition.silence();
    let first = {
        let (client, base, environment) = (client.clone(), base.clone(), environment.clone());
        plinth_kit::tasks::spawn(async move { create(&client, &base, &environment).await })
    };
    // B is handed the session: its working directory appears.
    let half_made = eventually(Duration::from_secs(20), async || {
        let now = on_disk(&b_state);
        match now.difference(&before).next() {
            Some(id) => Ok(id.clone()),
            None => Err(format!("node B has not received the attach\n{}", logs())),
        }
    })
    .await;
    // A command in B's session answers within the deadline: 503, naming the node.
    let timed_out = exec(&client, &base, &session_on_b).await;
    assert_eq!(timed_out.status, 503, "{timed_out:?}");
    assert!(timed_out.retry_after.is_some(), "{timed_out:?}");
    assert_eq!(
        timed_out.body["error"]["code"], "unavailable",
        "{timed_out:?}"
    );
    let message = timed_out.body["error"]["message"].as_str().unwrap_or("");
    assert!(
        message.contains(&b_address) && message.contains("did not answer in time"),
        "{timed_out:?}"
    );
    assert!(timed_out.took < ANSWER_BOUND, "{timed_out:?}");
    let first_timeout = Instant::now();

    // A little load: creates and commands in the new sessions, and commands in B's session.
    let answers: Arc<Mutex<Vec<Seen>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let mut workers = Vec::new();
    for _ in 0..3 {
        let (client, base, environment, answers, stop) = (
            client.clone(),
            base.clone(),
            environment.clone(),
            answers.clone(),
            stop.clone(),
        );
        workers.push(plinth_kit::tasks::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let started = Instant::now();
                let created = create(&client, &base, &environment).await;
                let id = created.body["id"].as_str().map(str::to_owned);
                answers
                    .lock()
                    .expect("lock")
                    .push((started, created, id.clone()));
                if let Some(id) = id {
                    let ran = exec(&client, &base, &id).await;
                    answers.lock().expect("lock").push((started, ran, None));
                    let ended = answer(
                        format!("end {id}"),
                        client.delete(format!("{base}/v1/sessions/{id}")),
                    )
                    .await;
                    answers.lock().expect("lock").push((started, ended, None));
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }));
    }
    {
        let (client, base, answers, stop, session) = (
            client.clone(),
            base.clone(),
            answers.clone(),
            stop.clone(),
            session_on_b.clone(),
        );
        workers.push(plinth_kit::tasks::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let started = Instant::now();
                let ran = exec(&client, &base, &session).await;
                answers.lock().expect("lock").push((started, ran, None));
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }));
    }
    let first = first.await.expect("the first create answers");
    tokio::time::sleep(Duration::from_secs(6)).await;
    stop.store(true, Ordering::SeqCst);
    for worker in workers {
        worker.await.expect("worker");
    }

    // The first create was placed again, on A, after its attach on B timed out.
    assert_eq!(first.status, 201, "{first:?}\n{}", logs());
    assert!(first.took < ANSWER_BOUND, "{first:?}");
    let first_id = first.body["id"].as_str().expect("id").to_owned();
    assert_ne!(first_id, half_made);
    assert_ne!(node_of(&catalog_url, &first_id).await, b_address);
    // Every request answered in time, each a success or a 503 with Retry-After; every create
    // succeeded, none of them on B.
    let answers = answers.lock().expect("lock").clone();
    assert!(
        answers.len() >= 6,
        "the load made a few requests: {answers:?}"
    );
    for (started, answered, id) in &answers {
        assert!(answered.took < ANSWER_BOUND, "{answered:?}");
        assert!(answered.acceptable(), "{answered:?}\n{}", logs());
        if answered.what == "create" {
            assert_eq!(answered.status, 201, "{answered:?}");
            assert!(*started >= first_timeout);
            let id = id.as_ref().expect("a created session");
            assert_ne!(
                node_of(&catalog_url, id).await,
                b_address,
                "a session was placed on the partitioned node after a call to it timed out"
            );
        } else if answered.what.contains(&session_on_b) {
            assert_eq!(answered.status, 503, "{answered:?}");
        } else {
            assert_eq!(answered.status, 200, "{answered:?}");
        }
    }
    // Only the first create was placed twice: none of the load's was placed on B at all.
    let metrics = metrics(&client, &base).await;
    assert_eq!(
        counter(&metrics, "plinth_session_placement_retries_total") - retries_before,
        1.0,
        "{metrics}"
    );
    assert!(
        counter(&metrics, "plinth_gateway_nodes_marked_suspect_total") >= 1.0,
        "{metrics}"
    );

    // Healed: B answers the gateway's probes, takes sessions again, and the half-made session
    // it was handed is gone from it (ended in the catalog when its attach timed out, then
    // detached by B on a heartbeat).
    partition.heal();
    let back_on_b = eventually(Duration::from_secs(60), async || {
        let created = create(&client, &base, &environment).await;
        assert_eq!(created.status, 201, "{created:?}");
        let id = created.body["id"].as_str().expect("id").to_owned();
        if node_of(&catalog_url, &id).await == b_address {
            Ok(id)
        } else {
            Err(format!(
                "node B got no session since the partition healed\n{}",
                logs()
            ))
        }
    })
    .await;
    let ran = exec(&client, &base, &back_on_b).await;
    assert_eq!(ran.status, 200, "{ran:?}");
    let ran = exec(&client, &base, &session_on_b).await;
    assert_eq!(
        ran.status, 200,
        "B's session outlived the partition: {ran:?}"
    );
    let workdir = crate::helpers::host_workdir(&b_state, &half_made);
    eventually(Duration::from_secs(30), async || {
        if on_disk(&b_state).contains(&half_made) || workdir.exists() {
            Err(format!(
                "the half-made session {half_made} is still on node B\n{}",
                logs()
            ))
        } else {
            Ok(())
        }
    })
    .await;
    drop(services);
}
