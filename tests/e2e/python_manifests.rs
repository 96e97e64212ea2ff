//! Which Python manifest a build installs, through HTTP against real builds with no network:
//! a `requirements.txt` app whose `pyproject.toml` declares no build system installs its
//! requirements; `install.python` names requirements files, groups and extras, and a bad
//! value is refused saying what to write; without uv, pip installs the dependency groups uv
//! would; `requires-python` ranges build on this machine's Python with and without uv.
//!
//! "Without uv" is a `plinth serve` process whose `PATH` has the system's directories only,
//! as on a host where uv was never installed: its builder finds no uv to give builds, and
//! they fall back to `python3 -m venv` and pip. Every package comes from a wheel in the
//! project's source.

use std::io::Write as _;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use crate::helpers::{Server, assert_error_in, send};
use crate::processes::Process;

/// How long a build of these small projects may take.
const BUILD_LIMIT: Duration = Duration::from_secs(120);

/// The system's directories: no uv there, nor a Python that has it.
const PATH_WITHOUT_UV: &str = "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin";

/// The REST API of one `plinth serve`.
struct Api {
    client: reqwest::Client,
    base: String,
}

impl Api {
    fn of(server: &Server) -> Api {
        Api {
            client: server.client.clone(),
            base: server.base.clone(),
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Creates an environment from `body`; answers its id and slug.
    async fn create(&self, body: Value) -> (String, String) {
        let (status, created) =
            send(self.client.post(self.url("/v1/environments")).json(&body)).await;
        assert_eq!(status, 201, "{body}: {created}");
        (
            created["id"].as_str().expect("id").to_owned(),
            created["slug"].as_str().expect("slug").to_owned(),
        )
    }

    async fn put(&self, id: &str, path: &str, body: impl Into<reqwest::Body>) {
        let (status, answer) = send(
            self.client
                .put(self.url(&format!("/v1/environments/{id}/files/{path}")))
                .body(body),
        )
        .await;
        assert_eq!(status, 200, "{path}: {answer}");
    }

    /// Builds version `version` of `id`; answers its record once it ended, ready or not.
    async fn build(&self, id: &str, version: u64) -> Value {
        let (status, queued) = send(
            self.client
                .post(self.url(&format!("/v1/environments/{id}/build"))),
        )
        .await;
        assert_eq!(status, 202, "{queued}");
        crate::helpers::wait_for_build_at(&self.client, &self.url(""), id, version, BUILD_LIMIT)
            .await
    }

    /// Builds version `version` of `id`, which must be ready; answers its log and the
    /// `name==version` of each pip package it installed, but the venv's own pip and
    /// setuptools.
    async fn built(&self, id: &str, version: u64) -> (String, Vec<String>) {
        let build = self.build(id, version).await;
        let log = build["log"].as_str().unwrap_or("").to_owned();
        assert_eq!(
            build["status"], "ready",
            "log:\n{log}\nerror: {}",
            build["error"]
        );
        let packages = build["packages"]
            .as_array()
            .expect("packages")
            .iter()
            .filter(|package| package["manager"] == "pip")
            // What `python3 -m venv` seeds every venv with, uv's venvs hold neither.
            .filter(|package| package["name"] != "pip" && package["name"] != "setuptools")
            .map(|package| {
                format!(
                    "{}=={}",
                    package["name"].as_str().unwrap_or(""),
                    package["version"].as_str().unwrap_or("")
                )
            })
            .collect();
        (log, packages)
    }
}

/// A `plinth serve` process on a host without uv (its `PATH` is [`PATH_WITHOUT_UV`]), builds
/// with no network. Killed when dropped, and what its builds left mounted is unmounted.
struct WithoutUv {
    api: Api,
    process: Option<Process>,
    data: tempfile::TempDir,
    /// Its own `builder.tools_dir`: a builder that finds no uv removes the copy it finds
    /// there, and the default directory is every other server's on this host.
    _tools: tempfile::TempDir,
}

impl WithoutUv {
    async fn start() -> WithoutUv {
        use std::os::unix::fs::PermissionsExt as _;
        let data = tempfile::tempdir().expect("data");
        // Outside /tmp, which builds see as their own.
        let tools = tempfile::Builder::new()
            .prefix("plinth-e2e-tools-")
            .tempdir_in("/var/tmp")
            .expect("tools");
        // The build user must reach the tools directory.
        std::fs::set_permissions(tools.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
        let config = data.path().join("plinth.toml");
        std::fs::write(
            &config,
            format!(
                "data_dir = \"{}\"\n[gateway]\nlisten = \"127.0.0.1:0\"\n\
                 [builder]\nnetwork = false\ntools_dir = \"{}\"\n",
                data.path().display(),
                tools.path().display()
            ),
        )
        .expect("config");
        let log = std::fs::File::create(data.path().join("serve.log")).expect("log");
        let mut command = Command::new(env!("CARGO_BIN_EXE_plinth"));
        command
            .args(["serve", "--config"])
            .arg(&config)
            .env("PATH", PATH_WITHOUT_UV)
            .env("PLINTH_LOG", "warn")
            .env_remove("PLINTH_TOKENS")
            .env_remove("PLINTH_CONFIG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        let (process, http) = crate::cluster::spawn_serve(&mut command).await;
        let api = Api {
            client: crate::helpers::http_client(),
            base: format!("http://{http}"),
        };
        WithoutUv {
            api,
            process: Some(process),
            data,
            _tools: tools,
        }
    }
}

impl Drop for WithoutUv {
    fn drop(&mut self) {
        self.process.take();
        crate::helpers::unmount_under(self.data.path());
    }
}

/// A wheel: package `name` 1.0, one empty module.
fn wheel(name: &str) -> Vec<u8> {
    let info = format!("{name}-1.0.dist-info");
    let files = [
        (format!("{name}/__init__.py"), String::new()),
        (
            format!("{info}/METADATA"),
            format!("Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n"),
        ),
        (
            format!("{info}/WHEEL"),
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
                .to_owned(),
        ),
    ];
    let mut writer = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let mut record = String::new();
    for (path, content) in &files {
        writer
            .start_file(path.as_str(), zip::write::SimpleFileOptions::default())
            .expect("start");
        writer.write_all(content.as_bytes()).expect("write");
        record.push_str(&format!("{path},,\n"));
    }
    record.push_str(&format!("{info}/RECORD,,\n"));
    writer
        .start_file(
            format!("{info}/RECORD"),
            zip::write::SimpleFileOptions::default(),
        )
        .expect("start");
    writer.write_all(record.as_bytes()).expect("write");
    writer.finish().expect("finish").into_inner()
}

/// Puts the wheels of `names` at `wheels/` in the source of `id`.
async fn put_wheels(api: &Api, id: &str, names: &[&str]) {
    for name in names {
        api.put(
            id,
            &format!("wheels/{name}-1.0-py3-none-any.whl"),
            wheel(name),
        )
        .await;
    }
}

/// A requirement on the wheel of `name` in the source of the environment at `/env/<slug>`,
/// which uv and pip both install offline (a `find-links` of pip's would need the build's
/// configuration, not the project's).
fn wheel_requirement(slug: &str, name: &str) -> String {
    format!("{name} @ file:///env/{slug}/wheels/{name}-1.0-py3-none-any.whl")
}

/// A Flask-style app's `pyproject.toml`: metadata and tools' settings, no build system. Its
/// dependency is on no index and in no wheel, so installing it as a project fails offline.
const METADATA_ONLY: &str = r#"[project]
name = "flaskapp"
version = "0.1.0"
dependencies = ["flask>=3"]

[tool.ruff]
line-length = 100

[tool.pytest.ini_options]
testpaths = ["tests"]
"#;

/// Tools' settings alone.
const SETTINGS_ONLY: &str = "[tool.ruff]\nline-length = 100\n\n[tool.pytest.ini_options]\n";

const REQUIREMENTS: &str = "--no-index\n--find-links wheels\ntinypkg==1.0\n";

/// The requirements app, built with or without uv: installs `requirements.txt` alone and says
/// why, for a `[project]` without a build system and for tools' settings alone.
async fn requirements_app(api: &Api, uv: bool) {
    let (id, _) = api.create(json!({"name": "Flask App"})).await;
    put_wheels(api, &id, &["tinypkg"]).await;
    api.put(&id, "requirements.txt", REQUIREMENTS).await;
    api.put(&id, "app.py", "import tinypkg\n").await;
    for (version, pyproject, why) in [
        (
            1,
            METADATA_ONLY,
            "==> installing from requirements.txt: pyproject.toml declares no build system, so \
             its [project] table names no package to install\n",
        ),
        (
            2,
            SETTINGS_ONLY,
            "==> installing from requirements.txt: pyproject.toml declares no build system (a \
             settings-only pyproject)\n",
        ),
    ] {
        api.put(&id, "pyproject.toml", pyproject).await;
        let (log, packages) = api.built(&id, version).await;
        assert!(log.contains(why), "{log}");
        assert_eq!(packages, ["tinypkg==1.0"], "{log}");
        assert!(
            !log.contains("uv sync") && !log.contains("pip install ."),
            "{log}"
        );
        if uv {
            assert!(
                log.contains("==> uv pip install -r requirements.txt"),
                "{log}"
            );
        } else {
            assert!(log.contains("==> uv not found on PATH"), "{log}");
            assert!(
                log.contains("==> .venv/bin/pip install -r requirements.txt"),
                "{log}"
            );
        }
    }
}

#[tokio::test]
async fn a_requirements_app_with_a_metadata_only_pyproject_installs_its_requirements() {
    if !crate::helpers::can_build() {
        return;
    }
    let server = Server::start_with(&["--builder-network", "false"]).await;
    requirements_app(&Api::of(&server), true).await;
    server.stop().await;
    let without = WithoutUv::start().await;
    requirements_app(&without.api, false).await;
}

#[tokio::test]
async fn install_python_names_requirements_files_groups_and_extras_and_bad_ones_are_refused() {
    if !crate::helpers::can_build() {
        return;
    }
    let server = Server::start_with(&["--builder-network", "false"]).await;
    let api = Api::of(&server);

    // Refused, on create and on change, naming the field, what is wrong and what to write.
    let (id, slug) = api.create(json!({"name": "Named"})).await;
    for (case, install, says) in [
        (
            "nothing named",
            json!({"python": {}}),
            r#"install.python: names nothing to install; write {"requirements": ["requirements.txt"]}"#,
        ),
        (
            "a path out of the project",
            json!({"python": {"requirements": ["../secrets.txt"]}}),
            "install.python.requirements[0]: \"../secrets.txt\" leaves the project; write a path \
             relative to the project's root",
        ),
        (
            "a group pyproject.toml cannot name",
            json!({"python": {"project": {"groups": ["dev tools"]}}}),
            "install.python.project.groups[0]: \"dev tools\" is not a name",
        ),
        (
            "a misspelt field",
            json!({"python": {"requirement": ["requirements.txt"]}}),
            "install.python.requirement: unknown field `requirement`, expected `requirements` or `project`",
        ),
        (
            "a string for a list",
            json!({"python": {"requirements": "requirements.txt"}}),
            "install.python.requirements: invalid type",
        ),
    ] {
        for request in [
            api.client
                .post(api.url("/v1/environments"))
                .json(&json!({"name": "Refused", "install": install})),
            api.client
                .put(api.url(&format!("/v1/environments/{id}")))
                .json(&json!({"install": install})),
        ] {
            let (status, body) = send(request).await;
            assert_error_in(case, status, &body, 400, "environment_invalid");
            let message = body["error"]["message"].as_str().unwrap_or("");
            assert!(message.contains(says), "{case}: {message}");
        }
    }
    let (_, unchanged) = send(api.client.get(api.url(&format!("/v1/environments/{id}")))).await;
    assert!(unchanged.get("install").is_none(), "{unchanged}");

    // Requirements files, installed together.
    put_wheels(&api, &id, &["tinypkg", "devpkg", "docpkg", "extrapkg"]).await;
    api.put(&id, "requirements.txt", REQUIREMENTS).await;
    api.put(
        &id,
        "requirements-dev.txt",
        "--no-index\n--find-links wheels\ndevpkg==1.0\n",
    )
    .await;
    let files = json!({"python": {"requirements": ["requirements.txt", "requirements-dev.txt"]}});
    let (status, changed) = send(
        api.client
            .put(api.url(&format!("/v1/environments/{id}")))
            .json(&json!({"install": files})),
    )
    .await;
    assert_eq!(status, 200, "{changed}");
    assert_eq!(changed["install"], files);
    let (log, packages) = api.built(&id, 1).await;
    assert!(
        log.contains("==> install.python names requirements.txt, requirements-dev.txt\n"),
        "{log}"
    );
    assert!(
        log.contains("==> uv pip install -r requirements.txt -r requirements-dev.txt"),
        "{log}"
    );
    assert_eq!(packages, ["devpkg==1.0", "tinypkg==1.0"], "{log}");

    // The project, with a group and an extra and not its default group; then, set on
    // creation, the same project with its default groups and requirements-dev.txt after it.
    let pyproject = format!(
        "[project]\nname = \"named\"\nversion = \"0.1.0\"\ndependencies = [{:?}]\n\n\
         [project.optional-dependencies]\ntest = [{:?}]\n\n\
         [dependency-groups]\ndev = [{:?}]\ndocs = [{:?}]\n",
        wheel_requirement(&slug, "tinypkg"),
        wheel_requirement(&slug, "extrapkg"),
        wheel_requirement(&slug, "devpkg"),
        wheel_requirement(&slug, "docpkg"),
    );
    api.put(&id, "pyproject.toml", pyproject.clone()).await;
    let project = json!({"python": {"project": {"groups": ["docs"], "extras": ["test"]}}});
    let (status, changed) = send(
        api.client
            .put(api.url(&format!("/v1/environments/{id}")))
            .json(&json!({"install": project})),
    )
    .await;
    assert_eq!(status, 200, "{changed}");
    let (log, packages) = api.built(&id, 2).await;
    assert!(
        log.contains(
            "==> install.python names the project in pyproject.toml (groups docs; extras test)\n"
        ),
        "{log}"
    );
    assert!(
        log.contains("==> uv sync --no-default-groups --group docs --extra test\n"),
        "{log}"
    );
    assert_eq!(
        packages,
        ["docpkg==1.0", "extrapkg==1.0", "tinypkg==1.0"],
        "{log}"
    );

    let both = json!({"python": {"project": {}, "requirements": ["requirements-dev.txt"]}});
    let (other, other_slug) = api
        .create(json!({"name": "Named Too", "install": both}))
        .await;
    put_wheels(&api, &other, &["tinypkg", "devpkg", "docpkg", "extrapkg"]).await;
    api.put(
        &other,
        "pyproject.toml",
        pyproject.replace(&slug, &other_slug),
    )
    .await;
    api.put(
        &other,
        "requirements-dev.txt",
        "--no-index\n--find-links wheels\ndevpkg==1.0\n",
    )
    .await;
    let (log, packages) = api.built(&other, 1).await;
    assert!(
        log.contains(
            "==> install.python names the project in pyproject.toml and requirements-dev.txt\n"
        ),
        "{log}"
    );
    assert_eq!(packages, ["devpkg==1.0", "tinypkg==1.0"], "{log}");

    // A file the setting names that the source lacks fails the build, saying so.
    let (status, _) = send(
        api.client
            .put(api.url(&format!("/v1/environments/{other}")))
            .json(&json!({"install": {"python": {"requirements": ["requirements-test.txt"]}}})),
    )
    .await;
    assert_eq!(status, 200);
    let failed = api.build(&other, 2).await;
    assert_eq!(failed["status"], "failed", "{failed}");
    let error = failed["error"].as_str().unwrap_or("");
    assert!(
        error.contains("install.python names the requirements file requirements-test.txt, and the source has no such file"),
        "{error}"
    );
    // `{}` clears the setting: the manifests found decide again.
    let (status, cleared) = send(
        api.client
            .put(api.url(&format!("/v1/environments/{other}")))
            .json(&json!({"install": {}})),
    )
    .await;
    assert_eq!(status, 200, "{cleared}");
    assert!(cleared.get("install").is_none(), "{cleared}");
    server.stop().await;
}

/// A PEP 517 backend in the project (`backend-path = ["."]`, nothing to install first), so a
/// package builds offline with pip's build isolation as with uv: `grouped` 0.1.0.
const BACKEND: &str = r#"import os, zipfile

def get_requires_for_build_wheel(config_settings=None):
    return []

def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    info = "grouped-0.1.0.dist-info"
    name = "grouped-0.1.0-py3-none-any.whl"
    files = {
        "grouped/__init__.py": "ANSWER = 42\n",
        f"{info}/METADATA": "Metadata-Version: 2.1\nName: grouped\nVersion: 0.1.0\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w") as wheel:
        for path, text in files.items():
            wheel.writestr(path, text)
        wheel.writestr(f"{info}/RECORD", "".join(f"{p},,\n" for p in files) + f"{info}/RECORD,,\n")
    return name

get_requires_for_build_editable = get_requires_for_build_wheel
build_editable = build_wheel
"#;

#[tokio::test]
async fn without_uv_pip_installs_the_dev_dependency_group_as_uv_sync_does() {
    if !crate::helpers::can_build() {
        return;
    }
    let host = WithoutUv::start().await;
    let api = &host.api;
    let (id, slug) = api.create(json!({"name": "Grouped"})).await;
    put_wheels(api, &id, &["devpkg", "docpkg"]).await;
    api.put(&id, "grouped_backend.py", BACKEND).await;
    api.put(
        &id,
        "pyproject.toml",
        format!(
            "[build-system]\nrequires = []\nbuild-backend = \"grouped_backend\"\n\
             backend-path = [\".\"]\n\n\
             [project]\nname = \"grouped\"\nversion = \"0.1.0\"\n\n\
             [dependency-groups]\ndev = [{{include-group = \"test\"}}]\ntest = [{:?}]\n\
             docs = [{:?}]\n",
            wheel_requirement(&slug, "devpkg"),
            wheel_requirement(&slug, "docpkg"),
        ),
    )
    .await;
    let (log, packages) = api.built(&id, 1).await;
    assert!(log.contains("==> uv not found on PATH"), "{log}");
    assert!(
        log.contains("==> installing the project in pyproject.toml: it declares a build system\n"),
        "{log}"
    );
    assert!(
        log.contains(&format!(
            "==> .venv/bin/pip install . {}\n",
            wheel_requirement(&slug, "devpkg")
        )),
        "{log}"
    );
    assert_eq!(packages, ["devpkg==1.0", "grouped==0.1.0"], "{log}");
}

/// One project per `requires-python` form the pins accept, built in turn on `api`.
async fn requires_python_ranges(api: &Api, uv: bool) {
    let (id, slug) = api.create(json!({"name": "Pinned Python"})).await;
    put_wheels(api, &id, &["tinypkg"]).await;
    for (version, range) in [(1, ">=3.9"), (2, "~=3.11"), (3, "==3.11.*")] {
        api.put(
            &id,
            "pyproject.toml",
            format!(
                "[project]\nname = \"pinned\"\nversion = \"0.1.0\"\nrequires-python = {range:?}\n\
                 dependencies = [{:?}]\n",
                wheel_requirement(&slug, "tinypkg")
            ),
        )
        .await;
        let build = api.build(&id, version).await;
        let log = build["log"].as_str().unwrap_or("");
        assert_eq!(
            build["status"], "ready",
            "requires-python {range}, uv {uv}: {}\nlog:\n{log}",
            build["error"]
        );
        assert_eq!(log.contains("==> uv sync\n"), uv, "{range}: {log}");
        assert!(
            build["packages"]
                .as_array()
                .is_some_and(|packages| packages.iter().any(|p| p["name"] == "tinypkg")),
            "{range}: {build}"
        );
        let python = build["toolchains"]
            .as_array()
            .and_then(|toolchains| toolchains.iter().find(|t| t["name"] == "python"))
            .unwrap_or_else(|| panic!("{range}: no python toolchain: {build}"));
        assert!(
            python["version"]
                .as_str()
                .is_some_and(|version| version.starts_with("3.11.")),
            "{range}: {python}"
        );
    }
}

#[tokio::test]
async fn requires_python_ranges_build_with_this_machines_python_with_and_without_uv() {
    if !crate::helpers::can_build() {
        return;
    }
    let server = Server::start_with(&["--builder-network", "false"]).await;
    requires_python_ranges(&Api::of(&server), true).await;
    server.stop().await;
    let without = WithoutUv::start().await;
    requires_python_ranges(&without.api, false).await;
}
