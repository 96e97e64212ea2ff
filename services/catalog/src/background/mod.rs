//! What each catalog replica runs beside its gRPC services: the sweep that ends sessions past
//! their limits, retention, the wakeups of waiting build claims, and the fleet's gauges. Each
//! is safe with several replicas on one database.

pub mod gauges;
pub mod retention;
pub mod sweep;
pub mod wakeups;
