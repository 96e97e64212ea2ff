//! A data directory whose disk fills: `plinth serve` on a small ext4 file system (a loop
//! mount this test makes). Writes past its capacity answer `507 insufficient_storage` naming
//! the store, the `plinth_store_full` gauge and `/readyz`'s details say so, reads and
//! sessions go on (the node's state and the builds live on another disk here, as they would
//! on a host that separates them), nothing written before is damaged, and writes succeed
//! again once files are deleted and collected, without a restart.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::{Value, json};

use crate::helpers::{Server, built_environment, can_build, exec_in, send, start_session_with};

/// Size of the file system; small enough to fill in seconds.
const FS_MIB: u64 = 48;
/// Size of each file written to fill it.
const FILE_BYTES: usize = 2 << 20;

/// An ext4 image mounted on a directory; unmounted (and its image removed) when dropped,
/// whatever the test did.
struct LoopMount {
    dir: tempfile::TempDir,
    _image_dir: tempfile::TempDir,
}

impl LoopMount {
    fn new(mib: u64) -> Self {
        let image_dir = tempfile::tempdir().expect("temp dir");
        let image = image_dir.path().join("fs.img");
        std::fs::File::create(&image)
            .and_then(|file| file.set_len(mib << 20))
            .expect("image");
        run(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&image));
        let dir = tempfile::tempdir().expect("mount point");
        run(Command::new("mount")
            .args(["-o", "loop"])
            .arg(&image)
            .arg(dir.path()));
        LoopMount {
            dir,
            _image_dir: image_dir,
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for LoopMount {
    fn drop(&mut self) {
        let _ = Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

fn run(command: &mut Command) {
    let output = command.output().expect("run");
    assert!(
        output.status.success(),
        "{command:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Distinct content for file `n`.
fn content(n: usize) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(FILE_BYTES);
    let mut state = (n as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    while bytes.len() < FILE_BYTES {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        bytes.extend_from_slice(&state.to_le_bytes());
    }
    bytes
}

async fn put(server: &Server, id: &str, n: usize) -> (u16, Value, Option<String>) {
    let response = server
        .client
        .put(server.url(&format!("/v1/environments/{id}/files/fill/{n}.bin")))
        .body(content(n))
        .send()
        .await
        .expect("request");
    let retry_after = response
        .headers()
        .get("retry-after")
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned);
    let (status, body) = crate::helpers::json(response).await;
    (status, body, retry_after)
}

fn gauge(store: &str) -> Option<f64> {
    let rendered = plinth_kit::telemetry::render_metrics();
    let prefix = format!("plinth_store_full{{store=\"{store}\"}} ");
    rendered
        .lines()
        .find_map(|line| line.strip_prefix(prefix.as_str()))
        .and_then(|value| value.trim().parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_data_directory_refuses_writes_with_507_and_recovers_once_space_is_freed() {
    if !can_build() {
        return;
    }
    // Dropped last: the server, and its data directory on the mount, go first.
    let mount = LoopMount::new(FS_MIB);
    let elsewhere = tempfile::tempdir().expect("temp dir");
    let config = elsewhere.path().join("plinth.toml");
    let node: PathBuf = elsewhere.path().join("node");
    let builder: PathBuf = elsewhere.path().join("builder");
    std::fs::write(
        &config,
        format!(
            "[node]\nstate_dir = {:?}\n\n[builder]\nwork_dir = {:?}\n",
            node.to_str().expect("utf-8"),
            builder.to_str().expect("utf-8")
        ),
    )
    .expect("config");
    let data_dir = tempfile::tempdir_in(mount.path()).expect("data dir on the mount");
    let server = Server::start_in(data_dir, &["--config", config.to_str().expect("utf-8")]).await;

    // Before the disk fills: an environment built, to start a session from later.
    let environment = built_environment(&server, "full-disk", Duration::from_secs(120)).await;
    assert_eq!(gauge("blobs"), Some(0.0), "registered at 0 from the start");

    // Fill it: every write succeeds until one answers 507 naming the store.
    let mut written = Vec::new();
    let refusal = loop {
        let n = written.len();
        assert!(
            n < (FS_MIB as usize * 2),
            "{n} files of 2 MiB fit on a {FS_MIB} MiB disk"
        );
        let (status, body, retry_after) = put(&server, &environment, n).await;
        match status {
            200 | 201 => written.push(n),
            507 => break (body, retry_after),
            other => panic!("a write on a filling disk answered {other}: {body}"),
        }
    };
    assert!(written.len() >= 4, "{} files fit", written.len());
    let (body, retry_after) = refusal;
    assert_eq!(body["error"]["code"], "insufficient_storage", "{body}");
    let store = body["error"]["detail"]["store"]
        .as_str()
        .expect("detail.store")
        .to_owned();
    assert!(
        ["blobs", "spool", "database"].contains(&store.as_str()),
        "{body}"
    );
    let message = body["error"]["message"].as_str().expect("message");
    assert!(message.contains("is full"), "{message}");
    assert!(message.contains("free space"), "{message}");
    assert!(retry_after.is_some(), "a 507 says when to try again");
    assert_eq!(gauge(&store), Some(1.0), "the gauge names the full store");

    // Reads go on, and nothing written before is damaged.
    for &n in &written {
        let response = server
            .client
            .get(server.url(&format!(
                "/v1/environments/{environment}/files/fill/{n}.bin"
            )))
            .send()
            .await
            .expect("request");
        assert_eq!(response.status(), 200, "file {n}");
        assert!(
            response.bytes().await.expect("body").as_ref() == content(n).as_slice(),
            "file {n} reads back as written"
        );
    }
    // So do sessions: the node's state is on another disk.
    let session = start_session_with(&server, json!({ "environment": environment })).await;
    let ran = exec_in(
        &server,
        session["id"].as_str().expect("id"),
        json!({ "command": "echo alive" }),
    )
    .await;
    assert_eq!(ran["exit_code"], 0, "{ran}");
    assert!(
        ran["stdout"].as_str().unwrap_or_default().contains("alive"),
        "{ran}"
    );

    // Free space: delete files and collect their blobs. Deletes and collection have room:
    // new content is refused while less than 8 MiB is free. Writes then succeed without a
    // restart, and the gauge goes back to 0.
    let freed = written.len().min(8);
    for &n in &written[..freed] {
        let (status, body) = send(server.client.delete(server.url(&format!(
            "/v1/environments/{environment}/files/fill/{n}.bin"
        ))))
        .await;
        assert!(
            status == 200 || status == 204,
            "delete {n}: {status} {body}"
        );
    }
    let gc = crate::gc::gc_config(&server.data_dir(), None);
    let collected = crate::gc::pass_now(&gc).await;
    let again = written.len();
    let (status, body, _) = put(&server, &environment, again).await;
    assert!(
        status == 200 || status == 201,
        "after freeing: {status} {body}"
    );
    let mut cleared = false;
    for _ in 0..100 {
        if gauge(&store) == Some(0.0) {
            cleared = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let df = Command::new("df")
        .arg("-B1")
        .arg(mount.path())
        .output()
        .expect("df");
    assert!(
        cleared,
        "the gauge clears once the store has room: {store} is {:?}; collected: {collected}; {}",
        gauge(&store),
        String::from_utf8_lossy(&df.stdout)
    );
    for &n in &written[freed..] {
        let response = server
            .client
            .get(server.url(&format!(
                "/v1/environments/{environment}/files/fill/{n}.bin"
            )))
            .send()
            .await
            .expect("request");
        assert_eq!(response.status(), 200, "file {n}");
        assert!(
            response.bytes().await.expect("body").as_ref() == content(n).as_slice(),
            "file {n} is intact"
        );
    }
    server.stop().await;
    drop(mount);
}
