//! plinth-catalog: the catalog service. It owns Plinth's durable metadata (environments, their
//! versions and builds and the build queue, harnesses, sessions and their turns, nodes,
//! workspace adapters, Brain's ledger, quotas, idempotency keys) in SQLite (the embedded
//! default) or PostgreSQL, and serves it over gRPC (`plinth.catalog.v1`).
//!
//! File bytes never come here (the source service and the blob store hold them), and neither
//! do HTTP shapes (the gateway owns those). The modules go by role: `domain` holds the types
//! and their rules, `persistence` every query, `grpc` one thin module per gRPC service, and
//! `background` what each replica runs beside them (the session sweep, retention, build
//! wakeups, gauges); [`run`] starts it all.

pub mod background;
pub mod domain;
mod grpc;
pub mod persistence;
#[cfg(feature = "testing")]
pub mod testing;

// The paths other crates name these modules by.
pub use background::retention;
pub use domain::{adapters, brain, model, seal, sessions, warm};

use std::sync::Arc;

use plinth_kit::admin::{self, ReadinessCheck};
use plinth_kit::auth::{Access, Role};
use plinth_kit::grpc::Internal;
use plinth_kit::tasks::CancellationToken;
use plinth_proto::catalog::v1::adapter_service_server::AdapterServiceServer;
use plinth_proto::catalog::v1::brain_service_server::BrainServiceServer;
use plinth_proto::catalog::v1::catalog_service_server::CatalogServiceServer;
use plinth_proto::catalog::v1::collection_service_server::CollectionServiceServer;
use plinth_proto::catalog::v1::harness_service_server::HarnessServiceServer;
use plinth_proto::catalog::v1::quota_service_server::QuotaServiceServer;
use plinth_proto::catalog::v1::replay_memory_service_server::ReplayMemoryServiceServer;
use plinth_proto::catalog::v1::request_key_service_server::RequestKeyServiceServer;
use plinth_proto::catalog::v1::session_service_server::SessionServiceServer;
use tokio::net::TcpListener;

pub use domain::seal::{SealError, SealKey};
pub use domain::sessions::{DEFAULT_NODE_TTL_MS, NodeTtl};
pub use grpc::collection::MAX_FENCE_MS;
pub use persistence::{
    AdapterCredentials, CollectionRoots, DEFAULT_RUNNING_PER_SCOPE, LeasePolicy, NewSession,
    NewTask, RetentionPolicy, Retired, Store, StoreError,
};

/// The catalog's gRPC service name, as health checks name it.
pub const SERVICE_NAME: &str = "plinth.catalog.v1.CatalogService";
/// The harness registry's gRPC service name, served beside [`SERVICE_NAME`] and healthy
/// exactly when it is.
pub const HARNESS_SERVICE_NAME: &str = "plinth.catalog.v1.HarnessService";

/// Which roles may call each of the catalog's RPCs: builders only the calls about builds they
/// lease, nodes only their own registration and sessions, the source service only what
/// garbage collection asks, the gateway everything that acts for a scope.
pub const ACCESS: Access = Access(&[
    (
        "/plinth.catalog.v1.CatalogService/ClaimBuild",
        &[Role::Builder],
    ),
    (
        "/plinth.catalog.v1.CatalogService/RenewLease",
        &[Role::Builder],
    ),
    (
        "/plinth.catalog.v1.CatalogService/ReleaseBuild",
        &[Role::Builder],
    ),
    (
        "/plinth.catalog.v1.CatalogService/AppendBuildLog",
        &[Role::Builder],
    ),
    (
        "/plinth.catalog.v1.CatalogService/FindReusable",
        &[Role::Builder],
    ),
    (
        "/plinth.catalog.v1.CatalogService/CompleteBuild",
        &[Role::Builder],
    ),
    (
        "/plinth.catalog.v1.SessionService/RegisterNode",
        &[Role::Node],
    ),
    (
        "/plinth.catalog.v1.SessionService/NodeHeartbeat",
        &[Role::Node],
    ),
    (
        "/plinth.catalog.v1.SessionService/ListNodeSessions",
        &[Role::Node],
    ),
    (
        "/plinth.catalog.v1.SessionService/DeregisterNode",
        &[Role::Node],
    ),
    (
        "/plinth.catalog.v1.SessionService/RecordReadOrder",
        &[Role::Node],
    ),
    (
        "/plinth.catalog.v1.SessionService/GetReadOrder",
        &[Role::Node],
    ),
    (
        "/plinth.catalog.v1.CollectionService/HoldBlobs",
        &[Role::Builder],
    ),
    ("/plinth.catalog.v1.CollectionService/", &[Role::Source]),
    ("/plinth.catalog.v1.CatalogService/", &[Role::Gateway]),
    ("/plinth.catalog.v1.SessionService/", &[Role::Gateway]),
    ("/plinth.catalog.v1.HarnessService/", &[Role::Gateway]),
    ("/plinth.catalog.v1.BrainService/", &[Role::Gateway]),
    ("/plinth.catalog.v1.AdapterService/", &[Role::Gateway]),
    ("/plinth.catalog.v1.ReplayMemoryService/", &[Role::Gateway]),
    ("/plinth.catalog.v1.RequestKeyService/", &[Role::Gateway]),
    ("/plinth.catalog.v1.QuotaService/", &[Role::Gateway]),
]);

/// The largest answer `BeginCollection` sends: every kept tree's digest (72 bytes each on
/// the wire), so about 900,000 of them. Collectors accept as much.
pub const COLLECTION_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

/// How the catalog runs.
#[derive(Debug, Clone)]
pub struct CatalogOptions {
    /// `sqlite://path?mode=rwc` or `postgres://user:pass@host/db`.
    pub database_url: String,
    /// Upper bound on pooled database connections.
    pub max_connections: u32,
    /// Who may call the catalog (see [`ACCESS`]), and TLS.
    pub internal: Internal,
    /// How builds are leased to builders.
    pub leases: LeasePolicy,
    /// How long a silent node still gets new sessions.
    pub node_ttl: NodeTtl,
    /// How long a workspace adapter's rotated-out credential is still accepted.
    pub adapter_credential_grace: std::time::Duration,
    /// Where callers in this process reach the catalog directly, when they run beside it.
    pub local: Option<plinth_kit::grpc::LocalSlot>,
    /// Seals workspace adapters' credentials in the database; every catalog on one database
    /// needs the same key.
    pub seal_key: SealKey,
    /// Every scope's limits on environments, active sessions and builds queued or running.
    pub quotas: plinth_kit::quota::Quotas,
    /// What retention keeps, and how often it runs (`None`: never by itself).
    pub retention: RetentionPolicy,
    /// How often retention runs; `None`: only when asked (`plinth gc`).
    pub retention_every: Option<std::time::Duration>,
    /// How many versions a heartbeat names for nodes to hold warm (0: none), the most
    /// recently activated first ([`warm::DEFAULT_PREWARM_VERSIONS`] by default).
    pub prewarm_versions: u32,
}

/// Why the catalog stopped.
#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    /// The database could not be opened or migrated.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The gRPC server failed.
    #[error("catalog gRPC server failed: {0}")]
    Grpc(#[from] tonic::transport::Error),
}

/// How long the database may take to answer the readiness check's statement.
const DATABASE_CHECK_WITHIN: std::time::Duration = std::time::Duration::from_secs(1);

/// The most one request to a catalog service may carry (Brain's service excepted).
const MAX_REQUEST_BYTES: usize = 4 * 1024 * 1024;

/// The most one request to the session service may carry: a read order at its bounds (4,096
/// paths of 1,024 bytes, [`warm::MAX_READ_ORDER_PATHS`]) is 4 MiB and its framing, so the
/// bounds the catalog states are the ones it enforces, with its own message.
const MAX_SESSION_REQUEST_BYTES: usize = 5 * 1024 * 1024;

/// Opens the database, applies migrations, and serves gRPC on `grpc` (and `/healthz`,
/// `/readyz`, `/metrics` on `admin`, when given) until `shutdown` is cancelled.
pub async fn run(
    options: CatalogOptions,
    grpc: TcpListener,
    admin: Option<admin::Listener>,
    shutdown: CancellationToken,
) -> Result<(), CatalogError> {
    let seal_key = options.seal_key.id().to_owned();
    let store = Store::connect(
        &options.database_url,
        options.max_connections,
        options.seal_key,
    )
    .await?
    .with_quotas(options.quotas)
    .with_prewarm_versions(options.prewarm_versions);
    store.migrate().await?;
    plinth_kit::storage::watch_database(&options.database_url);
    tracing::info!(backend = store.backend().as_str(), address = ?grpc.local_addr().ok(), %seal_key, "catalog serving");

    let readiness_store = store.clone();
    let readiness: ReadinessCheck = admin::watch(Arc::new(move || {
        let store = readiness_store.clone();
        Box::pin(async move {
            // A statement on a pooled connection to a database that stopped answering
            // (its packets dropped) would wait for TCP to give up: a second is plenty.
            match tokio::time::timeout(DATABASE_CHECK_WITHIN, store.ping()).await {
                Ok(outcome) => outcome.map_err(|error| error.to_string()),
                Err(_) => Err(format!(
                    "the database did not answer within {} s",
                    DATABASE_CHECK_WITHIN.as_secs()
                )),
            }
        })
    }));
    let mut server = options
        .internal
        .server(plinth_proto::FILE_DESCRIPTOR_SET, ACCESS)
        .answer_locally(options.local.clone())
        .cap_calls(options.internal.calls.clone());
    // Catalogs on PostgreSQL have replicas to send callers to: one whose database stopped
    // answering turns them away at once. One on SQLite is the only one there is.
    if store.backend() == plinth_kit::database::Backend::Postgres {
        server = server.refuse_while_not_ready(readiness.clone());
    }
    server
        .report_health(
            &[SERVICE_NAME, HARNESS_SERVICE_NAME],
            readiness.clone(),
            shutdown.clone(),
        )
        .await;
    admin::spawn(
        admin,
        readiness,
        Some(options.internal.accepted.clone()),
        shutdown.clone(),
    );
    plinth_kit::tasks::spawn(background::gauges::report(
        store.clone(),
        options.node_ttl,
        shutdown.clone(),
    ));
    let wakeups = match store.backend() {
        plinth_kit::database::Backend::Sqlite => background::wakeups::Wakeups::in_process(),
        plinth_kit::database::Backend::Postgres => {
            let wakeups = background::wakeups::Wakeups::shared();
            plinth_kit::tasks::spawn(background::wakeups::listen(
                options.database_url.clone(),
                wakeups.clone(),
                shutdown.clone(),
            ));
            wakeups
        }
    };
    plinth_kit::tasks::spawn(background::sweep::end_sessions_past_their_limits(
        store.clone(),
        shutdown.clone(),
    ));
    if let Some(every) = options.retention_every {
        plinth_kit::tasks::spawn(background::retention::run(
            store.clone(),
            options.retention,
            every,
            shutdown.clone(),
        ));
    }

    // Every service bounds what one request may carry (tonic's default, 4 MiB, said here so
    // it is a decision and not an accident); Brain's operations carry tools' inputs.
    let service = CatalogServiceServer::new(grpc::catalog::Catalog::new(
        store.clone(),
        options.leases,
        wakeups,
        shutdown.clone(),
    ))
    .max_decoding_message_size(MAX_REQUEST_BYTES);
    let sessions = SessionServiceServer::new(grpc::sessions::Sessions::new(
        store.clone(),
        options.node_ttl,
    ))
    .max_decoding_message_size(MAX_SESSION_REQUEST_BYTES);
    server
        .add_service(service)
        .add_service(
            HarnessServiceServer::new(grpc::harnesses::Harnesses::new(store.clone()))
                .max_decoding_message_size(MAX_REQUEST_BYTES),
        )
        .add_service(sessions)
        .add_service(
            BrainServiceServer::new(grpc::brain::Brain::new(store.clone()))
                .max_decoding_message_size(grpc::brain::MAX_MESSAGE_BYTES)
                .max_encoding_message_size(grpc::brain::MAX_MESSAGE_BYTES),
        )
        .add_service(
            CollectionServiceServer::new(grpc::collection::Collection::new(store.clone()))
                .max_encoding_message_size(COLLECTION_MESSAGE_BYTES),
        )
        .add_service(
            AdapterServiceServer::new(grpc::adapters::Adapters::new(
                store.clone(),
                options.adapter_credential_grace,
                options.node_ttl,
            ))
            .max_decoding_message_size(MAX_REQUEST_BYTES),
        )
        .add_service(
            ReplayMemoryServiceServer::new(grpc::adapters::ReplayMemory::new(store.clone()))
                .max_decoding_message_size(MAX_REQUEST_BYTES),
        )
        .add_service(
            QuotaServiceServer::new(grpc::quotas::Quotas::new(store.clone()))
                .max_decoding_message_size(MAX_REQUEST_BYTES),
        )
        .add_service(
            RequestKeyServiceServer::new(grpc::request_keys::RequestKeys::new(store.clone()))
                .max_decoding_message_size(grpc::request_keys::MAX_MESSAGE_BYTES)
                .max_encoding_message_size(grpc::request_keys::MAX_MESSAGE_BYTES),
        )
        .serve(grpc, shutdown)
        .await?;
    store.close().await;
    Ok(())
}
