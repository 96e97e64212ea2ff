//! Starting a session's command without copying the node's address space:
//! `clone(CLONE_VM | CLONE_VFORK)`, as `posix_spawn` does, plus what `posix_spawn` cannot do
//! (enter the keeper's namespaces, drop to the session's uid, join the command's cgroup).
//!
//! Everything the child reads is prepared before `clone`, and every signal is blocked around
//! it; the child makes raw system calls only, allocates nothing and takes no lock, and a step
//! that fails is written to memory the parent reads, the child exiting with 127. The parent
//! reaps the child through a pidfd. The child joins its session's cgroup first, which cannot let
//! a session's OOM reach the node (the OOM killer never picks a `vfork` child sharing its
//! parent's memory).
//!
//! The steps in order, and what `fork` would cost: `docs/design/SANDBOX.md#starting-a-command`.

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};

use rustix::fs::{Mode, OFlags};
use rustix::process::{Pid, Signal, WaitId, WaitIdOptions};
use rustix::thread::LinkNameSpaceType;
use tokio::io::unix::AsyncFd;
use tokio::net::unix::pipe;

/// The child's stack: what it runs before `execve` is a few frames of system calls.
const STACK_BYTES: usize = 256 * 1024;

/// A child stack, mapped once per thread that starts commands (with a guard page below it: a
/// child overflowing its stack dies instead of writing into the node's memory).
/// `CLONE_VFORK` suspends that thread until its child has exec'd, so no two children ever run
/// on one stack.
type ChildStack = plinth_sandbox::keeper::Stack;

thread_local! {
    static STACK: std::cell::RefCell<Option<ChildStack>> = const { std::cell::RefCell::new(None) };
}

/// A command to start.
#[derive(Debug)]
pub struct Command {
    /// The program, and `argv` (its first element is `argv[0]`).
    pub argv: Vec<CString>,
    /// `NAME=value` entries: the whole environment.
    pub env: Vec<CString>,
    /// Where it starts.
    pub cwd: CString,
    /// The sandbox it runs in (its keeper's namespaces); `None` keeps the node's.
    pub namespace: Option<Arc<crate::session_sandbox::Sandbox>>,
    /// The cgroup it joins before anything else (its own, below its session's).
    pub cgroup: Option<plinth_sandbox::cgroup::SessionCgroup>,
    /// The system calls it may not make, installed last before `execve`.
    pub seccomp: Option<&'static plinth_sandbox::seccomp::Filter>,
    /// The uid and gid it runs as; `None` keeps the node's.
    pub uid: Option<u32>,
    /// A pseudo-terminal's slave: when given, it is the command's standard input, output and
    /// error and its controlling terminal (the command leads a session of its own rather
    /// than a process group), and no pipes are made.
    pub terminal: Option<OwnedFd>,
    /// Without a terminal: what the command reads as its standard input (a pipe's read end);
    /// `None` is `/dev/null`.
    pub stdin: Option<OwnedFd>,
}

/// Why a command did not start.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    /// Preparing it (pipes, `/dev/null`, `clone`) failed.
    #[error("{what}: {source}")]
    Prepare {
        /// What was being done.
        what: &'static str,
        /// The error.
        source: io::Error,
    },
    /// The child failed before `execve` replaced it.
    #[error("{step}: {source}")]
    Child {
        /// What the child was doing.
        step: &'static str,
        /// The kernel's answer.
        source: io::Error,
    },
}

impl SpawnError {
    /// The kernel's answer when the command could not change to its working directory (it
    /// does not exist as the session sees it, or is not a directory): the caller's `cwd` is
    /// at fault, not the node.
    pub fn cwd_failure(&self) -> Option<&io::Error> {
        match self {
            SpawnError::Child { step, source } if *step == STEPS[STEP_CWD] => Some(source),
            _ => None,
        }
    }
}

/// The index in [`STEPS`] of changing to the working directory.
const STEP_CWD: usize = 7;

fn prepare(what: &'static str) -> impl FnOnce(io::Error) -> SpawnError {
    move |source| SpawnError::Prepare { what, source }
}

/// What the child does, in the order it does it: the names of its steps.
const STEPS: [&str; 13] = [
    "resetting signals",
    "entering the session's sandbox",
    "starting a process group (a session, on a terminal)",
    "dropping supplementary groups",
    "switching to the session's gid",
    "switching to the session's uid",
    "setting up the process (death signal, no_new_privs)",
    "changing to the working directory",
    "connecting standard input and output",
    "dropping capabilities",
    "joining the command's cgroup",
    "installing the seccomp filter",
    "setting its oom_score_adj",
];
const STEP_EXEC: i32 = STEPS.len() as i32;

/// Everything the child reads, in the parent's memory (which the child shares).
struct Plan {
    program: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
    cwd: *const c_char,
    namespace: RawFd,
    /// `cgroup.procs` descriptors of the command's cgroup (`join_count` of them).
    join: [RawFd; 8],
    join_count: usize,
    seccomp: Option<&'static plinth_sandbox::seccomp::Filter>,
    uid: Option<u32>,
    stdin: RawFd,
    stdout: RawFd,
    stderr: RawFd,
    /// Whether stdin is a terminal to take as the controlling terminal.
    terminal: bool,
    /// The step that failed (`STEPS` index, or `STEP_EXEC`), and its errno; `failed_errno`
    /// stays 0 when the child reached `execve` and it succeeded.
    failed_step: AtomicI32,
    failed_errno: AtomicI32,
}

/// A started command.
#[derive(Debug)]
pub struct Child {
    pid: Pid,
    pidfd: Option<AsyncFd<OwnedFd>>,
    /// Its standard output.
    pub stdout: Option<pipe::Receiver>,
    /// Its standard error.
    pub stderr: Option<pipe::Receiver>,
}

impl Child {
    /// Its process id (also its process group's).
    pub fn pid(&self) -> Pid {
        self.pid
    }

    /// Waits for it to end and reaps it; answers its exit code (128 + the signal when a signal
    /// ended it).
    pub async fn wait(&mut self) -> io::Result<i32> {
        let Some(pidfd) = &self.pidfd else {
            return Err(io::Error::other("the command was reaped already"));
        };
        loop {
            let mut ready = pidfd.readable().await?;
            match rustix::process::waitid(
                WaitId::PidFd(pidfd.get_ref().as_fd()),
                WaitIdOptions::EXITED | WaitIdOptions::NOHANG,
            )? {
                Some(status) => {
                    self.pidfd = None;
                    return Ok(status
                        .exit_status()
                        .or_else(|| status.terminating_signal().map(|signal| 128 + signal))
                        .unwrap_or(-1));
                }
                None => ready.clear_ready(),
            }
        }
    }
}

impl Drop for Child {
    /// A command nobody waits for any more is killed and reaped.
    fn drop(&mut self) {
        let Some(pidfd) = self.pidfd.take() else {
            return;
        };
        let _ = rustix::process::kill_process(self.pid, Signal::KILL);
        let pidfd = pidfd.into_inner();
        let reap = move || {
            let _ = rustix::process::waitid(WaitId::PidFd(pidfd.as_fd()), WaitIdOptions::EXITED);
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn_blocking(reap)),
            Err(_) => reap(),
        }
    }
}

/// The node's own PID namespace, to return to after starting a session's command.
fn own_pid_namespace() -> io::Result<std::os::fd::BorrowedFd<'static>> {
    static OWN: std::sync::OnceLock<OwnedFd> = std::sync::OnceLock::new();
    if let Some(fd) = OWN.get() {
        return Ok(fd.as_fd());
    }
    let fd = rustix::fs::open(
        c"/proc/self/ns/pid",
        OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    Ok(OWN.get_or_init(|| fd).as_fd())
}

fn pointers(strings: &[CString]) -> Vec<*const c_char> {
    strings
        .iter()
        .map(|string| string.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect()
}

/// The ends of the pipes a command without a terminal gets.
struct Pipes {
    stdout_read: OwnedFd,
    stdout_write: OwnedFd,
    stderr_read: OwnedFd,
    stderr_write: OwnedFd,
    null: OwnedFd,
}

/// Starts `command` with stdin from `command.stdin` (else `/dev/null`) and stdout and stderr
/// on pipes, or with all
/// three on its terminal.
pub fn spawn(command: &Command) -> Result<Child, SpawnError> {
    let program: &CStr = command
        .argv
        .first()
        .ok_or_else(|| prepare("no program")(io::Error::from(io::ErrorKind::InvalidInput)))?;
    let pipes = match &command.terminal {
        Some(_) => None,
        None => Some(pipes()?),
    };
    let stdio = match (&command.terminal, &pipes) {
        (Some(terminal), _) => [terminal.as_raw_fd(); 3],
        (None, Some(pipes)) => [
            command
                .stdin
                .as_ref()
                .map_or(pipes.null.as_raw_fd(), AsRawFd::as_raw_fd),
            pipes.stdout_write.as_raw_fd(),
            pipes.stderr_write.as_raw_fd(),
        ],
        (None, None) => {
            return Err(prepare("connecting standard input and output")(
                io::Error::other("a command needs a terminal or pipes"),
            ));
        }
    };
    let mut join = [-1; 8];
    let join_fds = command
        .cgroup
        .as_ref()
        .map_or(&[][..], |cgroup| cgroup.join_fds());
    if join_fds.len() > join.len() {
        return Err(prepare("joining the command's cgroup")(io::Error::other(
            "more cgroup hierarchies than a command can join",
        )));
    }
    for (slot, fd) in join.iter_mut().zip(join_fds) {
        *slot = fd.as_raw_fd();
    }
    let join_count = join_fds.len();
    let argv = pointers(&command.argv);
    let envp = pointers(&command.env);
    let plan = Plan {
        program: program.as_ptr(),
        argv: argv.as_ptr(),
        envp: envp.as_ptr(),
        cwd: command.cwd.as_ptr(),
        namespace: command
            .namespace
            .as_ref()
            .map_or(-1, |sandbox| sandbox.keeper.pidfd().as_raw_fd()),
        join,
        join_count,
        seccomp: command.seccomp,
        uid: command.uid,
        stdin: stdio[0],
        stdout: stdio[1],
        stderr: stdio[2],
        terminal: command.terminal.is_some(),
        failed_step: AtomicI32::new(0),
        failed_errno: AtomicI32::new(0),
    };
    let top = STACK.with(|stack| {
        let mut stack = stack.borrow_mut();
        if stack.is_none() {
            *stack = Some(ChildStack::map(STACK_BYTES)?);
        }
        Ok::<_, io::Error>(stack.as_ref().map(ChildStack::top))
    });
    let top = match top {
        Ok(Some(top)) => top,
        Ok(None) => return Err(prepare("mapping a stack")(io::Error::other("no stack"))),
        Err(error) => return Err(prepare("mapping a stack")(error)),
    };
    let mut pidfd: c_int = -1;
    // The command must be a process of the session's PID namespace: this thread's children
    // are, from here until it returns to the node's below.
    let pid_namespace = match &command.namespace {
        Some(keeper) => {
            // A keeper that died leaves a namespace no process can be born in.
            let own = own_pid_namespace().map_err(prepare("opening the node's PID namespace"))?;
            rustix::thread::move_into_thread_name_spaces(
                keeper.keeper.pidfd(),
                rustix::thread::ThreadNameSpaceType::PROCESS_ID,
            )
            .map_err(|errno| prepare("entering the session's PID namespace")(errno.into()))?;
            Some(own)
        }
        None => None,
    };

    // SAFETY: `clone` with CLONE_VM | CLONE_VFORK suspends this thread until the child has
    // called `execve` or exited, so `plan`, the strings it points to and this thread's stack
    // mapping outlive every use the child makes of them. Every signal is blocked on this thread across the
    // call, so none is handled in the child before it resets dispositions; the old mask is
    // restored right after. `child` only makes system calls (see the module documentation).
    #[allow(unsafe_code)]
    let (pid, clone_error) = unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut old);
        let pid = libc::clone(
            child,
            top,
            libc::CLONE_VM | libc::CLONE_VFORK | libc::CLONE_PIDFD | libc::SIGCHLD,
            std::ptr::from_ref(&plan).cast_mut().cast::<c_void>(),
            &mut pidfd as *mut c_int,
        );
        let clone_error = io::Error::last_os_error();
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        (pid, clone_error)
    };
    if let Some(own) = pid_namespace {
        // Back to the node's PID namespace for whatever else this thread starts. It is the
        // thread's own active namespace, which setns always allows; should it still fail, the
        // thread's later children would be born in a session's namespace: stop the node
        // rather than risk that.
        if let Err(errno) =
            rustix::thread::move_into_link_name_space(own, Some(LinkNameSpaceType::ProcessID))
        {
            tracing::error!(%errno, "cannot return to the node's PID namespace after starting a command; stopping");
            std::process::abort();
        }
    }
    // The child has its own copies now; the parent keeps only the read ends.
    let pipes = pipes.map(|pipes| {
        drop((pipes.stdout_write, pipes.stderr_write, pipes.null));
        (pipes.stdout_read, pipes.stderr_read)
    });
    if pid < 0 {
        return Err(prepare("starting the process")(clone_error));
    }
    // SAFETY: CLONE_PIDFD wrote a new descriptor, owned by nobody else, into `pidfd`.
    #[allow(unsafe_code)]
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    let errno = plan.failed_errno.load(Ordering::SeqCst);
    if errno != 0 {
        // It exited with 127 before `execve`; reap it (it is gone already).
        let _ = rustix::process::waitid(WaitId::PidFd(pidfd.as_fd()), WaitIdOptions::EXITED);
        let step = plan.failed_step.load(Ordering::SeqCst);
        let step = usize::try_from(step)
            .ok()
            .and_then(|index| STEPS.get(index).copied())
            .unwrap_or("starting the program");
        return Err(SpawnError::Child {
            step,
            source: io::Error::from_raw_os_error(errno),
        });
    }
    let pid = Pid::from_raw(pid).ok_or_else(|| {
        prepare("starting the process")(io::Error::other("the kernel answered no process id"))
    })?;
    let registered = (|| {
        // SAFETY: an owned descriptor, which stays open and the same while the AsyncFd owns it.
        #[allow(unsafe_code)]
        let pidfd =
            unsafe { AsyncFd::register_with_interest(pidfd, tokio::io::Interest::READABLE) }
                .map_err(|error| io::Error::other(error.to_string()))?;
        let (stdout, stderr) = match pipes {
            Some((stdout, stderr)) => (
                Some(pipe::Receiver::from_owned_fd(stdout)?),
                Some(pipe::Receiver::from_owned_fd(stderr)?),
            ),
            None => (None, None),
        };
        Ok::<_, io::Error>((pidfd, stdout, stderr))
    })();
    match registered {
        Ok((pidfd, stdout, stderr)) => Ok(Child {
            pid,
            pidfd: Some(pidfd),
            stdout,
            stderr,
        }),
        Err(error) => {
            let _ = rustix::process::kill_process(pid, Signal::KILL);
            let _ = rustix::process::waitid(WaitId::Pid(pid), WaitIdOptions::EXITED);
            Err(prepare("watching the process")(error))
        }
    }
}

/// Pipes for stdout and stderr, and `/dev/null` for stdin.
fn pipes() -> Result<Pipes, SpawnError> {
    let (stdout_read, stdout_write) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
        .map_err(|errno| {
            prepare("making the output pipe")(io::Error::from_raw_os_error(errno.raw_os_error()))
        })?;
    let (stderr_read, stderr_write) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
        .map_err(|errno| {
            prepare("making the error pipe")(io::Error::from_raw_os_error(errno.raw_os_error()))
        })?;
    let null = rustix::fs::open(
        c"/dev/null",
        OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|errno| {
        prepare("opening /dev/null")(io::Error::from_raw_os_error(errno.raw_os_error()))
    })?;
    Ok(Pipes {
        stdout_read,
        stdout_write,
        stderr_read,
        stderr_write,
        null,
    })
}

/// The child's side, on its own stack in the node's memory, until `execve`.
extern "C" fn child(arg: *mut c_void) -> c_int {
    // SAFETY: `arg` is the parent's `Plan`, alive until this child execs or exits (vfork).
    #[allow(unsafe_code)]
    let plan = unsafe { &*arg.cast::<Plan>() };
    let failed = |step: i32, errno: i32| -> c_int {
        plan.failed_step.store(step, Ordering::SeqCst);
        plan.failed_errno.store(errno.max(1), Ordering::SeqCst);
        // SAFETY: ends this child only, without running anything of the parent's.
        #[allow(unsafe_code)]
        unsafe {
            libc::_exit(127)
        }
    };
    // SAFETY: only system calls on memory the parent prepared; see the module documentation.
    #[allow(unsafe_code)]
    unsafe {
        // 0: a fresh process's signals: every handled one at its default, SIGPIPE too, none
        // blocked. (Signals 32 and 33 belong to libc, which refuses them: nothing to reset.)
        for signal in 1..65 {
            if signal == libc::SIGKILL || signal == libc::SIGSTOP {
                continue;
            }
            let mut current: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(signal, std::ptr::null(), &mut current) != 0 {
                continue;
            }
            if current.sa_sigaction != libc::SIG_DFL
                && (current.sa_sigaction != libc::SIG_IGN || signal == libc::SIGPIPE)
            {
                let mut default: libc::sigaction = std::mem::zeroed();
                default.sa_sigaction = libc::SIG_DFL;
                if libc::sigaction(signal, &default, std::ptr::null_mut()) != 0 {
                    return failed(0, *libc::__errno_location());
                }
            }
        }
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        if libc::pthread_sigmask(libc::SIG_SETMASK, &none, std::ptr::null_mut()) != 0 {
            return failed(0, libc::EINVAL);
        }
    }
    if plan.namespace >= 0 {
        // A session's command: the OOM killer's pick before its keeper, and before the node
        // (see `plinth_sandbox::keeper`). This child's own: a `vfork` child's value is not
        // shared with its parent, and it keeps it across `execve`.
        let adjusted = rustix::fs::open(
            c"/proc/self/oom_score_adj",
            OFlags::WRONLY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .and_then(|file| {
            rustix::io::write(
                &file,
                plinth_sandbox::keeper::COMMAND_OOM_SCORE_ADJ.to_bytes(),
            )
        });
        if let Err(errno) = adjusted {
            return failed(12, errno.raw_os_error());
        }
    }
    for fd in &plan.join[..plan.join_count] {
        // SAFETY: the parent holds the cgroup's descriptors open across the clone.
        #[allow(unsafe_code)]
        let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(*fd) };
        if let Err(errno) = plinth_sandbox::cgroup::join(&[fd]) {
            return failed(10, errno.raw_os_error());
        }
    }
    if plan.namespace >= 0 {
        // SAFETY: the parent holds the namespace's descriptor open across the clone.
        #[allow(unsafe_code)]
        let namespace = unsafe { std::os::fd::BorrowedFd::borrow_raw(plan.namespace) };
        if let Err(errno) = rustix::thread::move_into_thread_name_spaces(
            namespace,
            rustix::thread::ThreadNameSpaceType::MOUNT
                | rustix::thread::ThreadNameSpaceType::INTER_PROCESS_COMMUNICATION
                | rustix::thread::ThreadNameSpaceType::HOST_NAME_AND_NIS_DOMAIN_NAME
                | rustix::thread::ThreadNameSpaceType::NETWORK
                | rustix::thread::ThreadNameSpaceType::CONTROL_GROUP,
        ) {
            return failed(1, errno.raw_os_error());
        }
    }
    // A terminal's command leads a session of its own (also a process group of its own), so
    // the terminal can become its controlling terminal below.
    let grouped = if plan.terminal {
        rustix::process::setsid().map(drop)
    } else {
        rustix::process::setpgid(None, None)
    };
    if let Err(errno) = grouped {
        return failed(2, errno.raw_os_error());
    }
    if let Some(uid) = plan.uid {
        // While still root (it takes CAP_SETPCAP): nothing the command runs can regain a
        // capability, set-uid programs included.
        for capability in 0..64 {
            match rustix::thread::remove_capability_from_bounding_set(
                rustix::thread::CapabilitySet::from_bits_retain(1 << capability),
            ) {
                Ok(()) => {}
                // Past the last capability this kernel knows.
                Err(rustix::io::Errno::INVAL) => break,
                Err(errno) => return failed(9, errno.raw_os_error()),
            }
        }
        // rustix's raw calls change only the calling task: this child, not the node.
        if let Err(errno) = rustix::thread::set_thread_groups(&[]) {
            return failed(3, errno.raw_os_error());
        }
        let gid = rustix::process::Gid::from_raw(uid);
        if let Err(errno) = rustix::thread::set_thread_res_gid(gid, gid, gid) {
            return failed(4, errno.raw_os_error());
        }
        let uid = rustix::process::Uid::from_raw(uid);
        if let Err(errno) = rustix::thread::set_thread_res_uid(uid, uid, uid) {
            return failed(5, errno.raw_os_error());
        }
    }
    if plan.uid.is_some() {
        // The uid change cleared the effective and permitted sets, not the inheritable one.
        let none = rustix::thread::CapabilitySet::empty();
        if let Err(errno) = rustix::thread::set_capabilities(
            None,
            rustix::thread::CapabilitySets {
                effective: none,
                permitted: none,
                inheritable: none,
            },
        ) {
            return failed(9, errno.raw_os_error());
        }
    }
    // After the uid change, which clears it.
    if let Err(errno) = rustix::process::set_parent_process_death_signal(Some(Signal::KILL))
        .and_then(|()| rustix::thread::set_no_new_privs(true))
    {
        return failed(6, errno.raw_os_error());
    }
    // SAFETY: `cwd` is a C string the parent keeps alive.
    #[allow(unsafe_code)]
    let cwd = unsafe { CStr::from_ptr(plan.cwd) };
    if let Err(errno) = rustix::process::chdir(cwd) {
        return failed(STEP_CWD as i32, errno.raw_os_error());
    }
    // SAFETY: system calls on descriptors the parent holds open across the clone; `execve`
    // reads only the parent's prepared, NUL-terminated arrays.
    #[allow(unsafe_code)]
    unsafe {
        for (from, to) in [(plan.stdin, 0), (plan.stdout, 1), (plan.stderr, 2)] {
            if libc::dup2(from, to) < 0 {
                return failed(8, *libc::__errno_location());
            }
        }
        // The session this child leads has no controlling terminal yet: its terminal is.
        if plan.terminal && libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
            return failed(8, *libc::__errno_location());
        }
        // Last: the filter refuses `setns`, which the steps above need.
        if let Some(filter) = plan.seccomp
            && let Err(errno) = filter.install()
        {
            return failed(11, errno.raw_os_error());
        }
        libc::execve(plan.program, plan.argv, plan.envp);
        failed(STEP_EXEC, *libc::__errno_location())
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncReadExt;

    use super::*;

    fn shell(script: &str, cwd: &str) -> Command {
        Command {
            argv: vec![
                c"/bin/sh".to_owned(),
                c"-c".to_owned(),
                CString::new(script).expect("script"),
            ],
            env: vec![c"PATH=/usr/bin:/bin".to_owned(), c"GREETING=hi".to_owned()],
            cwd: CString::new(cwd).expect("cwd"),
            namespace: None,
            cgroup: None,
            seccomp: None,
            uid: None,
            terminal: None,
            stdin: None,
        }
    }

    async fn run(command: &Command) -> (i32, String, String) {
        let mut child = spawn(command).expect("spawn");
        let (mut out, mut err) = (String::new(), String::new());
        let mut stdout = child.stdout.take().expect("stdout");
        let mut stderr = child.stderr.take().expect("stderr");
        let (read_out, read_err, code) = tokio::join!(
            stdout.read_to_string(&mut out),
            stderr.read_to_string(&mut err),
            child.wait()
        );
        read_out.expect("read stdout");
        read_err.expect("read stderr");
        (code.expect("wait"), out, err)
    }

    #[tokio::test]
    async fn a_command_gets_its_environment_directory_and_pipes_and_its_exit_code_is_reported() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().to_str().expect("utf-8");
        let (code, out, err) = run(&shell(
            "echo \"$GREETING from $(pwd)\"; echo oops >&2; read line || echo no-input; exit 3",
            path,
        ))
        .await;
        assert_eq!(code, 3);
        assert_eq!(out, format!("hi from {path}\nno-input\n"));
        assert_eq!(err, "oops\n");
    }

    #[tokio::test]
    async fn a_signal_is_reported_as_128_plus_it_and_sigpipe_is_at_its_default() {
        let (code, _, _) = run(&shell("kill -9 $$", "/")).await;
        assert_eq!(code, 128 + 9);
        // The node ignores SIGPIPE; a command must not: `yes` dies of it quietly instead of
        // complaining about a broken pipe.
        let (code, out, err) = run(&shell("yes | head -n 1", "/")).await;
        assert_eq!((code, out.as_str(), err.as_str()), (0, "y\n", ""));
    }

    #[tokio::test]
    async fn a_command_on_a_terminal_has_it_for_all_three_streams_and_as_its_controlling_terminal()
    {
        use rustix::pty::OpenptFlags;
        let flags = OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC;
        let master = rustix::pty::openpt(flags).expect("openpt");
        rustix::pty::unlockpt(&master).expect("unlockpt");
        let slave = rustix::pty::ioctl_tiocgptpeer(&master, flags).expect("slave");
        // It leads its own session (field 6 of its stat is its pid), and /dev/tty, its
        // controlling terminal, is ours.
        let mut command = shell(
            "test -t 0 && test -t 1 && test -t 2 && read -r _ _ _ _ _ sid _ < /proc/$$/stat && \
             [ \"$sid\" = \"$$\" ] && echo on-the-terminal > /dev/tty; exit 4",
            "/",
        );
        command.terminal = Some(slave);
        let mut child = spawn(&command).expect("spawn");
        // Only the command holds the slave now: the master reads EIO once it is gone.
        command.terminal = None;
        assert!(child.stdout.is_none() && child.stderr.is_none());
        let mut master = std::fs::File::from(master);
        let shown = tokio::task::spawn_blocking(move || {
            let mut shown = Vec::new();
            let _ = std::io::Read::read_to_end(&mut master, &mut shown);
            String::from_utf8_lossy(&shown).into_owned()
        });
        assert_eq!(child.wait().await.expect("wait"), 4);
        let shown = shown.await.expect("joined");
        assert!(shown.contains("on-the-terminal"), "{shown:?}");
    }

    #[tokio::test]
    async fn a_failure_before_exec_names_its_step_and_leaves_no_process() {
        let error = spawn(&shell("true", "/nonexistent/plinth")).expect_err("no such directory");
        assert!(
            error
                .to_string()
                .starts_with("changing to the working directory: "),
            "{error}"
        );
        let mut missing = shell("true", "/");
        missing.argv[0] = c"/nonexistent/sh".to_owned();
        let error = spawn(&missing).expect_err("no such program");
        assert!(error.to_string().contains("No such file"), "{error}");
        // Both children were reaped: nothing is left to wait for.
        assert!(matches!(
            rustix::process::waitpid(None, rustix::process::WaitOptions::NOHANG),
            Err(rustix::io::Errno::CHILD) | Ok(None)
        ));
    }
}
