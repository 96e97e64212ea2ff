//! The unified (v2) hierarchy: delegating the controllers down to session groups, the limit
//! files, the OOM count and `cgroup.kill`.
//!
//! v2 lets a cgroup hand controllers to its children (`cgroup.subtree_control`) only while
//! it holds no process itself, the root excepted ("no internal processes"). The node lives in
//! `<base>` (its own cgroup: a container's, a systemd unit's, or the root), so:
//!
//! ```text
//! <base>                  controllers enabled for children; emptied first if needed
//! └── <group>             Plinth's; never holds a process
//!     ├── node            the processes that were in <base>, moved here when <base> was
//!     │                   not the root and held processes (a node in a container)
//!     └── sessions        enables memory, pids, cpu for its children
//!         └── sess_…      one per session: memory.max, memory.swap.max, pids.max, cpu.max
//! ```

use std::io::ErrorKind;
use std::path::Path;
use std::time::Instant;

use rustix::process::Pid;

use super::detect::NODE_LEAF;
use super::{
    CPU_PERIOD_US, CgroupError, Cgroups, Hierarchy, Limits, SessionCgroup, Version, field,
    make_dir, read, read_pids, wait_until, write,
};

/// Prepares `<base>/<group>/sessions` so its children get `controllers`.
pub(super) fn prepare(
    base: &Path,
    group: &str,
    controllers: &[&str],
) -> Result<Cgroups, CgroupError> {
    let group_dir = base.join(group);
    let sessions = group_dir.join("sessions");
    make_dir(&group_dir)?;
    let node_leaf = group_dir.join(NODE_LEAF);
    enable(base, controllers, Some(&node_leaf))?;
    enable(&group_dir, controllers, Some(&node_leaf))?;
    make_dir(&sessions)?;
    enable(&sessions, controllers, None)?;
    Ok(Cgroups {
        version: Version::V2,
        hierarchies: vec![Hierarchy {
            controllers: controllers.iter().map(|&name| name.to_owned()).collect(),
            sessions,
        }],
    })
}

/// Enables `controllers` in `dir`'s `cgroup.subtree_control`. When `dir` holds processes
/// (the kernel answers EBUSY), they are moved to `leaf` first, if given.
fn enable(dir: &Path, controllers: &[&str], leaf: Option<&Path>) -> Result<(), CgroupError> {
    let control = dir.join("cgroup.subtree_control");
    let enabled = read(&control)?;
    let missing: Vec<&str> = controllers
        .iter()
        .copied()
        .filter(|name| !enabled.split_whitespace().any(|on| on == *name))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let offered = read(&dir.join("cgroup.controllers"))?;
    if let Some(absent) = missing
        .iter()
        .find(|name| !offered.split_whitespace().any(|on| on == **name))
    {
        return Err(CgroupError::NotDelegated {
            controller: (*absent).to_owned(),
            path: dir.to_owned(),
        });
    }
    let line = missing
        .iter()
        .map(|name| format!("+{name}"))
        .collect::<Vec<_>>()
        .join(" ");
    match write(&control, &line) {
        Err(CgroupError::Io { source, .. })
            if source.kind() == ErrorKind::ResourceBusy && leaf.is_some() =>
        {
            if let Some(leaf) = leaf {
                move_processes(dir, leaf)?;
            }
            write(&control, &line)
        }
        result => result,
    }
}

/// Moves every process of `from` into `to`: what a process manager running inside a
/// container does with its own cgroup before it can delegate controllers below it.
fn move_processes(from: &Path, to: &Path) -> Result<(), CgroupError> {
    make_dir(to)?;
    let procs = from.join("cgroup.procs");
    let target = to.join("cgroup.procs");
    // A process forking while we move it may leave a child behind: a few rounds catch those.
    for _ in 0..8 {
        let pids = read_pids(&procs)?;
        if pids.is_empty() {
            return Ok(());
        }
        tracing::warn!(
            from = %from.display(),
            to = %to.display(),
            processes = pids.len(),
            "moving the processes of the node's cgroup to a leaf, so controllers can be delegated to session groups"
        );
        for pid in pids {
            match write(&target, &pid.to_string()) {
                // It exited meanwhile.
                Err(CgroupError::Io { source, .. })
                    if source.raw_os_error() == Some(libc::ESRCH) => {}
                result => result?,
            }
        }
    }
    Err(CgroupError::Crowded {
        path: from.to_owned(),
    })
}

pub(super) fn apply(dir: &Path, limits: &Limits) -> Result<(), CgroupError> {
    if let Some(bytes) = limits.memory_bytes {
        write(&dir.join("memory.max"), &bytes.to_string())?;
        // Absent when the kernel accounts no swap: then there is none to dodge the limit with.
        let swap = dir.join("memory.swap.max");
        if swap.exists() {
            write(&swap, "0")?;
        }
    }
    if let Some(pids) = limits.pids {
        write(&dir.join("pids.max"), &pids.to_string())?;
    }
    if let Some(quota) = limits.cpu_quota_us()? {
        write(&dir.join("cpu.max"), &format!("{quota} {CPU_PERIOD_US}"))?;
    }
    Ok(())
}

pub(super) fn oom_kills(dir: &Path) -> Result<u64, CgroupError> {
    let path = dir.join("memory.events");
    let text = read(&path)?;
    field(&text, "oom_kill").ok_or(CgroupError::Parse {
        path,
        content: text,
    })
}

pub(super) fn cpu_usage_us(dir: &Path) -> Result<u64, CgroupError> {
    let path = dir.join("cpu.stat");
    let text = read(&path)?;
    field(&text, "usage_usec").ok_or(CgroupError::Parse {
        path,
        content: text,
    })
}

/// Kills with `cgroup.kill` (Linux 5.14): one write, the kernel signals every process of the
/// group and its descendants, and a process forking meanwhile cannot leave a child behind.
/// Older kernels get the freeze-and-signal method of v1 (`cgroup.freeze`, Linux 5.2).
pub(super) fn kill_all(session: &SessionCgroup, deadline: Instant) -> Result<(), CgroupError> {
    let dir = session.dirs[0].path.as_path();
    let kill = dir.join("cgroup.kill");
    if !kill.exists() {
        return kill_by_signals(session, deadline);
    }
    write(&kill, "1")?;
    let events = dir.join("cgroup.events");
    // `populated` counts the group and its descendants; a process that has exited but is
    // not reaped yet no longer counts.
    if wait_until(deadline, || {
        Ok(field(&read(&events)?, "populated") == Some(0))
    })? {
        return Ok(());
    }
    Err(CgroupError::Survivors {
        path: dir.to_owned(),
        pids: session
            .processes()?
            .into_iter()
            .map(Pid::as_raw_pid)
            .collect(),
    })
}

/// The method for kernels without `cgroup.kill`.
pub(super) fn kill_by_signals(
    session: &SessionCgroup,
    deadline: Instant,
) -> Result<(), CgroupError> {
    let dir = session.dirs[0].path.as_path();
    let freeze = dir.join("cgroup.freeze");
    let freezer = freeze.exists().then(|| super::Freezer::V2 {
        freeze,
        events: dir.join("cgroup.events"),
    });
    super::kill_by_signals(session, freezer.as_ref(), deadline)
}
