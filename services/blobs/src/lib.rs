//! plinth-blobs: content-addressed storage shared by the source service, the builders and the
//! node agents. A blob is file content named by its SHA-256, stored at
//! `blobs/sha256/<2 hex>/<64 hex>` in object storage: local files (the embedded default),
//! S3 (production) or memory (tests), all through `object_store`.
//!
//! The guarantees, whatever the backend:
//! * a write is streamed and hashed in flight, bounded in size, and either lands whole under
//!   its final name or not at all (never a partial object under a final name);
//! * a write that returns is durable: in a directory store the file and its directory are
//!   synced before and after it is named (`local`), so nothing that names a blob can commit
//!   before the blob would survive a power cut;
//! * an existing name is not taken on trust: a blob that does not verify (size, and digest
//!   where the write has the bytes) is replaced by a write of the same content;
//! * a blob's name is its content's digest, so writing the same content twice is one blob;
//! * a read is verified against the digest before any byte is handed out, and fails closed.
//!
//! Trees (`tree`) are the one structured blob: the canonical listing of a source snapshot or
//! a build layer. What is in any other blob is for the callers. `inventory` lists and removes
//! objects for garbage collection, which decides elsewhere what may go; a [`Holder`] given to
//! a write keeps what it writes from being collected before it is referenced.

mod digest;
pub mod inventory;
mod local;
pub mod pack;
mod store;
pub mod tree;

pub use digest::{Digest, DigestParseError};
pub use local::link_unnamed;
pub use store::{Blob, BlobError, BlobStore, Holder, VerifiedBlob};

/// Makes ring the process's TLS crypto provider. HTTP clients here (object storage's, and
/// any `reqwest` client of the process) use rustls without a built-in provider, which spares
/// the build aws-lc's C code; a client built before a provider is installed panics, so every
/// process and test that makes HTTP clients calls this first. Calling it again is harmless.
pub fn install_tls_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
