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
//! - A new PID namespace whose first process is the (root) setup shell, waiting for the command:
//!   the command sees only its own processes, and when the command ends, times out or the
//!   builder drops the run, the namespace's first process ends and the kernel kills every
//!   process left in it, daemons and `setsid` escapees included. A timeout returns only once
//!   they are all gone. IPC and UTS namespaces are private too, and with `isolate_network` so is the network (only
//!   a loopback that is down: no network at all).
//! - It runs as `uid:gid` with no supplementary groups, no capabilities (bounding set emptied)
//!   and `no_new_privs` (set-uid binaries cannot raise it), with exactly the environment it is
//!   given: nothing of the builder's own environment is inherited.
//!
//! Mechanism: the builder runs as root and uses util-linux (`unshare`, `mount`, `setpriv`) and
//! `env` from coreutils. The workspace denies `unsafe_code`, and doing this with raw syscalls
//! needs `pre_exec`/`fork` (unsafe). The tools cost ~5 ms more per command than syscalls would
//! (PERFORMANCE.md); a build runs a handful of commands that take seconds each and is not
//! latency-critical (session attach is, and lives in the node agent), so the tools are the right
//! trade here. Every path and value put into the setup script is single-quoted byte for byte.
//!
//! The host keeps one trace: an empty `/env` directory, created as the tmpfs's mount point.
//!
//! Limits: no CPU, memory or disk quota (that needs cgroups, which the deployment provides); the
//! host's file system stays *readable* wherever the uid's permissions allow (hide what matters
//! with `hidden_paths`); with the network on, the command reaches whatever the host reaches.

use std::ffi::OsString;
use std::io::Read;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use tokio::sync::mpsc;

/// Where environments are mounted; inside the sandbox, a private tmpfs.
pub const ENV_ROOT: &str = "/env";
/// The command's `HOME` inside the sandbox.
pub const HOME: &str = "/env/.home";

/// PATH for the setup script itself (not the command): where util-linux and coreutils live.
const SYSTEM_PATH: &str = "/usr/sbin:/usr/bin:/sbin:/bin";
/// The setup script prints this just before it hands over to the command: output before it
/// is the setup's own, and its absence means the sandbox was never set up.
const READY: &[u8] = b"plinth-sandbox: ready\n";
/// At most this much setup output is kept for an error message.
const SETUP_OUTPUT_CAP: usize = 64 * 1024;
/// How long to wait for the output pipe to close once the sandbox is dead.
const DRAIN_AFTER_KILL: Duration = Duration::from_secs(5);
/// How long a killed namespace may take to empty before `unshare` is killed outright.
const TEARDOWN_GRACE: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error(
        "the build sandbox is not permitted here: {0}. Run the builder as root (in a container: \
         with CAP_SYS_ADMIN, CAP_SETUID, CAP_SETGID, CAP_CHOWN and a seccomp/AppArmor profile \
         that allows unshare and mount)"
    )]
    NotPermitted(String),
    #[error("{tool} was not found; the build sandbox needs util-linux (unshare, mount, setpriv)")]
    ToolMissing { tool: &'static str },
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
        let script = self.script(&host_mounts(&mounts), argv, env)?;

        let (reader, writer) = std::io::pipe().map_err(SandboxError::io("creating a pipe"))?;
        let stderr = writer
            .try_clone()
            .map_err(SandboxError::io("creating a pipe"))?;
        let mut command = tokio::process::Command::new("unshare");
        command
            .args([
                "--mount",
                "--propagation",
                "private",
                "--pid",
                "--fork",
                "--kill-child",
                "--mount-proc",
                "--ipc",
                "--uts",
            ])
            .args(self.isolate_network.then_some("--net"))
            .arg("--")
            .arg("/bin/sh")
            .arg("-c")
            .arg(OsString::from_vec(script))
            .env_clear()
            .env("PATH", SYSTEM_PATH)
            .env("LANG", "C.UTF-8")
            .current_dir("/")
            .stdin(Stdio::null())
            .stdout(writer)
            .stderr(stderr)
            // Its own process group, the fallback for a timeout; and if this future is dropped,
            // `unshare` dies and `--kill-child` takes the namespace down with it (the signal goes
            // to the setup shell, which stays root: a uid change would clear it).
            .process_group(0)
            .kill_on_drop(true);
        let spawned = command.spawn();
        // The command holds our copies of the pipe's write end: drop them, or EOF never comes.
        drop(command);
        let mut child = match spawned {
            Ok(child) => child,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                return Err(SandboxError::ToolMissing { tool: "unshare" });
            }
            Err(error) => return Err(SandboxError::io("starting unshare")(error)),
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

        let mut setup = SetupOutput::default();
        let mut pass = |chunk: &[u8], setup: &mut SetupOutput| {
            if let Some(after) = setup.feed(chunk)
                && !after.is_empty()
            {
                output(&after);
            }
        };
        let deadline = tokio::time::sleep(self.timeout);
        tokio::pin!(deadline);
        let mut status = None;
        let mut eof = false;
        while status.is_none() || !eof {
            tokio::select! {
                chunk = received.recv(), if !eof => match chunk {
                    Some(chunk) => pass(&chunk, &mut setup),
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
                            pass(&chunk, &mut setup);
                        }
                    })
                    .await;
                    return Err(SandboxError::TimedOut { limit: self.timeout });
                }
            }
        }
        let _ = reader_task.await;
        let status = status.ok_or_else(|| SandboxError::Setup("no exit status".to_owned()))?;
        if !setup.ready {
            let text = String::from_utf8_lossy(&setup.before).trim().to_owned();
            let text = if text.is_empty() {
                format!("the sandbox exited with status {}", status_code(status))
            } else {
                text
            };
            return Err(
                if text.contains("not permitted") || text.contains("ermission denied") {
                    SandboxError::NotPermitted(text)
                } else if text.contains("setpriv: not found") {
                    SandboxError::ToolMissing { tool: "setpriv" }
                } else {
                    SandboxError::Setup(text)
                },
            );
        }
        Ok(status)
    }

    /// The shell script that sets the namespace up and then becomes the command. `mounts` are
    /// the host's mount points (with their options) to make read-only.
    fn script(
        &self,
        mounts: &[HostMount],
        argv: &[String],
        env: &[(String, String)],
    ) -> Result<Vec<u8>, SandboxError> {
        let Some(program) = argv.first() else {
            return Err(SandboxError::InvalidCommand("empty command".to_owned()));
        };
        // `env` reads leading NAME=VALUE words as assignments, so the program cannot hold '='.
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
        let mount_path = self.mount_path();

        let mut s = Script::default();
        s.line(b"set -e");
        s.line(b"fail() { echo \"plinth-sandbox: $*\" >&2; exit 1; }");
        s.line(b"warn() { echo \"plinth-sandbox: warning: $*\" >&2; }");
        // /env first, while the host's paths are still reachable (a hidden path may contain
        // the scratch directory), then the rest of the host read-only, then the hidden paths.
        s.words(&[
            b"mount -t tmpfs -o mode=0755,nosuid,nodev,size=1m plinth-env",
            &quote(ENV_ROOT.as_bytes()),
            b"|| fail 'cannot mount a tmpfs on /env'",
        ]);
        s.words(&[
            b"mkdir",
            &quote(mount_path.as_bytes()),
            &quote(HOME.as_bytes()),
        ]);
        s.bind(self.root.as_os_str().as_bytes(), mount_path.as_bytes());
        s.bind(self.home.as_os_str().as_bytes(), HOME.as_bytes());
        s.words(&[
            b"mount -o remount,bind,ro",
            &quote(ENV_ROOT.as_bytes()),
            b"|| fail 'cannot make /env read-only'",
        ]);
        s.bind(self.tmp.as_os_str().as_bytes(), b"/tmp");
        s.line(
            b"if [ -d /dev/shm ]; then mount -t tmpfs -o nosuid,nodev,mode=1777,size=64m \
              plinth-shm /dev/shm || fail 'cannot mount a tmpfs on /dev/shm'; fi",
        );
        for mount in mounts {
            let options = format!("remount,bind,ro{}", mount.flags);
            let point = quote(&mount.point);
            if mount.point == b"/" {
                s.words(&[
                    b"mount -o",
                    options.as_bytes(),
                    &point,
                    b"|| fail 'cannot make / read-only'",
                ]);
            } else {
                s.words(&[
                    b"mount -o",
                    options.as_bytes(),
                    &point,
                    b"|| warn 'could not make'",
                    &point,
                    b"read-only",
                ]);
            }
        }
        for hidden in &self.hidden_paths {
            let path = hidden.as_os_str().as_bytes();
            if path_is_under(path, ENV_ROOT.as_bytes()) || path_is_under(path, b"/tmp") {
                continue;
            }
            let path = quote(path);
            s.words(&[
                b"if [ -d",
                &path,
                b"]; then mount -t tmpfs -o ro,nosuid,nodev,noexec,mode=000,size=4k plinth-hidden",
                &path,
                b"|| fail 'cannot hide'",
                &path,
                b"; elif [ -e",
                &path,
                b"]; then mount --bind /dev/null",
                &path,
                b"|| fail 'cannot hide'",
                &path,
                b"; fi",
            ]);
        }
        s.line(b"command -v setpriv > /dev/null || fail 'setpriv: not found'");
        s.words(&[b"cd", &quote(mount_path.as_bytes())]);
        s.words(&[b"printf '%s'", &quote(READY)]);
        let uid = format!("--reuid={}", self.uid);
        let gid = format!("--regid={}", self.gid);
        let mut exec: Vec<Vec<u8>> = vec![
            // Not `exec`: the root shell stays the namespace's first process (see `stop`).
            b"setpriv".to_vec(),
            uid.into_bytes(),
            gid.into_bytes(),
            b"--clear-groups --inh-caps=-all --bounding-set=-all --no-new-privs -- env -i".to_vec(),
        ];
        exec.extend(
            env.iter()
                .map(|(name, value)| quote(format!("{name}={value}").as_bytes())),
        );
        exec.extend(argv.iter().map(|arg| quote(arg.as_bytes())));
        let exec: Vec<&[u8]> = exec.iter().map(Vec::as_slice).collect();
        s.words(&exec);
        Ok(s.0)
    }
}

/// The setup script, built from bytes (host paths need not be UTF-8).
#[derive(Default)]
struct Script(Vec<u8>);

impl Script {
    fn line(&mut self, line: &[u8]) {
        self.0.extend_from_slice(line);
        self.0.push(b'\n');
    }

    fn words(&mut self, words: &[&[u8]]) {
        self.line(&words.join(&b' '));
    }

    fn bind(&mut self, from: &[u8], to: &[u8]) {
        let to = quote(to);
        self.words(&[
            b"mount --bind",
            &quote(from),
            &to,
            b"|| fail 'cannot bind-mount'",
            &to,
        ]);
    }
}

/// `bytes` as one shell word: single-quoted, each `'` written as `'\''`.
pub(crate) fn quote(bytes: &[u8]) -> Vec<u8> {
    let mut quoted = Vec::with_capacity(bytes.len() + 2);
    quoted.push(b'\'');
    for &byte in bytes {
        if byte == b'\'' {
            quoted.extend_from_slice(b"'\\''");
        } else {
            quoted.push(byte);
        }
    }
    quoted.push(b'\'');
    quoted
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
    /// `,nosuid,nodev,noexec` as the mount had them.
    flags: String,
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
        let mut flags = String::new();
        for option in options.split(|&byte| byte == b',') {
            for kept in ["nosuid", "nodev", "noexec"] {
                if option == kept.as_bytes() {
                    flags.push(',');
                    flags.push_str(kept);
                }
            }
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
/// namespace's first process (the setup shell, `unshare`'s child) makes the kernel kill every
/// process in the namespace, and `unshare`, which waits for that child, exits only after the
/// last one is gone. Should that not happen in time, or the child not exist yet, the process
/// group (`unshare` and whatever did not leave it) is killed instead.
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

/// Separates the setup script's output from the command's at the [`READY`] marker.
#[derive(Default)]
struct SetupOutput {
    ready: bool,
    before: Vec<u8>,
}

impl SetupOutput {
    /// Takes a chunk; returns the part that belongs to the command's output (setup warnings
    /// included once the sandbox is known to be up), or `None` while still in setup.
    fn feed<'a>(&'a mut self, chunk: &'a [u8]) -> Option<std::borrow::Cow<'a, [u8]>> {
        if self.ready {
            return Some(std::borrow::Cow::Borrowed(chunk));
        }
        self.before.extend_from_slice(chunk);
        let found = self
            .before
            .windows(READY.len())
            .position(|window| window == READY);
        match found {
            Some(at) => {
                self.ready = true;
                let mut passed = self.before[..at].to_vec();
                passed.extend_from_slice(&self.before[at + READY.len()..]);
                self.before.clear();
                Some(std::borrow::Cow::Owned(passed))
            }
            None => {
                if self.before.len() > SETUP_OUTPUT_CAP {
                    let excess = self.before.len() - SETUP_OUTPUT_CAP;
                    self.before.drain(..excess);
                }
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_survives_the_shell() {
        for text in ["plain", "it's", "a b", "$(touch /x)", "'\\''", "\n", ""] {
            let script = [b"printf '%s' ".as_slice(), &quote(text.as_bytes())].concat();
            let out = std::process::Command::new("/bin/sh")
                .arg("-c")
                .arg(OsString::from_vec(script))
                .output()
                .expect("sh");
            assert_eq!(String::from_utf8_lossy(&out.stdout), text);
        }
    }

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
                    flags: String::new()
                },
                HostMount {
                    point: b"/mnt/a b".to_vec(),
                    flags: ",nosuid,nodev".to_owned()
                },
                HostMount {
                    point: b"/environment".to_vec(),
                    flags: ",noexec".to_owned()
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

    #[test]
    fn setup_output_is_split_at_the_marker_even_across_chunks() {
        let mut setup = SetupOutput::default();
        assert!(
            setup
                .feed(b"plinth-sandbox: warning: x\nplinth-san")
                .is_none()
        );
        let passed = setup.feed(b"dbox: ready\nhello").expect("ready");
        assert_eq!(&*passed, b"plinth-sandbox: warning: x\nhello");
        assert_eq!(
            &*setup.feed(b"plinth-sandbox: ready\n").expect("ready"),
            READY
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
    fn the_script_quotes_paths_and_refuses_bad_input() {
        let argv = vec!["bash".to_owned(), "setup.sh".to_owned()];
        let env = vec![("A".to_owned(), "x y".to_owned())];
        let script = sandbox()
            .script(&host_mounts(b"1 0 1:1 / / rw - ext4 x rw\n"), &argv, &env)
            .expect("script");
        let script = String::from_utf8(script).expect("utf-8");
        assert!(script.contains("mount --bind '/scratch/it'\\''s' '/env/demo'"));
        assert!(script.contains("mount -o remount,bind,ro '/' || fail"));
        assert!(script.contains("plinth-hidden '/var/lib/plinth'"));
        assert!(
            !script.contains("'/env/x'"),
            "paths under /env are covered already"
        );
        assert!(
            script.ends_with("env -i 'A=x y' 'bash' 'setup.sh'\n"),
            "{script}"
        );

        let bad_env = vec![("A=B".to_owned(), String::new())];
        assert!(sandbox().script(&[], &argv, &bad_env).is_err());
        assert!(sandbox().script(&[], &["X=1".to_owned()], &[]).is_err());
        assert!(sandbox().script(&[], &[], &[]).is_err());
        let mut relative = sandbox();
        relative.home = PathBuf::from("home");
        assert!(matches!(
            relative.script(&[], &argv, &[]),
            Err(SandboxError::RelativePath(_))
        ));
        let mut root_hidden = sandbox();
        root_hidden.hidden_paths = vec![PathBuf::from("/")];
        assert!(matches!(
            root_hidden.script(&[], &argv, &[]),
            Err(SandboxError::InvalidHiddenPath(_))
        ));
    }
}
