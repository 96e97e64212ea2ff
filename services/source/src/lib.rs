//! plinth-source: the source service. It owns every environment's source: an index per
//! environment (path → digest, size, executable bit) in SQLite or PostgreSQL, and the file
//! contents as SHA-256-named blobs in the blob store. It serves file reads and writes,
//! imports whole projects (zip, tar and compressed tars, git repositories), and freezes a
//! source into a tree for builds (`plinth.source.v1`).
//!
//! Whether an environment exists, and whose it is, is the catalog's business: callers ask it
//! first. Building and mounting are not here either. `paths` holds the one path rule;
//! `archive` reads untrusted archives; `import` and `git` turn them into entries and blobs;
//! `links` decides which symlinks stay (those that cannot leave the root; reads never follow
//! them); `persistence` owns the index and each scope's stored bytes (the distinct blobs its
//! sources and build layers hold, and its quota); `gc` collects the blob store's garbage (the
//! source holds most of its references); `service` is the gRPC adapter; `run` starts it all.

pub mod archive;
pub mod gc;
pub mod git;
pub mod import;
pub mod links;
pub mod paths;
pub mod persistence;
mod service;
pub mod tree;

use std::path::PathBuf;
use std::sync::Arc;

use plinth_blobs::BlobStore;
use plinth_kit::admin::{self, ReadinessCheck};
use plinth_kit::auth::{Access, Role};
use plinth_kit::grpc::Internal;
use plinth_kit::tasks::CancellationToken;
use plinth_proto::source::v1::source_service_server::SourceServiceServer;
use tokio::net::TcpListener;

pub use git::GitPolicy;
pub use persistence::{Index, IndexError};
pub use service::SourceLimits;

/// The source's gRPC service name, as health checks name it.
pub const SERVICE_NAME: &str = "plinth.source.v1.SourceService";

/// How the source service runs.
#[derive(Debug, Clone)]
pub struct SourceOptions {
    /// The index's database: `sqlite://…` or `postgres://…`.
    pub database_url: String,
    /// Upper bound on pooled database connections.
    pub max_connections: u32,
    /// The blob store: `file://…`, `s3://…` or `memory://`.
    pub blob_url: String,
    /// Where uploads and imports are spooled and large blobs verified.
    pub spool_dir: PathBuf,
    /// Size limits.
    pub limits: SourceLimits,
    /// What git imports may reach.
    pub git: GitPolicy,
    /// Who may call the source service (the gateway only: every call names a scope), and
    /// TLS.
    pub internal: Internal,
    /// Where callers in this process reach the source service directly, when they run beside
    /// it.
    pub local: Option<plinth_kit::grpc::LocalSlot>,
    /// Every scope's limits; the source service enforces stored bytes.
    pub quotas: plinth_kit::quota::Quotas,
    /// Garbage collection: the grace period and how long holds of work in progress live.
    pub collection: gc::GcOptions,
    /// Whether this process collects, and how often: `None` leaves it to others (another
    /// replica, `plinth gc`); its writes hold what they write all the same.
    pub collector: Option<Collector>,
}

/// A source service's periodic garbage collection.
#[derive(Clone)]
pub struct Collector {
    /// The catalog, asked what it keeps.
    pub catalog: Arc<dyn gc::Catalog>,
    /// Time between passes.
    pub every: std::time::Duration,
}

impl std::fmt::Debug for Collector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Collector")
            .field("every", &self.every)
            .finish_non_exhaustive()
    }
}

/// Why the source service stopped.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The index could not be opened or migrated.
    #[error(transparent)]
    Index(#[from] IndexError),
    /// The blob store could not be opened.
    #[error("cannot open the blob store: {0}")]
    Blobs(#[from] plinth_blobs::BlobError),
    /// The gRPC server failed.
    #[error("source gRPC server failed: {0}")]
    Grpc(#[from] tonic::transport::Error),
}

/// Which roles may call the source service: builders only to count and forget the layers
/// of builds they lease and to read where a source came from, the gateway everything else
/// (every call names a scope).
pub const ACCESS: Access = Access(&[
    (
        "/plinth.source.v1.SourceService/RecordLayer",
        &[Role::Builder],
    ),
    (
        "/plinth.source.v1.SourceService/ForgetLayer",
        &[Role::Builder],
    ),
    (
        "/plinth.source.v1.SourceService/GetOrigin",
        &[Role::Builder],
    ),
    ("/plinth.source.v1.SourceService/", &[Role::Gateway]),
]);

/// Removes the git fetch directories a killed run left in the spool directory, opens the
/// index and the blob store and serves gRPC on `grpc` (and `/healthz`, `/readyz`, `/metrics`
/// on `admin`, when given) until `shutdown` is cancelled.
pub async fn run(
    options: SourceOptions,
    grpc: TcpListener,
    admin: Option<admin::Listener>,
    shutdown: CancellationToken,
) -> Result<(), SourceError> {
    match git::remove_leftovers(&options.spool_dir) {
        Ok(0) => {}
        Ok(removed) => tracing::info!(
            removed,
            "removed git fetch directories left by an earlier run"
        ),
        Err(error) => tracing::warn!(
            %error,
            spool_dir = %options.spool_dir.display(),
            "cannot remove git fetch directories left by an earlier run; check the spool directory's permissions"
        ),
    }
    let index = Index::connect(&options.database_url, options.max_connections)
        .await?
        .with_quotas(options.quotas);
    index.migrate().await?;
    let blobs = BlobStore::open(&options.blob_url, options.spool_dir.clone())?;
    blobs.watch_disks();
    gc::start_metrics(blobs.clone());
    plinth_kit::storage::watch_database(&options.database_url);
    tracing::info!(address = ?grpc.local_addr().ok(), "source serving");

    // Ready when its index database answers. The blob store is every replica's: were its
    // outage to make them not ready, a balancer would take every replica out of service,
    // and calls that need no blob (and the spool's uploads) would fail with them. A call
    // that needs it fails on its own, saying so; `/readyz` says so under its details.
    let (readiness_index, readiness_blobs) = (index.clone(), blobs.clone());
    let readiness: ReadinessCheck = admin::watch(Arc::new(move || {
        let (index, blobs) = (readiness_index.clone(), readiness_blobs.clone());
        Box::pin(async move {
            // A database or store whose packets are dropped would hold a statement until TCP
            // gives up: a second is plenty.
            // Both at once, so the round ends within a second whatever either does.
            let within = std::time::Duration::from_secs(1);
            let (indexed, stored) = tokio::join!(
                tokio::time::timeout(within, index.ping()),
                tokio::time::timeout(within, blobs.ping())
            );
            admin::describe(
                "blob store",
                match stored {
                    Ok(Ok(())) => "answers".to_owned(),
                    Ok(Err(error)) => format!("does not answer ({error})"),
                    Err(_) => "does not answer within 1 s".to_owned(),
                },
            );
            match indexed {
                Ok(Ok(())) => Ok(()),
                Ok(Err(error)) => Err(format!("the index database does not answer: {error}")),
                Err(_) => Err("the index database did not answer within 1 s".to_owned()),
            }
        })
    }));
    let mut server = options
        .internal
        .server(plinth_proto::FILE_DESCRIPTOR_SET, ACCESS)
        .answer_locally(options.local.clone())
        .cap_calls(options.internal.calls.clone());
    // Sources on PostgreSQL have replicas to send callers to: one whose index database
    // stopped answering turns them away at once. One on SQLite is the only one there is.
    if options.database_url.starts_with("postgres") {
        server = server.refuse_while_not_ready(readiness.clone());
    }
    server
        .report_health(&[SERVICE_NAME], readiness.clone(), shutdown.clone())
        .await;
    admin::spawn(
        admin,
        readiness,
        Some(options.internal.accepted.clone()),
        shutdown.clone(),
    );

    plinth_kit::tasks::spawn(gc::forget_expired_work(
        index.clone(),
        options
            .collection
            .hold_ttl
            .max(std::time::Duration::from_secs(1)),
        shutdown.clone(),
    ));
    if let Some(collector) = &options.collector {
        tracing::info!(
            every_s = collector.every.as_secs(),
            grace_s = options.collection.grace.as_secs(),
            "garbage collection of the blob store runs here"
        );
        plinth_kit::tasks::spawn(gc::run(
            index.clone(),
            blobs.clone(),
            collector.catalog.clone(),
            options.collection,
            collector.every,
            shutdown.clone(),
        ));
    }
    // One message at most 4 MiB (tonic's default, said here so it is a decision): uploads and
    // imports stream in chunks, bounded in total by `limits` as they arrive.
    let service = SourceServiceServer::new(service::Source::new(
        index.clone(),
        blobs,
        options.spool_dir,
        options.limits,
        options.git,
        options.collection.hold_ttl,
    ))
    .max_decoding_message_size(4 * 1024 * 1024);
    server.add_service(service).serve(grpc, shutdown).await?;
    index.close().await;
    Ok(())
}
