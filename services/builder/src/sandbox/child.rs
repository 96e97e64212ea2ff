//! The sandbox's side of the fork: what P, C and D run between `fork` and `exec` (see the
//! module documentation's numbered steps), on data [`Plan`] prepared before the fork. Nothing
//! here allocates or takes a lock; every step is a raw system call.

use std::ffi::CString;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use plinth_sandbox::root::RootPlan;
use plinth_sandbox::seccomp::Filter;
use rustix::io::Errno;
use rustix::thread::UnshareFlags;

use super::CANNOT;

/// Everything the sandbox's processes need between fork and exec, prepared before the fork.
pub(super) struct Plan {
    pub(super) namespaces: UnshareFlags,
    /// The build's network namespace, entered instead of making one.
    pub(super) netns: Option<Arc<OwnedFd>>,
    /// Bring the loopback of a namespace made here up.
    pub(super) loopback: bool,
    pub(super) root: RootPlan,
    /// `/env/<slug>`.
    pub(super) mount_path: CString,
    pub(super) uid: rustix::process::Uid,
    pub(super) gid: rustix::process::Gid,
    pub(super) seccomp: &'static Filter,
    /// The build's cgroup, joined first.
    pub(super) cgroup: Option<Arc<plinth_sandbox::cgroup::SessionCgroup>>,
}

/// The sandbox's side of the fork (see the module documentation), run in P; returns only in D,
/// ready to exec, or with the error of a step (which std reports to the spawning parent).
/// Raw system calls only.
pub(super) fn enter(plan: &Plan) -> Result<(), Errno> {
    if let Some(cgroup) = &plan.cgroup {
        // One write per hierarchy to a descriptor opened before the fork.
        plinth_sandbox::cgroup::join(cgroup.join_fds())
            .map_err(|error| cannot(&[b"join the build's cgroup"], error))?;
    }
    if let Some(netns) = &plan.netns {
        rustix::thread::move_into_link_name_space(
            netns.as_fd(),
            Some(rustix::thread::LinkNameSpaceType::Network),
        )
        .map_err(|error| cannot(&[b"enter the build's network namespace (setns)"], error))?;
    }
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
    if let Err(failure) = plan.root.enter() {
        let (what, path) = plan
            .root
            .steps
            .get(failure.step)
            .map_or(("building the root", c"/"), |step| step.describe());
        return Err(cannot(
            &[
                b"build the root while ",
                what.as_bytes(),
                b" ",
                path.to_bytes(),
            ],
            failure.errno,
        ));
    }
    rustix::system::sethostname(b"build").map_err(|error| cannot(&[b"name the host"], error))?;
    if plan.loopback {
        plinth_sandbox::egress::netns::bring_loopback_up()
            .map_err(|error| cannot(&[b"bring the loopback up"], error))?;
    }
    if let Some(command) = fork().map_err(|error| cannot(&[b"fork"], error))? {
        close_inherited();
        exit(reap_until(command));
    }

    // D: becomes the command.
    drop_privileges(plan)?;
    rustix::process::chdir(&*plan.mount_path)
        .map_err(|error| cannot(&[b"change to ", plan.mount_path.to_bytes()], error))?;
    // Last: the filter refuses `setns`, `unshare` and `mount`. std's exec follows at once.
    plan.seccomp
        .install()
        .map_err(|error| cannot(&[b"install the seccomp filter"], error))?;
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

/// Writes `parts` to stderr (the command's output pipe), one `write` each: no allocation.
fn say(parts: &[&[u8]]) {
    for part in parts {
        let _ = rustix::io::write(rustix::stdio::stderr(), part);
    }
}

/// Says which step failed (`plinth-sandbox: cannot <step>`), for [`super::setup_error`].
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
