//! plinth-builder: builds turn an environment's source into a layer: its files plus what its
//! manifests install, installed at the mount path sessions will see, in isolation.
//!
//! This crate is the builder's core as a library: which steps a source needs
//! ([`manifests`]), running them as an unprivileged user in the sandbox sessions get (an
//! allow-listed root where the scratch directory is `/env/<slug>`, the seccomp filter, no
//! network or the egress proxy: [`plinth_sandbox`], [`sandbox`], [`install()`]), and
//! describing the result entry by entry with its packages ([`layer`]). It holds no state and speaks no protocol:
//! leasing jobs from catalog, materializing the source, uploading blobs and storing the layer
//! tree belong to the service that wires this in (ARCHITECTURE §3).
//!
//! The sandbox needs root on a Linux host (it sets up namespaces, mounts and the build's uid
//! with direct system calls); see [`sandbox`] for what it guarantees and what it does not.

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
