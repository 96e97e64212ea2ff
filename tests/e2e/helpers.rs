//! Starting Plinth the way `main` does, on port 0, with a private data directory.

use clap::Parser as _;
use plinth::args::{Cli, Command};
use plinth::config::Config;
use plinth::serve::{self, Running};
use serde_json::Value;

/// A `plinth serve` in this process.
pub struct Server {
    pub base: String,
    pub client: reqwest::Client,
    running: Option<Running>,
    _data_dir: tempfile::TempDir,
}

impl Server {
    /// `plinth serve` with no extra flags.
    pub async fn start() -> Self {
        Self::start_with(&[]).await
    }

    /// `plinth serve` with these flags added, parsed by the real command line.
    pub async fn start_with(flags: &[&str]) -> Self {
        Self::start_in(tempfile::tempdir().expect("temp dir"), flags).await
    }

    /// `plinth serve` with these client tokens (`(token, scope)`) in its config file, as they
    /// must be given (never on the command line), and these flags added.
    pub async fn start_with_tokens(tokens: &[(&str, &str)], flags: &[&str]) -> Self {
        Self::start_with_config(&tokens_toml(tokens), flags).await
    }

    /// `plinth serve` with this config file (kept in its data directory) and these flags.
    pub async fn start_with_config(toml: &str, flags: &[&str]) -> Self {
        let data_dir = tempfile::tempdir().expect("temp dir");
        let file = data_dir.path().join("plinth.toml");
        std::fs::write(&file, toml).expect("config file");
        let file = file.to_str().expect("utf-8").to_owned();
        let mut all = vec!["--config", file.as_str()];
        all.extend_from_slice(flags);
        Self::start_in(data_dir, &all).await
    }

    /// `plinth serve` on this data directory (one a stopped server used, say), with these
    /// flags added.
    pub async fn start_in(data_dir: tempfile::TempDir, flags: &[&str]) -> Self {
        let dir = data_dir.path().to_str().expect("utf-8 temp dir").to_owned();
        let mut argv = vec![
            "plinth",
            "serve",
            "--data-dir",
            &dir,
            "--listen",
            "127.0.0.1:0",
        ];
        argv.extend_from_slice(flags);
        let cli = Cli::try_parse_from(argv).expect("flags parse");
        let Command::Serve(args) = &cli.command else {
            unreachable!("parsed serve")
        };
        let config = Config::for_serve(args).expect("config");
        let listener = tokio::net::TcpListener::bind(config.gateway.listen)
            .await
            .expect("bind");
        let running = serve::start_all(&config, listener).await.expect("start");
        Server {
            base: format!("http://{}", running.http_addr),
            client: http_client(),
            running: Some(running),
            _data_dir: data_dir,
        }
    }

    /// A client interceptor that calls the in-process services with the credential `serve`
    /// made for `role` (its gateway's, builders' or node's).
    pub fn interceptor(&self, role: plinth_kit::auth::Role) -> plinth_kit::grpc::ClientInterceptor {
        let credentials = self
            .running
            .as_ref()
            .and_then(|running| running.credentials.as_ref())
            .expect("serve's credentials");
        let internal = match role {
            plinth_kit::auth::Role::Gateway => &credentials.gateway,
            plinth_kit::auth::Role::Builder => &credentials.builder,
            plinth_kit::auth::Role::Node => &credentials.node,
            plinth_kit::auth::Role::Source => &credentials.source,
            plinth_kit::auth::Role::Observer => panic!("serve makes no observer credential"),
        };
        internal.interceptor("test").expect("a credential")
    }

    /// Where the in-process node agent serves gRPC.
    pub fn node_addr(&self) -> std::net::SocketAddr {
        self.running
            .as_ref()
            .and_then(|running| running.node_addr)
            .expect("a running node")
    }

    /// Where the server listens for `flag` (`catalog_admin_listen`, say), as it bound it: a
    /// port given as 0 is the one the system chose.
    pub fn bound(&self, flag: &str) -> std::net::SocketAddr {
        self.running
            .as_ref()
            .and_then(|running| {
                running
                    .bound
                    .iter()
                    .find(|(name, _)| *name == flag)
                    .map(|(_, address)| *address)
            })
            .unwrap_or_else(|| panic!("serve listens for no {flag}"))
    }

    /// Where the in-process catalog serves gRPC.
    pub fn catalog_addr(&self) -> std::net::SocketAddr {
        self.running
            .as_ref()
            .map(|running| running.catalog_addr)
            .expect("running")
    }

    /// Where the in-process source service serves gRPC.
    pub fn source_addr(&self) -> std::net::SocketAddr {
        self.running
            .as_ref()
            .map(|running| running.source_addr)
            .expect("running")
    }

    /// The layer tree the catalog records for `version` of environment `id`.
    pub async fn layer(&self, id: &str, version: u32) -> plinth_blobs::Digest {
        layer_tree(
            &format!("http://{}", self.catalog_addr()),
            self.interceptor(plinth_kit::auth::Role::Gateway),
            id,
            version,
        )
        .await
        .parse()
        .expect("a layer digest")
    }

    /// Another gateway (`plinth gateway`, in this process) in front of this server's catalog,
    /// source service and node, as a second replica would be, with these flags added; stop
    /// it by cancelling its `shutdown`.
    pub async fn another_gateway(&self, flags: &[&str]) -> Running {
        let catalog = format!("http://{}", self.catalog_addr());
        let source = format!("http://{}", self.source_addr());
        let mut argv = vec![
            "plinth",
            "gateway",
            "--listen",
            "127.0.0.1:0",
            "--catalog-url",
            &catalog,
            "--source-url",
            &source,
        ];
        argv.extend_from_slice(flags);
        let cli = Cli::try_parse_from(argv).expect("flags parse");
        let Command::Gateway(args) = &cli.command else {
            unreachable!("parsed gateway")
        };
        let mut config = Config::for_gateway(args).expect("config");
        config.internal.credential = self
            .running
            .as_ref()
            .and_then(|running| running.credentials.as_ref())
            .and_then(|credentials| credentials.gateway.credential.clone());
        serve::start_gateway(&config)
            .await
            .expect("start a gateway")
    }

    /// The data directory `serve` uses.
    pub fn data_dir(&self) -> std::path::PathBuf {
        self._data_dir.path().to_owned()
    }

    /// The full URL of a path.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Stops the services cleanly and starts `plinth serve` again on the same data
    /// directory, with these flags (on a new port: use the new `base`).
    pub async fn restart(mut self, flags: &[&str]) -> Self {
        if let Some(running) = self.running.take() {
            running.stop().await.expect("clean stop");
        }
        let data_dir =
            std::mem::replace(&mut self._data_dir, tempfile::tempdir().expect("temp dir"));
        Self::start_in(data_dir, flags).await
    }

    /// Stops the services cleanly and hands over the data directory, for another process to
    /// be started on it.
    pub async fn stop_keeping_data(mut self) -> tempfile::TempDir {
        if let Some(running) = self.running.take() {
            running.stop().await.expect("clean stop");
        }
        std::mem::replace(&mut self._data_dir, tempfile::tempdir().expect("temp dir"))
    }

    /// Stops the services and checks they stopped cleanly.
    pub async fn stop(mut self) {
        if let Some(running) = self.running.take() {
            running.stop().await.expect("clean stop");
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(running) = &self.running {
            running.shutdown.cancel();
            unmount_under(self._data_dir.path());
        }
    }
}

/// The seal key the tests give a catalog started alone (`plinth catalog` refuses to start
/// without one): 32 bytes in base64.
pub const SEAL_KEY: &str = "c2VhbCBrZXkgb2YgdGhlIGUyZSB0ZXN0cywgMzIgYiE=";

/// Writes [`SEAL_KEY`] to `seal.key` in `dir` (mode 0600); answers the file, for a
/// configuration's `catalog.seal_key_file`.
pub fn seal_key_file(dir: &std::path::Path) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt as _;
    let path = dir.join("seal.key");
    std::fs::write(&path, format!("{SEAL_KEY}\n")).expect("seal key file");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("mode");
    path
}

/// `[[gateway.tokens]]` entries for these `(token, scope)` pairs.
pub fn tokens_toml(tokens: &[(&str, &str)]) -> String {
    tokens
        .iter()
        .map(|(token, scope)| format!("[[gateway.tokens]]\ntoken = {token:?}\nscope = {scope:?}\n"))
        .collect()
}

/// Where the node of a `serve` on `data_dir` keeps a session's working directory on the host
/// (the session itself sees it at `/home/session`).
pub fn host_workdir(data_dir: &std::path::Path, session_id: &str) -> std::path::PathBuf {
    data_dir
        .join("node")
        .join("sessions")
        .join(session_id)
        .join("work")
}

/// An HTTP client (with the process's TLS provider installed first).
pub fn http_client() -> reqwest::Client {
    plinth_blobs::install_tls_provider();
    reqwest::Client::new()
}

/// Sends a request and reads the answer's status and JSON body.
pub async fn send(request: reqwest::RequestBuilder) -> (u16, Value) {
    json(request.send().await.expect("request")).await
}

/// A response's status and JSON body.
pub async fn json(response: reqwest::Response) -> (u16, Value) {
    let status = response.status().as_u16();
    let text = response.text().await.expect("body");
    let body = serde_json::from_str(&text)
        .unwrap_or_else(|error| panic!("status {status}: body is not JSON ({error}): {text:?}"));
    (status, body)
}

/// Asserts an error answer: its status, its code, and that the message says something.
pub fn assert_error(status: u16, body: &Value, expected_status: u16, code: &str) {
    assert_error_in("the answer", status, body, expected_status, code);
}

/// [`assert_error`] for one case of a table: whatever fails names `case`.
pub fn assert_error_in(case: &str, status: u16, body: &Value, expected_status: u16, code: &str) {
    assert_eq!(status, expected_status, "{case}: {body}");
    assert_eq!(body["error"]["code"], code, "{case}: {body}");
    let message = body["error"]["message"]
        .as_str()
        .unwrap_or_else(|| panic!("{case}: the message is not a string: {body}"));
    assert!(!message.is_empty(), "{case}: {body}");
}

/// Every regular file beneath `dir`, relative paths sorted, with their sizes.
pub fn files_under(dir: &std::path::Path) -> Vec<(String, u64)> {
    fn walk(root: &std::path::Path, dir: &std::path::Path, out: &mut Vec<(String, u64)>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let Ok(meta) = std::fs::symlink_metadata(&path) else {
                continue;
            };
            if meta.is_dir() {
                walk(root, &path, out);
            } else {
                let relative = path
                    .strip_prefix(root)
                    .unwrap_or(&path)
                    .display()
                    .to_string();
                out.push((relative, meta.len()));
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

/// Whether build tests can run here: builds need root (a mount namespace, another user). Under
/// CI a missing prerequisite is a failure; elsewhere the test says so and is skipped.
pub fn can_build() -> bool {
    let root = std::process::Command::new("id")
        .arg("-u")
        .output()
        .map(|output| String::from_utf8_lossy(&output.stdout).trim() == "0")
        .unwrap_or(false);
    if root {
        return true;
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "build tests need root under CI"
    );
    eprintln!("not root: skipping a build test (CI runs it as root)");
    false
}

/// Puts one file of an environment's source; anything but 200 fails the test.
pub async fn put_file(server: &Server, id: &str, path: &str, body: impl Into<reqwest::Body>) {
    let (status, answer) = send(
        server
            .client
            .put(server.url(&format!("/v1/environments/{id}/files/{path}")))
            .body(body),
    )
    .await;
    assert_eq!(status, 200, "{path}: {answer}");
}

/// Polls a build until it is `ready` or `failed`; answers its record. A build still running
/// after `limit` fails the test.
pub async fn wait_for_build(
    server: &Server,
    id: &str,
    version: u64,
    limit: std::time::Duration,
) -> Value {
    wait_for_build_at(&server.client, &server.base, id, version, limit).await
}

/// [`wait_for_build`] on a gateway at `base` (a `plinth` started as a process of its own).
pub async fn wait_for_build_at(
    client: &reqwest::Client,
    base: &str,
    id: &str,
    version: u64,
    limit: std::time::Duration,
) -> Value {
    crate::waiting::eventually(limit, async || {
        let (_, build) =
            send(client.get(format!("{base}/v1/environments/{id}/builds/{version}"))).await;
        if build["status"] == "ready" || build["status"] == "failed" {
            Ok(build)
        } else {
            Err(format!("build {version}: {build}"))
        }
    })
    .await
}

/// Queues the next build of `id` (version `version`) and waits for it to end; answers its
/// record, ready or failed. One running past `limit` fails the test.
pub async fn queue_and_wait_build(
    server: &Server,
    id: &str,
    version: u64,
    limit: std::time::Duration,
) -> Value {
    let (status, queued) = send(
        server
            .client
            .post(server.url(&format!("/v1/environments/{id}/build"))),
    )
    .await;
    assert_eq!(status, 202, "{queued}");
    wait_for_build(server, id, version, limit).await
}

/// Starts the next build of `id` (version `version`) and waits until it is ready; answers its
/// record. A failed build (its log and error shown) or one running past `limit` fails the
/// test.
pub async fn build_ready(
    server: &Server,
    id: &str,
    version: u64,
    limit: std::time::Duration,
) -> Value {
    let build = queue_and_wait_build(server, id, version, limit).await;
    assert_eq!(
        build["status"],
        "ready",
        "log:\n{}\nerror: {}",
        build["log"].as_str().unwrap_or(""),
        build["error"]
    );
    build
}

/// `len` bytes that do not compress, the same on every call (xorshift from a fixed seed).
pub fn incompressible(len: usize) -> Vec<u8> {
    let mut state: u64 = 0x2545_f491_4f6c_dd1d;
    (0..len.div_ceil(8))
        .flat_map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state.to_le_bytes()
        })
        .take(len)
        .collect()
}

/// Every TCP port listening on the host (any address: whatever listens on a wildcard answers
/// on loopback too), from the test process's `/proc/net/tcp{,6}`.
pub fn host_listening_ports() -> std::collections::BTreeSet<u16> {
    let mut ports = std::collections::BTreeSet::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // st 0A is LISTEN.
            if fields.len() > 3
                && fields[3] == "0A"
                && let Some(port) = fields[1]
                    .rsplit(':')
                    .next()
                    .and_then(|hex| u16::from_str_radix(hex, 16).ok())
            {
                ports.insert(port);
            }
        }
    }
    ports
}

/// `POST /v1/environments` with `body`; anything but 201 fails the test. Answers the record.
pub async fn created_environment(server: &Server, body: Value) -> Value {
    let (status, created) = send(
        server
            .client
            .post(server.url("/v1/environments"))
            .json(&body),
    )
    .await;
    assert_eq!(status, 201, "{body}: {created}");
    created
}

/// Creates an environment named `name`; answers its id.
pub async fn create_environment(server: &Server, name: &str) -> String {
    create_environment_at(&server.client, &server.url(""), name).await
}

/// [`create_environment`] on a gateway at `base` (a `plinth` started as a process of its own);
/// anything but 201 fails the test.
pub async fn create_environment_at(client: &reqwest::Client, base: &str, name: &str) -> String {
    let (status, created) = send(
        client
            .post(format!("{base}/v1/environments"))
            .json(&serde_json::json!({ "name": name })),
    )
    .await;
    assert_eq!(status, 201, "{name}: {created}");
    created["id"].as_str().expect("id").to_owned()
}

/// An environment holding one script, built within `limit`: its id.
pub async fn built_environment(server: &Server, name: &str, limit: std::time::Duration) -> String {
    let id = create_environment(server, name).await;
    put_file(server, &id, "run.py", "print('hi')\n").await;
    build_ready(server, &id, 1, limit).await;
    id
}

/// `POST /v1/sessions` with `body`; anything but 201 fails the test.
pub async fn start_session_with(server: &Server, body: Value) -> Value {
    let (status, session) = send(server.client.post(server.url("/v1/sessions")).json(&body)).await;
    assert_eq!(status, 201, "{body}: {session}");
    session
}

/// `POST /v1/sessions/{session_id}/exec` with `body` (the command and its options); anything
/// but 200 fails the test. Answers the result.
pub async fn exec_in(server: &Server, session_id: &str, body: Value) -> Value {
    let (status, result) = send(
        server
            .client
            .post(server.url(&format!("/v1/sessions/{session_id}/exec")))
            .json(&body),
    )
    .await;
    assert_eq!(status, 200, "{body}: {result}");
    result
}

/// The layer tree the catalog at `catalog_url` records for `version` of environment `id` (of
/// the `default` scope), asked with the gateway's credential through `interceptor`; empty
/// while the version has none.
pub async fn layer_tree(
    catalog_url: &str,
    interceptor: plinth_kit::grpc::ClientInterceptor,
    id: &str,
    version: u32,
) -> String {
    use plinth_proto::catalog::v1 as pb;
    let channel = tonic::transport::Endpoint::from_shared(catalog_url.to_owned())
        .expect("url")
        .connect()
        .await
        .expect("connect");
    pb::catalog_service_client::CatalogServiceClient::with_interceptor(channel, interceptor)
        .get_build(pb::GetBuildRequest {
            scope: "default".into(),
            id: id.into(),
            version,
        })
        .await
        .expect("build")
        .into_inner()
        .layer_tree
}

/// An uncompressed tar of `files` (path to content), each a plain 0644 file.
pub fn tar_of(files: &std::collections::BTreeMap<String, Vec<u8>>) -> Vec<u8> {
    let mut archive = tar::Builder::new(Vec::new());
    for (path, content) in files {
        let mut header = tar::Header::new_gnu();
        header.set_size(content.len() as u64);
        header.set_mode(0o644);
        header.set_cksum();
        archive
            .append_data(&mut header, path, content.as_slice())
            .expect("append");
    }
    archive.into_inner().expect("archive")
}

/// The mount points under `dir` in this process's mount namespace (where builders in this
/// process and those it started mount their scopes' disks).
pub fn mounts_under(dir: &std::path::Path) -> Vec<String> {
    let dir = format!("{}/", dir.to_str().expect("utf-8"));
    std::fs::read_to_string("/proc/self/mountinfo")
        .expect("mountinfo")
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .filter(|point| point.starts_with(&dir))
        .map(str::to_owned)
        .collect()
}

/// Unmounts (lazily) whatever is still mounted under a test's data directory `dir`: a
/// build's scope disk or a session's working directory mounted when the test ends (a builder
/// killed mid-build leaves its mount) would outlive the test, and its loop device with it.
pub fn unmount_under(dir: &std::path::Path) {
    for point in mounts_under(dir).into_iter().rev() {
        let _ = rustix::mount::unmount(&point, rustix::mount::UnmountFlags::DETACH);
    }
}

/// How many loop devices have a file under `dir` attached.
pub fn loop_devices_under(dir: &std::path::Path) -> usize {
    let dir = format!("{}/", dir.to_str().expect("utf-8"));
    std::fs::read_dir("/sys/block")
        .expect("sysfs")
        .flatten()
        .filter_map(|entry| std::fs::read_to_string(entry.path().join("loop/backing_file")).ok())
        .filter(|backing| backing.starts_with(&dir))
        .count()
}

/// Waits until nothing is mounted under `dir` and no loop device holds a file there (a
/// builder lets go of a scope's disk just after its build is reported done).
pub async fn until_unmounted(dir: &std::path::Path) {
    crate::waiting::eventually(std::time::Duration::from_secs(10), async || {
        let (mounts, loops) = (mounts_under(dir), loop_devices_under(dir));
        if mounts.is_empty() && loops == 0 {
            Ok(())
        } else {
            Err(format!(
                "still mounted under {}: {mounts:?}, {loops} loop devices",
                dir.display()
            ))
        }
    })
    .await;
}

/// The scopes' disk images in a builder's work directory.
pub fn scope_images(work_dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let Ok(entries) = std::fs::read_dir(work_dir.join("scopes")) else {
        return Vec::new();
    };
    entries
        .flatten()
        .map(|entry| entry.path().join("work.ext4"))
        .filter(|image| image.is_file())
        .collect()
}

/// A program a test runs: the path the environment variable `variable` names (`.ci/run` sets
/// it), else `name` on `PATH`, if it answers `--version`. `None` when it does not, which under
/// CI fails the test; `install` says how to get it.
pub fn tool(variable: &str, name: &str, install: &str) -> Option<std::path::PathBuf> {
    let candidate = std::env::var_os(variable)
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| name.into());
    let runs = std::process::Command::new(&candidate)
        .arg("--version")
        .output()
        .is_ok_and(|output| output.status.success());
    if runs {
        return Some(candidate);
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "{name} does not run at {} (set {variable} to it; {install})",
        candidate.display()
    );
    eprintln!("{name} is not installed: skipping (CI runs it)");
    None
}

/// Creates an environment named `name` as the tenant of `token`, with one file `path` holding
/// `body`, and queues its first build; answers its id.
pub async fn queue_first_build(
    server: &Server,
    token: &str,
    name: &str,
    path: &str,
    body: &str,
) -> String {
    let (status, created) = send(
        server
            .client
            .post(server.url("/v1/environments"))
            .bearer_auth(token)
            .json(&serde_json::json!({ "name": name })),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().expect("id").to_owned();
    let (status, put) = send(
        server
            .client
            .put(server.url(&format!("/v1/environments/{id}/files/{path}")))
            .bearer_auth(token)
            .body(body.to_owned()),
    )
    .await;
    assert_eq!(status, 200, "{put}");
    let (status, queued) = send(
        server
            .client
            .post(server.url(&format!("/v1/environments/{id}/build")))
            .bearer_auth(token),
    )
    .await;
    assert_eq!(status, 202, "{queued}");
    id
}
