//! A sandbox's keeper: the first process of its PID namespace, owner of its mount, IPC, UTS
//! and network namespaces, and the reaper of whatever is orphaned inside.
//!
//! The node starts one per session ([`Keeper::start`]) with `clone(CLONE_VM | CLONE_VFORK |
//! CLONE_NEW…)`, making raw system calls only until it runs the keeper's program (`reaper/main.rs`,
//! from a sealed memfd), which only reaps orphans. Nothing of the node lives in a session's
//! cgroup; the keeper stays root of the host's user namespace, so the sandbox's processes can
//! neither signal, trace nor read it, and commands get [`COMMAND_OOM_SCORE_ADJ`] so an OOM kills
//! them rather than the namespaces. Commands join it by `setns` on its pidfd; killing it
//! ([`Keeper::kill`]) kills every process of the sandbox.
//!
//! How it starts, and why an OOM in the session cannot reach the node:
//! `docs/design/SANDBOX.md#the-keeper`.

use std::ffi::{CStr, c_char, c_int, c_void};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};

use rustix::io::Errno;
use rustix::process::{Signal, WaitId, WaitIdOptions};

use crate::root::{Failure, RootPlan};

/// The keeper's stack until `execve`: root building is a few frames of system calls.
const STACK_BYTES: usize = 128 * 1024;
/// A page below it that faults, so an overflow cannot write into the node's memory.
const GUARD_BYTES: usize = 4096;

/// The keeper's program (`reaper/main.rs`), compiled for this target by `build.rs`.
static PROGRAM: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/plinth-keeper"));

/// The namespaces a keeper owns.
pub const NAMESPACES: c_int = libc::CLONE_NEWPID
    | libc::CLONE_NEWNS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWNET;

/// The keeper's `oom_score_adj`: never the OOM killer's pick (it holds a few KiB; killing it
/// would end the session's namespaces instead of freeing what its commands hold).
const KEEPER_OOM_SCORE_ADJ: &str = "-1000";

/// The `oom_score_adj` of a session's commands (set by the node as it starts them): within
/// the session's cgroup the OOM killer picks any of them before the keeper, whatever their
/// size, and on a host out of memory, a session's command before the node.
pub const COMMAND_OOM_SCORE_ADJ: &CStr = c"500";

/// Why a keeper could not be started.
#[derive(Debug, thiserror::Error)]
pub enum KeeperError {
    /// The node could not prepare it.
    #[error("starting the session's sandbox: {0}")]
    Start(io::Error),
    /// A step of building its root failed.
    #[error("building the session's sandbox failed while {what} {path}: {errno}")]
    Root {
        /// What was being done.
        what: &'static str,
        /// To what.
        path: String,
        /// The kernel's answer.
        errno: Errno,
    },
    /// It set up its root but could not finish.
    #[error("the session's sandbox failed while {0}: {1}")]
    Setup(&'static str, Errno),
}

/// What the keeper reads, in the node's memory (which it shares until `execve`).
struct Plan<'a> {
    root: &'a RootPlan,
    /// `cgroup.procs` of the session's cgroup: the keeper joins it before anything else.
    join: &'a [OwnedFd],
    /// A network namespace made ahead to enter, instead of a new one.
    network: RawFd,
    /// The keeper's program, a memfd.
    program: RawFd,
    argv: [*const c_char; 2],
    envp: [*const c_char; 1],
    /// Set before the keeper exits on a failure: a root step (`< ROOT_DONE`) or a later one.
    failed_step: AtomicUsize,
    failed_errno: AtomicI32,
}

/// The steps after the root, as `failed_step` values (`ROOT_DONE + index`).
const ROOT_DONE: usize = 1 << 20;
const LATER_STEPS: [&str; 7] = [
    "naming its host",
    "bringing its loopback up",
    "starting its program",
    "joining the session's cgroup",
    "making its cgroup namespace",
    "entering its network namespace",
    "asking to be killed with the node",
];
const STEP_HOST: usize = ROOT_DONE;
const STEP_LOOPBACK: usize = ROOT_DONE + 1;
const STEP_EXEC: usize = ROOT_DONE + 2;
const STEP_CGROUP: usize = ROOT_DONE + 3;
const STEP_CGROUP_NS: usize = ROOT_DONE + 4;
const STEP_NETWORK: usize = ROOT_DONE + 5;
const STEP_DEATH_SIGNAL: usize = ROOT_DONE + 6;

/// A running keeper.
#[derive(Debug)]
pub struct Keeper {
    pidfd: OwnedFd,
    pid: rustix::process::Pid,
}

/// A stack for a child that runs in the parent's memory (`clone(CLONE_VM …)`), with a page
/// below it that faults, so an overflow cannot write into the parent's memory. The node's
/// command starter and the keeper both run their children on one.
#[derive(Debug)]
pub struct Stack {
    base: *mut c_void,
    bytes: usize,
}

// SAFETY: the mapping is owned by one value and only unmapped by its `Drop`, after the child
// using it is gone (its owners guarantee that); nothing else touches it.
#[allow(unsafe_code)]
unsafe impl Send for Stack {}
// SAFETY: as above; shared references never touch the mapping.
#[allow(unsafe_code)]
unsafe impl Sync for Stack {}

impl Stack {
    /// Maps a stack of `bytes` (plus its guard page).
    pub fn map(bytes: usize) -> io::Result<Self> {
        use rustix::mm::{MapFlags, MprotectFlags, ProtFlags};
        // SAFETY: a fresh anonymous mapping owned by this value; its lowest page is made
        // inaccessible before anything runs on it.
        #[allow(unsafe_code)]
        unsafe {
            let base = rustix::mm::mmap_anonymous(
                std::ptr::null_mut(),
                bytes + GUARD_BYTES,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::PRIVATE,
            )?;
            if let Err(error) = rustix::mm::mprotect(base, GUARD_BYTES, MprotectFlags::empty()) {
                let _ = rustix::mm::munmap(base, bytes + GUARD_BYTES);
                return Err(error.into());
            }
            Ok(Stack { base, bytes })
        }
    }

    /// Its top, 16-byte aligned (it grows down): what `clone` takes.
    pub fn top(&self) -> *mut c_void {
        ((self.base as usize + GUARD_BYTES + self.bytes) & !15) as *mut c_void
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        // SAFETY: unmapped once, after the child that ran on it is gone (see `Stack`).
        #[allow(unsafe_code)]
        unsafe {
            let _ = rustix::mm::munmap(self.base, self.bytes + GUARD_BYTES);
        }
    }
}

/// The keeper's program, written once into a sealed memfd (nothing can change it after), which
/// keepers `execveat` whatever mount namespace they are in by then.
fn program() -> io::Result<BorrowedFd<'static>> {
    static MEMFD: OnceLock<OwnedFd> = OnceLock::new();
    if let Some(fd) = MEMFD.get() {
        return Ok(fd.as_fd());
    }
    use rustix::fs::{MemfdFlags, SealFlags};
    let flags = MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING;
    // MFD_EXEC (Linux 6.3) says it is to be executed where `vm.memfd_noexec` asks for that;
    // older kernels refuse the flag, and execute any memfd.
    let fd = match rustix::fs::memfd_create(c"plinth-keeper", flags | MemfdFlags::EXEC) {
        Err(Errno::INVAL) => rustix::fs::memfd_create(c"plinth-keeper", flags)?,
        made => made?,
    };
    let mut written = 0;
    while written < PROGRAM.len() {
        match rustix::io::write(&fd, &PROGRAM[written..]) {
            Ok(count) => written += count,
            Err(Errno::INTR) => {}
            Err(errno) => return Err(errno.into()),
        }
    }
    rustix::fs::fchmod(&fd, rustix::fs::Mode::from_raw_mode(0o500))?;
    rustix::fs::fcntl_add_seals(
        &fd,
        SealFlags::WRITE | SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL,
    )?;
    Ok(MEMFD.get_or_init(|| fd).as_fd())
}

impl Keeper {
    /// Starts a keeper whose sandbox has the root `root`, in the cgroup whose `cgroup.procs`
    /// descriptors are `join` (see [`crate::cgroup::SessionCgroup::join_fds`]; the sandbox's
    /// cgroup namespace is rooted there), and returns once it runs its program. Call it from
    /// a thread that lives as long as the node (the keeper is killed when the thread that
    /// started it ends: the parent-death signal follows the thread).
    ///
    /// `network`, when given, is a network namespace made ahead (see
    /// [`crate::egress::SpareNetworks`]) the keeper enters instead of making one: making one
    /// is the slowest part of a sandbox while the kernel tears others down.
    pub fn start(
        root: &RootPlan,
        join: &[OwnedFd],
        network: Option<BorrowedFd<'_>>,
    ) -> Result<Keeper, KeeperError> {
        let program = program().map_err(KeeperError::Start)?;
        let stack = Stack::map(STACK_BYTES).map_err(KeeperError::Start)?;
        let name: &CStr = c"plinth-keeper";
        let plan = Plan {
            root,
            join,
            network: network.map_or(-1, |fd| fd.as_raw_fd()),
            program: program.as_raw_fd(),
            argv: [name.as_ptr(), std::ptr::null()],
            envp: [std::ptr::null()],
            failed_step: AtomicUsize::new(0),
            failed_errno: AtomicI32::new(0),
        };
        let mut pidfd: c_int = -1;
        // SAFETY: `clone` with CLONE_VM | CLONE_VFORK suspends this thread until the child
        // has called `execve` or exited, so `plan`, what it points to and `stack` outlive
        // every use the child makes of them. Every signal is blocked on this thread across
        // the call, so no handler of the node runs in the child (it keeps them blocked until
        // its program sets its own mask); the old mask is restored right after. `keeper` only
        // makes system calls.
        #[allow(unsafe_code)]
        let (pid, error) = unsafe {
            let mut all: libc::sigset_t = std::mem::zeroed();
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut all);
            libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut old);
            let pid = libc::clone(
                keeper,
                stack.top(),
                libc::CLONE_VM
                    | libc::CLONE_VFORK
                    | libc::CLONE_PIDFD
                    | libc::SIGCHLD
                    | if network.is_some() {
                        NAMESPACES & !libc::CLONE_NEWNET
                    } else {
                        NAMESPACES
                    },
                std::ptr::from_ref(&plan).cast_mut().cast::<c_void>(),
                &mut pidfd as *mut c_int,
            );
            let error = io::Error::last_os_error();
            libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
            (pid, error)
        };
        // The child runs its own program now, or is gone: its stack is free.
        drop(stack);
        if pid < 0 {
            return Err(KeeperError::Start(error));
        }
        // SAFETY: CLONE_PIDFD wrote a new descriptor, owned by nobody else, into `pidfd`.
        #[allow(unsafe_code)]
        let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
        let pid = rustix::process::Pid::from_raw(pid)
            .ok_or_else(|| KeeperError::Start(io::Error::other("no process id")))?;
        let errno = plan.failed_errno.load(Ordering::SeqCst);
        if errno != 0 {
            // It exited before `execve`: reap it, then say why.
            let _ = rustix::process::waitid(WaitId::PidFd(pidfd.as_fd()), WaitIdOptions::EXITED);
            let step = plan.failed_step.load(Ordering::SeqCst);
            let errno = Errno::from_raw_os_error(errno);
            return Err(if step >= ROOT_DONE {
                KeeperError::Setup(
                    LATER_STEPS[(step - ROOT_DONE).min(LATER_STEPS.len() - 1)],
                    errno,
                )
            } else {
                let (what, path) = root
                    .steps
                    .get(step)
                    .map_or(("building the root", c"?"), |step| step.describe());
                KeeperError::Root {
                    what,
                    path: path.to_string_lossy().into_owned(),
                    errno,
                }
            });
        }
        let keeper = Keeper { pidfd, pid };
        // Its own memory now: its `oom_score_adj` is its own (it no longer shares the node's).
        // Lowering it takes CAP_SYS_RESOURCE, which a node in a container may lack: the
        // keeper then keeps the node's, and the commands' higher one still makes them the
        // OOM killer's pick before it.
        let adjusted = std::fs::write(
            format!("/proc/{}/oom_score_adj", pid.as_raw_nonzero()),
            KEEPER_OOM_SCORE_ADJ,
        );
        match adjusted {
            Ok(()) => {}
            Err(error) if error.kind() == io::ErrorKind::PermissionDenied => {
                static SAID: std::sync::Once = std::sync::Once::new();
                SAID.call_once(|| {
                    tracing::info!("keepers keep the node's oom_score_adj: the node lacks CAP_SYS_RESOURCE to lower it");
                });
            }
            // `keeper` is killed and reaped as it drops.
            Err(error) => return Err(KeeperError::Start(error)),
        }
        Ok(keeper)
    }

    /// Its pidfd: the handle commands enter its namespaces through.
    pub fn pidfd(&self) -> BorrowedFd<'_> {
        self.pidfd.as_fd()
    }

    /// Its process id, as the node sees it.
    pub fn pid(&self) -> rustix::process::Pid {
        self.pid
    }

    /// Kills the keeper, and with it every process of the sandbox; returns once all are gone.
    /// Blocks for as long as the kernel takes to empty the namespace (milliseconds).
    pub fn kill(&self) {
        let _ = rustix::process::pidfd_send_signal(&self.pidfd, Signal::KILL);
        while let Err(Errno::INTR) = rustix::process::waitid(
            WaitId::PidFd(self.pidfd.as_fd()),
            WaitIdOptions::EXITED | WaitIdOptions::NOWAIT,
        ) {}
    }
}

impl Drop for Keeper {
    fn drop(&mut self) {
        self.kill();
        let _ = rustix::process::waitid(WaitId::PidFd(self.pidfd.as_fd()), WaitIdOptions::EXITED);
    }
}

/// The keeper's side until `execve`: raw system calls only, on its own stack, in the node's
/// memory, with every signal blocked.
extern "C" fn keeper(arg: *mut c_void) -> c_int {
    // SAFETY: `arg` is the parent's `Plan`, alive until this process execs or exits (vfork).
    #[allow(unsafe_code)]
    let plan = unsafe { &*arg.cast::<Plan<'_>>() };
    let fail = |step: usize, errno: Errno| -> c_int {
        plan.failed_step.store(step, Ordering::SeqCst);
        plan.failed_errno
            .store(errno.raw_os_error().max(1), Ordering::SeqCst);
        // SAFETY: ends this process only, without running anything of the parent's.
        #[allow(unsafe_code)]
        unsafe {
            libc::_exit(127)
        }
    };
    if plan.network >= 0 {
        // SAFETY: the parent holds the namespace's descriptor open across the clone.
        #[allow(unsafe_code)]
        let network = unsafe { BorrowedFd::borrow_raw(plan.network) };
        if let Err(errno) = rustix::thread::move_into_link_name_space(
            network,
            Some(rustix::thread::LinkNameSpaceType::Network),
        ) {
            return fail(STEP_NETWORK, errno);
        }
    }
    // Into the session's cgroup first, while its descriptors are still open. Until `execve`
    // this process shares the node's memory, but the kernel's OOM killer never picks a
    // `vfork` child that does, and what it touches is charged to the memory's owner, the node.
    if let Err(errno) = crate::cgroup::join(plan.join) {
        return fail(STEP_CGROUP, errno);
    }
    // SAFETY: a new cgroup namespace for this process alone (it shares no nsproxy with the
    // node: it is another process), rooted at the cgroup it just joined.
    #[allow(unsafe_code)]
    let unshared =
        unsafe { rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::NEWCGROUP) };
    if let Err(errno) = unshared {
        return fail(STEP_CGROUP_NS, errno);
    }
    // Every descriptor inherited from the node (its sockets, its databases) but its program:
    // the keeper must not hold them open.
    let program = plan.program as u32;
    // SAFETY: closes this process's own descriptors (it has its own table: no CLONE_FILES).
    #[allow(unsafe_code)]
    unsafe {
        if program > 0 {
            libc::syscall(libc::SYS_close_range, 0u32, program - 1, 0u32);
        }
        libc::syscall(libc::SYS_close_range, program + 1, u32::MAX, 0u32);
    }
    if let Err(errno) = rustix::process::set_parent_process_death_signal(Some(Signal::KILL)) {
        return fail(STEP_DEATH_SIGNAL, errno);
    }
    if let Err(Failure { step, errno }) = plan.root.enter() {
        return fail(step, errno);
    }
    if let Err(errno) = rustix::system::sethostname(b"session") {
        return fail(STEP_HOST, errno);
    }
    if let Err(errno) = crate::egress::netns::bring_loopback_up() {
        return fail(STEP_LOOPBACK, errno);
    }
    // SAFETY: `execveat` of the sealed memfd the parent holds open, with NUL-terminated
    // arrays the parent keeps alive; the kernel closes the memfd (close-on-exec) once it has
    // loaded the program.
    #[allow(unsafe_code)]
    unsafe {
        libc::syscall(
            libc::SYS_execveat,
            plan.program,
            c"".as_ptr(),
            plan.argv.as_ptr(),
            plan.envp.as_ptr(),
            libc::AT_EMPTY_PATH,
        );
        fail(
            STEP_EXEC,
            Errno::from_raw_os_error(*libc::__errno_location()),
        )
    }
}
