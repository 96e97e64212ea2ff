//! The catalog's domain types and their rules, knowing nothing of gRPC or SQL: environments,
//! versions and builds (`model`), sessions and nodes, what nodes hold warm and read first
//! (`warm`), workspace adapters, Brain's ledger, and the sealing of adapters' credentials at
//! rest.

pub mod adapters;
pub mod brain;
pub mod model;
pub mod seal;
pub mod sessions;
pub mod warm;
