//! The build sandbox: runs one command of a build at the environment's mount path, as an
//! unprivileged user, in private namespaces, with a time limit, streaming its output.
//!
//! What the command sees (ARCHITECTURE §3.3, UHP §9):
//!
//! - `/env` is a fresh read-only tmpfs holding only `/env/<slug>` (the scratch directory,
//!   bind-mounted read-write, the working directory) and `/env/.home` (`HOME`, the build's own).
//!   No other environment is visible, whatever the host has under `/env`. (A build's download
//!   cache lives inside the scratch directory while it runs, on the same mount as what it
//!   installs, so installers can hard-link from it: see [`mod@crate::install`].)
//! - `/tmp` is the build's own directory (on disk, beside HOME) and `/dev/shm` a small private
//!   tmpfs, so tools that write there work without touching the host's.
//! - Every other mount of the host (but `/proc`, `/sys` and `/dev`, kernel interfaces and device
//!   nodes) is re-mounted read-only inside the namespace, so the command can write nowhere but
//!   `/env/<slug>`, HOME, `/tmp` and `/dev/shm`, whatever the host's permissions say.
//!   (Host mounts stay as they are: every remount is of the namespace's copy.)
//! - Each hidden path (the builder's state, other environments, sessions) is covered by an empty,
//!   read-only, mode-000 tmpfs (a file by `/dev/null`).
//! - A new PID namespace whose first process is a minimal root waiter, the command's parent:
//!   the command sees only its own processes (`/proc` is the namespace's), and when the command
//!   ends, times out or the builder drops the run, the namespace's first process ends and the
//!   kernel kills every process left in it, daemons and `setsid` escapees included. A timeout
//!   returns only once they are all gone. IPC and UTS namespaces are private too, and with
//!   `isolate_network` so is the network (only a loopback that is down: no network at all).
//! - It runs as `uid:gid` with no supplementary groups, no capabilities (bounding set emptied,
//!   inheritable set cleared) and `no_new_privs` (set-uid binaries cannot raise it), with
//!   exactly the environment it is given: nothing of the builder's own environment is inherited.
//!
//! Mechanism: direct system calls in the child between `fork` and `exec` (`pre_exec`), as the
//! node agent isolates sessions. Setting up with util-linux (`unshare`, `mount`, `setpriv`, `env`
//! and a setup shell: about 13 process launches) cost ~40 ms per command, and a build runs at
//! least two; the system calls take a few milliseconds. A PID namespace needs a first process
//! inside it, and `unshare(CLONE_NEWPID)` moves only the caller's *children* there, so the child
//! std forks (P, outside the namespace, the process the builder waits for) forks once more:
//!
//! 1. P unshares the mount, PID, IPC and UTS (and network) namespaces and forks C, the PID
//!    namespace's first process. P closes every descriptor but stdio, waits for C and exits with
//!    its status.
//! 2. C asks for SIGKILL should P die (a dropped run kills P: C dies, so does the namespace),
//!    makes every mount private, mounts the namespace's `/proc`, sets up the mounts above and
//!    forks D. C closes every descriptor but stdio and waits: it reaps whatever is orphaned in
//!    the namespace and exits with D's status (128 + the signal if D was killed by one), which
//!    takes the rest of the namespace down.
//! 3. D empties the capability bounding set, drops to `uid:gid`, clears the inheritable
//!    capabilities, sets `no_new_privs`, changes to `/env/<slug>` and returns to std, which
//!    executes the command (looked up on the command's own `PATH`) with exactly its environment.
//!
//! Each step runs only raw system calls on data prepared before the fork (C strings, the mount
//! list): nothing is allocated and no lock is taken between fork and exec. The spawn returns
//! once D has executed the command or one of C's or D's steps failed; a failed step writes
//! `plinth-sandbox: cannot …` to the command's stderr first, so the error names the step.
//!
//! The host keeps one trace: an empty `/env` directory, created as the tmpfs's mount point.
//!
//! Limits: no CPU, memory or disk quota (that needs cgroups, which the deployment provides); the
//! host's file system stays *readable* wherever the uid's permissions allow (hide what matters
//! with `hidden_paths`); with the network on, the command reaches whatever the host reaches.

use std::ffi::{CStr, CString};
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use rustix::io::Errno;
use rustix::mount::{MountFlags, MountPropagationFlags};
use rustix::thread::UnshareFlags;
use tokio::sync::mpsc;

/// Where environments are mounted; inside the sandbox, a private tmpfs.
pub const ENV_ROOT: &str = "/env";
/// The command's `HOME` inside the sandbox.
pub const HOME: &str = "/env/.home";

/// What a failed setup step writes before its name (and what the error reports).
const CANNOT: &[u8] = b"plinth-sandbox: cannot ";
/// At most this much setup output is kept for an error message.
const SETUP_OUTPUT_CAP: u64 = 64 * 1024;
/// How long to wait for the output pipe to close once the sandbox is dead.
const DRAIN_AFTER_KILL: Duration = Duration::from_secs(5);
/// How long a killed namespace may take to empty before its waiter is killed outright.
const TEARDOWN_GRACE: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error(
        "the build sandbox is not permitted here: {0}. Run the builder as root (in a container: \
         with CAP_SYS_ADMIN, CAP_SETUID, CAP_SETGID, CAP_SETPCAP, CAP_CHOWN and a \
         seccomp/AppArmor profile that allows unshare and mount)"
    )]
    NotPermitted(String),
    #[error(
        "invalid environment slug {0:?}: use letters, digits, '.', '_' and '-', not starting with '.' or '-'"
    )]
    InvalidSlug(String),
    #[error("invalid hidden path {0:?}: it must be absolute and not the root")]
    InvalidHiddenPath(PathBuf),
    #[error("the sandbox's directories must be absolute paths, not {0:?}")]
    RelativePath(PathBuf),
    #[error("invalid command or environment for the sandbox: {0}")]
    InvalidCommand(String),
    #[error("could not set up the build sandbox: {0}")]
    Setup(String),
    #[error("exceeded its time limit of {limit:?} and was killed")]
    TimedOut { limit: Duration },
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
}

impl SandboxError {
    fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> SandboxError {
        let context = context.into();
        move |source| SandboxError::Io { context, source }
    }
}

/// One build's sandbox. Every path is a host path and should be absolute.
#[derive(Debug, Clone)]
pub struct Sandbox {
    /// The environment's slug: the command runs in `/env/<slug>`.
    pub slug: String,
    /// The scratch directory holding the source, mounted read-write at `/env/<slug>`.
    pub root: PathBuf,
    /// The build's HOME, mounted at [`HOME`].
    pub home: PathBuf,
    /// The build's own `/tmp`.
    pub tmp: PathBuf,
    pub uid: u32,
    pub gid: u32,
    /// Host paths covered by an empty read-only tmpfs (directories) or `/dev/null` (files).
    /// Paths under `/env` and `/tmp` are replaced wholesale anyway and need no entry.
    pub hidden_paths: Vec<PathBuf>,
    /// Give the command a network namespace of its own with no interfaces up.
    pub isolate_network: bool,
    /// The wall-clock limit for one command.
    pub timeout: Duration,
}

/// Checks a slug is one path segment that cannot collide with the sandbox's own `/env/.home`,
/// nor be read as an option.
pub fn validate_slug(slug: &str) -> Result<(), SandboxError> {
    let valid = !slug.is_empty()
        && slug.len() <= 128
        && !slug.starts_with(['.', '-'])
        && slug
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || matches!(byte, b'.' | b'_' | b'-'));
    if valid {
        Ok(())
    } else {
        Err(SandboxError::InvalidSlug(slug.to_owned()))
    }
}

/// Why a build would not see `path` as it is on the host, if it would not: `/env`, `/tmp` and
/// `/dev/shm` are the sandbox's own, and every hidden path is covered. For a path a build must
/// reach (the tools directory), so a configuration that hides it is refused at start instead
/// of failing every build with "No such file".
pub fn hidden_from_builds(path: &Path, hidden_paths: &[PathBuf]) -> Option<String> {
    let bytes = path.as_os_str().as_bytes();
    for own in [ENV_ROOT, "/tmp", "/dev/shm"] {
        if path_is_under(bytes, own.as_bytes()) {
            return Some(format!(
                "{} is under {own}, which the build sandbox replaces with its own",
                path.display()
            ));
        }
    }
    hidden_paths
        .iter()
        .find(|hidden| path.starts_with(hidden))
        .map(|hidden| {
            format!(
                "{} is under {}, which the build sandbox hides (Plinth's data and the builder's \
                 state)",
                path.display(),
                hidden.display()
            )
        })
}

/// Refuses early when the sandbox cannot work: it needs root to mount and to change uid.
pub fn check_permitted() -> Result<(), SandboxError> {
    if rustix::process::geteuid().is_root() {
        Ok(())
    } else {
        Err(SandboxError::NotPermitted(
            "the builder is not running as root, and the sandbox mounts in a private mount \
             namespace and switches to an unprivileged uid"
                .to_owned(),
        ))
    }
}

/// The exit status as one number: the exit code, or 128 + the signal that killed it (as a shell
/// reports it).
pub fn status_code(status: ExitStatus) -> i32 {
    status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}

impl Sandbox {
    /// The command's working directory and the environment's mount path: `/env/<slug>`.
    pub fn mount_path(&self) -> String {
        format!("{ENV_ROOT}/{}", self.slug)
    }

    /// Runs `argv` (looked up on `env`'s PATH) in the sandbox with exactly `env` as its
    /// environment, passing its stdout and stderr, interleaved as written, to `output` as they
    /// come. Returns its exit status; a command past the time limit is killed with everything it
    /// started, and that is [`SandboxError::TimedOut`].
    pub async fn run(
        &self,
        argv: &[String],
        env: &[(String, String)],
        output: &mut (dyn FnMut(&[u8]) + Send),
    ) -> Result<ExitStatus, SandboxError> {
        validate_slug(&self.slug)?;
        check_permitted()?;
        // The tmpfs needs a mount point; an empty directory on the host is all it leaves there.
        std::fs::create_dir_all(ENV_ROOT)
            .map_err(SandboxError::io(format!("creating {ENV_ROOT} on the host")))?;
        let mounts = std::fs::read("/proc/self/mountinfo")
            .map_err(SandboxError::io("reading /proc/self/mountinfo"))?;
        let plan = self.plan(&host_mounts(&mounts), argv, env)?;

        let (reader, writer) = std::io::pipe().map_err(SandboxError::io("creating a pipe"))?;
        let stderr = writer
            .try_clone()
            .map_err(SandboxError::io("creating a pipe"))?;
        let mut command = tokio::process::Command::new(&argv[0]);
        command
            .args(&argv[1..])
            .env_clear()
            .envs(env.iter().map(|(name, value)| (name, value)))
            .stdin(Stdio::null())
            .stdout(writer)
            .stderr(stderr)
            // Its own process group, the fallback for a timeout; and if this future is dropped,
            // the waiter is killed, and the namespace's first process with it.
            .process_group(0)
            .kill_on_drop(true);
        // SAFETY: the closure runs in the child std forks, before exec. It only makes raw system
        // calls on data `plan` prepared before the fork (it owns its C strings and the mount
        // list; nothing is allocated, no lock is taken), and the processes it forks do the
        // same until they exit or exec (see `enter`), as `pre_exec` requires.
        #[allow(unsafe_code)]
        unsafe {
            command.pre_exec(move || enter(&plan).map_err(std::io::Error::from));
        }
        // Returns once the command is executing or the setup failed (a few milliseconds of
        // system calls).
        let spawned = command.spawn();
        // The command holds our copies of the pipe's write end: drop them, or EOF never comes.
        drop(command);
        let mut child = match spawned {
            Ok(child) => child,
            Err(error) => return Err(setup_error(error, reader, &argv[0])),
        };

        let (chunks, mut received) = mpsc::channel::<Vec<u8>>(16);
        // A blocking reader on its own thread: one pipe for both streams keeps their order,
        // and the bounded channel makes a chatty command wait for the log, not fill memory.
        let reader_task = tokio::task::spawn_blocking(move || {
            let mut reader = reader;
            let mut buffer = vec![0u8; 64 * 1024];
            loop {
                match reader.read(&mut buffer) {
                    Ok(0) => break,
                    Ok(read) => {
                        if chunks.blocking_send(buffer[..read].to_vec()).is_err() {
                            break;
                        }
                    }
                    Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(_) => break,
                }
            }
        });

        let deadline = tokio::time::sleep(self.timeout);
        tokio::pin!(deadline);
        let mut status = None;
        let mut eof = false;
        while status.is_none() || !eof {
            tokio::select! {
                chunk = received.recv(), if !eof => match chunk {
                    Some(chunk) => output(&chunk),
                    None => eof = true,
                },
                exited = child.wait(), if status.is_none() => {
                    status = Some(exited.map_err(SandboxError::io("waiting for the sandbox"))?);
                }
                () = &mut deadline => {
                    stop(&mut child).await;
                    // Whatever was written before the kill still belongs in the log.
                    let _ = tokio::time::timeout(DRAIN_AFTER_KILL, async {
                        while let Some(chunk) = received.recv().await {
                            output(&chunk);
                        }
                    })
                    .await;
                    return Err(SandboxError::TimedOut { limit: self.timeout });
                }
            }
        }
        let _ = reader_task.await;
        status.ok_or_else(|| SandboxError::Setup("no exit status".to_owned()))
    }

    /// Checks the command and the sandbox's paths and prepares, as C strings, everything the
    /// child needs. `mounts` are the host's mount points (with their flags) to make read-only.
    fn plan(
        &self,
        mounts: &[HostMount],
        argv: &[String],
        env: &[(String, String)],
    ) -> Result<Plan, SandboxError> {
        let Some(program) = argv.first() else {
            return Err(SandboxError::InvalidCommand("empty command".to_owned()));
        };
        // A word with '=' in the program's place is an assignment to a shell or `env`: no
        // manifest names a program that way.
        if program.is_empty() || program.contains('=') {
            return Err(SandboxError::InvalidCommand(format!(
                "program name {program:?}"
            )));
        }
        if argv.iter().any(|arg| arg.contains('\0')) {
            return Err(SandboxError::InvalidCommand(
                "a NUL in an argument".to_owned(),
            ));
        }
        for (name, value) in env {
            if name.is_empty() || name.contains(['=', '\0']) || value.contains('\0') {
                return Err(SandboxError::InvalidCommand(format!(
                    "environment variable {name:?}"
                )));
            }
        }
        let own = [&self.root, &self.home, &self.tmp];
        if let Some(relative) = own.into_iter().find(|path| !path.is_absolute()) {
            return Err(SandboxError::RelativePath(relative.clone()));
        }
        for hidden in &self.hidden_paths {
            if !hidden.is_absolute() || hidden == Path::new("/") {
                return Err(SandboxError::InvalidHiddenPath(hidden.clone()));
            }
        }
        let hidden = self
            .hidden_paths
            .iter()
            .map(|path| path.as_os_str().as_bytes())
            .filter(|path| {
                !path_is_under(path, ENV_ROOT.as_bytes()) && !path_is_under(path, b"/tmp")
            })
            .map(c_string)
            .collect::<Result<_, _>>()?;
        let read_only = mounts
            .iter()
            .map(|mount| {
                Ok(ReadOnly {
                    point: c_string(&mount.point)?,
                    flags: mount.flags,
                    required: mount.point == b"/",
                })
            })
            .collect::<Result<_, SandboxError>>()?;
        let mut namespaces = UnshareFlags::NEWNS
            | UnshareFlags::NEWPID
            | UnshareFlags::NEWIPC
            | UnshareFlags::NEWUTS;
        if self.isolate_network {
            namespaces |= UnshareFlags::NEWNET;
        }
        Ok(Plan {
            namespaces,
            mount_path: c_string(self.mount_path().as_bytes())?,
            root: c_string(self.root.as_os_str().as_bytes())?,
            home: c_string(self.home.as_os_str().as_bytes())?,
            tmp: c_string(self.tmp.as_os_str().as_bytes())?,
            read_only,
            hidden,
            uid: rustix::process::Uid::from_raw(self.uid),
            gid: rustix::process::Gid::from_raw(self.gid),
        })
    }
}

fn c_string(bytes: &[u8]) -> Result<CString, SandboxError> {
    CString::new(bytes).map_err(|_| {
        SandboxError::InvalidCommand(format!(
            "a NUL in the path {:?}",
            String::from_utf8_lossy(bytes)
        ))
    })
}

/// The error for a spawn that failed: a setup step that said which it was (on the command's
/// stderr, read here to the end: every process of the sandbox is gone by now), or else the
/// command itself could not be executed.
fn setup_error(error: std::io::Error, reader: std::io::PipeReader, program: &str) -> SandboxError {
    let mut said = Vec::new();
    let _ = reader.take(SETUP_OUTPUT_CAP).read_to_end(&mut said);
    let said = String::from_utf8_lossy(&said);
    let prefix = String::from_utf8_lossy(CANNOT);
    let Some(step) = said
        .lines()
        .rev()
        .find_map(|line| line.strip_prefix(prefix.as_ref()))
    else {
        return SandboxError::Io {
            context: format!("starting {program:?} in the build sandbox"),
            source: error,
        };
    };
    let text = format!("cannot {step}: {error}");
    match error.kind() {
        std::io::ErrorKind::PermissionDenied => SandboxError::NotPermitted(text),
        _ => SandboxError::Setup(text),
    }
}

/// Everything the sandbox's processes need between fork and exec, prepared before the fork.
struct Plan {
    namespaces: UnshareFlags,
    /// `/env/<slug>`.
    mount_path: CString,
    root: CString,
    home: CString,
    tmp: CString,
    read_only: Vec<ReadOnly>,
    /// Hidden paths outside `/env` and `/tmp`.
    hidden: Vec<CString>,
    uid: rustix::process::Uid,
    gid: rustix::process::Gid,
}

/// A host mount to make read-only in the namespace.
struct ReadOnly {
    point: CString,
    /// Per-mount flags to keep: a bind remount sets them all at once.
    flags: MountFlags,
    /// `/`: the sandbox is refused if it stays writable; others only warn.
    required: bool,
}

const ENV_ROOT_C: &CStr = c"/env";
const HOME_C: &CStr = c"/env/.home";
const ENV_TMPFS: &CStr = c"mode=0755,size=1m";
const SHM_TMPFS: &CStr = c"mode=1777,size=64m";
const HIDDEN_TMPFS: &CStr = c"mode=000,size=4k";
const EMPTY: &CStr = c"";

/// The sandbox's side of the fork (see the module documentation), run in P; returns only in D,
/// ready to exec, or with the error of a step (which std reports to the spawning parent).
/// Raw system calls only.
fn enter(plan: &Plan) -> Result<(), Errno> {
    // SAFETY: new namespaces only; the forked child has one thread, so no file-descriptor
    // table or fs_struct is shared with another.
    #[allow(unsafe_code)]
    unsafe { rustix::thread::unshare_unsafe(plan.namespaces) }
        .map_err(|error| cannot(&[b"create namespaces (unshare)"], error))?;
    if let Some(first) = fork().map_err(|error| cannot(&[b"fork"], error))? {
        // P: std's error pipe must not wait for us, only for C or D.
        close_inherited();
        exit(wait_for(first));
    }

    // C: the PID namespace's first process, still root.
    rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))
        .map_err(|error| cannot(&[b"ask for the parent-death signal"], error))?;
    mount_everything(plan)?;
    if let Some(command) = fork().map_err(|error| cannot(&[b"fork"], error))? {
        close_inherited();
        exit(reap_until(command));
    }

    // D: becomes the command.
    drop_privileges(plan)?;
    rustix::process::chdir(&*plan.mount_path)
        .map_err(|error| cannot(&[b"change to ", plan.mount_path.to_bytes()], error))?;
    Ok(())
}

/// C's mounts, in the order that keeps host paths reachable as long as they are needed: /env
/// first (a hidden path may contain the scratch directory), then /tmp and /dev/shm, the rest of
/// the host read-only, then the hidden paths.
fn mount_everything(plan: &Plan) -> Result<(), Errno> {
    use rustix::mount::{mount, mount_bind, mount_change, mount_remount};
    let quiet = MountFlags::NOSUID | MountFlags::NODEV;
    mount_change(
        c"/",
        MountPropagationFlags::PRIVATE | MountPropagationFlags::REC,
    )
    .map_err(|error| cannot(&[b"make the mounts private"], error))?;
    mount(
        c"proc",
        c"/proc",
        c"proc",
        quiet | MountFlags::NOEXEC,
        EMPTY,
    )
    .map_err(|error| cannot(&[b"mount the namespace's /proc"], error))?;
    mount(c"plinth-env", ENV_ROOT_C, c"tmpfs", quiet, ENV_TMPFS)
        .map_err(|error| cannot(&[b"mount a tmpfs on /env"], error))?;
    for (from, to) in [(&*plan.root, &*plan.mount_path), (&*plan.home, HOME_C)] {
        rustix::fs::mkdir(to, rustix::fs::Mode::from_raw_mode(0o755))
            .map_err(|error| cannot(&[b"make ", to.to_bytes()], error))?;
        mount_bind(from, to).map_err(|error| cannot(&[b"bind-mount ", to.to_bytes()], error))?;
    }
    mount_remount(
        ENV_ROOT_C,
        MountFlags::BIND | MountFlags::RDONLY | quiet,
        EMPTY,
    )
    .map_err(|error| cannot(&[b"make /env read-only"], error))?;
    mount_bind(&*plan.tmp, c"/tmp").map_err(|error| cannot(&[b"bind-mount /tmp"], error))?;
    if is_directory(c"/dev/shm") == Some(true) {
        mount(c"plinth-shm", c"/dev/shm", c"tmpfs", quiet, SHM_TMPFS)
            .map_err(|error| cannot(&[b"mount a tmpfs on /dev/shm"], error))?;
    }
    for host in &plan.read_only {
        let flags = MountFlags::BIND | MountFlags::RDONLY | host.flags;
        if let Err(error) = mount_remount(&*host.point, flags, EMPTY) {
            if host.required {
                return Err(cannot(&[b"make / read-only"], error));
            }
            say(&[
                b"plinth-sandbox: warning: could not make ",
                host.point.to_bytes(),
                b" read-only\n",
            ]);
        }
    }
    for hidden in &plan.hidden {
        let covered = match is_directory(hidden) {
            Some(true) => mount(
                c"plinth-hidden",
                &**hidden,
                c"tmpfs",
                quiet | MountFlags::NOEXEC | MountFlags::RDONLY,
                HIDDEN_TMPFS,
            ),
            Some(false) => mount_bind(c"/dev/null", &**hidden),
            // Nothing there: nothing to hide.
            None => Ok(()),
        };
        covered.map_err(|error| cannot(&[b"hide ", hidden.to_bytes()], error))?;
    }
    Ok(())
}

/// D's privileges: the bounding set emptied (while still root, which it takes), then the uid
/// and gid with no supplementary groups (which clears the effective and permitted sets), the
/// inheritable set cleared, and `no_new_privs`. rustix's raw uid and gid calls change only the
/// calling thread, which after the fork is the whole process.
fn drop_privileges(plan: &Plan) -> Result<(), Errno> {
    use rustix::thread::{CapabilitySet, CapabilitySets};
    for capability in 0..64 {
        match rustix::thread::remove_capability_from_bounding_set(CapabilitySet::from_bits_retain(
            1 << capability,
        )) {
            Ok(()) => {}
            // Past the last capability this kernel knows.
            Err(Errno::INVAL) => break,
            Err(error) => return Err(cannot(&[b"empty the capability bounding set"], error)),
        }
    }
    rustix::thread::set_thread_groups(&[])
        .map_err(|error| cannot(&[b"drop the supplementary groups"], error))?;
    rustix::thread::set_thread_res_gid(plan.gid, plan.gid, plan.gid)
        .map_err(|error| cannot(&[b"change the gid"], error))?;
    rustix::thread::set_thread_res_uid(plan.uid, plan.uid, plan.uid)
        .map_err(|error| cannot(&[b"change the uid"], error))?;
    let none = CapabilitySet::empty();
    rustix::thread::set_capabilities(
        None,
        CapabilitySets {
            effective: none,
            permitted: none,
            inheritable: none,
        },
    )
    .map_err(|error| cannot(&[b"clear the capabilities"], error))?;
    rustix::thread::set_no_new_privs(true)
        .map_err(|error| cannot(&[b"set no_new_privs"], error))?;
    Ok(())
}

/// Whether `path` is a directory (following links, as mounting on it does); `None` if nothing
/// is there.
fn is_directory(path: &CStr) -> Option<bool> {
    let stat = rustix::fs::stat(path).ok()?;
    Some(rustix::fs::FileType::from_raw_mode(stat.st_mode) == rustix::fs::FileType::Directory)
}

/// Writes `parts` to stderr (the command's output pipe), one `write` each: no allocation.
fn say(parts: &[&[u8]]) {
    for part in parts {
        let _ = rustix::io::write(rustix::stdio::stderr(), part);
    }
}

/// Says which step failed (`plinth-sandbox: cannot <step>`), for [`setup_error`].
fn cannot(step: &[&[u8]], error: Errno) -> Errno {
    say(&[CANNOT]);
    say(step);
    say(&[b"\n"]);
    error
}

/// A plain `fork` as the raw system call (no `atfork` handlers, no locks): `Some(child)` in
/// the parent, `None` in the child.
fn fork() -> Result<Option<rustix::process::Pid>, Errno> {
    // SAFETY: `clone` with only SIGCHLD is `fork`. Both processes go on running nothing but raw
    // system calls on memory that each now has its own copy of (see `enter`).
    #[allow(unsafe_code)]
    let pid = unsafe {
        libc::syscall(
            libc::SYS_clone,
            libc::c_long::from(libc::SIGCHLD),
            0,
            0,
            0,
            0,
        )
    };
    if pid == 0 {
        return Ok(None);
    }
    match i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    {
        Some(child) if pid > 0 => Ok(Some(child)),
        _ => Err(Errno::from_io_error(&std::io::Error::last_os_error()).unwrap_or(Errno::AGAIN)),
    }
}

/// Closes every descriptor but stdio: among them the write end of std's exec-status pipe,
/// which must close when D executes the command, not when the waiters exit.
fn close_inherited() {
    // SAFETY: plain system calls on descriptor numbers; nothing of this process uses the
    // descriptors afterwards (it only waits and exits).
    #[allow(unsafe_code)]
    unsafe {
        if libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32) != 0 {
            // Kernels before 5.9.
            for fd in 3..65_536 {
                libc::close(fd);
            }
        }
    }
}

/// Waits for `child`; its status as an exit code (128 + the signal if one killed it).
fn wait_for(child: rustix::process::Pid) -> i32 {
    loop {
        match rustix::process::waitpid(Some(child), rustix::process::WaitOptions::empty()) {
            Ok(Some((_, status))) => return exit_code(status),
            Ok(None) | Err(Errno::INTR) => {}
            Err(_) => return 1,
        }
    }
}

/// Waits for any child, reaping orphans, until `command` ends; its status as an exit code.
fn reap_until(command: rustix::process::Pid) -> i32 {
    loop {
        match rustix::process::wait(rustix::process::WaitOptions::empty()) {
            Ok(Some((pid, status))) if pid == command => return exit_code(status),
            Ok(_) | Err(Errno::INTR) => {}
            Err(_) => return 1,
        }
    }
}

fn exit_code(status: rustix::process::WaitStatus) -> i32 {
    status
        .exit_status()
        .or_else(|| status.terminating_signal().map(|signal| 128 + signal))
        .unwrap_or(1)
}

/// Ends this process at once (no `atexit` handlers, no buffers flushed: there are none of its
/// own between fork and exec).
fn exit(code: i32) -> ! {
    // SAFETY: `_exit` is async-signal-safe and touches no memory of the process.
    #[allow(unsafe_code)]
    unsafe {
        libc::_exit(code)
    }
}

fn path_is_under(path: &[u8], root: &[u8]) -> bool {
    path.strip_prefix(root)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with(b"/"))
}

/// A host mount point to re-mount read-only, with the per-mount flags to keep (a bind remount
/// sets every per-mount flag at once, so flags not named are cleared).
#[derive(Debug, PartialEq, Eq)]
struct HostMount {
    point: Vec<u8>,
    /// `nosuid`, `nodev` and `noexec` as the mount had them.
    flags: MountFlags,
}

/// The host's mount points from `/proc/self/mountinfo`, minus those the sandbox replaces
/// (`/env`, `/tmp`) or must leave alone (`/proc`, `/sys`, `/dev`: kernel interfaces and device
/// nodes, which nobody unprivileged can create files in anyway). Stacked mounts appear once.
fn host_mounts(mountinfo: &[u8]) -> Vec<HostMount> {
    let mut mounts: Vec<HostMount> = Vec::new();
    for line in mountinfo.split(|&byte| byte == b'\n') {
        let fields: Vec<&[u8]> = line.split(|&byte| byte == b' ').collect();
        let (Some(point), Some(options)) = (fields.get(4), fields.get(5)) else {
            continue;
        };
        let point = unescape_mountinfo(point);
        let skip = [ENV_ROOT.as_bytes(), b"/tmp", b"/proc", b"/sys", b"/dev"]
            .iter()
            .any(|root| path_is_under(&point, root));
        if skip || mounts.iter().any(|mount| mount.point == point) {
            continue;
        }
        let mut flags = MountFlags::empty();
        for option in options.split(|&byte| byte == b',') {
            flags |= match option {
                b"nosuid" => MountFlags::NOSUID,
                b"nodev" => MountFlags::NODEV,
                b"noexec" => MountFlags::NOEXEC,
                _ => MountFlags::empty(),
            };
        }
        mounts.push(HostMount { point, flags });
    }
    mounts
}

/// Decodes mountinfo's `\ooo` octal escapes (space, tab, newline, backslash).
fn unescape_mountinfo(field: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(field.len());
    let mut i = 0;
    while i < field.len() {
        let octal = field.get(i + 1..i + 4).filter(|digits| {
            field[i] == b'\\' && digits.iter().all(|digit| (b'0'..=b'7').contains(digit))
        });
        match octal {
            Some(digits) => {
                let value = digits
                    .iter()
                    .fold(0u32, |acc, digit| acc * 8 + u32::from(digit - b'0'));
                out.push(u8::try_from(value).unwrap_or(b'?'));
                i += 4;
            }
            None => {
                out.push(field[i]);
                i += 1;
            }
        }
    }
    out
}

/// Stops a sandbox past its time limit, returning once nothing of it runs. Killing the PID
/// namespace's first process (C, the child of the waiter P that the builder spawned) makes the
/// kernel kill every process in the namespace, and P, which waits for C, exits only after the
/// last one is gone. Should that not happen in time, or C not exist yet, the process group (P
/// and whatever did not leave it) is killed instead.
async fn stop(child: &mut tokio::process::Child) {
    use rustix::process::{Pid, Signal, kill_process, kill_process_group};
    let Some(pid) = child.id() else { return };
    let inits = children_of(pid);
    for init in &inits {
        // It may have exited already; then there is nothing to kill.
        let _ = kill_process(*init, Signal::KILL);
    }
    if !inits.is_empty()
        && tokio::time::timeout(TEARDOWN_GRACE, child.wait())
            .await
            .is_ok()
    {
        return;
    }
    if let Some(group) = i32::try_from(pid).ok().and_then(Pid::from_raw) {
        let _ = kill_process_group(group, Signal::KILL);
    }
    let _ = child.kill().await;
}

/// The processes whose parent is `parent`, from `/proc/<pid>/stat` (which every kernel has,
/// unlike `/proc/<pid>/task/<tid>/children`).
fn children_of(parent: u32) -> Vec<rustix::process::Pid> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| {
            let pid: i32 = entry.ok()?.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read(format!("/proc/{pid}/stat")).ok()?;
            (parent_of(&stat)? == parent).then_some(rustix::process::Pid::from_raw(pid)?)
        })
        .collect()
}

/// The parent pid in a `/proc/<pid>/stat` line: `pid (comm) state ppid …`, where `comm` may
/// hold spaces and parentheses, so fields are counted from the last `)`.
fn parent_of(stat: &[u8]) -> Option<u32> {
    let close = stat.iter().rposition(|&byte| byte == b')')?;
    let rest = std::str::from_utf8(&stat[close + 1..]).ok()?;
    rest.split_ascii_whitespace().nth(1)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slugs_are_one_safe_segment() {
        for good in ["content-studio", "a", "v1.2_x"] {
            assert!(validate_slug(good).is_ok(), "{good}");
        }
        for bad in ["", ".home", "-x", "a/b", "..", "a b", "é", "a'b"] {
            assert!(validate_slug(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn mountinfo_is_parsed_filtered_and_unescaped() {
        let info = b"27 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n\
            22 27 0:21 / /proc rw,relatime - proc proc rw\n\
            28 27 0:25 / /mnt/a\\040b ro,nosuid,nodev,relatime - tmpfs x ro\n\
            29 27 0:25 / /env/other ro - tmpfs x ro\n\
            30 27 0:25 / /tmp rw,noexec - tmpfs x rw\n\
            31 27 0:25 / /dev/shm rw - tmpfs x rw\n\
            32 27 0:26 / /mnt/a\\040b rw - tmpfs x rw\n\
            33 27 0:27 / /environment rw,noexec - tmpfs x rw\n";
        assert_eq!(
            host_mounts(info),
            vec![
                HostMount {
                    point: b"/".to_vec(),
                    flags: MountFlags::empty()
                },
                HostMount {
                    point: b"/mnt/a b".to_vec(),
                    flags: MountFlags::NOSUID | MountFlags::NODEV
                },
                HostMount {
                    point: b"/environment".to_vec(),
                    flags: MountFlags::NOEXEC
                },
            ]
        );
        assert_eq!(unescape_mountinfo(b"a\\134b\\011"), b"a\\b\t");
        assert_eq!(unescape_mountinfo(b"trailing\\"), b"trailing\\");
    }

    #[test]
    fn parents_are_read_from_stat_lines_with_odd_names() {
        assert_eq!(parent_of(b"42 (a b) c) S 7 42 42 0 -1"), Some(7));
        assert_eq!(parent_of(b"garbage"), None);
        let me = std::process::id();
        let child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .expect("sleep");
        let found = children_of(me);
        let child_pid = i32::try_from(child.id()).expect("pid");
        let mut child = child;
        let _ = child.kill();
        let _ = child.wait();
        assert!(
            found
                .iter()
                .any(|pid| pid.as_raw_nonzero().get() == child_pid)
        );
    }

    fn sandbox() -> Sandbox {
        Sandbox {
            slug: "demo".to_owned(),
            root: PathBuf::from("/scratch/it's"),
            home: PathBuf::from("/work/home"),
            tmp: PathBuf::from("/work/tmp"),
            uid: 65534,
            gid: 65534,
            hidden_paths: vec![PathBuf::from("/var/lib/plinth"), PathBuf::from("/env/x")],
            isolate_network: false,
            timeout: Duration::from_secs(1),
        }
    }

    #[test]
    fn the_plan_keeps_paths_exact_and_refuses_bad_input() {
        let argv = vec!["bash".to_owned(), "setup.sh".to_owned()];
        let env = vec![("A".to_owned(), "x y".to_owned())];
        let plan = sandbox()
            .plan(&host_mounts(b"1 0 1:1 / / rw - ext4 x rw\n"), &argv, &env)
            .expect("plan");
        assert_eq!(plan.root.as_bytes(), b"/scratch/it's");
        assert_eq!(plan.mount_path.as_bytes(), b"/env/demo");
        assert_eq!(plan.read_only.len(), 1);
        assert_eq!(plan.read_only[0].point.as_bytes(), b"/");
        assert!(plan.read_only[0].required, "/ must be made read-only");
        assert_eq!(
            plan.hidden,
            vec![CString::new("/var/lib/plinth").expect("path")],
            "paths under /env are covered already"
        );
        assert_eq!(
            plan.namespaces,
            UnshareFlags::NEWNS
                | UnshareFlags::NEWPID
                | UnshareFlags::NEWIPC
                | UnshareFlags::NEWUTS
        );
        let mut offline = sandbox();
        offline.isolate_network = true;
        let plan = offline.plan(&[], &argv, &env).expect("plan");
        assert!(plan.namespaces.contains(UnshareFlags::NEWNET));

        let bad_env = vec![("A=B".to_owned(), String::new())];
        assert!(sandbox().plan(&[], &argv, &bad_env).is_err());
        assert!(sandbox().plan(&[], &["X=1".to_owned()], &[]).is_err());
        assert!(sandbox().plan(&[], &["a\0b".to_owned()], &[]).is_err());
        assert!(sandbox().plan(&[], &[], &[]).is_err());
        let mut relative = sandbox();
        relative.home = PathBuf::from("home");
        assert!(matches!(
            relative.plan(&[], &argv, &[]),
            Err(SandboxError::RelativePath(_))
        ));
        let mut root_hidden = sandbox();
        root_hidden.hidden_paths = vec![PathBuf::from("/")];
        assert!(matches!(
            root_hidden.plan(&[], &argv, &[]),
            Err(SandboxError::InvalidHiddenPath(_))
        ));
    }

    #[test]
    fn a_failed_step_is_named_in_the_error() {
        let (reader, mut writer) = std::io::pipe().expect("pipe");
        std::io::Write::write_all(
            &mut writer,
            b"plinth-sandbox: warning: x\nplinth-sandbox: cannot mount a tmpfs on /env\n",
        )
        .expect("write");
        drop(writer);
        let error = setup_error(std::io::Error::from_raw_os_error(1), reader, "uv");
        assert!(
            matches!(&error, SandboxError::NotPermitted(text) if text.starts_with("cannot mount a tmpfs on /env: ")),
            "{error}"
        );
        let (reader, writer) = std::io::pipe().expect("pipe");
        drop(writer);
        let error = setup_error(std::io::Error::from_raw_os_error(2), reader, "uv");
        assert!(
            error
                .to_string()
                .contains("starting \"uv\" in the build sandbox"),
            "{error}"
        );
    }
}
