//! Everyday tools inside a real session on a really built uv project, with no network at all:
//! the session's uid has a name (`whoami`, `id -un`, `getpass.getuser()`), tools that write
//! caches (pytest, ruff, mypy) write them in the working directory and never try the
//! read-only project, and `uv run` runs the environment as built, offline,
//! without locking or syncing anything. What a second session sees of the first's caches:
//! nothing. And a project's own test suite (pytest with Hypothesis and coverage, installed
//! from PyPI by its build, through the build's egress proxy) passes from the read-only
//! project exactly as the session's instructions say to run it.

use std::time::Duration;

use serde_json::{Value, json};

use crate::builds::put_tiny_wheel;
use crate::helpers::{Server, build_ready, created_environment, put_file, send};
use crate::sessions::{exec, start_session};

/// How long a build of this small project may take.
const BUILD_LIMIT: Duration = Duration::from_secs(120);

/// A uv project (no package of its own) whose one dependency comes from a wheel in its
/// source, so the build resolves and installs offline.
const PYPROJECT: &str = r#"[project]
name = "everyday"
version = "0.1.0"
requires-python = ">=3.8"
dependencies = ["tinypkg==1.0"]

[tool.uv]
package = false
no-index = true
find-links = ["wheels"]
"#;

/// Does what pytest, ruff and mypy do with their caches, where their settings (or, without
/// them, their defaults beside the project) say, and exits 1 when a write fails, as pytest
/// does when its cache warning is an error; then imports a module of the project (whose
/// bytecode Python cannot write beside it, and must not fail for).
const CACHE_WRITER: &str = r#"
import getpass, os, shlex, sys

root = os.environ["PROJECT_ROOT"]
cache_dir = os.path.join(root, ".pytest_cache")
args = shlex.split(os.environ.get("PYTEST_ADDOPTS", ""))
for option, value in zip(args, args[1:]):
    if option == "-o" and value.startswith("cache_dir="):
        cache_dir = value.split("=", 1)[1]
targets = {
    "pytest": os.path.join(cache_dir, "v", "cache", "lastfailed"),
    "ruff": os.path.join(os.environ.get("RUFF_CACHE_DIR", os.path.join(root, ".ruff_cache")), "0.9", "cache"),
    "mypy": os.path.join(os.environ.get("MYPY_CACHE_DIR", os.path.join(root, ".mypy_cache")), "3.11", "cache.json"),
    "xdg": os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.join(root, ".cache")), "everyday", "state"),
    # pytest's tmp_path lives beneath /tmp/pytest-of-<user>.
    "tmp": os.path.join("/tmp", "pytest-of-" + getpass.getuser(), "pytest-0", "marker"),
}
failed = []
for name, path in targets.items():
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as out:
            out.write(os.environ.get("PLINTH_SESSION_ID", ""))
        print(f"{name} {path}")
    except OSError as error:
        failed.append(f"{name}: {error}")

import everyday_helpers
if everyday_helpers.answer() != 42:
    failed.append(f"import: {everyday_helpers.__file__} answered wrong")
if failed:
    print("\n".join(failed), file=sys.stderr)
    sys.exit(1)
"#;

/// The uv project's tests, written with unittest (the environment has no pytest).
const UNITTEST_SUITE: &str = "import unittest\n\nimport everyday_helpers\n\n\n\
class Helpers(unittest.TestCase):\n    def test_answer(self):\n        \
self.assertEqual(everyday_helpers.answer(), 42)\n";

/// The uv project above, with a module of its own and its tests, built: its id and mount.
async fn everyday_project(server: &Server, name: &str) -> (String, String) {
    let created = created_environment(server, json!({ "name": name })).await;
    let id = created["id"].as_str().expect("id").to_owned();
    let mount = format!("/env/{}", created["slug"].as_str().expect("slug"));
    put_tiny_wheel(server, &id).await;
    put_file(server, &id, "pyproject.toml", PYPROJECT).await;
    put_file(
        server,
        &id,
        "everyday_helpers.py",
        "def answer():\n    return 42\n",
    )
    .await;
    put_file(server, &id, "test_helpers.py", UNITTEST_SUITE).await;
    build_ready(server, &id, 1, BUILD_LIMIT).await;
    (id, mount)
}

/// Runs `command`; it must exit 0. Answers its stdout.
async fn ok(server: &Server, session: &Value, command: &str) -> String {
    let ran = exec(server, session, command).await;
    assert_eq!(ran["exit_code"], 0, "{command}: {ran}");
    ran["stdout"].as_str().expect("stdout").to_owned()
}

/// Every path under the environment with its type, size, mode and modification time, as the
/// session sees it.
/// (`$PROJECT_ROOT/`: without isolation it is a link to the version's directory.)
const LISTING: &str = "find \"$PROJECT_ROOT/\" -printf '%p %y %s %m %T@\\n' | sort";

#[tokio::test]
async fn whoami_test_caches_and_uv_run_work_in_a_session_and_leave_the_project_as_built() {
    if !crate::helpers::can_build() {
        return;
    }
    let server = Server::start_with_config(
        "[builder]\nnetwork = false\n[node]\nnetwork = \"none\"\n",
        &[],
    )
    .await;
    let (id, mount) = everyday_project(&server, "Everyday").await;

    let first = start_session(&server, &id).await;
    let workdir = first["workdir"].as_str().expect("workdir").to_owned();
    let instructions = first["instructions"].as_str().expect("instructions");
    for needle in [
        format!("{workdir}/.cache"),
        format!(
            " Tests written with unittest run with: cd {mount} && python -m unittest (pytest \
             is not installed in this environment). "
        ),
        format!("uv run --project {mount} runs commands in the installed environment"),
    ] {
        assert!(
            instructions.contains(&needle),
            "{needle:?} not in {instructions:?}"
        );
    }
    let before = ok(&server, &first, LISTING).await;
    assert!(
        before.contains(&format!("{mount}/uv.lock ")),
        "the build locked the project: {before}"
    );

    // The session's uid has a name and a home, from its passwd whatever USER says.
    let names = ok(
        &server,
        &first,
        "whoami; id -un; id -gn; env -u USER -u LOGNAME python3 -c \
         'import getpass, os, pwd; print(getpass.getuser()); print(pwd.getpwuid(os.getuid()).pw_dir)'",
    )
    .await;
    let names: Vec<&str> = names.lines().collect();
    assert_eq!(
        names,
        ["session", "session", "session", "session", workdir.as_str()],
        "{names:?}"
    );
    // Its own passwd cannot be changed from inside, to claim another uid or anything else.
    let forged = exec(
        &server,
        &first,
        "echo 'root2:x:0:0::/:/bin/sh' >> /etc/passwd",
    )
    .await;
    assert_ne!(forged["exit_code"], 0, "{forged}");
    let passwd = ok(&server, &first, "cat /etc/passwd").await;
    assert!(!passwd.contains("root2"), "{passwd}");

    assert!(!instructions.contains("-m pytest"), "{instructions}");
    // The test command the instructions give runs the project's tests, from the project.
    let tested = exec(
        &server,
        &first,
        &format!("cd {mount} && python -m unittest"),
    )
    .await;
    assert_eq!(tested["exit_code"], 0, "{tested}");
    assert!(
        tested["stderr"]
            .as_str()
            .is_some_and(|said| said.contains("Ran 1 test") && said.ends_with("OK\n")),
        "{tested}"
    );

    // Test tools' caches land in the working directory.
    put_and_run_cache_writer(&server, &first).await;
    let cached = ok(
        &server,
        &first,
        "cd \"$HOME\" && find .cache -type f | sort",
    )
    .await;
    for expected in [
        ".cache/pytest/v/cache/lastfailed",
        ".cache/ruff/",
        ".cache/mypy/",
        ".cache/everyday/state",
    ] {
        assert!(cached.contains(expected), "{expected:?} not in {cached}");
    }

    // uv, the builds' own, runs the environment as built: from the working directory, from
    // the project, and as the instructions say; offline, with no network at all.
    let where_uv = ok(&server, &first, "command -v uv").await;
    assert_eq!(where_uv.trim(), "/plinth/bin/uv");
    let script = "import tinypkg, sys; tinypkg.main(); print(sys.prefix)";
    for command in [
        format!("cd \"$HOME\" && uv run python -c '{script}'"),
        format!("cd \"$PROJECT_ROOT\" && uv run python -c '{script}'"),
        format!("cd \"$HOME\" && uv run --project \"$PROJECT_ROOT\" python -c '{script}'"),
    ] {
        let ran = exec(&server, &first, &command).await;
        assert_eq!(ran["exit_code"], 0, "{command}: {ran}");
        let stdout = ran["stdout"].as_str().expect("stdout");
        assert!(
            stdout.contains("tinytool ran") && stdout.contains(&format!("{mount}/.venv")),
            "{command}: {ran}"
        );
        if command.contains("--project") {
            let stderr = ran["stderr"].as_str().unwrap_or_default();
            assert!(!stderr.contains("warning"), "{command}: {ran}");
        }
    }

    // None of it wrote anything in the environment.
    let after = ok(&server, &first, LISTING).await;
    assert_eq!(before, after, "the environment changed");

    // A second session (another uid) has a name too, and caches of its own: it sees none of
    // the first's, in its working directory or its /tmp.
    let second = start_session(&server, &id).await;
    let uids = (
        ok(&server, &first, "id -u").await,
        ok(&server, &second, "id -u").await,
    );
    assert_ne!(uids.0, uids.1);
    assert_eq!(ok(&server, &second, "whoami").await.trim(), "session");
    let first_id = first["id"].as_str().expect("id");
    let others = ok(
        &server,
        &second,
        &format!(
            "for path in \"$XDG_CACHE_HOME/everyday\" \"$XDG_CACHE_HOME/pytest\" \
             \"$XDG_CACHE_HOME/ruff\" /tmp/pytest-of-session; do \
             test -e \"$path\" && echo \"$path\"; done; \
             grep -rl {first_id} \"$HOME\" /tmp 2>/dev/null; true"
        ),
    )
    .await;
    assert_eq!(others, "", "the second session sees the first's caches");
    put_and_run_cache_writer(&server, &second).await;
    let mine = ok(&server, &second, "cat \"$XDG_CACHE_HOME/everyday/state\"").await;
    assert_eq!(mine, second["id"].as_str().expect("id"));
    let theirs = ok(&server, &first, "cat \"$XDG_CACHE_HOME/everyday/state\"").await;
    assert_eq!(theirs, first["id"].as_str().expect("id"));
}

/// Puts [`CACHE_WRITER`] in the session's working directory and runs it from there; it must
/// exit 0 (every cache written).
async fn put_and_run_cache_writer(server: &Server, session: &Value) {
    let id = session["id"].as_str().expect("session id");
    let (status, answer) = send(
        server
            .client
            .put(server.url(&format!("/v1/sessions/{id}/files/cache_writer.py")))
            .body(CACHE_WRITER),
    )
    .await;
    assert!(status == 200 || status == 201, "{status}: {answer}");
    ok(server, session, "cd \"$HOME\" && python3 cache_writer.py").await;
}

/// Without isolation commands run as the node's own user, which the host names: the same
/// settings send caches to the working directory and give `uv`, here the node's copy on the
/// host, though the version would not refuse a write by the node's user.
#[tokio::test]
async fn without_isolation_the_same_settings_keep_tools_out_of_the_project() {
    if !crate::helpers::can_build() {
        return;
    }
    let server =
        Server::start_with(&["--builder-network", "false", "--insecure-no-isolation"]).await;
    let (id, mount) = everyday_project(&server, "Everyday Open").await;
    let session = start_session(&server, &id).await;
    assert_eq!(session["isolated"], false, "{session}");
    let before = ok(&server, &session, LISTING).await;
    assert!(before.contains(&format!("{mount}/uv.lock ")), "{before}");
    let names = ok(
        &server,
        &session,
        "whoami; env -u USER -u LOGNAME python3 -c 'import getpass; print(getpass.getuser())'",
    )
    .await;
    assert_eq!(names.lines().count(), 2, "{names}");
    assert!(names.lines().all(|name| !name.is_empty()), "{names}");
    put_and_run_cache_writer(&server, &session).await;
    let uv = ok(&server, &session, "command -v uv").await;
    assert_eq!(
        uv.trim(),
        server.data_dir().join("node/tools/uv").to_string_lossy(),
        "the node's copy of uv"
    );
    let ran = ok(
        &server,
        &session,
        "uv run --project \"$PROJECT_ROOT\" python -c 'import tinypkg; tinypkg.main()'",
    )
    .await;
    assert!(ran.contains("tinytool ran"), "{ran}");
    let after = ok(&server, &session, LISTING).await;
    assert_eq!(before, after, "the environment changed");
}

/// A project with its own pytest suite, as real projects have one: its configuration
/// (`testpaths`, warnings as errors) in `pytest.ini`, a Hypothesis test whose failing example
/// Hypothesis saves (an expected failure), and benchmarks outside `testpaths` that fail when
/// collected (as attrs' `bench/` does when pytest is pointed at the project from elsewhere).
const PYTEST_PROJECT: [(&str, &str); 4] = [
    (
        "requirements.txt",
        "pytest==8.4.2\nhypothesis==6.140.3\ncoverage==7.10.7\n",
    ),
    (
        "pytest.ini",
        "[pytest]\ntestpaths = tests\nfilterwarnings = error\n",
    ),
    (
        "tests/test_numbers.py",
        r#"import pytest
from hypothesis import given, strategies as st


@given(st.integers(), st.integers())
def test_addition_commutes(a, b):
    assert a + b == b + a


@pytest.mark.xfail(strict=True, reason="Hypothesis finds, shrinks and saves a failing example")
@given(st.integers())
def test_small(x):
    assert x < 10
"#,
    ),
    (
        "bench/test_bench.py",
        "def test_bench_is_not_part_of_the_suite():\n    assert False, \"bench/ was collected\"\n",
    ),
];

#[tokio::test]
async fn a_projects_pytest_suite_passes_from_the_read_only_project_as_the_instructions_say() {
    if !crate::helpers::can_build() {
        return;
    }
    // The build installs from PyPI through its egress proxy; sessions reach nothing.
    let server = Server::start_with_config("[node]\nnetwork = \"none\"\n", &[]).await;
    let created = created_environment(&server, json!({ "name": "Own Suite" })).await;
    let id = created["id"].as_str().expect("id").to_owned();
    let mount = format!("/env/{}", created["slug"].as_str().expect("slug"));
    for (path, content) in PYTEST_PROJECT {
        put_file(&server, &id, path, content).await;
    }
    build_ready(&server, &id, 1, Duration::from_secs(300)).await;

    let session = start_session(&server, &id).await;
    let workdir = session["workdir"].as_str().expect("workdir").to_owned();
    let instructions = session["instructions"].as_str().expect("instructions");
    let command = format!("cd {mount} && python -m pytest");
    assert!(
        instructions.contains(&format!(
            " Run the project's tests with: {command} (from the project, so its own pytest \
             configuration applies). "
        )),
        "{instructions}"
    );
    assert!(!instructions.contains("unittest"), "{instructions}");
    let before = ok(&server, &session, LISTING).await;

    // As the instructions say: the project's configuration applies (benchmarks are not
    // collected), and nothing pytest, Hypothesis or coverage writes fails it.
    let tested = exec(&server, &session, &command).await;
    let said = format!("{}{}", tested["stdout"], tested["stderr"]);
    assert_eq!(tested["exit_code"], 0, "{said}");
    assert!(said.contains("1 passed, 1 xfailed"), "{said}");
    assert!(!said.to_lowercase().contains("warning"), "{said}");
    assert!(!said.contains("bench"), "{said}");
    let covered = exec(
        &server,
        &session,
        &format!("cd {mount} && python -m coverage run -m pytest -q && python -m coverage report"),
    )
    .await;
    assert_eq!(covered["exit_code"], 0, "{covered}");
    assert!(
        covered["stdout"]
            .as_str()
            .is_some_and(|said| said.contains("TOTAL")),
        "{covered}"
    );
    // What they wrote is in the working directory: pytest's cache (so --lf works),
    // Hypothesis's saved example, coverage's data.
    let written = ok(
        &server,
        &session,
        "cd \"$HOME\" && find .cache/pytest/v .cache/hypothesis/examples .coverage -type f | sort",
    )
    .await;
    for expected in [
        ".cache/pytest/v/cache/nodeids",
        ".cache/hypothesis/examples/",
        ".coverage\n",
    ] {
        assert!(written.contains(expected), "{expected:?} not in {written}");
    }
    let again = exec(&server, &session, &format!("{command} --lf")).await;
    assert_eq!(again["exit_code"], 0, "{again}");
    assert_eq!(
        ok(&server, &session, LISTING).await,
        before,
        "the environment changed"
    );

    // What the instructions no longer say: the project named from the working directory
    // ignores its testpaths and collects the benchmarks.
    let named = exec(
        &server,
        &session,
        &format!("cd {workdir} && python -m pytest {mount}"),
    )
    .await;
    assert_ne!(named["exit_code"], 0, "{named}");
    assert!(
        named["stdout"]
            .as_str()
            .is_some_and(|said| said.contains("bench/ was collected")),
        "{named}"
    );
}
