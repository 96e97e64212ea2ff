//! A blob store that stops answering while a build runs: the S3-protocol server
//! (`PLINTH_TEST_S3_ENDPOINT`) behind a loopback forwarder this test takes down for longer
//! than the S3 client's own retries last. The build waits the outage out, its lease renewed,
//! and becomes ready; its log says what it waited for. A file write during the outage answers
//! `503 unavailable` with `Retry-After`, not `500`.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tokio::net::{TcpListener, TcpStream};

use crate::helpers::{Server, can_build, create_environment, put_file, send, wait_for_build};
use crate::waiting::eventually;

/// Forwards loopback connections to `upstream` while up; while down, it closes every
/// connection it holds and each new one at once, as a store that went away does.
struct Forwarder {
    addr: SocketAddr,
    up: Arc<AtomicBool>,
    open: Arc<Mutex<Vec<tokio::task::AbortHandle>>>,
    accepting: tokio::task::JoinHandle<()>,
}

impl Forwarder {
    async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("address");
        let up = Arc::new(AtomicBool::new(true));
        let open: Arc<Mutex<Vec<tokio::task::AbortHandle>>> = Arc::default();
        let accepting = {
            let (up, open) = (up.clone(), open.clone());
            plinth_kit::tasks::spawn(async move {
                while let Ok((mut client, _)) = listener.accept().await {
                    if !up.load(Ordering::SeqCst) {
                        drop(client);
                        continue;
                    }
                    let task = plinth_kit::tasks::spawn(async move {
                        if let Ok(mut server) = TcpStream::connect(upstream).await {
                            let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                        }
                    });
                    open.lock().expect("lock").push(task.abort_handle());
                }
            })
        };
        Forwarder {
            addr,
            up,
            open,
            accepting,
        }
    }

    fn down(&self) {
        self.up.store(false, Ordering::SeqCst);
        for task in self.open.lock().expect("lock").drain(..) {
            task.abort();
        }
    }

    fn up(&self) {
        self.up.store(true, Ordering::SeqCst);
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        self.accepting.abort();
        self.down();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_build_waits_out_a_blob_store_outage_and_writes_meanwhile_answer_503() {
    if !can_build() {
        return;
    }
    let Some(url) = crate::gc::fresh_bucket().await else {
        return;
    };
    let endpoint = std::env::var("PLINTH_TEST_S3_ENDPOINT").expect("endpoint");
    let upstream: SocketAddr = endpoint
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .parse()
        .expect("the S3 test endpoint is http://<ip>:<port>");
    let forwarder = Forwarder::start(upstream).await;
    let url = url.replace(&endpoint, &format!("http://{}", forwarder.addr));
    let server = Server::start_with(&["--blob-url", &url]).await;

    let id = create_environment(&server, "outage").await;
    put_file(&server, &id, "run.py", "print('hi')\n").await;
    put_file(
        &server,
        &id,
        "setup.sh",
        "echo setup-started\nsleep 6\necho made > made.txt\necho setup-done\n",
    )
    .await;
    let (status, started) = send(
        server
            .client
            .post(server.url(&format!("/v1/environments/{id}/build"))),
    )
    .await;
    assert!(status == 200 || status == 201 || status == 202, "{started}");

    // Once setup.sh runs (the source is materialized), the store goes away for longer than
    // the S3 client retries a request: storing the layer meets the outage.
    eventually(Duration::from_secs(60), async || {
        let (_, build) = send(
            server
                .client
                .get(server.url(&format!("/v1/environments/{id}/builds/1"))),
        )
        .await;
        assert_ne!(build["status"], "failed", "{build}");
        let started = build["log"]
            .as_str()
            .unwrap_or_default()
            .contains("setup-started");
        started.then_some(()).ok_or(build)
    })
    .await;
    forwarder.down();

    // A file write meanwhile: 503 with a time to retry, not 500.
    let response = server
        .client
        .put(server.url(&format!("/v1/environments/{id}/files/during.txt")))
        .body("written during the outage")
        .send()
        .await
        .expect("request");
    let retry_after = response.headers().get("retry-after").cloned();
    let (status, body) = crate::helpers::json(response).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "unavailable", "{body}");
    assert!(retry_after.is_some(), "a 503 says when to retry: {body}");

    tokio::time::sleep(Duration::from_secs(15)).await;
    forwarder.up();

    let build: Value = wait_for_build(&server, &id, 1, Duration::from_secs(300)).await;
    assert_eq!(build["status"], "ready", "{build}");
    let log = build["log"].as_str().unwrap_or_default();
    assert!(log.contains("setup-done"), "{log}");
    assert!(
        log.contains("retrying"),
        "the build waited the outage out: {log}"
    );
    server.stop().await;
}
