//! Installing: runs a source's manifests ([`crate::manifests`]) in the build sandbox
//! ([`crate::sandbox`]) at the environment's mount path, then compiles Python bytecode, and keeps
//! the installers' output as the build log.
//!
//! The caller materializes the source into a scratch directory, calls [`install`], then
//! [`crate::layer::scan`]s the same directory. Afterwards every file in it is owned by the build
//! uid; the builder (root) can read and delete it. HOME and `/tmp` of the build live in a
//! directory `.plinth-build-*` created beside the scratch directory and removed on return.
//!
//! ## What reaches the installers
//!
//! Each command gets exactly this environment (later entries win):
//!
//! - `PATH=/env/<slug>/.venv/bin:/env/<slug>/node_modules/.bin:<options.path>`,
//!   `HOME=/env/.home`, `TMPDIR=/tmp`, `LANG=C.UTF-8`, `PROJECT_ROOT=/env/<slug>`,
//!   `VIRTUAL_ENV=/env/<slug>/.venv` (when the plan installs Python packages or a `.venv` exists),
//!   `UV_PROJECT_ENVIRONMENT=/env/<slug>/.venv`;
//! - `UV_PYTHON_DOWNLOADS=never`, `UV_PYTHON_PREFERENCE=only-system`: the build uses the
//!   toolchain's Python (a downloaded one would live in the build's HOME, which is discarded);
//! - `UV_LINK_MODE=copy`: the uv cache is on another mount than the venv, where hard links fail;
//! - `PIP_DISABLE_PIP_VERSION_CHECK=1`, `PIP_NO_INPUT=1`, `PIP_PROGRESS_BAR=off`,
//!   `npm_config_fund=false`, `npm_config_audit=false`, `npm_config_update_notifier=false`,
//!   `npm_config_progress=false`: no prompts, no chatter, no calls home beyond the install;
//! - with `options.cache_dir`: `XDG_CACHE_HOME=/env/.cache`, `UV_CACHE_DIR=/env/.cache/uv`,
//!   `PIP_CACHE_DIR=/env/.cache/pip`, `npm_config_cache=/env/.cache/npm`;
//! - then `options.extra_env`, verbatim.
//!
//! Offline installs (tests, air-gapped deployments) go through `extra_env`;
//! [`InstallOptions::offline`] sets them: `UV_OFFLINE=1` + `UV_FIND_LINKS=<dir>` (uv has no
//! environment variable for `--no-index`; offline mode with find-links is the equivalent),
//! `PIP_NO_INDEX=1` + `PIP_FIND_LINKS=<dir>`, `npm_config_offline=true`, and a network namespace
//! of the build's own, so nothing can reach the network whatever a tool decides.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::manifests::{self, Plan, Step, Toolchain};
use crate::output::{CappedLog, Tail};
use crate::sandbox::{self, Sandbox, SandboxError};

/// How much of a failed step's output its error carries.
const ERROR_TAIL_BYTES: usize = 4 * 1024;

/// How a build installs. [`Default`] is a production-shaped starting point.
#[derive(Debug, Clone)]
pub struct InstallOptions {
    /// The unprivileged user and group installers run as; they own the results.
    pub uid: u32,
    pub gid: u32,
    /// The wall-clock limit for each command (each installer, `setup.sh`, the bytecode pass).
    pub step_timeout: Duration,
    /// The build log keeps this many bytes from its start…
    pub log_head_bytes: usize,
    /// …and this many from its end, and says how many it cut between them.
    pub log_tail_bytes: usize,
    /// Host paths the build must not see: the builder's state, other environments, sessions.
    pub hidden_paths: Vec<PathBuf>,
    /// Variables added to (and overriding) the installers' environment.
    pub extra_env: Vec<(String, String)>,
    /// PATH inside the sandbox after the environment's own bins: where uv, python3, node and npm
    /// live. Its directories must be readable and searchable by `uid`.
    pub path: String,
    /// A persistent download cache for uv, pip and npm, mounted at `/env/.cache`. Share one only
    /// between builds of one scope: a build can write anything into it.
    pub cache_dir: Option<PathBuf>,
    /// Run installers without any network (see [`InstallOptions::offline`]).
    pub isolate_network: bool,
    /// The scratch directory already holds `.venv` and `node_modules` reused from an earlier
    /// version with the same manifests and toolchain: keep them, run only `setup.sh`.
    pub reuse_dependencies: bool,
}

impl Default for InstallOptions {
    fn default() -> Self {
        InstallOptions {
            uid: 65534,
            gid: 65534,
            step_timeout: Duration::from_secs(30 * 60),
            log_head_bytes: 256 * 1024,
            log_tail_bytes: 256 * 1024,
            hidden_paths: Vec::new(),
            extra_env: Vec::new(),
            path: "/usr/local/bin:/usr/bin:/bin".to_owned(),
            cache_dir: None,
            isolate_network: false,
            reuse_dependencies: false,
        }
    }
}

impl InstallOptions {
    /// Installs from `find_links` (a directory of wheels and sdists, readable by `uid`) and
    /// npm's cache or local `file:` packages only, with no network at all.
    pub fn offline(mut self, find_links: &Path) -> Self {
        let find_links = find_links.to_string_lossy().into_owned();
        self.extra_env.extend(
            [
                ("UV_OFFLINE", "1"),
                ("UV_FIND_LINKS", find_links.as_str()),
                ("PIP_NO_INDEX", "1"),
                ("PIP_FIND_LINKS", find_links.as_str()),
                ("npm_config_offline", "true"),
            ]
            .map(|(name, value)| (name.to_owned(), value.to_owned())),
        );
        self.isolate_network = true;
        self
    }
}

/// What a successful install ran.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstallReport {
    /// Every command run, as shown in the log (`uv pip install -r requirements.txt`, …).
    pub steps: Vec<String>,
    /// Whether uv was used (false: the Python steps fell back to venv + pip, or there were none).
    pub used_uv: bool,
    /// Bytes of output cut from the middle of the log.
    pub log_bytes_cut: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    #[error("the scratch directory {path}: {source}")]
    Scratch {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("`{tool}` is not on the build's PATH ({path}); install it or fix the builder's path")]
    ToolMissing { tool: String, path: String },
    #[error("`{step}` failed with exit status {status}; its output ended with:\n{tail}")]
    StepFailed {
        step: String,
        status: i32,
        tail: String,
    },
    #[error(
        "`{step}` exceeded its time limit of {limit:?} and was killed; its output ended with:\n{tail}"
    )]
    TimedOut {
        step: String,
        limit: Duration,
        tail: String,
    },
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
}

/// Installs what the source in `scratch` declares, at `/env/<slug>`, in the sandbox, streaming
/// the (capped) build log to `log`. See the module documentation for what runs and how.
pub async fn install(
    scratch: &Path,
    slug: &str,
    options: &InstallOptions,
    log: &mut (dyn FnMut(&[u8]) + Send),
) -> Result<InstallReport, InstallError> {
    sandbox::validate_slug(slug)?;
    sandbox::check_permitted()?;
    let scratch_error = |source| InstallError::Scratch {
        path: scratch.to_owned(),
        source,
    };
    let root = std::fs::canonicalize(scratch).map_err(scratch_error)?;
    let parent = root
        .parent()
        .ok_or_else(|| scratch_error(std::io::Error::other("it has no parent directory")))?
        .to_owned();

    // Removing dependency trees and chowning walk whole trees: keep them off the runtime.
    let prepared = {
        let (root, uid, gid, cache, reuse) = (
            root.clone(),
            options.uid,
            options.gid,
            options.cache_dir.clone(),
            options.reuse_dependencies,
        );
        tokio::task::spawn_blocking(move || {
            prepare(&root, &parent, uid, gid, cache.as_deref(), reuse)
        })
        .await
        .map_err(|join| scratch_error(std::io::Error::other(join.to_string())))?
        .map_err(scratch_error)?
    };
    let sandbox = Sandbox {
        slug: slug.to_owned(),
        root: root.clone(),
        home: prepared.work.path().join("home"),
        tmp: prepared.work.path().join("tmp"),
        cache: options.cache_dir.clone(),
        uid: options.uid,
        gid: options.gid,
        hidden_paths: options.hidden_paths.clone(),
        isolate_network: options.isolate_network,
        timeout: options.step_timeout,
    };

    let mut log = CappedLog::new(log, options.log_head_bytes, options.log_tail_bytes);
    let result = run_steps(&sandbox, &root, &prepared.plan, options, &mut log).await;
    let cut = log.finish();
    // HOME and /tmp go, as root, whatever the build left there (an npm cache can take a while
    // to delete: off the runtime).
    let _ = tokio::task::spawn_blocking(move || drop(prepared)).await;
    result.map(|(steps, used_uv)| InstallReport {
        steps,
        used_uv,
        log_bytes_cut: cut,
    })
}

struct Prepared {
    plan: Plan,
    work: tempfile::TempDir,
}

/// Drops the dependency trees that came with the source, makes the build's HOME and `/tmp`, and
/// hands everything the build may write to its uid.
fn prepare(
    root: &Path,
    parent: &Path,
    uid: u32,
    gid: u32,
    cache: Option<&Path>,
    reuse_dependencies: bool,
) -> std::io::Result<Prepared> {
    if !std::fs::metadata(root)?.is_dir() {
        return Err(std::io::Error::other("not a directory"));
    }
    // A virtualenv made on a laptop does not run here (UHP §1): what the build installs is what
    // a session gets. Only the top level: a nested node_modules is the project's own business.
    // Reused dependencies were installed by an earlier build here, and stay.
    let dropped: &[&str] = if reuse_dependencies {
        &[]
    } else {
        &[".venv", "node_modules"]
    };
    for dependencies in dropped {
        let path = root.join(dependencies);
        match std::fs::symlink_metadata(&path) {
            Ok(metadata) if metadata.is_dir() => std::fs::remove_dir_all(&path)?,
            Ok(_) => std::fs::remove_file(&path)?,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => return Err(error),
        }
    }
    let mut plan = manifests::plan(root);
    if reuse_dependencies {
        plan.steps.retain(|step| *step == Step::SetupScript);
    }
    let work = tempfile::Builder::new()
        .prefix(".plinth-build-")
        .tempdir_in(parent)?;
    for dir in ["home", "tmp"] {
        std::fs::create_dir(work.path().join(dir))?;
    }
    chown_tree(root, uid, gid)?;
    chown_tree(work.path(), uid, gid)?;
    if let Some(cache) = cache {
        std::fs::create_dir_all(cache)?;
        // Only the top: a persistent cache can be large, and builds of one uid fill it.
        std::os::unix::fs::lchown(cache, Some(uid), Some(gid))?;
    }
    Ok(Prepared { plan, work })
}

/// `lchown` on every entry under `root` (and `root`), never following a link.
fn chown_tree(root: &Path, uid: u32, gid: u32) -> std::io::Result<()> {
    let mut pending = vec![root.to_owned()];
    while let Some(path) = pending.pop() {
        let metadata = std::fs::symlink_metadata(&path)?;
        if metadata.uid() != uid || metadata.gid() != gid {
            std::os::unix::fs::lchown(&path, Some(uid), Some(gid))?;
        }
        if metadata.is_dir() {
            for entry in std::fs::read_dir(&path)? {
                pending.push(entry?.path());
            }
        }
    }
    Ok(())
}

/// Runs the plan's commands, then the bytecode pass. Returns the commands run and whether uv was.
async fn run_steps(
    sandbox: &Sandbox,
    root: &Path,
    plan: &Plan,
    options: &InstallOptions,
    log: &mut CappedLog<'_>,
) -> Result<(Vec<String>, bool), InstallError> {
    let uv = find_executable(&options.path, "uv").is_some();
    let used_uv = uv && plan.has_python();
    if plan.has_python() && !uv {
        let lock = if plan.steps.contains(&Step::UvSyncLocked) {
            " (uv.lock is not used)"
        } else {
            ""
        };
        log.write(
            format!("==> uv not found on PATH: falling back to python3 -m venv and pip{lock}\n")
                .as_bytes(),
        );
    }
    // Every installer the plan needs, checked before any runs: a missing npm should not cost
    // a Python install first.
    for step in &plan.steps {
        let toolchain = Toolchain {
            uv,
            venv_exists: false,
        };
        for argv in step.commands(toolchain) {
            let program = &argv[0];
            if !program.contains('/') && find_executable(&options.path, program).is_none() {
                return Err(InstallError::ToolMissing {
                    tool: program.clone(),
                    path: options.path.clone(),
                });
            }
        }
    }
    let mut run = Vec::new();
    for step in &plan.steps {
        let toolchain = Toolchain {
            uv,
            venv_exists: venv_python(root).is_some(),
        };
        for argv in step.commands(toolchain) {
            let python = plan.has_python() || venv_python(root).is_some();
            run_command(sandbox, &argv, environment(sandbox, options, python), log).await?;
            run.push(manifests::display(&argv));
        }
    }
    // Reused dependencies were compiled by the build that installed them.
    if venv_python(root).is_some() && !options.reuse_dependencies {
        let mount = sandbox.mount_path();
        // Bytecode makes imports from a read-only venv ~2.5× faster (PERFORMANCE.md), and a
        // session cannot write it later. `unchecked-hash` pycs are trusted without comparing
        // the source's mtime: materializing a version (hard links from a blob cache) gives
        // every file a new mtime, which would make timestamp pycs stale and recompiled on every
        // import. `-f` rewrites the timestamp pycs pip already made.
        let argv: Vec<String> = [
            format!("{mount}/.venv/bin/python").as_str(),
            "-m",
            "compileall",
            "-q",
            "-f",
            "-j",
            "0",
            "--invalidation-mode",
            "unchecked-hash",
            format!("{mount}/.venv").as_str(),
        ]
        .map(str::to_owned)
        .to_vec();
        match run_command(sandbox, &argv, environment(sandbox, options, true), log).await {
            Ok(()) => {}
            // Packages often ship files that do not compile (templates, other Pythons' code);
            // pip ignores those too. The rest is compiled all the same.
            Err(InstallError::StepFailed { status, .. }) => log.write(
                format!("==> some files did not compile (exit status {status}); continuing\n")
                    .as_bytes(),
            ),
            Err(error) => return Err(error),
        }
        run.push(manifests::display(&argv));
    }
    Ok((run, used_uv))
}

/// Runs one command, logging a `==> command` line and its output; a non-zero exit is an error.
async fn run_command(
    sandbox: &Sandbox,
    argv: &[String],
    env: Vec<(String, String)>,
    log: &mut CappedLog<'_>,
) -> Result<(), InstallError> {
    let shown = manifests::display(argv);
    log.write(format!("==> {shown}\n").as_bytes());
    let mut tail = Tail::new(ERROR_TAIL_BYTES);
    let mut output = |bytes: &[u8]| {
        tail.push(bytes);
        log.write(bytes);
    };
    let status = match sandbox.run(argv, &env, &mut output).await {
        Ok(status) => status,
        Err(SandboxError::TimedOut { limit }) => {
            return Err(InstallError::TimedOut {
                step: shown,
                limit,
                tail: tail.text(),
            });
        }
        Err(error) => return Err(error.into()),
    };
    if status.success() {
        Ok(())
    } else {
        Err(InstallError::StepFailed {
            step: shown,
            status: sandbox::status_code(status),
            tail: tail.text(),
        })
    }
}

/// The installers' environment (see the module documentation), later entries overriding.
fn environment(sandbox: &Sandbox, options: &InstallOptions, python: bool) -> Vec<(String, String)> {
    let mount = sandbox.mount_path();
    let venv = format!("{mount}/.venv");
    let mut env: Vec<(String, String)> = Vec::new();
    let mut set = |name: &str, value: &str| {
        env.retain(|(existing, _)| existing != name);
        env.push((name.to_owned(), value.to_owned()));
    };
    set(
        "PATH",
        &format!("{venv}/bin:{mount}/node_modules/.bin:{}", options.path),
    );
    set("HOME", sandbox::HOME);
    set("TMPDIR", "/tmp");
    set("LANG", "C.UTF-8");
    set("PROJECT_ROOT", &mount);
    if python {
        set("VIRTUAL_ENV", &venv);
    }
    set("UV_PROJECT_ENVIRONMENT", &venv);
    set("UV_PYTHON_DOWNLOADS", "never");
    set("UV_PYTHON_PREFERENCE", "only-system");
    set("UV_LINK_MODE", "copy");
    set("PIP_DISABLE_PIP_VERSION_CHECK", "1");
    set("PIP_NO_INPUT", "1");
    set("PIP_PROGRESS_BAR", "off");
    set("npm_config_fund", "false");
    set("npm_config_audit", "false");
    set("npm_config_update_notifier", "false");
    set("npm_config_progress", "false");
    if sandbox.cache.is_some() {
        let cache = sandbox::CACHE;
        set("XDG_CACHE_HOME", cache);
        set("UV_CACHE_DIR", &format!("{cache}/uv"));
        set("PIP_CACHE_DIR", &format!("{cache}/pip"));
        set("npm_config_cache", &format!("{cache}/npm"));
    }
    for (name, value) in &options.extra_env {
        set(name, value);
    }
    env
}

/// `.venv/bin/python` in the scratch directory, if there is one (a link to the interpreter, so
/// it is looked at, not followed: the target exists only as the sandbox sees it).
fn venv_python(root: &Path) -> Option<PathBuf> {
    let python = root.join(".venv/bin/python");
    std::fs::symlink_metadata(&python).ok().map(|_| python)
}

/// The first executable file `name` in the directories of `path`, as the host sees them (the
/// sandbox sees the same file system, minus the hidden paths).
pub fn find_executable(path: &str, name: &str) -> Option<PathBuf> {
    path.split(':')
        .filter(|dir| !dir.is_empty())
        .map(|dir| Path::new(dir).join(name))
        .find(|candidate| {
            std::fs::metadata(candidate)
                .is_ok_and(|metadata| metadata.is_file() && metadata.mode() & 0o111 != 0)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sandbox() -> Sandbox {
        Sandbox {
            slug: "demo".to_owned(),
            root: PathBuf::from("/scratch"),
            home: PathBuf::from("/work/home"),
            tmp: PathBuf::from("/work/tmp"),
            cache: Some(PathBuf::from("/cache")),
            uid: 65534,
            gid: 65534,
            hidden_paths: Vec::new(),
            isolate_network: false,
            timeout: Duration::from_secs(1),
        }
    }

    #[test]
    fn the_environment_is_explicit_and_extra_env_wins() {
        let options = InstallOptions {
            path: "/tools:/usr/bin".to_owned(),
            extra_env: vec![("npm_config_audit".to_owned(), "true".to_owned())],
            ..InstallOptions::default()
        }
        .offline(Path::new("/wheels"));
        let env = environment(&sandbox(), &options, true);
        let get = |name: &str| {
            env.iter()
                .find(|(existing, _)| existing == name)
                .map(|(_, value)| value.as_str())
        };
        assert_eq!(
            get("PATH"),
            Some("/env/demo/.venv/bin:/env/demo/node_modules/.bin:/tools:/usr/bin")
        );
        assert_eq!(get("HOME"), Some("/env/.home"));
        assert_eq!(get("VIRTUAL_ENV"), Some("/env/demo/.venv"));
        assert_eq!(get("UV_CACHE_DIR"), Some("/env/.cache/uv"));
        assert_eq!(get("npm_config_audit"), Some("true"));
        assert_eq!(get("PIP_FIND_LINKS"), Some("/wheels"));
        assert_eq!(
            env.iter()
                .filter(|(name, _)| name == "npm_config_audit")
                .count(),
            1
        );
        assert!(options.isolate_network);
        assert!(
            environment(&sandbox(), &options, false)
                .iter()
                .all(|(name, _)| name != "VIRTUAL_ENV")
        );
    }

    #[test]
    fn executables_are_found_on_a_path() {
        assert!(find_executable("/nonexistent:/bin:/usr/bin", "sh").is_some());
        assert!(find_executable("/nonexistent", "sh").is_none());
        assert!(find_executable("", "sh").is_none());
    }
}
