//! plinth-builder: the builder service. Builds turn an environment's source into a layer: its
//! files plus what its manifests install, installed at the mount path sessions will see, in
//! isolation.
//!
//! [`worker`] is the service: it leases builds from the catalog, materializes the source from
//! the blob store, installs, uploads the layer's blobs and tree, and completes the build under
//! its lease. Beneath it: which steps a source needs ([`manifests`]), running them as an
//! unprivileged user in the sandbox sessions get ([`sandbox`], [`install()`], over
//! [`plinth_sandbox`]), a build's limits and a scope's build disk ([`limits`], [`scope_disk`]),
//! and describing the result entry by entry with its packages ([`layer`]).
//!
//! The sandbox needs root on a Linux host (namespaces, mounts and the build's uid are set up
//! with direct system calls).

pub mod beneath;
pub mod install;
pub mod kept;
pub mod layer;
pub mod limits;
pub mod manifests;
pub mod origin;
mod output;
pub mod registries;
pub mod reuse_key;
pub mod sandbox;
pub mod scope_disk;
pub mod toolchains;
pub mod tools;
pub mod worker;

pub use install::{BuildNetwork, InstallError, InstallOptions, InstallReport, install};
pub use layer::{EntryKind, Layer, LayerEntry, LayerError, Package, scan};
pub use manifests::{Plan, Step, plan};
pub use registries::Registries;
pub use sandbox::SandboxError;
