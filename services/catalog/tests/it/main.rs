//! The catalog's integration tests: the store conformance suite, run unchanged against
//! SQLite and PostgreSQL.

mod adapters;
mod brain;
mod harnesses;
mod sessions;
mod store;
