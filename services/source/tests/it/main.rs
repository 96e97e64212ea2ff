//! The source service's integration tests: the index conformance suite on SQLite and
//! PostgreSQL, and git imports against a real git server.

#[macro_use]
mod index;
mod git;
mod git_server;
mod stored_bytes;
