//! plinth-sandbox: the sandbox recipe sessions and builds share, so they cannot drift apart in
//! what they hide, allow or limit (see docs/design/SANDBOX.md's threat model and
//! docs/guide/sandbox.md).
//!
//! Each module owns one measure and is used by both the node agent (sessions) and the builder
//! (builds). What runs between `fork` and `exec` here makes raw system calls only, on data
//! prepared before the fork: nothing is allocated and no lock is taken there.
//!
//! - [`cgroup`]: memory, process and CPU limits per session, and killing everything a session
//!   started (cgroup v2, or v1 where a node has no v2 controllers).
//! - [`egress`]: the network policy, `none` or `egress` through a filtering HTTP proxy the
//!   node serves on a socket inside the sandbox's network namespace.
//! - [`root`]: the sandbox's file system, built from an allow-list.
//! - [`keeper`]: the first process of a session's PID namespace, owner of its namespaces.
//! - [`disk`]: a session's disk limit, an ext4 image of its size on a loop device.
//! - [`seccomp`]: the system calls sandboxes never need, refused with `EPERM`.
//! - [`tools`]: the host's `uv`, copied where sandboxes can be shown it.
//!
//! What does not belong here: how a session or a build is scheduled, recorded or served.

pub mod cgroup;
pub mod disk;
pub mod egress;
pub mod keeper;
pub mod root;
pub mod seccomp;
pub mod tools;
