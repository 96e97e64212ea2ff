//! plinth-kit: the ground every Plinth service stands on.
//!
//! It owns the error vocabulary and its one mapping to gRPC and HTTP (`error`, `details`),
//! configuration helpers and secrets that never print (`config`), telemetry (`telemetry`,
//! `http`, `metered`), gRPC between services: servers, clients, credentials, TLS, balancing
//! across replicas, reflection and streams read to their end (`grpc`, `auth`, `tls`,
//! `replicas`, `reflection`, `streams`), the admin HTTP surface (`admin`), one process per
//! directory of state (`dir_lock`), full stores (`storage`), shutdown and task spawning
//! (`tasks`), ids and time (`ids`, `clock`), quotas per scope (`quota`), the rules written once
//! for a value two services check (`slug`, `python_install`), and, with the `database`
//! feature, a service's SQLite or PostgreSQL database (`database`).
//!
//! Business rules do not belong here (beyond those shared checks), nor anything else that knows
//! what an environment is.

pub mod admin;
pub mod auth;
pub mod clock;
pub mod config;
#[cfg(feature = "database")]
pub mod database;
pub mod details;
pub mod dir_lock;
pub mod error;
pub mod grpc;
pub mod http;
pub mod ids;
pub mod metered;
pub mod python_install;
pub mod quota;
pub mod reflection;
pub mod replicas;
pub mod slug;
pub mod storage;
pub mod streams;
pub mod tasks;
pub mod telemetry;
pub mod tls;

pub use error::{ErrorCode, PlinthError};

/// `bytes` as lowercase hex, two digits a byte: how digests, signatures and tokens are
/// written everywhere in Plinth.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut out, byte| {
            let _ = write!(out, "{byte:02x}");
            out
        })
}
