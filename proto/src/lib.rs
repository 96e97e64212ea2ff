//! The gRPC contracts between Plinth's services, generated from `proto/plinth/**.proto`.
//!
//! Only generated wire types live here. Validation into domain types happens at each
//! service's edge (`TryFrom<proto>`), never in this crate.

/// `plinth.catalog.v1`: environments, versions, builds, sessions and scopes.
pub mod catalog {
    /// Version 1 of the catalog contract.
    pub mod v1 {
        #![allow(clippy::all, missing_docs)]
        tonic::include_proto!("plinth.catalog.v1");
    }
}

mod adapter_labels;

/// `plinth.source.v1`: environment files, imports and snapshots.
pub mod source {
    /// Version 1 of the source contract.
    pub mod v1 {
        #![allow(clippy::all, missing_docs)]
        tonic::include_proto!("plinth.source.v1");
    }
}

/// `plinth.node.v1`: the node agent's sessions, commands and workdir files.
pub mod node {
    /// Version 1 of the node contract.
    pub mod v1 {
        #![allow(clippy::all, missing_docs)]
        tonic::include_proto!("plinth.node.v1");
    }
}

/// `plinth.v1`: the tenant API the gateway serves beside REST (clients only).
pub mod public {
    /// Version 1 of the tenant API.
    pub mod v1 {
        #![allow(clippy::all, missing_docs)]
        tonic::include_proto!("plinth.v1");
    }
}

/// Every compiled `.proto` as one `FileDescriptorSet`, for gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("plinth_descriptor");

/// The tenant API, `plinth.v1` (`proto/plinth/v1`), with its imports, as one
/// `FileDescriptorSet`: the gateway serves it over gRPC by its `google.api.http` options, and
/// its reflection lists it.
pub const PUBLIC_DESCRIPTOR_SET: &[u8] =
    tonic::include_file_descriptor_set!("plinth_public_descriptor");
