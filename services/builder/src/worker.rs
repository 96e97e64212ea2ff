//! The builder's work loop: lease the oldest queued build from the catalog, materialize its
//! source tree from the blob store (verified), install at the mount path in isolation
//! (`install`), describe the result as a layer (`layer`), upload the blobs the store lacks,
//! store the layer tree, count it in its scope's stored bytes with the source service (a
//! layer past the scope's quota fails the build), and complete the build, all under the
//! lease: the lease is renewed every third of its length, and once it is lost the build is
//! abandoned and nothing of it is published (the catalog refuses a stale token anyway).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use plinth_blobs::tree::{Tree, TreeEntry, TreeEntryKind};
use plinth_blobs::{BlobStore, Digest};
use plinth_kit::grpc::{ClientInterceptor, Transport};
use plinth_kit::tasks::CancellationToken;
use plinth_kit::{ErrorCode, PlinthError};
use plinth_proto::catalog::v1 as pb;

use crate::toolchains;
use plinth_proto::catalog::v1::catalog_service_client::CatalogServiceClient;
use plinth_proto::catalog::v1::collection_service_client::CollectionServiceClient;
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;
use tonic::service::interceptor::InterceptedService;
use tracing::Instrument as _;

use crate::install::{self, InstallOptions};
use crate::layer::{self, EntryKind};

/// Blob reads or writes in flight at once when materializing or publishing.
const PARALLEL_BLOBS: usize = 32;

type Catalog = CatalogServiceClient<InterceptedService<Transport, ClientInterceptor>>;
/// The catalog's part in garbage collection: where a build holds the blobs it publishes.
pub type Collection = CollectionServiceClient<InterceptedService<Transport, ClientInterceptor>>;

/// Most digests one hold names (the catalog's limit per call).
const HOLD_CHUNK: usize = 20_000;

pub use crate::origin::LayerLedger;

/// How long a build waits out a blob store or catalog that does not answer (retrying with a
/// backoff from [`RETRY_FIRST`] doubling to [`RETRY_MOST`]) before it fails for it. Its lease
/// is renewed meanwhile, so no other builder takes it.
const RETRY_FOR: Duration = Duration::from_secs(300);
const RETRY_FIRST: Duration = Duration::from_millis(500);
const RETRY_MOST: Duration = Duration::from_secs(8);
/// How long a poll for work waits on one catalog (which holds an empty one up to 20 s).
const CLAIM_WITHIN: Duration = Duration::from_secs(25);
/// How often counting a layer is tried before its build fails, and the pause between tries.
const LEDGER_TRIES: u32 = 3;
const LEDGER_PAUSE: Duration = Duration::from_secs(1);

/// How a builder runs.
#[derive(Debug, Clone)]
pub struct BuilderOptions {
    /// Its name, for operators and logs.
    pub name: String,
    /// Where builds happen (scratch directories; on the same file system as installer caches).
    pub work_dir: PathBuf,
    /// How installers run.
    pub install: InstallOptions,
    /// How long to wait before asking again when nothing is queued (unless the catalog already
    /// held the empty answer at least this long).
    pub idle_poll: Duration,
    /// What the installers are (see `tools::identity`): part of every dependency key, so a new
    /// uv, Python or npm never reuses what an older one installed.
    pub toolchain: String,
    /// Where layers are counted in their scope's stored bytes before a build completes; none:
    /// layers are not counted (the builder warns at start).
    pub layers: Option<LayerLedger>,
    /// How builds' disk is limited (`install.limits.disk_mb`, a disk per scope:
    /// [`crate::scope_disk`]); [`run`] checks the host can when it is `None` and a limit is
    /// set.
    pub disk: Option<plinth_sandbox::disk::DiskLimits>,
    /// Whether a host that cannot limit builds' disk stops the builder; otherwise the builder
    /// warns and builds without a disk limit (the limit is the default, not asked for).
    pub disk_required: bool,
    /// The bytes of dependency trees kept for rebuilds in each kept directory (the builder's,
    /// or each scope's build disk), least recently kept evicted first ([`crate::kept`]).
    pub kept_budget: u64,
}

/// Why the builder stopped.
#[derive(Debug, thiserror::Error)]
pub enum BuilderError {
    /// Another builder process works in the same directory.
    #[error(
        "another builder process works in {path}, {holder}: stop it{stop}, or give each builder process its own work directory (--data-dir, or builder.work_dir)",
        stop = .holder.kill_hint()
    )]
    WorkDirInUse {
        /// The directory.
        path: PathBuf,
        /// The process that holds it.
        holder: Box<plinth_kit::dir_lock::Holder>,
    },
    /// Builds are to be bounded and cannot be.
    #[error("builds need cgroups for their memory, process and CPU limits (builder.limits): {0}")]
    Limits(crate::limits::LimitsError),
    /// Builds are to have a disk limit and cannot.
    #[error(
        "builds need loop devices and mkfs.ext4 for the disk limit the configuration sets \
         (builder.limits.disk_mb): {0}. Or leave builder.limits.disk_mb out, so a host without \
         them builds with no disk limit (and a warning), or set it to 0"
    )]
    Disk(String),
    /// Its work directory is unusable.
    #[error("builder work directory {path}: {source}")]
    WorkDir {
        /// The directory.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// Takes `work_dir` for this process (running `command`): an exclusive lock on
/// `<work_dir>/.lock` ([`plinth_kit::dir_lock`]), held while the answered lock is. A second
/// builder process on the same directory would remove the first one's builds in progress as
/// leftovers, and both would write the same caches; it is refused instead, naming the
/// directory and the process that holds it.
pub fn lock_work_dir(
    work_dir: &Path,
    command: &str,
) -> Result<plinth_kit::dir_lock::DirLock, BuilderError> {
    use plinth_kit::dir_lock::{DirLock, DirLockError};
    match DirLock::acquire(work_dir, ".lock", command, "") {
        Ok(lock) => Ok(lock),
        Err(DirLockError::InUse { holder, .. }) => Err(BuilderError::WorkDirInUse {
            path: work_dir.to_owned(),
            holder,
        }),
        Err(DirLockError::Io { source, .. }) => Err(BuilderError::WorkDir {
            path: work_dir.to_owned(),
            source,
        }),
    }
}

/// Removes what a builder killed mid-build left in `work_dir`: scratch directories of builds
/// (a build is always started afresh), dependency trees it was setting aside, and the mounts
/// of the scopes' disks ([`crate::scope_disk::remove_leftovers`]; their caches stay). Call it
/// once per work directory, before any builder there starts. Answers how many were removed.
pub fn remove_leftovers(work_dir: &Path) -> std::io::Result<usize> {
    let mut removed = crate::scope_disk::remove_leftovers(work_dir)?;
    let builds = work_dir.join("builds");
    unmount_build_images(&builds)?;
    removed += crate::scope_disk::remove_entries(&builds, false)?;
    removed += crate::scope_disk::remove_entries(&work_dir.join("kept"), true)?;
    Ok(removed)
}

/// Unmounts the image of every build directory in `builds` that has one (a killed builder's
/// of an earlier release, which gave each build an image of its own): the loop device goes
/// with the mount (autoclear), the image and the rest with the directory.
fn unmount_build_images(builds: &Path) -> std::io::Result<()> {
    let entries = match std::fs::read_dir(builds) {
        Ok(entries) => entries,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(error) => return Err(error),
    };
    for entry in entries {
        let dir = entry?.path();
        if std::fs::symlink_metadata(dir.join("work.ext4")).is_ok() {
            crate::scope_disk::unmount_all(&dir.join("work"))?;
        }
    }
    Ok(())
}

/// Makes every series the dashboards show of a builder exist, at zero: call it when the
/// process starts, before anything slow (placing its tools) runs.
pub fn register_metrics() {
    plinth_kit::telemetry::metrics();
    for result in ["claimed", "empty", "error"] {
        metrics::counter!("plinth_builder_claims_total", "result" => result).increment(0);
    }
    for outcome in ["ready", "failed"] {
        let _ = metrics::histogram!("plinth_build_duration_seconds", "outcome" => outcome);
    }
}

/// Leases and runs builds until `shutdown`.
pub async fn run(
    options: BuilderOptions,
    catalog: Catalog,
    collection: Collection,
    blobs: BlobStore,
    shutdown: CancellationToken,
) -> Result<(), BuilderError> {
    register_metrics();
    let builds = options.work_dir.join("builds");
    std::fs::create_dir_all(&builds).map_err(|source| BuilderError::WorkDir {
        path: builds.clone(),
        source,
    })?;
    if options.layers.is_none() {
        tracing::warn!(
            "no source service to count layers in: built layers do not count in their scope's stored-bytes quota (give the builder builder.source_url)"
        );
    }
    let mut options = options;
    if options.install.cgroups.is_none() && options.install.limits.cgroup_limits().is_some() {
        options.install.cgroups = Some(build_cgroups(&options.work_dir).await?);
    }
    if options.disk.is_none() && options.install.limits.disk_mb.is_some() {
        let scopes = crate::scope_disk::ScopeDisks::dir_of(&options.work_dir);
        // Builders of one work directory in one process would share the check's probe
        // directory (named after the process): one check at a time.
        static CHECKING: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let checked = tokio::task::spawn_blocking(move || {
            let _one = CHECKING
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            plinth_sandbox::disk::DiskLimits::check(&scopes)
        })
        .await
        .map_err(|join| BuilderError::Disk(join.to_string()))?;
        match checked {
            Ok(checked) => options.disk = Some(checked),
            Err(error) if options.disk_required => {
                return Err(BuilderError::Disk(error.to_string()));
            }
            Err(error) => {
                tracing::warn!(
                    %error,
                    fix = "give the builder what the error asks for, or set \
                           builder.limits.disk_mb = 0 to build without a disk limit and silence this",
                    "builds run without a disk limit: this host cannot make their disk images \
                     (builder.limits.disk_mb limits each scope's builds where it can)"
                );
                options.install.limits.disk_mb = None;
            }
        }
    }
    let scope_disks = match (&options.disk, options.install.limits.disk_mb) {
        (Some(disk), Some(size_mb)) => {
            // The download caches and kept trees of builds without a limit are not used
            // with one (each scope's are on its disk).
            let work_dir = options.work_dir.clone();
            let _ = tokio::task::spawn_blocking(move || remove_unlimited_caches(&work_dir)).await;
            Some(crate::scope_disk::ScopeDisks::new(
                disk.clone(),
                &options.work_dir,
                size_mb,
            ))
        }
        _ => None,
    };
    tracing::info!(builder = %options.name, work_dir = %options.work_dir.display(), "builder waiting for work");
    let options = Arc::new(options);
    loop {
        if shutdown.is_cancelled() {
            return Ok(());
        }
        let asked = tokio::time::Instant::now();
        let mut client = catalog.clone();
        // An empty poll is not worth a trace; a build it finds gets its own (see `build`).
        // The catalog holds an empty poll for up to 20 s; a catalog that has not answered
        // well after that is not going to, and the next poll goes to another replica.
        let mut request = tonic::Request::new(pb::ClaimBuildRequest {
            builder: options.name.clone(),
        });
        request.set_timeout(CLAIM_WITHIN);
        let poll = client
            .claim_build(request)
            .instrument(plinth_kit::telemetry::idle("builder.poll"));
        let claim = tokio::select! {
            () = shutdown.cancelled() => return Ok(()),
            claim = poll => claim,
        };
        let result = match &claim {
            Ok(answer) if answer.get_ref().claim.is_some() => "claimed",
            Ok(_) => "empty",
            Err(_) => "error",
        };
        metrics::counter!("plinth_builder_claims_total", "result" => result).increment(1);
        // The catalog holds an empty answer open for a while (a long poll): after one that took
        // a poll's length, ask again at once, or a build queued now would wait for the sleep.
        let (claim, held) = match claim {
            Ok(answer) => (
                answer.into_inner().claim,
                asked.elapsed() >= options.idle_poll,
            ),
            Err(status) => {
                tracing::warn!(error = %status.message(), "cannot reach the catalog for work; retrying");
                (None, false)
            }
        };
        match claim {
            Some(claim) => {
                build(
                    &options,
                    scope_disks.as_ref(),
                    catalog.clone(),
                    collection.clone(),
                    &blobs,
                    claim,
                    &shutdown,
                )
                .await
            }
            None if held => {}
            None => {
                tokio::select! {
                    () = shutdown.cancelled() => return Ok(()),
                    () = tokio::time::sleep(options.idle_poll) => {}
                }
            }
        }
    }
}

/// Runs one leased build to its end, or until its lease is lost, in a trace of its own, and
/// records its duration by outcome.
async fn build(
    options: &BuilderOptions,
    scope_disks: Option<&crate::scope_disk::ScopeDisks>,
    catalog: Catalog,
    collection: Collection,
    blobs: &BlobStore,
    claim: pb::BuildClaim,
    shutdown: &CancellationToken,
) {
    let Some(build) = claim.build.clone() else {
        return;
    };
    let span = tracing::info_span!(
        parent: None,
        "builder.build",
        environment = %build.environment_id,
        version = build.version,
        attempt = build.attempt,
        outcome = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
        trace_id = tracing::field::Empty,
    );
    plinth_kit::telemetry::record_trace_id(&span);
    let started = std::time::Instant::now();
    let outcome = run_build(
        options,
        scope_disks,
        catalog,
        collection,
        blobs,
        claim,
        build,
        shutdown,
    )
    .instrument(span.clone())
    .await;
    span.record("outcome", outcome);
    if outcome == "failed" {
        span.record("otel.status_code", "error");
    }
    metrics::histogram!("plinth_build_duration_seconds", "outcome" => outcome)
        .record(started.elapsed().as_secs_f64());
}

/// [`build`]'s work; answers how the build ended: `ready` or `failed` (as the catalog recorded
/// it), or `abandoned` when this builder lost its lease or stopped.
#[allow(clippy::too_many_arguments)]
async fn run_build(
    options: &BuilderOptions,
    scope_disks: Option<&crate::scope_disk::ScopeDisks>,
    catalog: Catalog,
    collection: Collection,
    blobs: &BlobStore,
    claim: pb::BuildClaim,
    build: pb::Build,
    shutdown: &CancellationToken,
) -> &'static str {
    let token = claim.lease_token.clone();
    let lease_lost = shutdown.child_token();

    // Renew the lease every third of it; a builder that cannot renew stops its build.
    let keeper = {
        let (mut catalog, token, lost) = (catalog.clone(), token.clone(), lease_lost.clone());
        let every =
            Duration::from_millis(u64::try_from(claim.renew_every_ms.max(100)).unwrap_or(1000));
        let expires = claim.expires_at_ms;
        plinth_kit::tasks::spawn(async move {
            let mut expires_at_ms = expires;
            loop {
                tokio::select! {
                    () = lost.cancelled() => return,
                    () = tokio::time::sleep(every) => {}
                }
                // A renewal that takes longer than the renewal period is a failed one: the
                // lease must not run out while this builder waits on a stuck call.
                // Each replica gets half the period, so a sick one leaves time for another.
                let mut request = tonic::Request::new(pb::RenewLeaseRequest {
                    lease_token: token.clone(),
                });
                request.set_timeout(every / 2);
                let renewed = tokio::time::timeout(every, catalog.renew_lease(request))
                    .await
                    .unwrap_or_else(|_| {
                        Err(tonic::Status::deadline_exceeded(
                            "renewing the lease timed out",
                        ))
                    });
                match renewed {
                    Ok(answer) => expires_at_ms = answer.into_inner().expires_at_ms,
                    Err(status) => {
                        let lost_for_good =
                            PlinthError::from_status(&status).code == ErrorCode::LeaseLost;
                        let now = plinth_kit::clock::now_ms();
                        if lost_for_good || now >= expires_at_ms {
                            tracing::warn!(error = %status.message(), "renewing the lease was refused");
                            lost.cancel();
                            return;
                        }
                        tracing::warn!(error = %status.message(), "renewing the lease failed; retrying");
                    }
                }
            }
        })
    };

    // Ship the log in batches as it comes.
    // Unbounded, because installers must never wait on the catalog; the install log is itself
    // capped (head and tail), so what can queue here is bounded too.
    let (log_tx, log_rx) = mpsc::unbounded_channel::<Vec<u8>>();
    let shipper = plinth_kit::tasks::spawn(ship_log(
        catalog.clone(),
        token.clone(),
        log_rx,
        lease_lost.clone(),
    ));

    let name = format!(
        "{}-{}-{}",
        build.environment_id, build.version, build.attempt
    );
    // With a disk limit, everything the build can write, and what its scope keeps between
    // builds, lives on the scope's disk, mounted while builds of the scope run.
    let disk = match scope_disks {
        Some(disks) => {
            let (disks, key) = (disks.clone(), scope_key(&claim.scope));
            let acquired = tokio::task::spawn_blocking(move || disks.acquire(&key))
                .await
                .map_err(|join| join.to_string())
                .and_then(|acquired| acquired.map_err(|error| error.to_string()))
                .map_err(|error| {
                    format!(
                        "making this scope's build disk failed ({}): {error}",
                        crate::limits::DISK_SETTING
                    )
                });
            Some(acquired)
        }
        None => None,
    };
    let places = match &disk {
        Some(Ok(disk)) => Places {
            scratch: disk.build_dir(&name),
            cache: disk.cache(),
            kept: disk.kept(),
            kept_prefix: String::new(),
            kept_environment: format!("{}-", scope_key(&build.environment_id)),
        },
        _ => Places::unlimited(
            &options.work_dir,
            &claim.scope,
            &build.environment_id,
            &name,
        ),
    };
    let scratch = places.scratch.clone();
    let ready = match &disk {
        Some(Err(error)) => Err(error.clone()),
        _ => Ok(()),
    };
    let context = BuildContext {
        options,
        blobs,
        catalog: catalog.clone(),
        collection,
        token: &token,
        build: &build,
        slug: &claim.slug,
        places: &places,
        log: log_tx.clone(),
        lease_lost: &lease_lost,
    };
    let outcome = tokio::select! {
        outcome = async {
            ready?;
            let python = crate::manifests::python_setting(claim.install.as_ref())
                .map_err(|refused| refused.to_string())?;
            produce(&context, python).await
        } => outcome,
        () = lease_lost.cancelled() => Err(BuildFailure::LeaseLost),
    };
    drop(context);
    // Out of space outside the installers' commands (the source itself, the builder's own
    // writes on the image): the reason names the limit too.
    let outcome = match outcome {
        Err(failure)
            if matches!(disk, Some(Ok(_)))
                && failure.ran_out_of_space()
                && !failure.names_the_disk_limit() =>
        {
            Err(BuildFailure::Step(format!(
                "{}: {failure}",
                options.install.limits.disk_reason()
            )))
        }
        other => other,
    };
    // Out of the scope's disk: its caches make room for the next build.
    if let (Err(failure), Some(Ok(disk))) = (&outcome, &disk)
        && failure.names_the_disk_limit()
    {
        disk.mark_full();
    }
    drop(log_tx);
    let _ = shipper.await;
    // A layer counts in its scope's stored bytes before it is published; past the quota the
    // build fails instead.
    let mut recorded = false;
    let outcome = match outcome {
        Ok(ready) if !lease_lost.is_cancelled() => {
            match record_layer(options, &claim.scope, &build, &ready.layer_tree).await {
                Ok(counted) => {
                    recorded = counted;
                    Ok(ready)
                }
                Err(error) => Err(BuildFailure::Step(error)),
            }
        }
        other => other,
    };
    let published_layer = outcome
        .as_ref()
        .ok()
        .and_then(|ready| ready.layer_tree.parse::<Digest>().ok());
    let outcome = match outcome {
        Ok(ready) => pb::complete_build_request::Outcome::Ready(ready),
        Err(failure) => pb::complete_build_request::Outcome::Failed(failure.to_string()),
    };
    // Whichever call learned it (a renewal, a log append, a reuse query), a lost lease ends
    // the build here, and nothing it made is offered to the catalog.
    let mut published = false;
    let mut doomed = crate::kept::Doomed::default();
    let mut ended = "abandoned";
    if lease_lost.is_cancelled() {
        if shutdown.is_cancelled() {
            // Stopping: the build goes back to the queue now rather than when the lease runs
            // out, so another builder takes it at once.
            release(catalog.clone(), token).await;
        } else {
            tracing::error!("lease lost: this build was abandoned and publishes nothing");
        }
    } else {
        // A catalog that does not answer is waited out while the lease is renewed: the
        // build is done, and running it again elsewhere would only repeat it. The log has
        // been shipped; the waits go to the builder's own log.
        let (quiet, _) = mpsc::unbounded_channel();
        let completed = retrying("completing the build", &lease_lost, &quiet, || {
            let request = pb::CompleteBuildRequest {
                lease_token: token.clone(),
                outcome: Some(outcome.clone()),
            };
            let mut catalog = catalog.clone();
            async move {
                match catalog.complete_build(request).await {
                    Ok(done) => Ok(Ok(done)),
                    Err(status)
                        if PlinthError::from_status(&status).code == ErrorCode::Unavailable =>
                    {
                        Err(Failed::status(&status))
                    }
                    Err(status) => Ok(Err(status)),
                }
            }
        })
        .await
        .unwrap_or_else(|failed| Err(tonic::Status::unavailable(failed.message)));
        match completed {
            Ok(done) => {
                published = true;
                let status = done.into_inner().status();
                ended = match status {
                    pb::BuildStatus::Ready => "ready",
                    _ => "failed",
                };
                tracing::info!(status = status.as_str_name(), "build completed");
                if let Some(layer) = published_layer {
                    doomed = keep_dependencies(options, &places, &layer).await;
                }
            }
            Err(status) if PlinthError::from_status(&status).code == ErrorCode::LeaseLost => {
                tracing::error!(error = %status.message(), "lease lost: this build was abandoned and publishes nothing")
            }
            Err(status) => {
                tracing::error!(error = %status.message(), "completing the build was refused")
            }
        }
    }
    if recorded && !published {
        forget_layer(options, &build).await;
    }
    lease_lost.cancel();
    let _ = keeper.await;
    // Scratch directories can be large; removing them must not hold up the next build, unless
    // the builder is stopping: then nothing of the build, its scope's mount included, is left.
    let cleanup = tokio::task::spawn_blocking(move || {
        if let Err(error) = std::fs::remove_dir_all(&scratch)
            && error.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(dir = %scratch.display(), %error, "removing a build's scratch directory failed");
        }
        doomed.delete();
        if let Some(Ok(disk)) = disk {
            disk.release();
        }
    });
    if shutdown.is_cancelled() {
        let _ = cleanup.await;
    }
    ended
}

/// Where a build's scratch directory is, and what it keeps for its scope's later builds.
struct Places {
    /// The scratch directory, removed when the build ends.
    scratch: PathBuf,
    /// The scope's download cache between builds.
    cache: PathBuf,
    /// The directory of kept dependency trees ([`crate::kept`]), and the name prefix of the
    /// scope's there.
    kept: PathBuf,
    kept_prefix: String,
    /// The name prefix of the build's environment's kept trees (after the scope's).
    kept_environment: String,
}

impl Places {
    /// Without a disk limit: all in the work directory, the scope's caches named after it.
    fn unlimited(work_dir: &Path, scope: &str, environment: &str, name: &str) -> Places {
        let kept_prefix = format!("{}-", scope_key(scope));
        Places {
            scratch: work_dir.join("builds").join(name),
            cache: work_dir.join("cache").join(scope_key(scope)),
            kept: work_dir.join("kept"),
            kept_environment: format!("{kept_prefix}{}-", scope_key(environment)),
            kept_prefix,
        }
    }

    /// The name of the kept dependency trees of the build that produced `layer`.
    fn kept_tree(&self, layer: &Digest) -> String {
        format!("{}{}", self.kept_environment, layer.to_hex())
    }
}

/// Removes the download caches and kept dependency trees of builds without a disk limit
/// (`<work_dir>/cache`, `<work_dir>/kept`): with a limit, each scope's are on its disk.
fn remove_unlimited_caches(work_dir: &Path) {
    for name in ["cache", "kept"] {
        let path = work_dir.join(name);
        match std::fs::remove_dir_all(&path) {
            Ok(()) => {
                tracing::info!(dir = %path.display(), "removed the caches of builds without a disk limit: with builder.limits.disk_mb, each scope's are on its build disk")
            }
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => {
                tracing::warn!(dir = %path.display(), %error, "could not remove the caches of builds without a disk limit")
            }
        }
    }
}

/// Counts a build's layer in its scope's stored bytes; answers whether it was counted (false
/// when no source service is configured). The error is the build's `error` for its owner.
async fn record_layer(
    options: &BuilderOptions,
    scope: &str,
    build: &pb::Build,
    layer_tree: &str,
) -> Result<bool, String> {
    let Some(ledger) = &options.layers else {
        return Ok(false);
    };
    let request = plinth_proto::source::v1::RecordLayerRequest {
        scope: scope.to_owned(),
        environment_id: build.environment_id.clone(),
        version: build.version,
        attempt: build.attempt,
        layer_tree: layer_tree.to_owned(),
    };
    let mut tries = 0;
    loop {
        tries += 1;
        match ledger.clone().record_layer(request.clone()).await {
            Ok(answer) => {
                tracing::info!(
                    stored_bytes = answer.into_inner().stored_bytes,
                    "layer counted in its scope's stored bytes"
                );
                return Ok(true);
            }
            Err(status) => {
                let error = PlinthError::from_status(&status);
                if error.code == ErrorCode::QuotaExceeded {
                    return Err(format!(
                        "the built layer was not published: it would take this scope past its stored-bytes quota. {}",
                        error.message
                    ));
                }
                if error.code != ErrorCode::Unavailable || tries >= LEDGER_TRIES {
                    return Err(format!(
                        "the built layer could not be counted in this scope's stored bytes ({}); build again",
                        error.message
                    ));
                }
                tracing::warn!(error = %error.message, "counting the layer failed; retrying");
                tokio::time::sleep(LEDGER_PAUSE).await;
            }
        }
    }
}

/// Gives a build this builder is stopping in the middle of back to the queue.
async fn release(mut catalog: Catalog, lease_token: String) {
    let released = tokio::time::timeout(
        Duration::from_secs(5),
        catalog.release_build(pb::ReleaseBuildRequest { lease_token }),
    )
    .await;
    match released {
        Ok(Ok(_)) => tracing::info!("stopping: the build was given back to the queue"),
        Ok(Err(status)) => {
            tracing::warn!(error = %status.message(), "stopping: the build could not be given back; another builder takes it when its lease runs out")
        }
        Err(_) => tracing::warn!(
            "stopping: giving the build back timed out; another builder takes it when its lease runs out"
        ),
    }
}

/// Forgets what this attempt counted, once its build will not be published.
async fn forget_layer(options: &BuilderOptions, build: &pb::Build) {
    let Some(ledger) = &options.layers else {
        return;
    };
    let forgotten = ledger
        .clone()
        .forget_layer(plinth_proto::source::v1::ForgetLayerRequest {
            environment_id: build.environment_id.clone(),
            version: build.version,
            attempt: Some(build.attempt),
        })
        .await;
    if let Err(status) = forgotten {
        tracing::warn!(error = %status.message(), "the unpublished layer could not be forgotten; it counts in its scope's stored bytes until its environment is deleted");
    }
}

/// Why a build produced no layer. Its text is the build's `error`, shown in its log and by the
/// API; a lost lease is its own case, since such a build is abandoned and publishes nothing.
#[derive(Debug)]
enum BuildFailure {
    /// The catalog refused this builder's lease: the build may be another builder's now.
    LeaseLost,
    /// A step failed; the sentence says which and why.
    Step(String),
}

impl std::fmt::Display for BuildFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BuildFailure::LeaseLost => f.write_str("the lease was lost; this build was abandoned"),
            BuildFailure::Step(reason) => f.write_str(reason),
        }
    }
}

impl From<String> for BuildFailure {
    fn from(reason: String) -> Self {
        BuildFailure::Step(reason)
    }
}

impl BuildFailure {
    /// Whether a step ran out of disk space: the operating system's `ENOSPC`, as the error
    /// that reached the step words it (the errors come from many libraries, each with its
    /// own type; their text is what they share).
    fn ran_out_of_space(&self) -> bool {
        matches!(self, BuildFailure::Step(reason) if reason.contains("(os error 28)"))
    }

    /// Whether its reason names the scope's disk limit (`builder.limits.disk_mb`).
    fn names_the_disk_limit(&self) -> bool {
        matches!(self, BuildFailure::Step(reason) if reason.contains(crate::limits::DISK_SETTING))
    }
}

/// What one build's steps share: the settings, the stores and services it talks to, the build
/// and its lease, where it runs, and where its log goes.
struct BuildContext<'a> {
    options: &'a BuilderOptions,
    blobs: &'a BlobStore,
    catalog: Catalog,
    collection: Collection,
    token: &'a str,
    build: &'a pb::Build,
    slug: &'a str,
    places: &'a Places,
    log: mpsc::UnboundedSender<Vec<u8>>,
    lease_lost: &'a CancellationToken,
}

/// What a build found before installing: the toolchains it pins, where its source came
/// from, and the key under which earlier builds' layers are reused.
struct Prepared {
    selection: toolchains::Selection,
    origin: Option<crate::origin::Derived>,
    dependency_key: String,
    python: Option<crate::manifests::PythonInstall>,
}

/// What the catalog says can be reused.
enum Reusable {
    /// An earlier version's whole layer: nothing to install.
    Whole(pb::BuildReady),
    /// The dependencies of an earlier version to start from, if any.
    Dependencies(Option<pb::ReusableBuild>),
}

/// What installing left in the scratch directory.
struct Installed {
    report: install::InstallReport,
    /// The build's `PATH` (the chosen toolchains first).
    path: String,
}

/// Materializes, installs, scans and uploads; the failure is the build's `error` for its
/// owner.
async fn produce(
    ctx: &BuildContext<'_>,
    python: Option<crate::manifests::PythonInstall>,
) -> Result<pb::BuildReady, BuildFailure> {
    let prepared = prepare(ctx, python).await?;
    let dependencies = match reusable(ctx, &prepared.dependency_key).await? {
        Reusable::Whole(ready) => return Ok(ready),
        Reusable::Dependencies(dependencies) => dependencies,
    };
    let installed = install_dependencies(ctx, &prepared, dependencies).await?;
    store_layer(ctx, prepared, installed).await
}

/// Writes out the source and reads what it pins and where it came from.
async fn prepare(
    ctx: &BuildContext<'_>,
    python: Option<crate::manifests::PythonInstall>,
) -> Result<Prepared, BuildFailure> {
    let scratch = ctx.places.scratch.as_path();
    let source: Digest = ctx.build.source_tree.parse().map_err(|_| {
        format!(
            "the build names no valid source tree ({:?})",
            ctx.build.source_tree
        )
    })?;
    let phase = std::time::Instant::now();
    retrying("materializing the source", ctx.lease_lost, &ctx.log, || {
        materialize(ctx.blobs, &source, scratch, None)
    })
    .await
    .map_err(|error| format!("materializing the source failed: {error}"))?;
    let _ = ctx.log.send(
        format!(
            "==> source materialized in {:.2} s\n",
            phase.elapsed().as_secs_f64()
        )
        .into_bytes(),
    );
    let say = |line: String| {
        let _ = ctx.log.send(line.into_bytes());
    };
    // The project's toolchain pins, checked before anything is installed: one that cannot be
    // met fails the build naming what was asked and what there is.
    let selection = {
        let (scratch, path) = (scratch.to_owned(), ctx.options.install.path.clone());
        let python = python.clone();
        tokio::task::spawn_blocking(move || {
            let plan = crate::manifests::plan(&scratch, python.as_ref())
                .map_err(|refused| refused.to_string())?;
            toolchains::select(&scratch, &path, plan.has_python(), plan.has_node())
                .map_err(|unmet| unmet.to_string())
        })
        .await
        .map_err(|error| error.to_string())??
    };
    if let Some(node) = &selection.node {
        say(format!(
            "==> Node {} ({}) as the project pins it\n",
            node.version, node.path
        ));
    }
    for warning in &selection.warnings {
        say(format!("==> warning: {warning}\n"));
    }
    // Where the source came from by git (an import, a push of a checkout): the version it
    // describes, by the project's own setuptools-scm / hatch-vcs settings, is installed into
    // the layer, so it is part of the key.
    let origin = match &ctx.options.layers {
        Some(ledger) => crate::origin::fetch(ledger, &ctx.build.environment_id).await,
        None => None,
    }
    .map(|origin| crate::origin::derive(&origin, scratch));
    for line in origin.iter().flat_map(|origin| &origin.log) {
        say(line.clone());
    }
    let dependency_key = dependency_key(
        scratch,
        ctx.slug,
        &format!(
            "{}\n{}{}",
            ctx.options.toolchain,
            selection.key,
            origin
                .as_ref()
                .map(crate::origin::key_material)
                .unwrap_or_default()
        ),
        &ctx.options.install.registries,
        python.as_ref(),
    )
    .map_err(|error| format!("reading the manifests failed: {error}"))?;
    Ok(Prepared {
        selection,
        origin,
        dependency_key,
        python,
    })
}

/// Asks the catalog what earlier builds of the scope this one can reuse (nothing for a clean
/// build, or when the catalog cannot say).
async fn reusable(ctx: &BuildContext<'_>, dependency_key: &str) -> Result<Reusable, BuildFailure> {
    let say = |line: String| {
        let _ = ctx.log.send(line.into_bytes());
    };
    let reusable = if ctx.build.clean {
        say("==> a clean build was asked for: nothing is reused from earlier builds\n".to_owned());
        pb::FindReusableResponse::default()
    } else {
        let reusable = ctx
            .catalog
            .clone()
            .find_reusable(pb::FindReusableRequest {
                lease_token: ctx.token.to_owned(),
                dependency_key: dependency_key.to_owned(),
            })
            .await
            .map(tonic::Response::into_inner);
        match reusable {
            Ok(reusable) => {
                if reusable.whole.is_none() && reusable.dependencies.is_none() {
                    say("==> no ready version of this scope has these manifests, pins, toolchain and registry settings: installing from scratch\n".to_owned());
                }
                reusable
            }
            Err(status) if PlinthError::from_status(&status).code == ErrorCode::LeaseLost => {
                ctx.lease_lost.cancel();
                return Err(BuildFailure::LeaseLost);
            }
            Err(status) => {
                tracing::warn!(error = %status.message(), "asking what can be reused failed; building from scratch");
                say("==> asking what can be reused failed: installing from scratch\n".to_owned());
                pb::FindReusableResponse::default()
            }
        }
    };
    if let Some(whole) = reusable.whole {
        say(format!(
            "==> source, manifests, pins and toolchain unchanged since version {}: reusing its layer\n",
            whole.version
        ));
        return Ok(Reusable::Whole(pb::BuildReady {
            layer_tree: whole.layer_tree,
            packages: whole.packages,
            size: whole.size,
            dependency_key: dependency_key.to_owned(),
            toolchains: whole.toolchains,
        }));
    }
    Ok(Reusable::Dependencies(reusable.dependencies))
}

/// Runs the installers over the source, starting from an earlier version's dependencies
/// when there are some.
async fn install_dependencies(
    ctx: &BuildContext<'_>,
    prepared: &Prepared,
    dependencies: Option<pb::ReusableBuild>,
) -> Result<Installed, BuildFailure> {
    let scratch = ctx.places.scratch.as_path();
    let say = |line: String| {
        let _ = ctx.log.send(line.into_bytes());
    };
    let mut install_options = ctx.options.install.clone();
    install_options.path = prepared.selection.path.clone();
    install_options.python = prepared.python.clone();
    // uv's, pip's and npm's downloads persist across builds of one scope, on the scratch
    // directory's file system so a build can take the cache in with a rename (and uv hard-link
    // from it); another scope's builds never see them.
    install_options.cache_dir = Some(ctx.places.cache.clone());
    if let Some(origin) = &prepared.origin {
        install_options.extra_env.extend(crate::origin::env(origin));
    }
    let phase = std::time::Instant::now();
    if let Some(earlier) = dependencies {
        let layer: Digest = earlier
            .layer_tree
            .parse()
            .map_err(|_| "the reusable build names no valid layer".to_owned())?;
        for dependencies in crate::kept::TREES {
            let path = scratch.join(dependencies);
            if tokio::fs::symlink_metadata(&path).await.is_ok() {
                let _ = tokio::fs::remove_dir_all(&path).await;
                let _ = tokio::fs::remove_file(&path).await;
            }
        }
        let taken = {
            let (dir, name, scratch) = (
                ctx.places.kept.clone(),
                ctx.places.kept_tree(&layer),
                scratch.to_owned(),
            );
            tokio::task::spawn_blocking(move || crate::kept::take(&dir, &name, &scratch))
                .await
                .unwrap_or(false)
        };
        if !taken {
            retrying("reusing the dependencies", ctx.lease_lost, &ctx.log, || {
                materialize(ctx.blobs, &layer, scratch, Some(&crate::kept::TREES))
            })
            .await
            .map_err(|error| {
                format!(
                    "reusing the dependencies of version {} failed: {error}",
                    earlier.version
                )
            })?;
        }
        say(format!(
            "==> manifests, pins and toolchain unchanged since version {}: starting from its .venv and node_modules ({}); the installers run over them\n",
            earlier.version,
            if taken {
                "kept on this builder"
            } else {
                "written out of the blob store"
            }
        ));
        install_options.reuse_dependencies = true;
        // A project without a lock resolves against the index on every build; with its
        // manifests unchanged (the reuse key), the resolution the earlier build wrote is still
        // the answer: it is taken along, as a rebuild by hand would find it.
        let carried = carried_locks(scratch);
        if !carried.is_empty() {
            retrying(
                "reusing the earlier resolution",
                ctx.lease_lost,
                &ctx.log,
                || materialize(ctx.blobs, &layer, scratch, Some(&carried)),
            )
            .await
            .map_err(|error| {
                format!(
                    "reusing the lock files of version {} failed: {error}",
                    earlier.version
                )
            })?;
            let found: Vec<&str> = carried
                .iter()
                .copied()
                .filter(|name| {
                    std::fs::symlink_metadata(scratch.join(name))
                        .is_ok_and(|metadata| metadata.is_file())
                })
                .collect();
            if !found.is_empty() {
                say(format!(
                    "==> the project has no lock file: reusing the resolution version {}'s build wrote ({}), as its manifests are unchanged\n",
                    earlier.version,
                    found.join(", ")
                ));
            }
        }
    }
    let mut sink = |bytes: &[u8]| {
        let _ = ctx.log.send(bytes.to_vec());
    };
    let report = install::install(scratch, ctx.slug, &install_options, &mut sink)
        .await
        .map_err(|error| error.to_string())?;
    if report.cache_discarded {
        // Kept trees of the scope may share the changed files with the discarded cache.
        drop_kept_dependencies(ctx.places).await;
    }
    if let Some(node) = &prepared.selection.node {
        // Sessions run the Node the build chose: `node_modules/.bin` comes before the
        // system's directories on their PATH too.
        let (scratch, target) = (scratch.to_owned(), node.path.clone());
        tokio::task::spawn_blocking(move || toolchains::link_node(&scratch, &target))
            .await
            .map_err(|error| error.to_string())?
            .map_err(|error| {
                format!("linking the chosen Node into node_modules/.bin failed: {error}")
            })?;
    }
    let _ = ctx
        .log
        .send(format!("==> installed in {:.2} s\n", phase.elapsed().as_secs_f64()).into_bytes());
    Ok(Installed {
        report,
        path: install_options.path,
    })
}

/// Reads the built layer, holds and stores its files and tree, and describes it.
async fn store_layer(
    ctx: &BuildContext<'_>,
    prepared: Prepared,
    installed: Installed,
) -> Result<pb::BuildReady, BuildFailure> {
    let scratch = ctx.places.scratch.as_path();
    let phase = std::time::Instant::now();
    let scanned = {
        let scratch = scratch.to_owned();
        tokio::task::spawn_blocking(move || layer::scan(&scratch))
            .await
            .map_err(|error| error.to_string())?
            .map_err(|error| format!("reading the built layer failed: {error}"))?
    };
    let hashed = phase.elapsed().as_secs_f64();
    let phase = std::time::Instant::now();
    // Only blobs the store lacks are uploaded, each content once (a venv holds many identical
    // files: empty `__init__.py`s, licences, `INSTALLER`s), many at a time: a venv is thousands
    // of small files.
    let files: Vec<(PathBuf, Digest)> = scanned
        .entries
        .iter()
        .filter(|entry| entry.kind == EntryKind::File)
        .map(|entry| {
            let digest = entry
                .digest
                .ok_or_else(|| format!("{} has no digest", entry.path))?;
            Ok((scratch.join(&entry.path), digest))
        })
        .collect::<Result<_, String>>()?;
    // The layer's tree, described before anything is stored, so that it too is held.
    let mut entries = Vec::with_capacity(scanned.entries.len());
    for entry in &scanned.entries {
        entries.push(match entry.kind {
            EntryKind::Directory => TreeEntry::dir(entry.path.clone()),
            EntryKind::Symlink => {
                TreeEntry::symlink(entry.path.clone(), entry.target.clone().unwrap_or_default())
            }
            EntryKind::File => {
                let digest = entry
                    .digest
                    .ok_or_else(|| format!("{} has no digest", entry.path))?;
                TreeEntry::file(entry.path.clone(), digest, entry.size, entry.executable)
            }
        });
    }
    let tree = bytes::Bytes::from(Tree::new(entries).encode().map_err(|e| e.to_string())?);
    // Held before they are stored or found stored, until the build completes: no garbage
    // collection takes them meanwhile, however young or old they are.
    let mut held: Vec<String> = files.iter().map(|(_, digest)| digest.to_string()).collect();
    held.sort();
    held.dedup();
    held.push(Digest::of(&tree).to_string());
    for chunk in held.chunks(HOLD_CHUNK) {
        let answer = retrying(
            "holding the layer's files against garbage collection",
            ctx.lease_lost,
            &ctx.log,
            || {
                let mut collection = ctx.collection.clone();
                let request = pb::HoldBlobsRequest {
                    lease_token: ctx.token.to_owned(),
                    blobs: chunk.to_vec(),
                    trees: Vec::new(),
                };
                async move {
                    match collection.hold_blobs(request).await {
                        Ok(_) => Ok(Ok(())),
                        Err(status)
                            if PlinthError::from_status(&status).code == ErrorCode::LeaseLost =>
                        {
                            Ok(Err(()))
                        }
                        Err(status) => Err(Failed::status(&status)),
                    }
                }
            },
        )
        .await;
        match answer {
            Ok(Ok(())) => {}
            Ok(Err(())) => {
                ctx.lease_lost.cancel();
                return Err(BuildFailure::LeaseLost);
            }
            Err(failed) => {
                return Err(BuildFailure::Step(format!(
                    "holding the layer's files against garbage collection failed: {failed}"
                )));
            }
        }
    }
    let stored = retrying(
        "storing the layer's files",
        ctx.lease_lost,
        &ctx.log,
        || {
            let files = files.clone();
            async move {
                ctx.blobs
                    .put_files(files, PARALLEL_BLOBS)
                    .await
                    .map_err(|error| Failed::blob(&error))
            }
        },
    )
    .await
    .map_err(|error| format!("storing the layer's files failed: {error}"))?;
    let _ = ctx.log.send(
        format!(
            "==> layer of {} entries hashed in {hashed:.2} s; {stored} new blobs stored in {:.2} s\n",
            scanned.entries.len(),
            phase.elapsed().as_secs_f64()
        )
        .into_bytes(),
    );
    let stored = retrying("storing the layer's tree", ctx.lease_lost, &ctx.log, || {
        let tree = tree.clone();
        async move {
            ctx.blobs
                .put_bytes(tree)
                .await
                .map_err(|error| Failed::blob(&error))
        }
    })
    .await
    .map_err(|error| format!("storing the layer's tree failed: {error}"))?;
    let toolchains = {
        let (scratch, mount, path) = (
            scratch.to_owned(),
            format!("/env/{}", ctx.slug),
            installed.path.clone(),
        );
        let node_used = installed
            .report
            .steps
            .iter()
            .any(|step| step.starts_with("npm "));
        let chosen = prepared.selection.node.clone();
        tokio::task::spawn_blocking(move || {
            toolchains::report(&scratch, &mount, &path, node_used, chosen)
        })
        .await
        .map_err(|error| error.to_string())?
    };
    // The scans name toolchains and managers by their labels; one the contract does not know
    // is this builder's bug, and fails the build rather than record a package of no manager.
    Ok(pb::BuildReady {
        toolchains: toolchains
            .into_iter()
            .map(|used| {
                Ok(pb::Toolchain {
                    name: pb::ToolchainName::from_label(used.name)
                        .ok_or_else(|| {
                            format!("toolchain {:?} is none the catalog knows", used.name)
                        })?
                        .into(),
                    version: used.version,
                    path: used.path,
                })
            })
            .collect::<Result<_, String>>()?,
        layer_tree: stored.digest.to_string(),
        packages: scanned
            .packages
            .into_iter()
            .map(|p| {
                Ok(pb::Package {
                    manager: pb::PackageManager::from_label(&p.manager)
                        .ok_or_else(|| {
                            format!("package manager {:?} is none the catalog knows", p.manager)
                        })?
                        .into(),
                    name: p.name,
                    version: p.version,
                })
            })
            .collect::<Result<_, String>>()?,
        size: scanned.bytes,
        dependency_key: prepared.dependency_key,
    })
}

/// A step's failure: what went wrong, and whether it may pass (a blob store or catalog that
/// did not answer), so that trying again may succeed.
#[derive(Debug)]
struct Failed {
    message: String,
    may_pass: bool,
}

impl std::fmt::Display for Failed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl From<String> for Failed {
    fn from(message: String) -> Self {
        Failed {
            message,
            may_pass: false,
        }
    }
}

impl Failed {
    fn blob(error: &plinth_blobs::BlobError) -> Self {
        Failed {
            message: error.to_string(),
            may_pass: error.may_pass(),
        }
    }

    fn status(status: &tonic::Status) -> Self {
        Failed {
            message: status.message().to_owned(),
            may_pass: PlinthError::from_status(status).code == ErrorCode::Unavailable,
        }
    }
}

/// Runs `attempt` until it succeeds, fails in a way that will not pass, the lease is lost, or
/// [`RETRY_FOR`] has gone by; says in the build's log what it waits for. Only the build's own
/// errors (and outages longer than that) fail a build.
async fn retrying<T, F, Fut>(
    what: &str,
    lease_lost: &CancellationToken,
    log: &mpsc::UnboundedSender<Vec<u8>>,
    mut attempt: F,
) -> Result<T, Failed>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, Failed>>,
{
    let started = std::time::Instant::now();
    let mut wait = RETRY_FIRST;
    loop {
        match attempt().await {
            Err(failed)
                if failed.may_pass
                    && started.elapsed() + wait < RETRY_FOR
                    && !lease_lost.is_cancelled() =>
            {
                tracing::warn!(error = %failed.message, "{what} failed; retrying");
                let _ = log.send(
                    format!(
                        "==> {what}: {}; retrying in {:.1} s\n",
                        failed.message,
                        wait.as_secs_f64()
                    )
                    .into_bytes(),
                );
                tokio::select! {
                    () = tokio::time::sleep(wait) => {}
                    () = lease_lost.cancelled() => return Err(failed),
                }
                wait = (wait * 2).min(RETRY_MOST);
            }
            outcome => return outcome,
        }
    }
}

/// Writes one tree file from its verified blob.
async fn write_one(blobs: &BlobStore, root: &Path, entry: &TreeEntry) -> Result<(), Failed> {
    let target = root.join(&entry.path);
    let digest = entry
        .file_digest()
        .ok_or_else(|| format!("{} has no digest", entry.path))?;
    if let Some(parent) = target.parent() {
        tokio::fs::create_dir_all(parent)
            .await
            .map_err(|e| e.to_string())?;
    }
    let blob = blobs.get(&digest).await.map_err(|error| Failed {
        message: format!("{}: {error}", entry.path),
        may_pass: error.may_pass(),
    })?;
    let mut file = tokio::fs::File::create(&target)
        .await
        .map_err(|e| e.to_string())?;
    let mut chunks = blob.into_stream();
    while let Some(chunk) = chunks.next().await {
        file.write_all(&chunk.map_err(|e| e.to_string())?)
            .await
            .map_err(|e| e.to_string())?;
    }
    file.flush().await.map_err(|e| e.to_string())?;
    let mode = if entry.mode & 0o111 != 0 {
        0o755
    } else {
        0o644
    };
    tokio::fs::set_permissions(&target, std::os::unix::fs::PermissionsExt::from_mode(mode))
        .await
        .map_err(|e| e.to_string().into())
}

/// The cgroups this builder's builds get: a group per work directory (stable across restarts,
/// apart from the node's and other work directories'; [`crate::limits::detect`]).
async fn build_cgroups(
    work_dir: &Path,
) -> Result<Arc<plinth_sandbox::cgroup::Cgroups>, BuilderError> {
    let work_dir = work_dir.to_owned();
    tokio::task::spawn_blocking(move || crate::limits::detect(&work_dir))
        .await
        .map_err(|join| BuilderError::Limits(crate::limits::LimitsError::Task(join)))?
        .map(Arc::new)
        .map_err(BuilderError::Limits)
}

/// A scope's name on the builder's disk (its download cache, its kept trees).
fn scope_key(scope: &str) -> String {
    Digest::of(scope.as_bytes()).to_hex()[..16].to_owned()
}

/// Forgets every dependency tree kept for the build's scope.
async fn drop_kept_dependencies(places: &Places) {
    let (parent, prefix) = (places.kept.clone(), places.kept_prefix.clone());
    let _ =
        tokio::task::spawn_blocking(move || crate::kept::forget(&parent, &prefix).delete()).await;
}

/// After a build is published, its dependency trees are exactly those of its layer (no build
/// process is left running): keeping them ([`crate::kept`]: renames) spares the environment's
/// next rebuild with the same dependencies from writing thousands of files back out of the
/// blob store. Kept per scope (`places`): uv installs hard links to the scope's download
/// cache, which the scope's later builds can write to, so a kept tree is only ever lent to
/// builds of its own scope. Answers what the keeping evicted, to delete off the build's path.
async fn keep_dependencies(
    options: &BuilderOptions,
    places: &Places,
    layer: &Digest,
) -> crate::kept::Doomed {
    let (dir, environment, name, scratch, budget) = (
        places.kept.clone(),
        places.kept_environment.clone(),
        places.kept_tree(layer),
        places.scratch.clone(),
        options.kept_budget,
    );
    tokio::task::spawn_blocking(move || {
        if let Err(error) = std::fs::create_dir_all(&dir) {
            tracing::warn!(dir = %dir.display(), %error, "cannot make the directory of kept dependency trees");
            return crate::kept::Doomed::default();
        }
        crate::kept::keep(&dir, &environment, &name, &scratch, budget)
    })
    .await
    .unwrap_or_default()
}

/// The lock files an installer writes that `scratch` (a source) lacks: `uv.lock` beside a
/// `pyproject.toml`, `package-lock.json` beside a `package.json` without one (or a shrinkwrap).
fn carried_locks(scratch: &Path) -> Vec<&'static str> {
    let has = |name: &str| {
        std::fs::symlink_metadata(scratch.join(name)).is_ok_and(|metadata| metadata.is_file())
    };
    let mut carried = Vec::new();
    if has("pyproject.toml") && std::fs::symlink_metadata(scratch.join("uv.lock")).is_err() {
        carried.push("uv.lock");
    }
    if has("package.json")
        && std::fs::symlink_metadata(scratch.join("package-lock.json")).is_err()
        && std::fs::symlink_metadata(scratch.join("npm-shrinkwrap.json")).is_err()
    {
        carried.push("package-lock.json");
    }
    carried
}

/// Names what a build's dependencies are installed from: the mount path (installed files
/// embed it), the toolchain (with the pins' choice), the registry settings, the environment's
/// `install.python`, and every file an installer reads ([`crate::reuse_key::inputs`]). Equal
/// keys install equal trees.
fn dependency_key(
    scratch: &Path,
    slug: &str,
    toolchain: &str,
    registries: &crate::registries::Registries,
    python: Option<&crate::manifests::PythonInstall>,
) -> std::io::Result<String> {
    let mut material = format!(
        "plinth-dependencies/3\nslug {slug}\ntoolchain {toolchain}\nregistries {}\n{}",
        crate::reuse_key::registries(registries),
        crate::reuse_key::python(python),
    )
    .into_bytes();
    for (path, digest) in crate::reuse_key::inputs(scratch, python)? {
        material.extend_from_slice(format!("{path} {digest}\n").as_bytes());
    }
    Ok(Digest::of(&material).to_string())
}

/// Writes a tree's directories, verified files and symlinks under `root`; with `only`, just
/// the entries beneath those top-level names.
async fn materialize(
    blobs: &BlobStore,
    tree: &Digest,
    root: &Path,
    only: Option<&[&str]>,
) -> Result<(), Failed> {
    let bytes = blobs
        .get(tree)
        .await
        .map_err(|error| Failed::blob(&error))?
        .into_bytes()
        .await
        .map_err(|e| e.to_string())?;
    let tree = Tree::decode(&bytes).map_err(|e| e.to_string())?;
    tokio::fs::create_dir_all(root)
        .await
        .map_err(|e| e.to_string())?;
    let selected: Vec<&TreeEntry> = tree
        .entries
        .iter()
        .filter(|entry| match only {
            Some(only) => only.contains(&entry.path.split('/').next().unwrap_or("")),
            None => true,
        })
        .collect();
    for entry in &selected {
        // Paths in a tree were checked when they entered the system; they are checked again
        // here because a tree is only bytes in a bucket.
        if entry
            .path
            .split('/')
            .any(|c| c.is_empty() || c == "." || c == "..")
            || entry.path.starts_with('/')
        {
            return Err(format!("the tree names an unsafe path {:?}", entry.path).into());
        }
        if entry.kind == TreeEntryKind::Dir {
            tokio::fs::create_dir_all(root.join(&entry.path))
                .await
                .map_err(|e| e.to_string())?;
        }
    }
    // Many blobs at a time: per-object round trips dominate for small files.
    let files: Vec<_> = selected
        .iter()
        .filter(|entry| entry.kind == TreeEntryKind::File)
        .map(|entry| write_one(blobs, root, entry))
        .collect();
    futures::stream::iter(files)
        .buffer_unordered(PARALLEL_BLOBS)
        .try_collect::<()>()
        .await?;
    for entry in selected
        .iter()
        .filter(|entry| entry.kind == TreeEntryKind::Symlink)
    {
        // Links are recreated as recorded, never followed: what they point at is the
        // installers' business, inside the mount path.
        let target = root.join(&entry.path);
        let link = entry
            .target
            .clone()
            .ok_or_else(|| format!("{} has no target", entry.path))?;
        if let Some(parent) = target.parent() {
            tokio::fs::create_dir_all(parent)
                .await
                .map_err(|e| e.to_string())?;
        }
        // An earlier attempt (one the blob store cut short) may have made it already.
        if tokio::fs::symlink_metadata(&target).await.is_ok() {
            let _ = tokio::fs::remove_file(&target).await;
        }
        tokio::fs::symlink(&link, &target)
            .await
            .map_err(|e| format!("{}: {e}", entry.path))?;
    }
    Ok(())
}

/// Sends the log to the catalog in batches: what arrives within 200 ms, up to 64 KiB.
async fn ship_log(
    mut catalog: Catalog,
    token: String,
    mut lines: mpsc::UnboundedReceiver<Vec<u8>>,
    lease_lost: CancellationToken,
) {
    const BATCH_BYTES: usize = 64 * 1024;
    loop {
        let Some(mut pending) = lines.recv().await else {
            return;
        };
        let deadline = tokio::time::sleep(Duration::from_millis(200));
        tokio::pin!(deadline);
        let mut ended = false;
        while pending.len() < BATCH_BYTES {
            tokio::select! {
                next = lines.recv() => match next {
                    Some(bytes) => pending.extend_from_slice(&bytes),
                    None => {
                        ended = true;
                        break;
                    }
                },
                () = &mut deadline => break,
            }
        }
        let chunk = String::from_utf8_lossy(&pending).into_owned();
        let sent = catalog
            .append_build_log(pb::AppendBuildLogRequest {
                lease_token: token.clone(),
                chunk,
            })
            .await;
        if let Err(status) = sent {
            if PlinthError::from_status(&status).code == ErrorCode::LeaseLost {
                tracing::warn!(error = %status.message(), "appending to the build log was refused");
                lease_lost.cancel();
                return;
            }
            tracing::warn!(error = %status.message(), "sending the build log failed");
        }
        if ended {
            return;
        }
    }
}
