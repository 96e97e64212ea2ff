//! A sandbox's keeper: the first process of its PID namespace, owner of its mount, IPC, UTS
//! and network namespaces, and the reaper of whatever is orphaned inside.
//!
//! The node starts one per session ([`Keeper::start`]) with `clone(CLONE_VM | CLONE_NEW…)` on
//! a small stack of its own: it shares the node's memory (no page tables are copied, unlike
//! `fork`: a running node holds tens of MiB) and never executes another program. It makes
//! raw system calls only: it resets its signal handlers (the node's must never run in it),
//! asks to be killed when the node dies, closes every descriptor it inherited but its status
//! pipe, builds and enters the sandbox's root ([`crate::root::RootPlan::enter`]), names its
//! host (`session`), brings its loopback up, says it is ready, and from then on only reaps
//! orphans. It stays root of the host's user namespace, so the sandbox's processes (another
//! uid, no capabilities) can neither signal it (the first process of a PID namespace gets no
//! signal it does not handle from inside), nor trace it, nor read its memory.
//!
//! Commands join it: the node enters its PID namespace for the children it starts
//! (`setns(pidfd, CLONE_NEWPID)` on the starting thread) and each child enters the rest
//! (`setns(pidfd, CLONE_NEWNS | …)`). Killing the keeper ([`Keeper::kill`]) kills every process
//! of the sandbox, daemons and `setsid` escapees included: the kernel empties a PID namespace
//! whose first process dies, and the keeper is reaped only once it is empty.

use std::ffi::{c_int, c_void};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};

use rustix::io::Errno;
use rustix::process::{Signal, WaitId, WaitIdOptions};

use crate::root::{Failure, RootPlan};

/// The keeper's stack: root building and the reap loop are a few frames of system calls.
const STACK_BYTES: usize = 128 * 1024;
/// A page below it that faults, so an overflow cannot write into the node's memory.
const GUARD_BYTES: usize = 4096;

/// The namespaces a keeper owns.
pub const NAMESPACES: c_int = libc::CLONE_NEWPID
    | libc::CLONE_NEWNS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWNET;

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

/// What the keeper reads, in the node's memory (which it shares) until it says it is ready.
struct Plan<'a> {
    root: &'a RootPlan,
    /// `cgroup.procs` of the session's cgroup: the keeper joins it before anything else.
    join: &'a [OwnedFd],
    /// A network namespace made ahead to enter, instead of a new one.
    network: RawFd,
    status: RawFd,
    /// Set before the keeper exits on a failure: a root step (`< ROOT_DONE`) or a later one.
    failed_step: AtomicUsize,
    failed_errno: AtomicI32,
}

/// The steps after the root, as `failed_step` values.
const ROOT_DONE: usize = 1 << 20;
const LATER_STEPS: [&str; 6] = [
    "naming its host",
    "bringing its loopback up",
    "saying it is ready",
    "joining the session's cgroup",
    "making its cgroup namespace",
    "entering its network namespace",
];

/// A running keeper.
#[derive(Debug)]
pub struct Keeper {
    pidfd: OwnedFd,
    /// Mapped while the keeper runs on it; unmapped after it is reaped (`Drop` runs first).
    _stack: Stack,
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

impl Keeper {
    /// Starts a keeper whose sandbox has the root `root`, in the cgroup whose `cgroup.procs`
    /// descriptors are `join` (see [`crate::cgroup::SessionCgroup::join_fds`]; the sandbox's
    /// cgroup namespace is rooted there), and waits until it is ready. Call it from a thread
    /// that lives as long as the node (the keeper is killed when the thread that started it
    /// ends: the parent-death signal follows the thread).
    ///
    /// `network`, when given, is a network namespace made ahead (see
    /// [`crate::egress::SpareNetworks`]) the keeper enters instead of making one: making one
    /// is the slowest part of a sandbox while the kernel tears others down.
    pub fn start(
        root: &RootPlan,
        join: &[OwnedFd],
        network: Option<BorrowedFd<'_>>,
    ) -> Result<Keeper, KeeperError> {
        let (status_read, status_write) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
            .map_err(|errno| KeeperError::Start(errno.into()))?;
        let stack = Stack::map(STACK_BYTES).map_err(KeeperError::Start)?;
        let plan = Plan {
            root,
            join,
            network: network.map_or(-1, |fd| fd.as_raw_fd()),
            status: status_write.as_raw_fd(),
            failed_step: AtomicUsize::new(0),
            failed_errno: AtomicI32::new(0),
        };
        let mut pidfd: c_int = -1;
        // SAFETY: the child shares this memory (CLONE_VM) and runs `keeper` on `stack`, which
        // outlives it (the `Keeper` owns it and unmaps it only after reaping the child). It
        // reads `plan` only until it writes to or closes its status pipe, and this function
        // keeps `plan` alive until it has read that pipe to its end or its first byte. Every
        // signal is blocked on this thread across the call, so none is handled in the child
        // before it resets its handlers.
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
        drop(status_write);
        if pid < 0 {
            return Err(KeeperError::Start(error));
        }
        // SAFETY: CLONE_PIDFD wrote a new descriptor, owned by nobody else, into `pidfd`.
        #[allow(unsafe_code)]
        let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
        let pid = rustix::process::Pid::from_raw(pid)
            .ok_or_else(|| KeeperError::Start(io::Error::other("no process id")))?;
        let mut ready = [0u8; 1];
        let read = loop {
            match rustix::io::read(&status_read, &mut ready) {
                Err(Errno::INTR) => continue,
                other => break other,
            }
        };
        if matches!(read, Ok(1)) {
            return Ok(Keeper {
                pidfd,
                _stack: stack,
                pid,
            });
        }
        // It exited before saying it was ready: reap it (its stack is unused from then on),
        // then say why.
        let _ = rustix::process::waitid(WaitId::PidFd(pidfd.as_fd()), WaitIdOptions::EXITED);
        drop(stack);
        let step = plan.failed_step.load(Ordering::SeqCst);
        let errno = Errno::from_raw_os_error(plan.failed_errno.load(Ordering::SeqCst).max(1));
        Err(if step >= ROOT_DONE {
            KeeperError::Setup(LATER_STEPS[(step - ROOT_DONE).min(5)], errno)
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
        })
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

/// The keeper's side: raw system calls only, on its own stack, in the node's memory.
extern "C" fn keeper(arg: *mut c_void) -> c_int {
    // SAFETY: `arg` is the parent's `Plan`, alive until this process writes to or closes its
    // status pipe (see `Keeper::start`); nothing below touches it after that.
    #[allow(unsafe_code)]
    let plan = unsafe { &*arg.cast::<Plan<'_>>() };
    let fail = |step: usize, errno: Errno| -> c_int {
        plan.failed_step.store(step, Ordering::SeqCst);
        plan.failed_errno
            .store(errno.raw_os_error().max(1), Ordering::SeqCst);
        // SAFETY: ends this process only; the status pipe closes with it.
        #[allow(unsafe_code)]
        unsafe {
            libc::_exit(127)
        }
    };
    if plan.network >= 0 {
        // SAFETY: the parent holds the namespace's descriptor open until this process says
        // it is ready.
        #[allow(unsafe_code)]
        let network = unsafe { BorrowedFd::borrow_raw(plan.network) };
        if let Err(errno) = rustix::thread::move_into_link_name_space(
            network,
            Some(rustix::thread::LinkNameSpaceType::Network),
        ) {
            return fail(ROOT_DONE + 5, errno);
        }
    }
    // Into the session's cgroup first, while its descriptors are still open.
    if let Err(errno) = crate::cgroup::join(plan.join) {
        return fail(ROOT_DONE + 3, errno);
    }
    // SAFETY: a new cgroup namespace for this process alone (it shares no nsproxy with the
    // node: it is another process), rooted at the cgroup it just joined.
    #[allow(unsafe_code)]
    let unshared =
        unsafe { rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::NEWCGROUP) };
    if let Err(errno) = unshared {
        return fail(ROOT_DONE + 4, errno);
    }
    // SAFETY: system calls on this process's own signal state and descriptors.
    #[allow(unsafe_code)]
    unsafe {
        // The node's handlers must never run here: every handled signal back to its default
        // (which, for a PID namespace's first process, means ignored when sent from inside).
        for signal in 1..65 {
            if signal == libc::SIGKILL || signal == libc::SIGSTOP {
                continue;
            }
            let mut current: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(signal, std::ptr::null(), &mut current) == 0
                && current.sa_sigaction != libc::SIG_DFL
            {
                let mut default: libc::sigaction = std::mem::zeroed();
                default.sa_sigaction = libc::SIG_DFL;
                libc::sigaction(signal, &default, std::ptr::null_mut());
            }
        }
        // Every descriptor inherited from the node (its sockets, its databases) but the
        // status pipe: the keeper must not hold them open.
        let status = plan.status as u32;
        if status > 0 {
            libc::syscall(libc::SYS_close_range, 0u32, status - 1, 0u32);
        }
        libc::syscall(libc::SYS_close_range, status + 1, u32::MAX, 0u32);
    }
    if let Err(errno) = rustix::process::set_parent_process_death_signal(Some(Signal::KILL)) {
        return fail(ROOT_DONE, errno);
    }
    if let Err(Failure { step, errno }) = plan.root.enter() {
        return fail(step, errno);
    }
    if let Err(errno) = rustix::system::sethostname(b"session") {
        return fail(ROOT_DONE, errno);
    }
    if let Err(errno) = crate::egress::netns::bring_loopback_up() {
        return fail(ROOT_DONE + 1, errno);
    }
    // SAFETY: the status pipe's write end, open in this process (see above).
    #[allow(unsafe_code)]
    let status = unsafe { BorrowedFd::borrow_raw(plan.status) };
    if let Err(errno) = rustix::io::write(status, b"k") {
        return fail(ROOT_DONE + 2, errno);
    }
    // From here on `plan` is gone: only this process's own state.
    let status_fd = status.as_raw_fd();
    // SAFETY: closes this process's own descriptor.
    #[allow(unsafe_code)]
    unsafe {
        libc::close(status_fd);
    }
    reap_forever()
}

/// Reaps every orphan of the namespace until the keeper is killed. SIGCHLD stays blocked and
/// is waited for, so a child that ends between two waits is never missed.
fn reap_forever() -> ! {
    // SAFETY: this process's own signal mask, and waits on its own children.
    #[allow(unsafe_code)]
    unsafe {
        let mut child: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut child);
        libc::sigaddset(&mut child, libc::SIGCHLD);
        let mut all: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, std::ptr::null_mut());
        loop {
            match rustix::process::wait(rustix::process::WaitOptions::NOHANG) {
                Ok(Some(_)) | Err(Errno::INTR) => continue,
                _ => {}
            }
            let mut info: libc::siginfo_t = std::mem::zeroed();
            libc::sigwaitinfo(&child, &mut info);
        }
    }
}
