//! The catalog's gRPC services, one module per service of `plinth.catalog.v1`: wire types are
//! validated into domain types on receipt, the store does the work, and domain types go back
//! out. No rule lives here.

pub(crate) mod adapters;
pub(crate) mod brain;
pub(crate) mod catalog;
pub(crate) mod collection;
pub(crate) mod harnesses;
pub(crate) mod quotas;
pub(crate) mod request_keys;
pub(crate) mod sessions;
