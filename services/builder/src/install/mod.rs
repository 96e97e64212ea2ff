//! Installing: runs a source's manifests ([`crate::manifests`]) in the build sandbox
//! ([`crate::sandbox`]) at the environment's mount path, makes sure the venv's Python files have
//! bytecode, and keeps the installers' output as the build log.
//!
//! The caller materializes the source into a scratch directory, calls [`install`], then
//! [`crate::layer::scan`]s the same directory. Afterwards every file in it is owned by the build
//! uid; the builder (root) can read and delete it. HOME and `/tmp` of the build live in a
//! directory `.plinth-build-*` created beside the scratch directory and removed on return. The
//! download cache is never part of the layer. This file holds the entry point, its types and the
//! steps' loop; `cache`, `bytecode`, `environment` and `network` beside it hold the rest.
//!
//! The download cache, bytecode, the installers' exact environment and the network:
//! `docs/design/builds.md#installing`.

mod bytecode;
mod cache;
mod environment;
mod network;

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use plinth_sandbox::cgroup::Cgroups;
use plinth_sandbox::egress::EgressPolicy;

use self::bytecode::{BYTECODE_LIST, uncompiled, write_list};
use self::cache::{BuildCache, linked_files, npm_debug_log};
use self::environment::environment;
use self::network::Egress;
use crate::limits::{BuildCgroup, BuildLimits, Hit};
use crate::manifests::{self, Plan, PythonInstall, Step, Toolchain};
use crate::output::{CappedLog, Tail};
use crate::registries::{self, Registries};
use crate::sandbox::{self, Network, Sandbox, SandboxError};

/// How much of a failed step's output its error carries.
const ERROR_TAIL_BYTES: usize = 4 * 1024;

/// The reserved name of the build's download cache in the scratch directory, for as long as the
/// installers run (see the module documentation). A source's own top-level entry of this name is
/// removed before installing.
pub const BUILD_CACHE: &str = ".plinth-build-cache";

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
    /// live. Its directories must be readable and searchable by `uid`; those outside the system
    /// directories (the tools directory) are shown to builds read-only.
    pub path: String,
    /// Further host directories builds see read-only at their own path (find-links, local
    /// packages). Nothing of the host but the system directories and these is shown.
    pub read_only_paths: Vec<PathBuf>,
    /// Where the download cache of uv, pip and npm persists between builds (without it, each
    /// build starts from an empty cache). It must be on the scratch directory's file system: it
    /// is renamed into the scratch directory for the build. Share one only between builds of
    /// one scope: a build can write anything into it.
    pub cache_dir: Option<PathBuf>,
    /// What installers reach (see the module documentation).
    pub network: BuildNetwork,
    /// How installers reach registries: certificate authority, proxies, indexes.
    pub registries: Registries,
    /// The build's bounds ([`crate::limits`]): memory, processes and CPU need `cgroups`; the
    /// wall time holds for all of the build's commands together.
    pub limits: BuildLimits,
    /// Where builds' cgroups are made; without it, builds have no memory, process or CPU
    /// bounds.
    pub cgroups: Option<Arc<Cgroups>>,
    /// The scratch directory already holds `.venv` and `node_modules` reused from an earlier
    /// version with the same reuse key: keep them and run every step over them (see
    /// [`manifests::Toolchain::reused`]), so the version holds what a fresh build's would.
    pub reuse_dependencies: bool,
    /// The environment's `install.python`: the Python manifest to install, instead of the
    /// one chosen from the manifests found ([`manifests::plan`]).
    pub python: Option<PythonInstall>,
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
            read_only_paths: Vec::new(),
            cache_dir: None,
            network: BuildNetwork::None,
            registries: Registries::default(),
            limits: BuildLimits::default(),
            cgroups: None,
            reuse_dependencies: false,
            python: None,
        }
    }
}

impl InstallOptions {
    /// Installs from `find_links` (a directory of wheels and sdists, readable by `uid`, shown
    /// to the build read-only) and npm's cache or local `file:` packages only, with no network
    /// at all.
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
        self.read_only_paths.push(PathBuf::from(find_links));
        self.network = BuildNetwork::None;
        self
    }
}

/// What a build's installers reach (see the module documentation).
#[derive(Debug, Clone, Default)]
pub enum BuildNetwork {
    /// Nothing: each command gets a network namespace holding only its loopback.
    #[default]
    None,
    /// What this policy lets through, by the egress proxy in the build's own network namespace.
    Egress(Arc<EgressPolicy>),
    /// The host's network, unfiltered.
    Host,
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
    /// A step after uv's wrote in place to a file uv had hard-linked from the download cache, so
    /// the cache was dropped instead of kept. Anything else that shares files with that cache
    /// (dependency trees kept from earlier builds of the scope) may hold the change too.
    pub cache_discarded: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    #[error("the scratch directory {path}: {source}")]
    Scratch {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// What the manifests, or the environment's `install.python`, ask for cannot be installed
    /// (a file it names is missing, a dependency group is not defined).
    #[error("{0}")]
    Manifests(manifests::PlanError),
    #[error("`{tool}` is not on the build's PATH ({path}); install it or fix the builder's path")]
    ToolMissing { tool: String, path: String },
    #[error("`{step}` failed with exit status {status}; its output ended with:\n{tail}{hint}")]
    StepFailed {
        step: String,
        status: i32,
        tail: String,
        /// A line naming the setting to look at when the output shows a certificate, proxy or
        /// network failure (with its leading newline), else empty.
        hint: String,
    },
    #[error(
        "`{step}` exceeded its time limit of {limit:?} and was killed; its output ended with:\n{tail}"
    )]
    TimedOut {
        step: String,
        limit: Duration,
        tail: String,
    },
    #[error("`{step}` failed: {reason}; its output ended with:\n{tail}")]
    OverLimit {
        step: String,
        /// Which bound, and the setting that sets it.
        reason: String,
        tail: String,
    },
    #[error("giving the build its network (its namespace and egress proxy): {0}")]
    Network(std::io::Error),
    #[error("bounding the build: {0}")]
    Limits(crate::limits::LimitsError),
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

    // What to install, decided before anything changes (an error here leaves the source and
    // the download cache as they were).
    let plan = {
        let (root, python) = (root.clone(), options.python.clone());
        tokio::task::spawn_blocking(move || manifests::plan(&root, python.as_ref()))
            .await
            .map_err(|join| scratch_error(std::io::Error::other(join.to_string())))?
            .map_err(InstallError::Manifests)?
    };
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
            prepare(&root, &parent, plan, uid, gid, cache.as_deref(), reuse)
        })
        .await
        .map_err(|join| scratch_error(std::io::Error::other(join.to_string())))?
        .map_err(scratch_error)?
    };
    // The egress proxy lives as long as this call: dropping `_egress` stops it.
    let (network, _egress) = match &options.network {
        BuildNetwork::None => (Network::None, None),
        BuildNetwork::Host => (Network::Host, None),
        BuildNetwork::Egress(policy) => {
            // With an upstream proxy for the host, the egress proxy reaches what it permits
            // through it.
            let upstream = options
                .registries
                .https_proxy
                .as_deref()
                .or(options.registries.http_proxy.as_deref())
                .map(network::Upstream::parse)
                .transpose()
                .map_err(|why| InstallError::Network(std::io::Error::other(why)))?
                .map(Arc::new);
            let egress = Egress::start(policy.clone(), upstream, format!("build of {slug}"))
                .await
                .map_err(InstallError::Network)?;
            (Network::Join(egress.netns.clone()), Some(egress))
        }
    };
    let cgroup = match (&options.cgroups, options.limits.cgroup_limits()) {
        (Some(cgroups), Some(limits)) => Some(
            BuildCgroup::create(cgroups.clone(), limits)
                .await
                .map_err(InstallError::Limits)?,
        ),
        _ => None,
    };
    let bounds = Bounds {
        cgroup: cgroup.as_ref(),
        limits: &options.limits,
        deadline: options
            .limits
            .wall
            .map(|wall| tokio::time::Instant::now() + wall),
    };
    let sandbox = Sandbox {
        slug: slug.to_owned(),
        root: root.clone(),
        home: prepared.work.path().join("home"),
        tmp: prepared.work.path().join("tmp"),
        shown: sandbox::shown_directories(&options.path, &options.read_only_paths),
        uid: options.uid,
        gid: options.gid,
        hidden_paths: options.hidden_paths.clone(),
        network,
        timeout: options.step_timeout,
        cgroup: cgroup.as_ref().map(|cgroup| cgroup.group.clone()),
    };

    let mut log = CappedLog::new(log, options.log_head_bytes, options.log_tail_bytes);
    if options.cache_dir.is_some() {
        log.write(if prepared.cache.reused {
            "==> download cache: this scope's, from its earlier builds on this builder\n".as_bytes()
        } else {
            "==> download cache: empty (no earlier build of this scope on this builder left \
             one, or another of its builds holds it now)\n"
                .as_bytes()
        });
    }
    let result = run_steps(&sandbox, &bounds, &root, &prepared.plan, options, &mut log).await;
    // Nothing of the build outlives it: what is left in its group is killed, the group goes.
    drop(sandbox);
    if let Some(cgroup) = cgroup {
        cgroup.finish().await;
    }
    if let Err(
        InstallError::StepFailed { step, .. }
        | InstallError::TimedOut { step, .. }
        | InstallError::OverLimit { step, .. },
    ) = &result
        && step.starts_with("npm ")
    {
        // The error points at npm's debug log, which lives in the download cache: the log
        // keeps its end, since the cache is out of the owner's reach.
        npm_debug_log(&root, &mut log);
    }
    let discard = result.as_ref().is_ok_and(|ran| ran.cache_changed);
    if discard {
        log.write(
            b"==> a step after uv's changed files uv had hard-linked from the download cache: \
              the cache is discarded, not kept for later builds\n",
        );
    }
    let cut = log.finish();
    // The cache leaves the scratch directory before anyone scans it; HOME and /tmp go, as
    // root, whatever the build left there (an npm cache can take a while to delete: off the
    // runtime).
    let Prepared {
        work, mut cache, ..
    } = prepared;
    let returned = tokio::task::spawn_blocking(move || {
        let returned = cache.give_back(discard);
        drop(work);
        returned
    })
    .await
    .map_err(|join| std::io::Error::other(join.to_string()))
    .and_then(|returned| returned);
    let ran = result?;
    returned.map_err(scratch_error)?;
    Ok(InstallReport {
        steps: ran.steps,
        used_uv: ran.used_uv,
        log_bytes_cut: cut,
        cache_discarded: discard,
    })
}

struct Prepared {
    plan: Plan,
    work: tempfile::TempDir,
    cache: BuildCache,
}

/// Drops the dependency trees (and any [`BUILD_CACHE`]) that came with the source, makes the
/// build's HOME and `/tmp`, hands everything the build may write to its uid, and moves the
/// download cache in.
fn prepare(
    root: &Path,
    parent: &Path,
    plan: Plan,
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
        &[BUILD_CACHE]
    } else {
        &[BUILD_CACHE, ".venv", "node_modules"]
    };
    for name in dropped {
        remove_any(&root.join(name))?;
    }
    let work = tempfile::Builder::new()
        .prefix(".plinth-build-")
        .tempdir_in(parent)?;
    for dir in ["home", "tmp"] {
        std::fs::create_dir(work.path().join(dir))?;
    }
    chown_tree(root, uid, gid)?;
    chown_tree(work.path(), uid, gid)?;
    // After the chown: a persistent cache can be large, and builds of one uid fill it.
    let cache = BuildCache::lend(root, cache, uid, gid)?;
    Ok(Prepared { plan, work, cache })
}

/// Removes a file, link or directory tree if there is one, never following a link.
fn remove_any(path: &Path) -> std::io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(metadata) if metadata.is_dir() => std::fs::remove_dir_all(path),
        Ok(_) => std::fs::remove_file(path),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(error) => Err(error),
    }
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

/// What [`run_steps`] did.
struct Ran {
    /// The commands run, as shown in the log.
    steps: Vec<String>,
    used_uv: bool,
    /// A step after uv's changed a file that shares its inode with the download cache.
    cache_changed: bool,
}

/// Runs the plan's commands, then the bytecode pass.
async fn run_steps(
    sandbox: &Sandbox,
    bounds: &Bounds<'_>,
    root: &Path,
    plan: &Plan,
    options: &InstallOptions,
    log: &mut CappedLog<'_>,
) -> Result<Ran, InstallError> {
    let uv = find_executable(&options.path, "uv").is_some();
    let used_uv = uv && plan.has_python();
    if let Some(why) = &plan.python {
        log.write(format!("==> {why}\n").as_bytes());
    }
    if plan.has_python() && !uv {
        let lock = if plan.locked() {
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
            reused: None,
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
    // Files of `.venv` hard-linked with the cache, as they were before the first step that is
    // not uv's (npm's lifecycle scripts, `setup.sh`) ran: that step must not change them.
    let mut linked: Option<HashMap<(u64, u64), (i64, i64)>> = None;
    // Over reused dependencies, `npm ci` (which would delete them) gives way to the root
    // package's own lifecycle scripts, which is what it runs after installing.
    let lifecycle = if options.reuse_dependencies {
        Some(blocking(root, |root| Ok(manifests::npm_lifecycle(root))).await?)
    } else {
        None
    };
    for step in &plan.steps {
        if !step.is_python() && linked.is_none() && venv_python(root).is_some() {
            linked = Some(blocking(root, |root| Ok(linked_files(root))).await?);
        }
        let toolchain = Toolchain {
            uv,
            venv_exists: venv_python(root).is_some(),
            reused: lifecycle.as_deref(),
        };
        for argv in step.commands(toolchain) {
            let python = plan.has_python() || venv_python(root).is_some();
            run_command(
                sandbox,
                bounds,
                &argv,
                environment(sandbox, options, python),
                &options.registries,
                log,
            )
            .await?;
            run.push(manifests::display(&argv));
        }
    }
    let cache_changed = match linked {
        Some(before) => {
            blocking(root, move |root| {
                let after = linked_files(root);
                Ok(before
                    .iter()
                    .any(|(inode, changed)| after.get(inode).is_some_and(|now| now != changed)))
            })
            .await?
        }
        None => false,
    };

    // uv compiled what it installed, and reused dependencies were compiled by the build that
    // installed them (see the module documentation).
    let setup_ran = plan.steps.contains(&Step::SetupScript);
    if venv_python(root).is_some() && (!used_uv || setup_ran) {
        let mount = sandbox.mount_path();
        let compile = |rest: &[&str]| -> Vec<String> {
            [
                format!("{mount}/.venv/bin/python").as_str(),
                "-m",
                "compileall",
                "-q",
                "-f",
            ]
            .iter()
            .chain(rest)
            .map(|word| (*word).to_owned())
            .collect()
        };
        let argv = if used_uv || options.reuse_dependencies {
            // Only what `setup.sh` (or pip over a reused venv) added (or compiled otherwise), listed in the build's /tmp
            // (a command line could not hold a long list).
            let uncompiled = blocking(root, |root| Ok(uncompiled(root))).await?;
            if uncompiled.is_empty() {
                None
            } else {
                let list = sandbox.tmp.join(BYTECODE_LIST);
                write_list(&list, &uncompiled).map_err(|source| InstallError::Scratch {
                    path: list.clone(),
                    source,
                })?;
                let list = format!("/tmp/{BYTECODE_LIST}");
                Some(compile(&[
                    "--invalidation-mode",
                    "checked-hash",
                    "-i",
                    &list,
                ]))
            }
        } else {
            let venv = format!("{mount}/.venv");
            Some(compile(&[
                "-j",
                "0",
                "--invalidation-mode",
                "checked-hash",
                &venv,
            ]))
        };
        if let Some(argv) = argv {
            match run_command(
                sandbox,
                bounds,
                &argv,
                environment(sandbox, options, true),
                &options.registries,
                log,
            )
            .await
            {
                Ok(()) => {}
                // Packages often ship files that do not compile (templates, other Pythons'
                // code); pip and uv ignore those too. The rest is compiled all the same.
                Err(InstallError::StepFailed { status, .. }) => log.write(
                    format!("==> some files did not compile (exit status {status}); continuing\n")
                        .as_bytes(),
                ),
                Err(error) => return Err(error),
            }
            run.push(manifests::display(&argv));
        }
    }
    Ok(Ran {
        steps: run,
        used_uv,
        cache_changed,
    })
}

/// Runs `work` on the scratch directory off the runtime (it walks trees).
async fn blocking<T: Send + 'static>(
    root: &Path,
    work: impl FnOnce(&Path) -> std::io::Result<T> + Send + 'static,
) -> Result<T, InstallError> {
    let owned = root.to_owned();
    tokio::task::spawn_blocking(move || work(&owned))
        .await
        .map_err(|join| std::io::Error::other(join.to_string()))
        .and_then(|done| done)
        .map_err(|source| InstallError::Scratch {
            path: root.to_owned(),
            source,
        })
}

/// What bounds a build's commands: its cgroup's limits and the build's deadline.
struct Bounds<'a> {
    cgroup: Option<&'a BuildCgroup>,
    limits: &'a BuildLimits,
    deadline: Option<tokio::time::Instant>,
}

/// Runs one command, logging a `==> command` line and its output; a non-zero exit is an error,
/// and so is a command that ran into one of the build's bounds (named in the error and the
/// log).
async fn run_command(
    sandbox: &Sandbox,
    bounds: &Bounds<'_>,
    argv: &[String],
    env: Vec<(String, String)>,
    registries: &Registries,
    log: &mut CappedLog<'_>,
) -> Result<(), InstallError> {
    let shown = manifests::display(argv);
    log.write(format!("==> {shown}\n").as_bytes());
    // The command may run for what is left of the build's time, if that is less than a step's.
    let mut sandbox = std::borrow::Cow::Borrowed(sandbox);
    let mut wall_bound = false;
    if let Some(deadline) = bounds.deadline {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if left <= sandbox.timeout {
            wall_bound = true;
            sandbox.to_mut().timeout = left.max(Duration::from_millis(1));
        }
    }
    let mut tail = Tail::new(ERROR_TAIL_BYTES);
    let mut output = |bytes: &[u8]| {
        tail.push(bytes);
        log.write(bytes);
    };
    let ran = sandbox.run(argv, &env, &mut output).await;
    let over = |reason: String, log: &mut CappedLog<'_>, tail: &mut Tail| {
        log.write(format!("==> {reason}\n").as_bytes());
        InstallError::OverLimit {
            step: shown.clone(),
            reason,
            tail: tail.text(),
        }
    };
    let failed = !matches!(&ran, Ok(status) if status.success());
    if let Some(cgroup) = bounds.cgroup {
        match cgroup.hit(failed) {
            Some(Hit::Memory) => return Err(over(bounds.limits.memory_reason(), log, &mut tail)),
            Some(Hit::Pids) => return Err(over(bounds.limits.pids_reason(), log, &mut tail)),
            None => {}
        }
    }
    if failed && bounds.limits.disk_mb.is_some() && disk_full(&sandbox.root, &mut tail) {
        return Err(over(bounds.limits.disk_reason(), log, &mut tail));
    }
    let status = match ran {
        Ok(status) => status,
        Err(SandboxError::TimedOut { .. }) if wall_bound => {
            return Err(over(bounds.limits.wall_reason(), log, &mut tail));
        }
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
        let tail = tail.text();
        let hint = registries::hint(registries, &sandbox.network, &tail)
            .map(|hint| {
                log.write(format!("==> {hint}\n").as_bytes());
                format!("\n{hint}")
            })
            .unwrap_or_default();
        Err(InstallError::StepFailed {
            step: shown,
            status: sandbox::status_code(status),
            tail,
            hint,
        })
    }
}

/// Whether a failed command ran out of the build's disk: its output says `ENOSPC`, or the file
/// system of the scratch directory (the build's image, which also holds its HOME and `/tmp`)
/// has no block left for the build's uid.
fn disk_full(root: &Path, tail: &mut Tail) -> bool {
    if tail.text().contains("No space left on device") {
        return true;
    }
    rustix::fs::statvfs(root).is_ok_and(|fs| fs.f_bavail == 0 || fs.f_favail == 0)
}

/// `.venv/bin/python` in the scratch directory, if there is one (a link to the interpreter, so
/// it is looked at, not followed: the target exists only as the sandbox sees it; nor is any
/// link on the way to it).
fn venv_python(root: &Path) -> Option<PathBuf> {
    let fd = crate::beneath::open_root(root).ok()?;
    crate::beneath::lstat(&fd, ".venv/bin/python")
        .ok()
        .flatten()
        .map(|_| root.join(".venv/bin/python"))
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

    #[test]
    fn executables_are_found_on_a_path() {
        assert!(find_executable("/nonexistent:/bin:/usr/bin", "sh").is_some());
        assert!(find_executable("/nonexistent", "sh").is_none());
        assert!(find_executable("", "sh").is_none());
    }
}
