//! End-to-end tests: real `plinth` services over real HTTP and gRPC, each test with its own
//! data directory and database.

mod adapters;
mod bounds;
mod brain;
mod build_faults;
mod build_rules;
mod build_sandbox;
mod builds;
mod crashes;
mod credentials;
mod edge;
mod environments;
mod everyday_tools;
mod failover;
mod files;
mod first_run;
mod gc;
mod grpc_surface;
mod harnesses;
mod helpers;
mod imports;
mod internal_tls;
mod limits;
mod node_restart;
mod novo;
mod operators_kit;
mod processes;
mod quotas;
mod real_projects;
mod reuse;
mod sandbox;
mod sessions;
mod snapshots;
mod telemetry;
mod tracing_propagation;
mod walkthrough;
