//! The source service's integration tests: the index conformance suite on SQLite and
//! PostgreSQL, git imports against a real git server, and garbage collection on real stores.

#[macro_use]
mod index;
mod gc;
mod git;
mod git_server;
mod stored_bytes;
