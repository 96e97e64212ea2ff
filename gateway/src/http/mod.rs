//! The HTTP edge every route shares, below the resources: who calls (tokens), what a web page
//! may do, connection and rate bounds, the error envelope, request bodies and queries,
//! paging, conditional requests, downloads, and the OpenAPI document's rules.

pub(crate) mod auth;
pub(crate) mod browsers;
pub(crate) mod conditional;
pub(crate) mod connections;
pub(crate) mod console;
pub(crate) mod downloads;
pub(crate) mod edge;
pub(crate) mod error;
pub(crate) mod json;
pub(crate) mod openapi;
pub(crate) mod paging;
pub(crate) mod query;
