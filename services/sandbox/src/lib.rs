//! plinth-sandbox: the sandbox recipe sessions and builds share, so they cannot drift apart in
//! what they hide, allow or limit (see ../shared/design/SANDBOX.md's threat model and the
//! README's "Sandbox" section).
//!
//! Each module owns one measure and is used by both the node agent (sessions) and the builder
//! (builds). What runs between `fork` and `exec` here makes raw system calls only, on data
//! prepared before the fork: nothing is allocated and no lock is taken there.
//!
//! - [`disk`]: the per-session disk limit (`disk_mb`) on the working directory.
//!
//! What does not belong here: how a session or a build is scheduled, recorded or served.

pub mod disk;
