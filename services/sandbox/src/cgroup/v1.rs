//! The v1 hierarchies: one directory per controller hierarchy (memory, pids, cpu, and
//! cpuacct and freezer when mounted), each `<node's cgroup>/<group>/sessions/<session>`. v1
//! has no "no internal processes" rule, so nothing of the node is moved.

use std::path::{Path, PathBuf};
use std::time::Instant;

use super::{
    CPU_PERIOD_US, CgroupError, Cgroups, Freezer, Hierarchy, Limits, SessionCgroup, Version, field,
    make_dir, write,
};

pub(super) fn prepare(
    hierarchies: Vec<(Vec<String>, PathBuf)>,
    group: &str,
) -> Result<Cgroups, CgroupError> {
    let mut prepared = Vec::with_capacity(hierarchies.len());
    for (controllers, base) in hierarchies {
        let group_dir = base.join(group);
        let sessions = group_dir.join("sessions");
        make_dir(&group_dir)?;
        make_dir(&sessions)?;
        prepared.push(Hierarchy {
            controllers,
            sessions,
        });
    }
    Ok(Cgroups {
        version: Version::V1,
        hierarchies: prepared,
    })
}

pub(super) fn apply(session: &SessionCgroup, limits: &Limits) -> Result<(), CgroupError> {
    if let Some(bytes) = limits.memory_bytes
        && let Some(dir) = session.dir("memory")
    {
        let bytes = bytes.to_string();
        write(&dir.join("memory.limit_in_bytes"), &bytes)?;
        // Memory plus swap, so swapping out cannot dodge the limit; present only when the
        // kernel accounts swap. It must not be below `limit_in_bytes`, hence the order.
        let memsw = dir.join("memory.memsw.limit_in_bytes");
        if memsw.exists() {
            write(&memsw, &bytes)?;
        }
        // TCP buffers: v1 charges them (to their own counter, not the memory one) only once
        // a group has a TCP limit; without one a session's sockets could hold any amount of
        // kernel memory. v2 charges them to `memory.max` itself. Other kernel memory (pipe
        // buffers, the tmpfs and memfd pages, page tables) is charged to the memory counter
        // in v1 as in v2.
        let tcp = dir.join("memory.kmem.tcp.limit_in_bytes");
        if tcp.exists()
            && let Err(error) = write(&tcp, &bytes)
        {
            tracing::warn!(%error, "cannot bound a session's TCP buffers (cgroup v1)");
        }
    }
    if let Some(pids) = limits.pids
        && let Some(dir) = session.dir("pids")
    {
        write(&dir.join("pids.max"), &pids.to_string())?;
    }
    if let Some(quota) = limits.cpu_quota_us()?
        && let Some(dir) = session.dir("cpu")
    {
        write(&dir.join("cpu.cfs_period_us"), &CPU_PERIOD_US.to_string())?;
        write(&dir.join("cpu.cfs_quota_us"), &quota.to_string())?;
    }
    Ok(())
}

/// `memory.oom_control`'s `oom_kill` count (Linux 4.13).
pub(super) fn oom_kills(session: &SessionCgroup) -> Result<u64, CgroupError> {
    let path = required(session, "memory")?.join("memory.oom_control");
    let text = super::read(&path)?;
    field(&text, "oom_kill").ok_or(CgroupError::Unsupported {
        what: "counting OOM kills (Linux 4.13 or later)",
        path,
    })
}

/// `cpuacct.usage`, in nanoseconds.
pub(super) fn cpu_usage_ns(session: &SessionCgroup) -> Result<u64, CgroupError> {
    let path = required(session, "cpuacct")?.join("cpuacct.usage");
    let text = super::read(&path)?;
    text.trim().parse().map_err(|_| CgroupError::Parse {
        path,
        content: text,
    })
}

fn required<'a>(
    session: &'a SessionCgroup,
    controller: &'static str,
) -> Result<&'a Path, CgroupError> {
    session
        .dir(controller)
        .ok_or(CgroupError::NoHierarchy { controller })
}

/// Freezes the group (when the freezer hierarchy is mounted), so nothing in it can fork or
/// exit while its processes are listed and signalled, then thaws it so the signals land.
pub(super) fn kill_all(session: &SessionCgroup, deadline: Instant) -> Result<(), CgroupError> {
    let freezer = session.dir("freezer").map(|dir| Freezer::V1 {
        state: dir.join("freezer.state"),
    });
    super::kill_by_signals(session, freezer.as_ref(), deadline)
}
