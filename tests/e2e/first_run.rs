//! A new user's first run: `plinth serve` with no data directory given, from a folder inside a
//! 0700 home (as `/root` is), building with the registries and the network settings the
//! machine has, as the README and `docs/operating/registries.md` say.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use crate::cluster::spawn_serve;
use crate::helpers::{Server, create_environment, create_environment_at, send};
use crate::processes::Process;

/// A folder inside a 0700 directory, as `mkdir ~/try && cd ~/try` makes in root's home.
struct PrivateHome {
    _root: tempfile::TempDir,
    folder: PathBuf,
}

impl PrivateHome {
    fn new() -> Self {
        let root = tempfile::tempdir().expect("temp dir");
        let home = root.path().join("home");
        std::fs::create_dir(&home).expect("home");
        std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o700)).expect("0700");
        let folder = home.join("try");
        std::fs::create_dir(&folder).expect("folder");
        PrivateHome {
            _root: root,
            folder,
        }
    }
}

/// `plinth serve` started in `folder` with no flags but a free port (the README's 8080 may be
/// taken on a test machine), its REST base URL once it is ready.
async fn serve_in(folder: &Path) -> (Process, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_plinth"));
    command
        .args(["serve", "--listen", "127.0.0.1:0"])
        .current_dir(folder)
        .env("PLINTH_LOG", "warn")
        .env_remove("PLINTH_DATA_DIR")
        .env_remove("PLINTH_CONFIG")
        .env_remove("PLINTH_TOKENS")
        .env_remove("PLINTH_BUILDER_NETWORK")
        .stdin(Stdio::null());
    let (process, http) = spawn_serve(&mut command).await;
    (process, format!("http://{http}"))
}

async fn put(client: &reqwest::Client, base: &str, id: &str, path: &str, body: &str) {
    let (status, answer) = send(
        client
            .put(format!("{base}/v1/environments/{id}/files/{path}"))
            .body(body.to_owned()),
    )
    .await;
    assert_eq!(status, 200, "{path}: {answer}");
}

/// Creates an environment with these files, builds it and waits for the build to end.
async fn built(
    client: &reqwest::Client,
    base: &str,
    name: &str,
    files: &[(&str, &str)],
    limit: Duration,
) -> (String, Value) {
    let id = create_environment_at(client, base, name).await;
    for (path, body) in files {
        put(client, base, &id, path, body).await;
    }
    let (status, queued) = send(client.post(format!("{base}/v1/environments/{id}/build"))).await;
    assert_eq!(status, 202, "{queued}");
    let build = crate::helpers::wait_for_build_at(client, base, &id, 1, limit).await;
    (id, build)
}

/// Runs `command` in a new session of `id`; answers the exec's answer.
async fn run_in_session(client: &reqwest::Client, base: &str, id: &str, command: &str) -> Value {
    let (status, session) = send(
        client
            .post(format!("{base}/v1/sessions"))
            .json(&json!({ "environment": id })),
    )
    .await;
    assert_eq!(status, 201, "{session}");
    assert_eq!(session["workdir"], "/home/session", "{session}");
    let session_id = session["id"].as_str().expect("session id");
    let (status, ran) = send(
        client
            .post(format!("{base}/v1/sessions/{session_id}/exec"))
            .json(&json!({ "command": command, "timeout_ms": 60_000 })),
    )
    .await;
    assert_eq!(status, 200, "{ran}");
    ran
}

#[tokio::test]
async fn serve_from_a_folder_in_a_private_home_builds_and_runs_session_commands() {
    if !crate::helpers::can_build() {
        return;
    }
    let home = PrivateHome::new();
    let client = crate::helpers::http_client();

    // The data directory defaults to ./plinth-data, and what is used is absolute.
    let dumped = Command::new(env!("CARGO_BIN_EXE_plinth"))
        .args(["serve", "--dump-config"])
        .current_dir(&home.folder)
        .env_remove("PLINTH_DATA_DIR")
        .env_remove("PLINTH_CONFIG")
        .output()
        .expect("dump the configuration");
    let dumped = String::from_utf8_lossy(&dumped.stdout);
    let data_dir = home.folder.join("plinth-data");
    assert!(
        dumped.contains(&format!("data_dir = \"{}\"", data_dir.display())),
        "{dumped}"
    );

    let (_serve, base) = serve_in(&home.folder).await;
    let (id, build) = built(
        &client,
        &base,
        "First Run",
        &[
            ("setup.sh", "echo made-by-setup > made.txt\n"),
            ("run.py", "print(open('made.txt').read().strip())\n"),
        ],
        Duration::from_secs(120),
    )
    .await;
    assert_eq!(build["status"], "ready", "{build}");
    assert!(data_dir.join("catalog.db").is_file());

    let ran = run_in_session(
        &client,
        &base,
        &id,
        "set -e; cd $PROJECT_ROOT && python3 run.py; cd; pwd; echo mine > mine.txt; cat mine.txt",
    )
    .await;
    assert_eq!(ran["exit_code"], 0, "{ran}");
    assert_eq!(
        ran["stdout"], "made-by-setup\n/home/session\nmine\n",
        "{ran}"
    );
}

#[tokio::test]
async fn builds_install_real_packages_from_pypi_and_npm_with_default_settings() {
    if !crate::helpers::can_build() {
        return;
    }
    let home = PrivateHome::new();
    let client = crate::helpers::http_client();
    let (_serve, base) = serve_in(&home.folder).await;
    let (id, build) = built(
        &client,
        &base,
        "Registries",
        &[
            ("requirements.txt", "six==1.16.0\n"),
            (
                "package.json",
                r#"{"name": "registries", "version": "1.0.0", "private": true, "dependencies": {"is-number": "7.0.0"}}"#,
            ),
        ],
        Duration::from_secs(300),
    )
    .await;
    assert_eq!(build["status"], "ready", "{build}");
    let ran = run_in_session(
        &client,
        &base,
        &id,
        "python3 -c 'import six; print(six.__version__)' && \
         node -e 'console.log(require(\"is-number\")(7), require(\"is-number/package.json\").version)'",
    )
    .await;
    assert_eq!(ran["exit_code"], 0, "{ran}");
    assert_eq!(ran["stdout"], "1.16.0\ntrue 7.0.0\n", "{ran}");
}

#[tokio::test]
async fn a_build_that_cannot_reach_its_proxy_names_the_setting() {
    if !crate::helpers::can_build() {
        return;
    }
    // A proxy on loopback that hangs up on every connection: nothing leaves the machine.
    let closed = crate::cluster::hanging_up();
    let config = tempfile::NamedTempFile::new().expect("config");
    std::fs::write(
        config.path(),
        format!("[builder]\nnetwork = true\nhttps_proxy = \"http://user:secret@{closed}\"\nhttp_proxy = \"http://user:secret@{closed}\"\nno_proxy = \"\"\n"),
    )
    .expect("write config");
    let path = config.path().to_str().expect("utf-8").to_owned();
    let server = Server::start_with(&["--config", &path]).await;
    let id = create_environment(&server, "Behind a proxy").await;
    crate::helpers::put_file(&server, &id, "requirements.txt", "six==1.16.0\n").await;
    let (status, _) = send(
        server
            .client
            .post(server.url(&format!("/v1/environments/{id}/build"))),
    )
    .await;
    assert_eq!(status, 202);
    let build = crate::helpers::wait_for_build(&server, &id, 1, Duration::from_secs(180)).await;
    assert_eq!(build["status"], "failed", "{build}");
    let error = build["error"].as_str().expect("error");
    assert!(error.contains("builder.https_proxy"), "{error}");
    assert!(!error.contains("secret"), "{error}");
    assert!(
        build["log"].as_str().expect("log").contains("hint: "),
        "{build}"
    );
}
