//! Installing: runs a source's manifests ([`crate::manifests`]) in the build sandbox
//! ([`crate::sandbox`]) at the environment's mount path, makes sure the venv's Python files have
//! bytecode, and keeps the installers' output as the build log.
//!
//! The caller materializes the source into a scratch directory, calls [`install`], then
//! [`crate::layer::scan`]s the same directory. Afterwards every file in it is owned by the build
//! uid; the builder (root) can read and delete it. HOME and `/tmp` of the build live in a
//! directory `.plinth-build-*` created beside the scratch directory and removed on return.
//!
//! ## The download cache
//!
//! uv, pip and npm keep their downloads in the build's cache, which sits in the scratch
//! directory under the reserved name [`BUILD_CACHE`] (`/env/<slug>/.plinth-build-cache`) while
//! the installers run: on the same mount as `.venv`, so uv hard-links installed files from it
//! instead of copying them. With [`InstallOptions::cache_dir`] the cache persists: it is renamed
//! into the scratch directory before the first command and renamed back after the last, whether
//! the build succeeded, failed or timed out, so it is never part of the layer. A source's own
//! top-level `.plinth-build-cache` is removed first, as `.venv` and `node_modules` are. While one
//! build holds the cache, a concurrent build of the same scope starts from an empty one; the
//! first to finish puts its cache back and the other's is dropped.
//!
//! Hard links mean a file installed by uv and the cache's copy are one file: a later step that
//! writes one *in place* (an npm lifecycle script, `setup.sh` appending to an installed module)
//! changes the other too. Such a build's cache is discarded rather than put back
//! ([`InstallReport::cache_discarded`]), so no later build installs the changed file.
//!
//! ## Bytecode
//!
//! A read-only environment cannot hold a `__pycache__` written at import time, so every `.py`
//! under `.venv` gets a checked-hash `.pyc`: valid whatever the files' modification times when a
//! version is materialized (hard links from a blob cache give them new ones), checked against
//! the source at import, and written with `SOURCE_DATE_EPOCH` set (which makes hash-based pycs
//! Python's default: uv, pip and `py_compile` all follow it). uv compiles site-packages itself
//! as it installs (`UV_COMPILE_BYTECODE=1`, in parallel). After the installers:
//!
//! - uv installed the Python packages and no `setup.sh` ran: nothing more to do;
//! - uv installed them and `setup.sh` ran: `compileall` of just the `.py` files under `.venv`
//!   that lack a checked-hash `.pyc` (compileall's own up-to-date check understands only
//!   timestamp pycs and would recompile everything);
//! - otherwise (pip, or a `.venv` made by `setup.sh`): `compileall -f` of all of `.venv`;
//! - dependencies reused from an earlier build: nothing (that build compiled them).
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
//! - `UV_COMPILE_BYTECODE=1`, `SOURCE_DATE_EPOCH=315532800` (1980-01-01, the earliest time a
//!   wheel's zip can record): bytecode as described above; `PYTHONDONTWRITEBYTECODE=1`: no
//!   timestamp `.pyc` from an import during the install lands in the tree (the bytecode
//!   passes compile explicitly, which it does not stop);
//! - `PIP_DISABLE_PIP_VERSION_CHECK=1`, `PIP_NO_INPUT=1`, `PIP_PROGRESS_BAR=off`,
//!   `npm_config_fund=false`, `npm_config_audit=false`, `npm_config_update_notifier=false`,
//!   `npm_config_progress=false`: no prompts, no chatter, no calls home beyond the install;
//! - `XDG_CACHE_HOME=/env/<slug>/.plinth-build-cache`, and `UV_CACHE_DIR`, `PIP_CACHE_DIR`,
//!   `npm_config_cache` its `uv`, `pip` and `npm` subdirectories;
//! - the registry settings (`options.registries`: certificate authority, proxies, indexes) under
//!   each installer's names ([`mod@crate::registries`]);
//! - with [`BuildNetwork::Egress`], the egress proxy ([`plinth_sandbox::egress::proxy_env`]:
//!   `HTTP_PROXY`, `HTTPS_PROXY`, `ALL_PROXY` in both cases, `NO_PROXY` for loopback only, npm's
//!   and Yarn's own names) at `http://127.0.0.1:3128`;
//! - then `options.extra_env`, verbatim.
//!
//! ## The network
//!
//! [`InstallOptions::network`] says what a build reaches:
//!
//! - [`BuildNetwork::None`]: nothing. Each command gets a network namespace of its own with
//!   only its loopback.
//! - [`BuildNetwork::Egress`]: what the policy given lets through, by the filtering proxy
//!   sessions get ([`plinth_sandbox::egress`]; `plinth serve` gives builds the sessions'
//!   policy plus the package registries by name). For each build the builder makes a network
//!   namespace that holds nothing but a loopback, listens in it on `127.0.0.1:3128` and serves
//!   that socket from its own network: every destination is resolved by the builder and
//!   checked before it is dialled, so loopback, private, link-local and metadata addresses and
//!   the node's own are refused unless the policy allows them. Every command of the build
//!   enters that namespace; when the build ends, the proxy stops and the namespace goes. There
//!   is no DNS and no route inside: a tool that ignores the proxy variables reaches nothing.
//! - [`BuildNetwork::Host`]: the host's network, unfiltered (for an upstream proxy, which the
//!   egress proxy cannot chain to).
//!
//! Offline installs (tests, air-gapped deployments) go through `extra_env`;
//! [`InstallOptions::offline`] sets them: `UV_OFFLINE=1` + `UV_FIND_LINKS=<dir>` (uv has no
//! environment variable for `--no-index`; offline mode with find-links is the equivalent),
//! `PIP_NO_INDEX=1` + `PIP_FIND_LINKS=<dir>`, `npm_config_offline=true`, the find-links
//! directory shown to the build read-only, and no network, so nothing can reach the network
//! whatever a tool decides.

use std::collections::HashMap;
use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use plinth_sandbox::egress::{DEFAULT_PROXY_ADDR, EgressPolicy};
use tokio_util::sync::{CancellationToken, DropGuard};
use tracing::Instrument;

use crate::manifests::{self, Plan, Step, Toolchain};
use crate::output::{CappedLog, Tail};
use crate::registries::{self, Registries};
use crate::sandbox::{self, Network, Sandbox, SandboxError};

/// How much of a failed step's output its error carries.
const ERROR_TAIL_BYTES: usize = 4 * 1024;

/// The reserved name of the build's download cache in the scratch directory, for as long as the
/// installers run (see the module documentation). A source's own top-level entry of this name is
/// removed before installing.
pub const BUILD_CACHE: &str = ".plinth-build-cache";

/// `SOURCE_DATE_EPOCH` for the installers: 1980-01-01T00:00:00Z, the earliest time a zip (and so
/// a wheel built during the install) can hold.
const SOURCE_DATE_EPOCH: &str = "315532800";

/// The flags word of a checked-hash `.pyc` (PEP 552): hash-based (bit 0) and checked (bit 1).
const CHECKED_HASH_PYC: u32 = 0b11;

/// The list of files the bytecode pass compiles, in the build's `/tmp`.
const BYTECODE_LIST: &str = ".plinth-uncompiled";

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
    /// The scratch directory already holds `.venv` and `node_modules` reused from an earlier
    /// version with the same reuse key: keep them and run every step over them (see
    /// [`manifests::Toolchain::reused`]), so the version holds what a fresh build's would.
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
            read_only_paths: Vec::new(),
            cache_dir: None,
            network: BuildNetwork::None,
            registries: Registries::default(),
            reuse_dependencies: false,
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
    #[error("giving the build its network (its namespace and egress proxy): {0}")]
    Network(std::io::Error),
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
    // The egress proxy lives as long as this call: dropping `_egress` stops it.
    let (network, _egress) = match &options.network {
        BuildNetwork::None => (Network::None, None),
        BuildNetwork::Host => (Network::Host, None),
        BuildNetwork::Egress(policy) => {
            let egress = Egress::start(policy.clone(), format!("build of {slug}"))
                .await
                .map_err(InstallError::Network)?;
            (Network::Join(egress.netns.clone()), Some(egress))
        }
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
    };

    let mut log = CappedLog::new(log, options.log_head_bytes, options.log_tail_bytes);
    let result = run_steps(&sandbox, &root, &prepared.plan, options, &mut log).await;
    if let Err(InstallError::StepFailed { step, .. } | InstallError::TimedOut { step, .. }) =
        &result
        && step.starts_with("npm ")
    {
        // The error points at npm's debug log, which lives in the download cache: the log
        // keeps its end, since the cache is out of the owner's reach.
        npm_debug_log(&prepared.cache.inside, &mut log);
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

/// A build's network namespace and the egress proxy serving the socket in it, for as long as
/// the build runs.
struct Egress {
    netns: Arc<OwnedFd>,
    /// Stops the proxy when the build is over (or abandoned).
    _stop: DropGuard,
}

impl Egress {
    async fn start(policy: Arc<EgressPolicy>, label: String) -> std::io::Result<Egress> {
        // Two short-lived threads (one makes the namespace, one listens in it): off the
        // runtime.
        let (netns, listener) = tokio::task::spawn_blocking(|| {
            let netns = plinth_sandbox::egress::new_namespace()?;
            let listener = plinth_sandbox::egress::listen_in(netns.as_fd(), DEFAULT_PROXY_ADDR)?;
            listener.set_nonblocking(true)?;
            std::io::Result::Ok((netns, listener))
        })
        .await
        .map_err(|join| std::io::Error::other(join.to_string()))??;
        let listener = tokio::net::TcpListener::from_std(listener)?;
        let stop = CancellationToken::new();
        let serving = stop.clone();
        plinth_kit::tasks::spawn(
            async move {
                plinth_sandbox::egress::serve(
                    listener,
                    policy,
                    Arc::new(plinth_sandbox::egress::SystemResolver),
                    &label,
                    serving,
                )
                .await;
            }
            .instrument(tracing::Span::current()),
        );
        Ok(Egress {
            netns: Arc::new(netns),
            _stop: stop.drop_guard(),
        })
    }
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
    let plan = manifests::plan(root);
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

/// How much of npm's debug log a failed build's log keeps.
const NPM_DEBUG_LOG_BYTES: u64 = 16 * 1024;

/// Writes the end of npm's newest debug log (in the download cache `cache`) to the build log.
fn npm_debug_log(cache: &Path, log: &mut CappedLog<'_>) {
    let logs = cache.join("npm").join("_logs");
    let newest = std::fs::read_dir(&logs).ok().and_then(|entries| {
        entries
            .flatten()
            .filter(|entry| entry.file_type().is_ok_and(|kind| kind.is_file()))
            .max_by_key(|entry| entry.metadata().and_then(|m| m.modified()).ok())
    });
    let Some(newest) = newest else {
        return;
    };
    let Ok(mut file) = std::fs::File::open(newest.path()) else {
        return;
    };
    let length = file.metadata().map(|m| m.len()).unwrap_or(0);
    let skip = length.saturating_sub(NPM_DEBUG_LOG_BYTES);
    let mut tail = Vec::new();
    if std::io::Seek::seek(&mut file, std::io::SeekFrom::Start(skip)).is_err()
        || file
            .take(NPM_DEBUG_LOG_BYTES)
            .read_to_end(&mut tail)
            .is_err()
    {
        return;
    }
    log.write(
        format!(
            "==> npm's debug log ({}), {}:\n",
            newest.file_name().to_string_lossy(),
            if skip > 0 { "its end" } else { "whole" }
        )
        .as_bytes(),
    );
    log.write(&tail);
    if !tail.ends_with(b"\n") {
        log.write(b"\n");
    }
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

/// The build's download cache, at [`BUILD_CACHE`] in the scratch directory while the build runs.
struct BuildCache {
    /// Its path in the scratch directory.
    inside: PathBuf,
    /// Where it persists between builds, if anywhere.
    home: Option<PathBuf>,
    /// It has left the scratch directory.
    gone: bool,
}

impl BuildCache {
    /// Moves the persistent cache at `home` into the scratch directory `root` (a rename: both
    /// are on one file system), or makes an empty one there when there is none to move (no
    /// `home`, the first build of a scope, or another build of the scope holds it now).
    fn lend(root: &Path, home: Option<&Path>, uid: u32, gid: u32) -> std::io::Result<BuildCache> {
        let inside = root.join(BUILD_CACHE);
        let mut moved = false;
        if let Some(home) = home {
            if let Some(parent) = home.parent() {
                std::fs::create_dir_all(parent)?;
            }
            match std::fs::rename(home, &inside) {
                Ok(()) => moved = true,
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
                Err(error) if error.kind() == std::io::ErrorKind::CrossesDevices => {
                    tracing::warn!(cache = %home.display(), "the download cache is on another file system than the build's scratch directory; builds start from an empty cache");
                }
                Err(error) => return Err(error),
            }
        }
        if moved && !std::fs::symlink_metadata(&inside)?.is_dir() {
            // Only builder code writes there, and only directories; anything else is no cache.
            std::fs::remove_file(&inside)?;
            moved = false;
        }
        if !moved {
            std::fs::create_dir(&inside)?;
        }
        // Only the top: a persistent cache can be large, and builds of one uid fill it.
        std::os::unix::fs::lchown(&inside, Some(uid), Some(gid))?;
        Ok(BuildCache {
            inside,
            home: home.map(Path::to_owned),
            gone: false,
        })
    }

    /// Takes the cache out of the scratch directory: back to its home, unless `discard`, there
    /// is none, or another build's cache got there first; otherwise it is deleted. Whatever the
    /// build left at the reserved name that is not a directory is deleted too.
    fn give_back(&mut self, discard: bool) -> std::io::Result<()> {
        self.gone = true;
        let metadata = match std::fs::symlink_metadata(&self.inside) {
            Ok(metadata) => metadata,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(error) => return Err(error),
        };
        if metadata.is_dir()
            && !discard
            && let Some(home) = &self.home
            && std::fs::rename(&self.inside, home).is_ok()
        {
            return Ok(());
        }
        remove_any(&self.inside)
    }
}

impl Drop for BuildCache {
    /// An install abandoned midway (its future dropped) still puts the cache back; the build
    /// publishes nothing. Only a rename here: deleting can take long, and the scratch directory
    /// is deleted anyway.
    fn drop(&mut self) {
        if !self.gone
            && let Some(home) = &self.home
            && std::fs::symlink_metadata(&self.inside).is_ok_and(|metadata| metadata.is_dir())
        {
            let _ = std::fs::rename(&self.inside, home);
        }
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
    root: &Path,
    plan: &Plan,
    options: &InstallOptions,
    log: &mut CappedLog<'_>,
) -> Result<Ran, InstallError> {
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
            linked = Some(blocking(root, |root| Ok(linked_files(&root.join(".venv")))).await?);
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
                let after = linked_files(&root.join(".venv"));
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

/// Every regular file under `dir` (not following links) with more than one link, by inode:
/// when its inode last changed (ctime, seconds and nanoseconds). Unreadable parts are skipped.
fn linked_files(dir: &Path) -> HashMap<(u64, u64), (i64, i64)> {
    let mut linked = HashMap::new();
    walk(dir, &mut |_, metadata| {
        if metadata.is_file() && metadata.nlink() > 1 {
            linked.insert(
                (metadata.dev(), metadata.ino()),
                (metadata.ctime(), metadata.ctime_nsec()),
            );
        }
    });
    linked
}

/// Calls `visit` with every entry under `dir` and its metadata, not following links.
fn walk(dir: &Path, visit: &mut dyn FnMut(&Path, &std::fs::Metadata)) {
    let mut pending = vec![dir.to_owned()];
    while let Some(dir) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let Ok(metadata) = std::fs::symlink_metadata(&path) else {
                continue;
            };
            if metadata.is_dir() {
                pending.push(path.clone());
            }
            visit(&path, &metadata);
        }
    }
}

/// The `.py` files under `.venv` in the scratch directory `root` without a checked-hash `.pyc`
/// beside them in `__pycache__`, as the sandbox sees them (`/env/<slug>/…` is `root`; only paths
/// relative to it are returned, sorted). Names that are not UTF-8 or hold a newline cannot be
/// listed for compileall and are left out.
fn uncompiled(root: &Path) -> Vec<String> {
    let mut sources = Vec::new();
    walk(&root.join(".venv"), &mut |path, metadata| {
        if metadata.is_file() && path.extension().is_some_and(|ext| ext == "py") {
            sources.push(path.to_owned());
        }
    });
    let mut uncompiled: Vec<String> = sources
        .into_iter()
        .filter(|source| !has_checked_hash_pyc(source))
        .filter_map(|source| {
            let relative = source.strip_prefix(root).ok()?.to_str()?.to_owned();
            (!relative.contains('\n')).then_some(relative)
        })
        .collect();
    uncompiled.sort_unstable();
    uncompiled
}

/// Whether `__pycache__/<stem>.<tag>.pyc` beside `source` exists for some interpreter tag and
/// is a checked-hash pyc. Opened without following links or blocking (it is the build's file).
fn has_checked_hash_pyc(source: &Path) -> bool {
    let (Some(dir), Some(stem)) = (
        source.parent(),
        source.file_stem().and_then(|stem| stem.to_str()),
    ) else {
        return false;
    };
    let Ok(entries) = std::fs::read_dir(dir.join("__pycache__")) else {
        return false;
    };
    entries.flatten().any(|entry| {
        let name = entry.file_name();
        let Some(tag) = name
            .to_str()
            .and_then(|name| name.strip_prefix(stem)?.strip_prefix('.'))
            .and_then(|rest| rest.strip_suffix(".pyc"))
        else {
            return false;
        };
        if tag.is_empty() || tag.contains('.') {
            return false;
        }
        let mut header = [0u8; 8];
        crate::layer::open_file(&entry.path())
            .and_then(|mut pyc| pyc.read_exact(&mut header))
            .is_ok_and(|()| {
                u32::from_le_bytes([header[4], header[5], header[6], header[7]]) == CHECKED_HASH_PYC
            })
    })
}

/// Writes the bytecode pass's list of files (paths relative to the mount path, which is the
/// command's working directory), replacing whatever the build left at that name, readable by
/// the build.
fn write_list(list: &Path, files: &[String]) -> std::io::Result<()> {
    use std::io::Write as _;
    remove_any(list)?;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(list)?;
    for path in files {
        file.write_all(path.as_bytes())?;
        file.write_all(b"\n")?;
    }
    file.flush()
}

/// Runs one command, logging a `==> command` line and its output; a non-zero exit is an error.
async fn run_command(
    sandbox: &Sandbox,
    argv: &[String],
    env: Vec<(String, String)>,
    registries: &Registries,
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

/// The installers' environment (see the module documentation), later entries overriding.
fn environment(sandbox: &Sandbox, options: &InstallOptions, python: bool) -> Vec<(String, String)> {
    let mount = sandbox.mount_path();
    let venv = format!("{mount}/.venv");
    let cache = format!("{mount}/{BUILD_CACHE}");
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
    set("UV_COMPILE_BYTECODE", "1");
    set("SOURCE_DATE_EPOCH", SOURCE_DATE_EPOCH);
    // Imports during the install (a build backend in the project, `setup.sh`'s scripts) must
    // not leave timestamp `.pyc`s in the tree: they name the materialized files' times, so
    // they differ from build to build and no session could use them.
    set("PYTHONDONTWRITEBYTECODE", "1");
    set("PIP_DISABLE_PIP_VERSION_CHECK", "1");
    set("PIP_NO_INPUT", "1");
    set("PIP_PROGRESS_BAR", "off");
    set("npm_config_fund", "false");
    set("npm_config_audit", "false");
    set("npm_config_update_notifier", "false");
    set("npm_config_progress", "false");
    set("XDG_CACHE_HOME", &cache);
    set("UV_CACHE_DIR", &format!("{cache}/uv"));
    set("PIP_CACHE_DIR", &format!("{cache}/pip"));
    set("npm_config_cache", &format!("{cache}/npm"));
    for (name, value) in options.registries.env() {
        set(&name, &value);
    }
    // After the registries' proxies: in the build's namespace nothing but the egress proxy
    // leads anywhere, so no host is reached without it.
    if matches!(options.network, BuildNetwork::Egress(_)) {
        for (name, value) in plinth_sandbox::egress::proxy_env(DEFAULT_PROXY_ADDR) {
            set(&name, &value);
        }
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
            shown: Vec::new(),
            uid: 65534,
            gid: 65534,
            hidden_paths: Vec::new(),
            network: Network::None,
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
        assert_eq!(
            get("UV_CACHE_DIR"),
            Some("/env/demo/.plinth-build-cache/uv")
        );
        assert_eq!(get("UV_COMPILE_BYTECODE"), Some("1"));
        assert_eq!(get("SOURCE_DATE_EPOCH"), Some("315532800"));
        assert_eq!(get("PYTHONDONTWRITEBYTECODE"), Some("1"));
        assert_eq!(get("UV_LINK_MODE"), None, "uv hard-links from the cache");
        assert_eq!(get("npm_config_audit"), Some("true"));
        assert_eq!(get("PIP_FIND_LINKS"), Some("/wheels"));
        assert_eq!(
            env.iter()
                .filter(|(name, _)| name == "npm_config_audit")
                .count(),
            1
        );
        assert!(matches!(options.network, BuildNetwork::None));
        assert_eq!(options.read_only_paths, vec![PathBuf::from("/wheels")]);
        assert!(
            environment(&sandbox(), &options, false)
                .iter()
                .all(|(name, _)| name != "VIRTUAL_ENV")
        );
        assert_eq!(get("HTTPS_PROXY"), None, "no proxy without the network");
    }

    #[test]
    fn with_egress_the_proxy_wins_over_the_registries_proxies_and_extra_env_over_both() {
        let options = InstallOptions {
            network: BuildNetwork::Egress(Arc::new(EgressPolicy::default())),
            registries: Registries {
                https_proxy: Some("http://upstream:3128".to_owned()),
                no_proxy: Some(".internal".to_owned()),
                python_index_url: Some("https://pypi.internal/simple".to_owned()),
                ..Registries::default()
            },
            extra_env: vec![("YARN_HTTP_PROXY".to_owned(), "http://mine".to_owned())],
            ..InstallOptions::default()
        };
        let env = environment(&sandbox(), &options, true);
        let get = |name: &str| {
            env.iter()
                .find(|(existing, _)| existing == name)
                .map(|(_, value)| value.as_str())
        };
        for name in [
            "HTTPS_PROXY",
            "https_proxy",
            "HTTP_PROXY",
            "npm_config_https_proxy",
        ] {
            assert_eq!(get(name), Some("http://127.0.0.1:3128"), "{name}");
        }
        assert_eq!(get("NO_PROXY"), Some("localhost,127.0.0.1,::1"));
        assert_eq!(get("UV_INDEX_URL"), Some("https://pypi.internal/simple"));
        assert_eq!(get("YARN_HTTP_PROXY"), Some("http://mine"));
    }

    fn me() -> (u32, u32) {
        (
            rustix::process::getuid().as_raw(),
            rustix::process::getgid().as_raw(),
        )
    }

    #[test]
    fn the_cache_is_lent_to_the_scratch_directory_and_put_back() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (root, home) = (dir.path().join("scratch"), dir.path().join("caches/scope"));
        std::fs::create_dir(&root).expect("mkdir");
        let (uid, gid) = me();

        // The first build of a scope: an empty cache, kept afterwards.
        let mut cache = BuildCache::lend(&root, Some(&home), uid, gid).expect("lend");
        std::fs::write(root.join(BUILD_CACHE).join("entry"), "x").expect("write");
        cache.give_back(false).expect("give back");
        assert!(!root.join(BUILD_CACHE).exists());
        assert_eq!(
            std::fs::read_to_string(home.join("entry")).expect("kept"),
            "x"
        );

        // The next takes it in with a rename.
        let mut cache = BuildCache::lend(&root, Some(&home), uid, gid).expect("lend");
        assert!(!home.exists());
        assert!(root.join(BUILD_CACHE).join("entry").exists());
        // A concurrent build of the scope meanwhile starts from an empty one…
        let other_root = dir.path().join("other");
        std::fs::create_dir(&other_root).expect("mkdir");
        let mut other = BuildCache::lend(&other_root, Some(&home), uid, gid).expect("lend");
        assert!(!other_root.join(BUILD_CACHE).join("entry").exists());
        std::fs::write(other_root.join(BUILD_CACHE).join("other"), "y").expect("write");
        // …and whichever finishes first puts its cache back; the other's is dropped.
        cache.give_back(false).expect("give back");
        other.give_back(false).expect("give back");
        assert!(home.join("entry").exists());
        assert!(!home.join("other").exists());
        assert!(!other_root.join(BUILD_CACHE).exists());

        // A discarded cache is deleted.
        let mut cache = BuildCache::lend(&root, Some(&home), uid, gid).expect("lend");
        cache.give_back(true).expect("give back");
        assert!(!root.join(BUILD_CACHE).exists());
        assert!(!home.exists());
    }

    #[test]
    fn what_a_build_leaves_at_the_reserved_name_is_removed_not_followed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (root, home) = (dir.path().join("scratch"), dir.path().join("cache"));
        let outside = dir.path().join("outside");
        std::fs::create_dir(&root).expect("mkdir");
        std::fs::create_dir(&outside).expect("mkdir");
        std::fs::write(outside.join("keep"), "x").expect("write");
        let (uid, gid) = me();

        let mut cache = BuildCache::lend(&root, Some(&home), uid, gid).expect("lend");
        std::fs::remove_dir_all(root.join(BUILD_CACHE)).expect("rm");
        std::os::unix::fs::symlink(&outside, root.join(BUILD_CACHE)).expect("symlink");
        cache.give_back(false).expect("give back");
        assert!(std::fs::symlink_metadata(root.join(BUILD_CACHE)).is_err());
        assert!(std::fs::symlink_metadata(&home).is_err());
        assert!(outside.join("keep").exists());

        // Without a home, the cache lasts one build.
        let mut cache = BuildCache::lend(&root, None, uid, gid).expect("lend");
        assert!(root.join(BUILD_CACHE).is_dir());
        cache.give_back(false).expect("give back");
        assert!(!root.join(BUILD_CACHE).exists());
    }

    #[test]
    fn an_abandoned_install_still_puts_the_cache_back() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (root, home) = (dir.path().join("scratch"), dir.path().join("cache"));
        std::fs::create_dir(&root).expect("mkdir");
        std::fs::create_dir(&home).expect("mkdir");
        std::fs::write(home.join("entry"), "x").expect("write");
        let (uid, gid) = me();
        drop(BuildCache::lend(&root, Some(&home), uid, gid).expect("lend"));
        assert!(home.join("entry").exists());
        assert!(!root.join(BUILD_CACHE).exists());
    }

    #[test]
    fn only_sources_without_checked_hash_bytecode_are_listed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        let site = root.join(".venv/lib/python3.11/site-packages");
        let pyc = |name: &str, flags: u32| {
            let cache = site.join("__pycache__");
            std::fs::create_dir_all(&cache).expect("mkdir");
            let mut bytes = vec![0xa7, 0x0d, 0x0d, 0x0a];
            bytes.extend_from_slice(&flags.to_le_bytes());
            bytes.extend_from_slice(&[0; 8]);
            std::fs::write(cache.join(name), bytes).expect("write");
        };
        for source in [
            "checked",
            "timestamp",
            "unchecked",
            "none",
            "other.name",
            "opt",
        ] {
            std::fs::create_dir_all(&site).expect("mkdir");
            std::fs::write(site.join(format!("{source}.py")), "").expect("write");
        }
        pyc("checked.cpython-311.pyc", 3);
        pyc("timestamp.cpython-311.pyc", 0);
        pyc("unchecked.cpython-311.pyc", 1);
        pyc("other.cpython-311.pyc", 3);
        pyc("opt.cpython-311.opt-1.pyc", 3);
        std::os::unix::fs::symlink(
            site.join("__pycache__/checked.cpython-311.pyc"),
            site.join("__pycache__/other.name.cpython-311.pyc"),
        )
        .expect("symlink");
        std::fs::write(root.join(".venv/README.txt"), "").expect("write");
        std::fs::write(root.join("app.py"), "").expect("write");

        let prefix = ".venv/lib/python3.11/site-packages/";
        assert_eq!(
            uncompiled(root),
            ["none", "opt", "other.name", "timestamp", "unchecked"]
                .map(|name| format!("{prefix}{name}.py"))
        );
    }

    #[test]
    fn executables_are_found_on_a_path() {
        assert!(find_executable("/nonexistent:/bin:/usr/bin", "sh").is_some());
        assert!(find_executable("/nonexistent", "sh").is_none());
        assert!(find_executable("", "sh").is_none());
    }
}
