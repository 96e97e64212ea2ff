//! The source service's integration tests: the index conformance suite on SQLite and
//! PostgreSQL.

mod index;
