//! The `plinth` command line without surprises: global flags wherever they are typed, what
//! `push` leaves out and says it left out, whether an import replaced the source, `env rm`
//! asking first, build logs past and running, counts in words, refusals that name the command
//! to run, and readers that go away. Each command runs as its own process against a real
//! `plinth serve`, as in `cli.rs`.

use std::collections::BTreeSet;
use std::io::{BufRead as _, Read as _, Write as _};
use std::path::Path;
use std::process::{Command, Output, Stdio};

use serde_json::Value;

use crate::cli::{Shell, source_paths, stderr, stdout, write};
use crate::helpers::{Server, send};

/// `plinth <args>` with its standard output's reader gone before the command writes: it must
/// end without a panic or an error message, with 0 or the status a shell gives a command
/// SIGPIPE ended.
async fn run_with_closed_stdout(shell: &Shell, args: &[&str]) {
    let mut command = shell.command(args);
    command.stdout(Stdio::piped()).stderr(Stdio::piped());
    let described = format!("{args:?}");
    let output = tokio::task::spawn_blocking(move || {
        let mut child = command.spawn().expect("plinth runs");
        drop(child.stdout.take());
        child.wait_with_output().expect("plinth ends")
    })
    .await
    .expect("joined");
    assert!(
        matches!(output.status.code(), Some(0 | 141)),
        "{described}: {:?}: {}",
        output.status,
        stderr(&output)
    );
    assert_eq!(stderr(&output), "", "{described}");
}

#[tokio::test]
async fn global_flags_go_before_or_after_the_command_and_readers_may_leave_early() {
    let server = Server::start().await;
    let mut shell = Shell::new(&server);

    // --config before the subcommand, as the example config's first line has it, and after.
    let dir = tempfile::tempdir().expect("dir");
    let config = dir.path().join("plinth.toml");
    let marked = dir.path().join("marked-data");
    std::fs::write(
        &config,
        format!("data_dir = {:?}\n", marked.display().to_string()),
    )
    .expect("config");
    let config = config.to_str().expect("utf-8");
    for args in [
        &["--config", config, "serve", "--dump-config"][..],
        &["serve", "--dump-config", "--config", config],
    ] {
        let dumped = shell.ok(args).await;
        assert!(
            dumped.contains(&marked.display().to_string()),
            "{args:?}: {dumped}"
        );
    }
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/plinth.example.toml");
    shell
        .ok(&["--config", example, "serve", "--dump-config"])
        .await;

    // --output before, between and after.
    shell.ok(&["env", "create", "Flags"]).await;
    for args in [
        &["-o", "json", "env", "list"][..],
        &["env", "--output", "json", "list"],
        &["env", "list", "-o", "json"],
    ] {
        let listed: Value = serde_json::from_str(&shell.ok(args).await).expect("JSON");
        assert_eq!(listed["data"][0]["slug"], "flags", "{args:?}: {listed}");
    }

    // A flag typed for a command that has no use for it is refused, not ignored; the same
    // setting from the environment is not a request of this command's.
    let refused = shell.run(&["--config", config, "env", "list"]).await;
    assert_eq!(refused.status.code(), Some(2), "{}", stderr(&refused));
    assert!(
        stderr(&refused).contains("--config does not apply to `plinth env`"),
        "{}",
        stderr(&refused)
    );
    let refused = shell.run(&["serve", "-o", "json"]).await;
    assert_eq!(refused.status.code(), Some(2), "{}", stderr(&refused));
    let mut with_variable = shell.command(&["env", "list"]);
    with_variable.env("PLINTH_CONFIG", config);
    let listed = shell.run_command(with_variable).await;
    assert!(listed.status.success(), "{}", stderr(&listed));

    // --url wins over PLINTH_URL, on either side of the command.
    let base = server.base.clone();
    shell.url = "http://127.0.0.1:9".to_owned();
    assert_eq!(shell.run(&["env", "list"]).await.status.code(), Some(1));
    let listed = shell.ok(&["--url", &base, "env", "list"]).await;
    assert!(listed.contains("flags"), "{listed}");
    let listed = shell.ok(&["versions", "flags", "--url", &base]).await;
    assert!(listed.starts_with("VERSION"), "{listed}");
    shell.url = base;

    // A refusal that names the REST call as the way out names the command instead.
    let unbuilt = shell.run(&["session", "new", "flags"]).await;
    assert_eq!(unbuilt.status.code(), Some(1), "{}", stderr(&unbuilt));
    let said = stderr(&unbuilt);
    assert!(said.contains("environment_not_ready"), "{said}");
    assert!(said.contains("`plinth build henv_"), "{said}");
    assert!(!said.contains("POST /v1"), "{said}");

    // Readers that go away: no panic, no message.
    for args in [
        &["completions", "bash"][..],
        &["completions", "zsh"],
        &["man"],
        &["env", "list"],
        &["env", "list", "-o", "json"],
        &["env", "show", "flags"],
        &["versions", "flags"],
    ] {
        run_with_closed_stdout(&shell, args).await;
    }
    // The shell's own `| head -1`.
    let plinth = env!("CARGO_BIN_EXE_plinth");
    let piped = Command::new("sh")
        .args(["-c", &format!("{plinth} completions bash | head -1")])
        .output()
        .expect("sh runs");
    assert_eq!(stdout(&piped).lines().count(), 1, "{}", stdout(&piped));
    assert_eq!(stderr(&piped), "");
}

/// A project with everything a build makes again beside its own files.
fn cluttered_project(root: &Path) {
    write(root, "app.py", "print('app')\n");
    write(root, "lib/util.py", "X = 1\n");
    // Virtualenvs: the usual name, and another one told by its pyvenv.cfg.
    write(root, ".venv/pyvenv.cfg", "home = /usr/bin\n");
    write(root, ".venv/bin/python", "#!/bin/sh\n");
    write(
        root,
        ".venv/lib/python3/site-packages/pkg/__init__.py",
        "\n",
    );
    write(root, "env/pyvenv.cfg", "home = /usr/bin\n");
    write(root, "env/bin/activate", "# activate\n");
    write(
        root,
        "node_modules/left-pad/index.js",
        "module.exports = 1;\n",
    );
    write(root, "node_modules/left-pad/package.json", "{}\n");
    write(root, "__pycache__/app.cpython-312.pyc", "compiled\n");
    write(root, "lib/__pycache__/util.cpython-312.pyc", "compiled\n");
    // Ignore files: git's and Plinth's own.
    write(root, ".gitignore", "secret.env\n");
    write(root, "secret.env", "TOKEN=do-not-send\n");
    write(root, ".plinthignore", "*.tmp\ndata/\n");
    write(root, "scratch.tmp", "scratch\n");
    write(root, "data/big.csv", "a,b\n");
    // A link out of the project: sent as a link, and left out by the server.
    std::os::unix::fs::symlink("/etc/passwd", root.join("passwd")).expect("symlink");
}

#[tokio::test]
async fn push_leaves_out_what_a_build_makes_again_and_says_what_it_left_out() {
    let server = Server::start().await;
    let shell = Shell::new(&server);
    let id = shell.json(&["env", "create", "Tidy"]).await["id"]
        .as_str()
        .expect("id")
        .to_owned();
    let project = tempfile::tempdir().expect("project");
    let root = project.path();
    cluttered_project(root);
    // A real checkout: .git's files are never sent nor counted.
    crate::imports::git(root, &["init", "--quiet"]);
    crate::imports::git(root, &["add", "app.py"]);
    crate::imports::git(root, &["commit", "--quiet", "-m", "first"]);
    let dir = root.to_str().expect("utf-8");

    let pushed = shell.ok(&["push", "tidy", dir]).await;
    let lines: Vec<&str> = pushed.lines().collect();
    assert!(
        lines[0].starts_with("pushed 4 files, 1 directory (")
            && lines[0].contains(" to tidy from git ")
            && lines[0].contains("replacing its source"),
        "{pushed}"
    );
    assert_eq!(
        lines[1],
        "skipped 12 files: 3 in .venv (default), 2 in __pycache__ (default), 2 in env (a \
         virtualenv, default), 2 in node_modules (default), 3 named by .gitignore, .ignore or \
         .plinthignore; --no-default-ignores sends the default ones too",
        "{pushed}"
    );
    assert_eq!(
        lines[2..],
        [
            "the server left out 1 member:",
            "  1 symlink whose target leaves the project"
        ],
        "{pushed}"
    );
    let expected: BTreeSet<String> = [
        ".gitignore",
        ".plinthignore",
        "app.py",
        "lib",
        "lib/util.py",
    ]
    .into_iter()
    .map(str::to_owned)
    .collect();
    assert_eq!(source_paths(&server, &id).await, expected);

    // Asked for, the defaults go too; the ignore files still apply.
    let pushed = shell
        .ok(&["push", "tidy", dir, "--no-default-ignores"])
        .await;
    assert!(
        pushed.contains("\nskipped 3 files: 3 named by .gitignore, .ignore or .plinthignore\n"),
        "{pushed}"
    );
    let paths = source_paths(&server, &id).await;
    for sent in [
        ".venv/pyvenv.cfg",
        "env/bin/activate",
        "node_modules/left-pad/index.js",
        "lib/__pycache__/util.cpython-312.pyc",
    ] {
        assert!(paths.contains(sent), "{sent}: {paths:?}");
    }
    assert!(
        !paths.contains("secret.env") && !paths.contains("data"),
        "{paths:?}"
    );

    // --output json: the API's answer alone on stdout, what was left out on stderr.
    let output = shell.run(&["push", "tidy", dir, "-o", "json"]).await;
    assert!(output.status.success(), "{}", stderr(&output));
    let report: Value = serde_json::from_slice(&output.stdout).expect("one JSON document");
    assert_eq!(report["files"], 4, "{report}");
    assert_eq!(report["skipped_by_reason"]["symlink"], 1, "{report}");
    assert!(
        stderr(&output).contains("skipped 12 files: 3 in .venv (default)"),
        "{}",
        stderr(&output)
    );

    // One of a thing is one, not ones; nothing left out says nothing.
    let single = tempfile::tempdir().expect("single");
    write(single.path(), "only.py", "print(1)\n");
    let pushed = shell
        .ok(&["push", "tidy", single.path().to_str().expect("utf-8")])
        .await;
    assert!(
        pushed.starts_with("pushed 1 file, 0 directories ("),
        "{pushed}"
    );
    assert!(!pushed.contains("skipped"), "{pushed}");
}

#[tokio::test]
async fn import_says_whether_it_replaced_the_source_or_landed_over_it() {
    use crate::imports::git;
    let repo = tempfile::tempdir().expect("repo");
    git(repo.path(), &["init", "--quiet"]);
    write(repo.path(), "app.py", "print('from git')\n");
    git(repo.path(), &["add", "."]);
    git(repo.path(), &["commit", "--quiet", "-m", "first"]);
    let server = Server::start_with(&[
        "--git-allowed-schemes",
        "file",
        "--git-allow-private-addresses",
        "true",
    ])
    .await;
    let shell = Shell::new(&server);
    let id = shell.json(&["env", "create", "Merged"]).await["id"]
        .as_str()
        .expect("id")
        .to_owned();
    let local = tempfile::tempdir().expect("local");
    write(local.path(), "local.txt", "mine\n");
    shell
        .ok(&["push", "merged", local.path().to_str().expect("utf-8")])
        .await;
    let url = format!("file://{}", repo.path().display());

    let merged = shell.ok(&["import", "merged", "--git", &url]).await;
    assert!(
        merged.starts_with("imported 1 file at ")
            && merged.contains("over its source (files only the source had are kept; --replace"),
        "{merged}"
    );
    assert_eq!(
        source_paths(&server, &id).await,
        BTreeSet::from(["app.py".to_owned(), "local.txt".to_owned()])
    );

    let replaced = shell
        .ok(&["import", "merged", "--git", &url, "--replace"])
        .await;
    assert!(replaced.contains("replacing its source"), "{replaced}");
    assert_eq!(
        source_paths(&server, &id).await,
        BTreeSet::from(["app.py".to_owned()])
    );
}

/// `plinth <args>` on a terminal (`script` makes one) in `shell`'s home, against its server:
/// types `answer` once `prompt` is on the screen, and answers the exit status and what the
/// terminal showed.
async fn on_a_terminal(
    shell: &Shell,
    args: &str,
    prompt: &'static str,
    answer: &'static str,
) -> (Option<i32>, String) {
    let plinth = env!("CARGO_BIN_EXE_plinth");
    let mut script = Command::new("script");
    script
        .args(["-qec", &format!("{plinth} {args}"), "/dev/null"])
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", shell.home.path())
        .env("XDG_CONFIG_HOME", shell.config_home())
        .env("PLINTH_URL", &shell.url)
        .current_dir(shell.home.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    tokio::task::spawn_blocking(move || typed(script, prompt, answer))
        .await
        .expect("joined")
}

fn typed(mut script: Command, prompt: &str, answer: &str) -> (Option<i32>, String) {
    let mut child = script.spawn().expect("script runs");
    let mut stdout = child.stdout.take().expect("stdout");
    let mut shown = Vec::new();
    let mut buffer = [0u8; 256];
    while !String::from_utf8_lossy(&shown).contains(prompt) {
        let read = stdout.read(&mut buffer).expect("read");
        assert!(read > 0, "no prompt: {}", String::from_utf8_lossy(&shown));
        shown.extend_from_slice(&buffer[..read]);
    }
    let mut stdin = child.stdin.take().expect("stdin");
    stdin.write_all(answer.as_bytes()).expect("typed");
    stdout.read_to_end(&mut shown).expect("rest");
    drop(stdin);
    let status = child.wait().expect("ends");
    (status.code(), String::from_utf8_lossy(&shown).into_owned())
}

#[tokio::test]
async fn env_rm_deletes_only_what_the_person_confirmed() {
    let server = Server::start().await;
    let shell = Shell::new(&server);
    let id = shell.json(&["env", "create", "Keep Me"]).await["id"]
        .as_str()
        .expect("id")
        .to_owned();
    let exists = |id: String| {
        let server = &server;
        async move {
            let (status, _) = send(
                server
                    .client
                    .get(server.url(&format!("/v1/environments/{id}"))),
            )
            .await;
            status == 200
        }
    };

    // Without a terminal and without --yes: refused, naming --yes.
    let refused = shell.run(&["env", "rm", "keep-me"]).await;
    assert_eq!(refused.status.code(), Some(2), "{}", stderr(&refused));
    assert!(stderr(&refused).contains("--yes"), "{}", stderr(&refused));
    assert!(exists(id.clone()).await);

    // On a terminal, a wrong answer deletes nothing; the slug deletes it.
    let (status, shown) = on_a_terminal(&shell, "env rm keep-me", "Type its slug", "yes\n").await;
    assert_eq!(status, Some(1), "{shown}");
    assert!(
        shown.contains("0 versions") && shown.contains("was not deleted"),
        "{shown}"
    );
    assert!(exists(id.clone()).await);
    let (status, shown) =
        on_a_terminal(&shell, "env rm keep-me", "Type its slug", "keep-me\n").await;
    assert_eq!(status, Some(0), "{shown}");
    assert!(shown.contains("deleted keep-me"), "{shown}");
    assert!(!exists(id).await);

    // --yes asks nothing.
    shell.ok(&["env", "create", "Gone Soon"]).await;
    let removed = shell.ok(&["env", "rm", "gone-soon", "--yes"]).await;
    assert!(removed.starts_with("deleted gone-soon"), "{removed}");
}

#[tokio::test]
async fn build_logs_print_a_past_build_and_follow_a_running_one_to_its_end() {
    if !crate::helpers::can_build() {
        return;
    }
    let server = Server::start_with(&["--builder-network", "false"]).await;
    let shell = Shell::new(&server);
    let id = shell.json(&["env", "create", "Logged"]).await["id"]
        .as_str()
        .expect("id")
        .to_owned();
    let project = tempfile::tempdir().expect("project");
    let root = project.path();
    write(root, "run.py", "print('logged')\n");
    // The build prints a line, waits, and prints another: followed, both arrive, the first
    // while the build is still running.
    write(
        root,
        "setup.sh",
        "echo first-line-of-setup\nsleep 5\necho last-line-of-setup\n",
    );
    let dir = root.to_str().expect("utf-8");
    shell.ok(&["push", "logged", dir]).await;

    // No build yet: nothing to print, and what to run instead.
    let none = shell.run(&["build", "logs", "logged"]).await;
    assert_eq!(none.status.code(), Some(1), "{}", stderr(&none));
    assert!(
        stderr(&none).contains("`plinth build logged --follow`"),
        "{}",
        stderr(&none)
    );

    let queued = shell.ok(&["build", "logged"]).await;
    assert_eq!(queued.trim(), "queued version 1 of logged");
    let mut follow = shell.command(&["build", "logs", "logged", "--follow"]);
    follow.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = follow.spawn().expect("plinth runs");
    let out = child.stdout.take().expect("stdout");
    let (lines, mut arriving) = tokio::sync::mpsc::unbounded_channel();
    let reader = tokio::task::spawn_blocking(move || {
        for line in std::io::BufReader::new(out).lines() {
            let _ = lines.send(line.expect("a line"));
        }
    });
    let mut printed = Vec::new();
    let mut status_at_first_line = None;
    while let Some(line) = arriving.recv().await {
        if line.contains("first-line-of-setup") && status_at_first_line.is_none() {
            let (_, record) = send(
                server
                    .client
                    .get(server.url(&format!("/v1/environments/{id}/builds/1"))),
            )
            .await;
            status_at_first_line = Some(record["status"].clone());
        }
        printed.push(line);
    }
    reader.await.expect("read to the end");
    let ended = tokio::task::spawn_blocking(move || child.wait_with_output().expect("plinth ends"))
        .await
        .expect("joined");
    let printed = printed.join("\n");
    assert_eq!(ended.status.code(), Some(0), "{}", stderr(&ended));
    assert!(
        printed.contains("first-line-of-setup") && printed.contains("last-line-of-setup"),
        "{printed}"
    );
    let status = status_at_first_line.expect("the first line was printed");
    assert!(
        status != "ready" && status != "failed",
        "followed while the build ran: {status}"
    );

    // A past build's log, whole, by version and as the latest.
    for args in [
        &["build", "logs", "logged", "1"][..],
        &["build", "logs", "logged"],
    ] {
        let log = shell.ok(args).await;
        assert!(
            log.contains("first-line-of-setup") && log.contains("last-line-of-setup"),
            "{args:?}: {log}"
        );
    }
    let record = shell.json(&["build", "logs", "logged", "1"]).await;
    assert_eq!(record["status"], "ready", "{record}");

    // A failed build: its log, and exit status 1, whether followed or not.
    write(root, "setup.sh", "echo doomed-by-setup\nexit 7\n");
    shell.ok(&["push", "logged", dir]).await;
    shell.ok(&["build", "logged"]).await;
    let followed = shell.run(&["build", "logs", "logged", "--follow"]).await;
    assert_eq!(followed.status.code(), Some(1), "{}", stderr(&followed));
    assert!(
        stdout(&followed).contains("doomed-by-setup"),
        "{}",
        stdout(&followed)
    );
    assert!(
        stderr(&followed).contains("version 2 failed"),
        "{}",
        stderr(&followed)
    );
    let past: Output = shell.run(&["build", "logs", "logged", "2"]).await;
    assert_eq!(past.status.code(), Some(1), "{}", stderr(&past));
    assert!(
        stdout(&past).contains("doomed-by-setup"),
        "{}",
        stdout(&past)
    );
    assert_eq!(
        shell
            .run(&["build", "logs", "logged", "1"])
            .await
            .status
            .code(),
        Some(0)
    );

    // A reader that leaves a log early ends it quietly.
    run_with_closed_stdout(&shell, &["build", "logs", "logged", "1"]).await;
}
