//! The tenant API's resources (UHP Environments §2–§7): environments, files, builds,
//! harnesses, sessions with their commands, files and terminals, tasks, usage; and the
//! Idempotency-Key that makes their POSTs safe to retry.

pub(crate) mod build_status;
pub(crate) mod builds;
pub(crate) mod environments;
pub(crate) mod exec;
pub(crate) mod files;
pub(crate) mod harnesses;
pub(crate) mod idempotency;
pub(crate) mod session_files;
pub(crate) mod sessions;
pub(crate) mod tasks;
pub(crate) mod terminal;
pub(crate) mod usage;
