//! The `plinth` command line as a person uses it: each command run as its own process
//! against a real `plinth serve`, with its answers read from stdout, stderr and the exit
//! status, and its effects checked through the REST API.

use std::collections::BTreeSet;
use std::io::{BufRead as _, Write as _};
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::Value;

use crate::helpers::{Server, built_environment, send};

/// A person's shell: a home and config directory of its own, and the server it talks to.
pub(crate) struct Shell {
    pub(crate) url: String,
    token: Option<String>,
    pub(crate) home: tempfile::TempDir,
}

impl Shell {
    pub(crate) fn new(server: &Server) -> Self {
        Shell {
            url: server.base.clone(),
            token: None,
            home: tempfile::tempdir().expect("home"),
        }
    }

    pub(crate) fn config_home(&self) -> PathBuf {
        self.home.path().join("config")
    }

    /// `plinth <args>` with PLINTH_URL (and PLINTH_TOKEN) set, and nothing of the test
    /// process's own environment that could change the answer.
    pub(crate) fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_plinth"));
        command
            .args(args)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", self.home.path())
            .env("XDG_CONFIG_HOME", self.config_home())
            .env("PLINTH_URL", &self.url)
            .current_dir(self.home.path())
            .stdin(Stdio::null());
        if let Some(token) = &self.token {
            command.env("PLINTH_TOKEN", token);
        }
        command
    }

    /// Runs `plinth <args>` to its end, off the async runtime the server runs on.
    pub(crate) async fn run(&self, args: &[&str]) -> Output {
        self.run_command(self.command(args)).await
    }

    pub(crate) async fn run_command(&self, mut command: Command) -> Output {
        tokio::task::spawn_blocking(move || command.output().expect("plinth runs"))
            .await
            .expect("joined")
    }

    /// Runs `plinth <args>`, which must succeed; answers its stdout.
    pub(crate) async fn ok(&self, args: &[&str]) -> String {
        let output = self.run(args).await;
        assert!(
            output.status.success(),
            "plinth {args:?}: {:?}\nstdout: {}\nstderr: {}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).expect("utf-8 stdout")
    }

    /// Runs `plinth <args> --output json`, which must succeed and print one JSON document.
    pub(crate) async fn json(&self, args: &[&str]) -> Value {
        let mut all = args.to_vec();
        all.extend(["--output", "json"]);
        let stdout = self.ok(&all).await;
        serde_json::from_str(&stdout)
            .unwrap_or_else(|error| panic!("plinth {all:?} printed no JSON ({error}): {stdout}"))
    }
}

pub(crate) fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

pub(crate) fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[tokio::test]
async fn login_saves_the_token_in_a_private_file_and_plinth_url_and_token_override_it() {
    let server = Server::start_with_tokens(&[("tok-cli", "acme")], &[]).await;
    let mut shell = Shell::new(&server);

    // No terminal and no --token-stdin: nowhere to read the token from, a usage error.
    let output = shell.run(&["login", &server.base]).await;
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("--token-stdin"),
        "{}",
        stderr(&output)
    );

    let login = |token: &'static str| {
        let mut command = shell.command(&["login", &server.base, "--token-stdin"]);
        command.env_remove("PLINTH_URL").stdin(Stdio::piped());
        tokio::task::spawn_blocking(move || {
            let mut child = command
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("plinth runs");
            let mut stdin = child.stdin.take().expect("stdin");
            stdin.write_all(token.as_bytes()).expect("token written");
            drop(stdin);
            child.wait_with_output().expect("plinth ends")
        })
    };

    // A token the server refuses is not saved.
    let refused = login("tok-wrong\n").await.expect("joined");
    assert_eq!(refused.status.code(), Some(1), "{}", stderr(&refused));
    assert!(
        stderr(&refused).contains("unauthenticated"),
        "{}",
        stderr(&refused)
    );
    let file = shell.config_home().join("plinth/client.toml");
    assert!(!file.exists(), "a refused token was saved");

    let accepted = login("tok-cli\n").await.expect("joined");
    assert!(accepted.status.success(), "{}", stderr(&accepted));
    let mode = std::fs::metadata(&file)
        .expect("client.toml")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "client.toml is mode {mode:o}");
    let dir_mode = std::fs::metadata(file.parent().expect("dir"))
        .expect("dir")
        .permissions()
        .mode();
    assert_eq!(dir_mode & 0o077, 0, "its directory is mode {dir_mode:o}");
    let saved = std::fs::read_to_string(&file).expect("read");
    assert!(
        saved.contains("tok-cli") && saved.contains(&server.base),
        "{saved}"
    );
    // Nothing else in the directory (no temporary left behind).
    let names: Vec<_> = std::fs::read_dir(file.parent().expect("dir"))
        .expect("list")
        .map(|entry| entry.expect("entry").file_name())
        .collect();
    assert_eq!(names, ["client.toml"]);

    // The saved URL and token serve later commands.
    let mut bare = shell.command(&["env", "create", "Logged In"]);
    bare.env_remove("PLINTH_URL");
    let created = shell.run_command(bare).await;
    assert!(created.status.success(), "{}", stderr(&created));
    assert!(
        stdout(&created).contains("logged-in"),
        "{}",
        stdout(&created)
    );

    // PLINTH_TOKEN overrides the file's token: a wrong one is refused with the API's code.
    shell.token = Some("tok-other".to_owned());
    let output = shell.run(&["env", "list"]).await;
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("unauthenticated"),
        "{}",
        stderr(&output)
    );
    // With --output json the API's error body is on stdout.
    let output = shell.run(&["env", "list", "--output", "json"]).await;
    let body: Value = serde_json::from_slice(&output.stdout).expect("error JSON");
    assert_eq!(body["error"]["code"], "unauthenticated", "{body}");

    // PLINTH_URL overrides the file's URL.
    shell.token = None;
    shell.url = "http://127.0.0.1:9".to_owned();
    let output = shell.run(&["env", "list"]).await;
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("127.0.0.1:9"),
        "{}",
        stderr(&output)
    );
}

#[tokio::test]
async fn env_commands_create_list_show_and_remove_environments_by_slug() {
    let server = Server::start().await;
    let shell = Shell::new(&server);

    let created = shell
        .json(&[
            "env",
            "create",
            "Content Studio",
            "--entry",
            "python3 run.py",
        ])
        .await;
    assert_eq!(created["slug"], "content-studio", "{created}");
    assert_eq!(created["entry"], "python3 run.py", "{created}");
    let id = created["id"].as_str().expect("id").to_owned();

    let text = shell.ok(&["env", "create", "Scratch"]).await;
    assert!(
        text.contains("scratch") && text.contains("/env/scratch"),
        "{text}"
    );

    let list = shell.ok(&["env", "list"]).await;
    assert!(list.starts_with("SLUG"), "{list}");
    assert!(
        list.contains("content-studio") && list.contains(&id),
        "{list}"
    );
    let listed = shell.json(&["env", "list"]).await;
    assert_eq!(listed["data"].as_array().map(Vec::len), Some(2), "{listed}");

    let shown = shell.ok(&["env", "show", "content-studio"]).await;
    assert!(
        shown.contains("/env/content-studio") && shown.contains(&id),
        "{shown}"
    );
    let by_id = shell.json(&["env", "show", &id]).await;
    assert_eq!(by_id["slug"], "content-studio", "{by_id}");

    // The API's own refusal, code and message, exit status 1.
    let taken = shell.run(&["env", "create", "content studio!"]).await;
    assert_eq!(taken.status.code(), Some(1));
    assert!(
        stderr(&taken).contains("environment_exists"),
        "{}",
        stderr(&taken)
    );

    // No terminal to confirm on: nothing is deleted without --yes.
    let unconfirmed = shell.run(&["env", "rm", "content-studio"]).await;
    assert_eq!(
        unconfirmed.status.code(),
        Some(2),
        "{}",
        stderr(&unconfirmed)
    );
    assert!(
        stderr(&unconfirmed).contains("--yes"),
        "{}",
        stderr(&unconfirmed)
    );
    shell.json(&["env", "show", "content-studio"]).await;
    let removed = shell.json(&["env", "rm", "content-studio", "--yes"]).await;
    assert_eq!(removed["deleted"], true, "{removed}");
    let gone = shell.run(&["env", "show", &id]).await;
    assert_eq!(gone.status.code(), Some(1));
    assert!(
        stderr(&gone).contains("environment_not_found"),
        "{}",
        stderr(&gone)
    );
    let unknown = shell.run(&["env", "show", "content-studio"]).await;
    assert_eq!(unknown.status.code(), Some(1));
    assert!(
        stderr(&unknown).contains("plinth env list"),
        "{}",
        stderr(&unknown)
    );

    // Usage errors are 2: clap's and the client's own.
    assert_eq!(shell.run(&["env"]).await.status.code(), Some(2));
    assert_eq!(
        shell.run(&["env", "frobnicate"]).await.status.code(),
        Some(2)
    );
    assert_eq!(shell.run(&["cp", "a", "b"]).await.status.code(), Some(2));
    assert_eq!(shell.run(&["exec", "scratch"]).await.status.code(), Some(2));

    // Completions and the manual page need no server.
    for shell_name in ["bash", "zsh", "fish"] {
        let script = shell.ok(&["completions", shell_name]).await;
        assert!(script.contains("push"), "{shell_name}: {script}");
    }
    let man = shell.ok(&["man"]).await;
    assert!(man.starts_with(".ie") || man.contains(".TH"), "{man}");
}

/// Every file and directory of an environment's source, as the files API lists them.
pub(crate) async fn source_paths(server: &Server, id: &str) -> BTreeSet<String> {
    let (status, list) = send(
        server
            .client
            .get(server.url(&format!("/v1/environments/{id}/files"))),
    )
    .await;
    assert_eq!(status, 200, "{list}");
    list["data"]
        .as_array()
        .expect("data")
        .iter()
        .map(|entry| entry["path"].as_str().expect("path").to_owned())
        .collect()
}

pub(crate) fn write(root: &Path, path: &str, content: &str) {
    let path = root.join(path);
    std::fs::create_dir_all(path.parent().expect("parent")).expect("dirs");
    std::fs::write(path, content).expect("write");
}

#[tokio::test]
async fn push_sends_the_directory_without_ignored_files_and_build_follow_exits_with_the_outcome() {
    if !crate::helpers::can_build() {
        return;
    }
    let server = Server::start_with(&["--builder-network", "false"]).await;
    let shell = Shell::new(&server);
    let id = shell.json(&["env", "create", "Pushed"]).await["id"]
        .as_str()
        .expect("id")
        .to_owned();

    // A project whose only top-level directory is `src/` beside a few files, with ignored
    // files at the top and deep down, and a `.git` that must never be sent.
    let project = tempfile::tempdir().expect("project");
    let root = project.path();
    write(root, "run.py", "print('pushed')\n");
    write(root, "src/app/deep/module.py", "VALUE = 1\n");
    write(root, ".gitignore", "secret.env\nbuild/\n*.log\n");
    write(root, "secret.env", "TOKEN=do-not-send\n");
    write(root, "build/out.bin", "artifact\n");
    write(root, "src/app/debug.log", "noise\n");
    write(root, "src/.ignore", "scratch.txt\n");
    write(root, "src/scratch.txt", "local only\n");
    write(root, ".git/HEAD", "ref: refs/heads/main\n");
    std::fs::create_dir_all(root.join("assets/empty")).expect("empty dir");

    let dir = root.to_str().expect("utf-8");
    let output = shell.run(&["push", "pushed", dir]).await;
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(stdout(&output).contains("pushed"), "{}", stdout(&output));
    let expected: BTreeSet<String> = [
        ".gitignore",
        "assets",
        "assets/empty",
        "run.py",
        "src",
        "src/.ignore",
        "src/app",
        "src/app/deep",
        "src/app/deep/module.py",
    ]
    .into_iter()
    .map(str::to_owned)
    .collect();
    assert_eq!(source_paths(&server, &id).await, expected);

    // A second push replaces: a file deleted locally is gone from the source too.
    std::fs::remove_file(root.join("run.py")).expect("rm");
    write(root, "main.py", "print('renamed')\n");
    let report = shell.json(&["push", &id, dir]).await;
    assert_eq!(report["skipped"], 0, "{report}");
    let paths = source_paths(&server, &id).await;
    assert!(
        paths.contains("main.py") && !paths.contains("run.py"),
        "{paths:?}"
    );

    let built = shell.run(&["build", "pushed", "--follow"]).await;
    assert_eq!(built.status.code(), Some(0), "{}", stderr(&built));
    assert!(
        stdout(&built).contains("==> "),
        "the log streams: {}",
        stdout(&built)
    );
    let versions = shell.json(&["versions", "pushed"]).await;
    assert_eq!(versions["active"], 1, "{versions}");

    write(root, "setup.sh", "echo doomed-by-setup\nexit 7\n");
    shell.ok(&["push", "pushed", dir]).await;
    let failed = shell.run(&["build", "pushed", "--follow"]).await;
    assert_eq!(failed.status.code(), Some(1), "{}", stderr(&failed));
    assert!(
        stdout(&failed).contains("doomed-by-setup"),
        "{}",
        stdout(&failed)
    );
    assert!(
        stderr(&failed).contains("version 2 failed"),
        "{}",
        stderr(&failed)
    );
    let record = shell.json(&["versions", "pushed"]).await;
    assert_eq!(
        record["active"], 1,
        "a failed build changes nothing: {record}"
    );

    // Rolling forward and back is one command.
    let activated = shell.json(&["activate", "pushed", "1"]).await;
    assert_eq!(activated["version"], 1, "{activated}");
}

#[tokio::test]
async fn exec_passes_the_argv_exactly_exits_with_its_status_and_ends_its_session() {
    if !crate::helpers::can_build() {
        return;
    }
    // One session at a time: a session exec left behind would refuse the next one.
    let server =
        Server::start_with_config("[quotas]\nsessions = 1\n", &["--builder-network", "false"])
            .await;
    let shell = Shell::new(&server);
    built_environment(&server, "Exec Studio", std::time::Duration::from_secs(120)).await;

    let program = "import sys; print(sys.argv); sys.exit(3)";
    for _ in 0..2 {
        let output = shell
            .run(&[
                "exec",
                "exec-studio",
                "--",
                "python3",
                "-c",
                program,
                "a b",
                "$HOME",
            ])
            .await;
        assert_eq!(output.status.code(), Some(3), "{}", stderr(&output));
        assert_eq!(stdout(&output), "['-c', 'a b', '$HOME']\n");
    }

    // Output streams as it comes, stderr apart from stdout.
    let output = shell
        .run(&[
            "exec",
            "exec-studio",
            "--",
            "sh",
            "-c",
            "echo out; echo err >&2",
        ])
        .await;
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(stdout(&output), "out\n");
    assert!(stderr(&output).contains("err\n"), "{}", stderr(&output));

    // --output json: the API's events, one per line, the last the result.
    let output = shell
        .run(&[
            "exec",
            "exec-studio",
            "--output",
            "json",
            "--",
            "echo",
            "hi",
        ])
        .await;
    let events: Vec<Value> = stdout(&output)
        .lines()
        .map(|line| serde_json::from_str(line).expect("NDJSON"))
        .collect();
    assert_eq!(
        events.first().map(|e| e["stdout"].clone()),
        Some("hi\n".into())
    );
    assert_eq!(
        events.last().map(|e| e["exit_code"].clone()),
        Some(0.into())
    );

    // Ctrl-C ends the session too: the next exec gets the one session the quota allows.
    let mut command = shell.command(&[
        "exec",
        "exec-studio",
        "--",
        "sh",
        "-c",
        "echo started; sleep 60",
    ]);
    command.stdout(Stdio::piped()).stderr(Stdio::piped());
    let interrupted = tokio::task::spawn_blocking(move || {
        let mut child = command.spawn().expect("plinth runs");
        let mut lines = std::io::BufReader::new(child.stdout.take().expect("stdout")).lines();
        let first = lines.next().and_then(Result::ok);
        assert_eq!(first.as_deref(), Some("started"));
        let killed = Command::new("kill")
            .args(["-INT", &child.id().to_string()])
            .status()
            .expect("kill");
        assert!(killed.success());
        child.wait().expect("plinth ends")
    })
    .await
    .expect("joined");
    assert_eq!(interrupted.code(), Some(130));
    let output = shell.run(&["exec", "exec-studio", "--", "true"]).await;
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
}

#[tokio::test]
async fn cp_copies_files_into_and_out_of_a_session_byte_for_byte() {
    if !crate::helpers::can_build() {
        return;
    }
    let server = Server::start_with(&["--builder-network", "false"]).await;
    let shell = Shell::new(&server);
    built_environment(&server, "Copy Studio", std::time::Duration::from_secs(120)).await;
    let session = shell.ok(&["session", "new", "copy-studio"]).await;
    let session = session.trim();
    assert!(session.starts_with("sess_"), "{session}");

    let local = shell.home.path();
    let bytes: Vec<u8> = (0..=255u8).cycle().take(100_000).collect();
    std::fs::write(local.join("in.bin"), &bytes).expect("write");
    let written = shell
        .json(&["cp", "in.bin", &format!("{session}:notes/in.bin")])
        .await;
    assert_eq!(written["size"], 100_000, "{written}");
    let sum = shell
        .ok(&["exec", session, "--", "sha256sum", "notes/in.bin"])
        .await;
    let expected = {
        use sha2::Digest as _;
        let digest = sha2::Sha256::digest(&bytes);
        digest
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    };
    assert!(sum.starts_with(&expected), "{sum} vs {expected}");

    shell
        .ok(&[
            "exec",
            session,
            "--",
            "sh",
            "-c",
            "printf 'made in session' > out.txt",
        ])
        .await;
    shell.ok(&["cp", &format!("{session}:out.txt"), "."]).await;
    assert_eq!(
        std::fs::read_to_string(local.join("out.txt")).expect("copied out"),
        "made in session"
    );
    shell
        .ok(&["cp", &format!("{session}:notes/in.bin"), "back.bin"])
        .await;
    assert_eq!(std::fs::read(local.join("back.bin")).expect("back"), bytes);

    let missing = shell
        .run(&["cp", &format!("{session}:nope.txt"), "x"])
        .await;
    assert_eq!(missing.status.code(), Some(1));
    assert!(
        stderr(&missing).contains("not_found"),
        "{}",
        stderr(&missing)
    );
    assert!(!local.join("x").exists(), "a failed copy leaves no file");

    let ended = shell.json(&["session", "end", session]).await;
    assert_eq!(ended["status"], "ended", "{ended}");
    let after = shell.run(&["exec", session, "--", "true"]).await;
    assert_eq!(after.status.code(), Some(1), "{}", stderr(&after));
}

#[tokio::test]
async fn import_git_lands_a_repository_at_the_ref_asked_for() {
    use crate::imports::git;
    let repo = tempfile::tempdir().expect("repo");
    let dir = repo.path();
    git(dir, &["init", "--quiet"]);
    write(dir, "app.py", "print('v1')\n");
    git(dir, &["add", "."]);
    git(dir, &["commit", "--quiet", "-m", "first"]);
    git(dir, &["tag", "v1"]);
    write(dir, "later.py", "print('v2')\n");
    git(dir, &["add", "."]);
    git(dir, &["commit", "--quiet", "-m", "second"]);
    let commit = git(dir, &["rev-parse", "v1"]);

    let server = Server::start_with(&[
        "--git-allowed-schemes",
        "file",
        "--git-allow-private-addresses",
        "true",
    ])
    .await;
    let shell = Shell::new(&server);
    let id = shell.json(&["env", "create", "From Git"]).await["id"]
        .as_str()
        .expect("id")
        .to_owned();
    let url = format!("file://{}", dir.display());
    let text = shell
        .ok(&[
            "import",
            "from-git",
            "--git",
            &url,
            "--ref",
            "v1",
            "--replace",
        ])
        .await;
    assert!(text.contains(&commit), "{text}");
    let paths = source_paths(&server, &id).await;
    assert_eq!(paths, BTreeSet::from(["app.py".to_owned()]));
    let report = shell
        .json(&["import", "from-git", "--git", &url, "--replace"])
        .await;
    assert_eq!(report["files"], 2, "{report}");
    assert_eq!(source_paths(&server, &id).await.len(), 2);

    let refused = shell
        .run(&["import", "from-git", "--git", "https://127.0.0.1/x.git"])
        .await;
    assert_eq!(refused.status.code(), Some(1), "{}", stderr(&refused));
    assert!(
        stderr(&refused).contains("environment_invalid"),
        "{}",
        stderr(&refused)
    );
}

#[tokio::test]
async fn login_on_a_terminal_asks_for_the_token_without_echoing_it() {
    let server = Server::start_with_tokens(&[("tok-typed-secret", "acme")], &[]).await;
    let shell = Shell::new(&server);
    // `script` gives plinth a terminal; what the terminal shows comes back on its stdout.
    let plinth = env!("CARGO_BIN_EXE_plinth");
    let mut script = Command::new("script");
    script
        .args([
            "-qec",
            &format!("{plinth} login {}", server.base),
            "/dev/null",
        ])
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", shell.home.path())
        .env("XDG_CONFIG_HOME", shell.config_home())
        .current_dir(shell.home.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let (status, shown) = tokio::task::spawn_blocking(move || {
        let mut child = script.spawn().expect("script runs");
        let mut stdout = child.stdout.take().expect("stdout");
        let mut shown = Vec::new();
        let mut buffer = [0u8; 256];
        // Type only once the question is on the screen, as a person would.
        while !String::from_utf8_lossy(&shown).contains("Token for") {
            let read = std::io::Read::read(&mut stdout, &mut buffer).expect("read");
            assert!(read > 0, "no prompt: {}", String::from_utf8_lossy(&shown));
            shown.extend_from_slice(&buffer[..read]);
        }
        let mut stdin = child.stdin.take().expect("stdin");
        stdin.write_all(b"tok-typed-secret\n").expect("typed");
        std::io::Read::read_to_end(&mut stdout, &mut shown).expect("rest");
        drop(stdin);
        (
            child.wait().expect("ends"),
            String::from_utf8_lossy(&shown).into_owned(),
        )
    })
    .await
    .expect("joined");
    assert!(status.success(), "{status:?}: {shown}");
    assert!(shown.contains("logged in"), "{shown}");
    assert!(
        !shown.contains("tok-typed-secret"),
        "the token was echoed: {shown}"
    );
    let saved =
        std::fs::read_to_string(shell.config_home().join("plinth/client.toml")).expect("saved");
    assert!(saved.contains("tok-typed-secret"), "{saved}");
}

#[tokio::test]
async fn exec_reads_piped_stdin_cp_takes_session_paths_as_the_session_sees_them_and_sessions_are_listed()
 {
    if !crate::helpers::can_build() {
        return;
    }
    let server = Server::start_with(&["--builder-network", "false"]).await;
    let shell = Shell::new(&server);
    built_environment(&server, "Pipe Studio", std::time::Duration::from_secs(120)).await;
    let session = shell.ok(&["session", "new", "pipe-studio"]).await;
    let session = session.trim();
    let local = shell.home.path();

    // Piped standard input is what the command reads; --no-stdin sends none.
    let piped = |args: &[&str], input: Vec<u8>| {
        let mut command = shell.command(args);
        command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        tokio::task::spawn_blocking(move || {
            let mut child = command.spawn().expect("plinth runs");
            let mut stdin = child.stdin.take().expect("stdin");
            // The child may refuse before reading it all.
            let _ = stdin.write_all(&input);
            drop(stdin);
            child.wait_with_output().expect("plinth ends")
        })
    };
    let output = piped(&["exec", session, "--", "cat"], b"hi\n".to_vec())
        .await
        .expect("joined");
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(stdout(&output), "hi\n");
    let bytes: Vec<u8> = (0..=255u8).cycle().take(200_000).collect();
    let output = piped(&["exec", session, "--", "sha256sum"], bytes.clone())
        .await
        .expect("joined");
    let expected = {
        use sha2::Digest as _;
        sha2::Sha256::digest(&bytes)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    };
    assert!(
        stdout(&output).starts_with(&expected),
        "{}",
        stdout(&output)
    );
    let output = piped(
        &["exec", "-n", session, "--", "wc", "-c"],
        b"ignored".to_vec(),
    )
    .await
    .expect("joined");
    assert_eq!(stdout(&output).trim(), "0", "{}", stderr(&output));
    // More than exec sends is refused, saying what to do instead; nothing runs.
    let output = piped(
        &["exec", session, "--", "sh", "-c", "echo ran"],
        vec![b'x'; 800 * 1024],
    )
    .await
    .expect("joined");
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("plinth cp -"),
        "{}",
        stderr(&output)
    );
    assert_eq!(stdout(&output), "");

    // Absolute paths in the working directory (/home/session, the session's HOME) and ~/…
    // land there, not under a directory of that name.
    std::fs::write(local.join("abs.txt"), "absolute\n").expect("write");
    shell
        .ok(&[
            "cp",
            "abs.txt",
            &format!("{session}:/home/session/deep/abs.txt"),
        ])
        .await;
    shell
        .ok(&["cp", "abs.txt", &format!("{session}:~/tilde.txt")])
        .await;
    let seen = shell
        .ok(&[
            "exec",
            session,
            "--",
            "sh",
            "-c",
            "cat /home/session/deep/abs.txt $HOME/tilde.txt; test -e home && echo misplaced; true",
        ])
        .await;
    assert_eq!(seen, "absolute\nabsolute\n");
    shell
        .ok(&[
            "exec",
            session,
            "--",
            "sh",
            "-c",
            "printf 'from tmp' > /tmp/t.txt; cp /tmp/t.txt /home/session/t.txt",
        ])
        .await;
    shell
        .ok(&["cp", &format!("{session}:/home/session/t.txt"), "back.txt"])
        .await;
    assert_eq!(
        std::fs::read_to_string(local.join("back.txt")).expect("copied"),
        "from tmp"
    );
    // The environment is read-only, and /tmp is the session's own: both refused, saying why,
    // in both directions, and nothing is written anywhere.
    for (args, says) in [
        (
            vec![
                "abs.txt".to_owned(),
                format!("{session}:/env/pipe-studio/x.txt"),
            ],
            "read-only",
        ),
        (
            vec![
                format!("{session}:/env/pipe-studio/run.py"),
                "run.py".to_owned(),
            ],
            "in the environment",
        ),
        (
            vec!["abs.txt".to_owned(), format!("{session}:/tmp/x.txt")],
            "outside the session's working directory",
        ),
        (
            vec![format!("{session}:/tmp/t.txt"), "t.txt".to_owned()],
            "outside the session's working directory",
        ),
    ] {
        let mut all: Vec<&str> = vec!["cp"];
        all.extend(args.iter().map(String::as_str));
        let refused = shell.run(&all).await;
        assert_eq!(
            refused.status.code(),
            Some(2),
            "{all:?}: {}",
            stderr(&refused)
        );
        assert!(
            stderr(&refused).contains(says),
            "{all:?}: {}",
            stderr(&refused)
        );
    }
    assert!(!local.join("run.py").exists() && !local.join("t.txt").exists());
    let listed = shell
        .ok(&["exec", session, "--", "sh", "-c", "ls -A; ls /tmp"])
        .await;
    assert!(
        !listed.contains("x.txt") && !listed.contains("pipe-studio"),
        "{listed}"
    );

    // `session list`: this session, active, with its environment; --state filters.
    let other = shell.ok(&["session", "new", "pipe-studio"]).await;
    let other = other.trim();
    shell.ok(&["session", "end", other]).await;
    let listed = shell
        .json(&["session", "list", "--env", "pipe-studio"])
        .await;
    let ids: Vec<&str> = listed["data"]
        .as_array()
        .expect("data")
        .iter()
        .filter_map(|s| s["id"].as_str())
        .collect();
    assert_eq!(ids, [session, other], "{listed}");
    let active = shell.json(&["session", "list", "--state", "active"]).await;
    assert_eq!(active["data"].as_array().map(Vec::len), Some(1), "{active}");
    assert_eq!(active["data"][0]["id"], session, "{active}");
    let table = shell.ok(&["session", "list", "--state", "ended"]).await;
    assert!(table.contains(other) && !table.contains(session), "{table}");
    assert!(table.contains("/env/pipe-studio"), "{table}");
}
