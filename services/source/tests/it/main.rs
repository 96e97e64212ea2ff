//! The source service's integration tests: the index conformance suite on SQLite and
//! PostgreSQL, and git imports against a real git server.

mod git;
mod git_server;
mod index;
