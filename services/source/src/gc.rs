//! Garbage collection of the blob store. The source service runs it: it holds the store's
//! largest set of references (every environment's files), and the catalog tells it the rest
//! (`plinth.catalog.v1.CollectionService`: kept versions' layers, live sessions' layers, the
//! source trees of builds in flight, what builds hold).
//!
//! A pass:
//! 1. takes the one pass lease (across replicas, in the database);
//! 2. lists the store, and sets aside objects younger than the grace period;
//! 3. marks, without blocking anyone: everything the catalog keeps (trees read and expanded),
//!    then asks the index which of the remaining blobs a file names;
//! 4. deletes what is left in rounds of at most [`ROUND`] blobs. Each round raises the fence
//!    in the source's database and in the catalog's, reads again what both hold and name,
//!    deletes what is still unnamed and unheld, and lowers the fences.
//!
//! Why this is safe with work in flight, whatever the grace period: whoever is about to rely
//! on a blob (an upload, an import, a snapshot, a builder publishing a layer) *holds* it
//! first, in a transaction that waits while a fence stands, and only then stores it or finds
//! it stored (`Work`, and `HoldBlobs` for builders). A round reads holds after raising its
//! fence, so a hold is either seen by the round, or taken after the round's deletes, and then
//! the blob is written again if it was taken. A hold lasts until what names the blob is
//! committed (an index row, a ready version), and lapses by itself if its holder dies.
//!
//! What a pass costs: one listing of the store, one read of every kept tree (a venv's layer
//! tree is ~100 bytes per file), one indexed query per 500 candidates.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use futures::{StreamExt, TryStreamExt};
use plinth_blobs::inventory::{ObjectKind, StoredObject};
use plinth_blobs::tree::{Tree, TreeEntryKind};
use plinth_blobs::{BlobError, BlobStore, Digest, Holder};
use plinth_kit::clock::now_ms;
use plinth_kit::tasks::CancellationToken;

use crate::persistence::{Index, IndexError, WorkId};

/// Most blobs one fenced round deletes: holds wait at most one round.
pub const ROUND: usize = 1000;
/// How long a round's fence stands unless lowered; a round deletes nothing past it (less a
/// margin for clocks that disagree).
pub const FENCE_MS: u32 = 120_000;
const FENCE_MARGIN_MS: i64 = 30_000;
/// How long the pass lease lasts unless renewed (it is, every tenth of it, while the pass runs).
const PASS_LEASE_MS: i64 = 10 * 60 * 1000;
/// Staging objects (parts of large uploads before they are named) are older than this when
/// their upload died: an upload names its staging object within moments of finishing it.
pub const STAGING_MIN_AGE: Duration = Duration::from_secs(3600);
/// Trees read at once while marking.
const PARALLEL_TREES: usize = 16;

/// How collection runs.
#[derive(Debug, Clone, Copy)]
pub struct GcOptions {
    /// Objects younger than this are never taken, whatever holds them.
    pub grace: Duration,
    /// How long a hold of work in progress lives unless its work renews it (every third of
    /// it): how long the holds of a holder that died keep their blobs.
    pub hold_ttl: Duration,
}

impl Default for GcOptions {
    fn default() -> Self {
        GcOptions {
            grace: Duration::from_secs(3600),
            hold_ttl: Duration::from_secs(60),
        }
    }
}

/// Why a pass did not run or stopped.
#[derive(Debug, thiserror::Error)]
pub enum GcError {
    /// Another pass holds the lease (another replica, or `plinth gc`).
    #[error("another garbage collection pass is running; try again when it ends")]
    Busy,
    /// The catalog could not say what it keeps: nothing is collected without it.
    #[error("cannot learn from the catalog what it keeps, so nothing was collected: {0}")]
    Catalog(String),
    /// The index failed.
    #[error(transparent)]
    Index(#[from] IndexError),
    /// The blob store failed.
    #[error("blob store: {0}")]
    Blobs(#[from] BlobError),
    /// A kept tree cannot be read as a tree: what it names cannot be known, so nothing is
    /// collected until it can.
    #[error("kept tree {digest} cannot be read ({reason}), so nothing was collected")]
    UnreadableTree {
        /// The tree.
        digest: Digest,
        /// Why.
        reason: String,
    },
}

/// What the catalog keeps, as a collector needs it.
#[derive(Debug, Clone, Default)]
pub struct CatalogRoots {
    /// Trees kept with what they name.
    pub trees: Vec<String>,
    /// Blobs kept as they are.
    pub blobs: Vec<String>,
    /// Environments deleted there.
    pub deleted_environments: Vec<String>,
    /// When the catalog's fence falls by itself (0: none raised).
    pub fence_until_ms: i64,
}

/// The catalog, as a collector asks it (over gRPC in a service; through its database for
/// `plinth gc`).
pub trait Catalog: Send + Sync {
    /// Raises its fence for `fence_ms` milliseconds (none for 0) and answers what it keeps.
    fn begin(&self, fence_ms: u32) -> BoxFuture<'_, Result<CatalogRoots, GcError>>;
    /// Lowers its fence.
    fn end(&self) -> BoxFuture<'_, Result<(), GcError>>;
}

/// What a pass found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// Nothing was removed: the figures say what would have been.
    pub dry_run: bool,
    /// Objects listed, and their bytes.
    pub listed_objects: u64,
    /// Bytes of the objects listed.
    pub listed_bytes: u64,
    /// Objects removed (or that would be), and their bytes.
    pub reclaimed_objects: u64,
    /// Bytes of the objects removed.
    pub reclaimed_bytes: u64,
    /// Objects no file or version names, kept because they are younger than the grace period.
    pub young_objects: u64,
    /// Deleted environments whose files were forgotten (or would be).
    pub forgotten_environments: u64,
    /// Recorded layers of versions the catalog no longer keeps (retired by retention, or
    /// left by a builder that died), which their scopes' stored bytes no longer count (or
    /// would not).
    pub forgotten_layers: u64,
    /// The pass stopped at a fence's deadline: the rest waits for the next pass.
    pub unfinished: bool,
    /// How long it took, in milliseconds.
    pub took_ms: u64,
}

/// Work in progress that writes blobs: holds them before they are named, renews itself
/// while it runs, and releases its holds when what names the blobs is committed
/// ([`Work::finish`]) or lets them lapse after the hold lifetime ([`Work::leave`]). Clones
/// are the same work; when the last one goes without either, the holds are released.
#[derive(Clone)]
pub struct Work(Arc<WorkInner>);

struct WorkInner {
    index: Index,
    id: WorkId,
    ttl_ms: i64,
    stop: CancellationToken,
    /// Set once finished or left: nothing more to release on drop.
    closed: std::sync::atomic::AtomicBool,
    /// Set once it holds something (its row exists).
    held: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for Work {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Work").field("id", &self.0.id).finish()
    }
}

impl Work {
    /// Starts work whose holds live `ttl` unless renewed; it renews them every third of that
    /// until it ends.
    pub fn start(index: &Index, ttl: Duration) -> Self {
        let ttl_ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX).max(1);
        let inner = WorkInner {
            index: index.clone(),
            id: WorkId::generate(),
            ttl_ms,
            stop: CancellationToken::new(),
            closed: std::sync::atomic::AtomicBool::new(false),
            held: std::sync::atomic::AtomicBool::new(false),
        };
        let (index, id, stop) = (inner.index.clone(), inner.id.clone(), inner.stop.clone());
        let every = Duration::from_millis(u64::try_from(ttl_ms / 3).unwrap_or(1).max(1));
        plinth_kit::tasks::spawn(async move {
            loop {
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(every) => {}
                }
                if let Err(error) = index.renew_work(&id, ttl_ms).await {
                    tracing::warn!(%error, "renewing holds against garbage collection failed; retrying");
                }
            }
        });
        Work(Arc::new(inner))
    }

    /// Holds `digests` as they are.
    pub async fn hold_blobs(&self, digests: &[Digest]) -> Result<(), IndexError> {
        let inner = &self.0;
        inner
            .index
            .hold(&inner.id, inner.ttl_ms, digests, &[])
            .await?;
        inner.held.store(true, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }

    /// What the commit of rows naming this work's blobs checks is still alive
    /// (`Index::write_file_held`): the work, once it holds anything.
    pub fn fence(&self) -> Option<&WorkId> {
        let inner = &self.0;
        inner
            .held
            .load(std::sync::atomic::Ordering::SeqCst)
            .then_some(&inner.id)
    }

    /// Ends the work: what it held is named by committed rows now, or not needed.
    pub async fn finish(&self) {
        let inner = &self.0;
        inner
            .closed
            .store(true, std::sync::atomic::Ordering::SeqCst);
        inner.stop.cancel();
        if let Err(error) = inner.index.release_work(&inner.id).await {
            tracing::warn!(%error, "releasing holds failed; they lapse by themselves");
        }
    }

    /// Stops renewing and leaves the holds to lapse after their lifetime: for what a caller
    /// will name elsewhere soon (a snapshot's tree, which a build row names next).
    pub fn leave(&self) {
        let inner = &self.0;
        inner
            .closed
            .store(true, std::sync::atomic::Ordering::SeqCst);
        inner.stop.cancel();
    }
}

impl Drop for WorkInner {
    fn drop(&mut self) {
        self.stop.cancel();
        if !self.closed.load(std::sync::atomic::Ordering::SeqCst)
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            let (index, id) = (self.index.clone(), self.id.clone());
            runtime.spawn(async move {
                let _ = index.release_work(&id).await;
            });
        }
    }
}

impl Holder for Work {
    fn hold<'a>(&'a self, digests: &'a [Digest]) -> BoxFuture<'a, Result<(), BlobError>> {
        Box::pin(async move {
            self.hold_blobs(digests)
                .await
                .map_err(|error| BlobError::Hold(error.to_string()))
        })
    }
}

/// Forgets the holds of work that stopped renewing them (a holder that died, a snapshot whose
/// build is long queued) every `every` until `shutdown`, whether or not this process
/// collects: nothing else would, where no collection runs.
pub async fn forget_expired_work(index: Index, every: Duration, shutdown: CancellationToken) {
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(every) => {}
        }
        if let Err(error) = index.drop_expired_work().await {
            tracing::warn!(%error, "cannot forget expired holds; retrying");
        }
    }
}

/// Makes the collection's series exist from the start, not only after the first pass (an
/// hour away by default, or never in a source service that does not collect): its counters
/// and histogram at zero, and the blob store's size from a count of the store made now, in
/// the background (0 until it ends; a pass counts it again).
pub fn start_metrics(blobs: BlobStore) {
    plinth_kit::telemetry::metrics();
    metrics::counter!("plinth_gc_reclaimed_objects_total").increment(0);
    metrics::counter!("plinth_gc_reclaimed_bytes_total").increment(0);
    let _ = metrics::histogram!("plinth_gc_pass_duration_seconds");
    let _ = metrics::gauge!("plinth_blob_store_bytes");
    let _ = metrics::gauge!("plinth_blob_store_objects");
    plinth_kit::tasks::spawn(async move {
        match blobs.inventory().await {
            Ok(objects) => {
                let (count, bytes) = objects.iter().fold((0u64, 0u64), |(count, bytes), object| {
                    (count + 1, bytes.saturating_add(object.size))
                });
                metrics::gauge!("plinth_blob_store_bytes").set(bytes as f64);
                metrics::gauge!("plinth_blob_store_objects").set(count as f64);
            }
            Err(error) => tracing::warn!(
                %error,
                "counting the blob store failed; its size is shown after the next collection pass"
            ),
        }
    });
}

/// Runs a pass every `every` until `shutdown` (the first one period after start). A pass that
/// fails is logged and tried again next period; another replica's pass running is not an
/// error.
pub async fn run(
    index: Index,
    blobs: BlobStore,
    catalog: Arc<dyn Catalog>,
    options: GcOptions,
    every: Duration,
    shutdown: CancellationToken,
) {
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(every) => {}
        }
        match collect(&index, &blobs, catalog.as_ref(), options, false).await {
            Ok(report) => {
                if report.reclaimed_objects > 0
                    || report.forgotten_environments > 0
                    || report.forgotten_layers > 0
                {
                    tracing::info!(
                        objects = report.reclaimed_objects,
                        bytes = report.reclaimed_bytes,
                        forgotten_environments = report.forgotten_environments,
                        forgotten_layers = report.forgotten_layers,
                        took_ms = report.took_ms,
                        "garbage collection reclaimed blobs nothing names"
                    );
                }
            }
            Err(GcError::Busy) => tracing::debug!("another garbage collection pass is running"),
            Err(error) => {
                tracing::warn!(%error, "garbage collection failed; it runs again next period")
            }
        }
    }
}

/// One pass (see the module notes); `dry_run` removes and forgets nothing and raises no
/// fence, and answers what it would have reclaimed.
pub async fn collect(
    index: &Index,
    blobs: &BlobStore,
    catalog: &dyn Catalog,
    options: GcOptions,
    dry_run: bool,
) -> Result<Report, GcError> {
    let begun = Instant::now();
    let holder = format!("pass_{}", uuid::Uuid::new_v4().simple());
    if !index
        .take_collection_pass(&holder, now_ms() + PASS_LEASE_MS)
        .await?
    {
        return Err(GcError::Busy);
    }
    // The lease is renewed while the pass runs, however long it marks: it lapses only if this
    // process stops (or pauses past it, and then its fences have fallen and it deletes no
    // more).
    let keeper = {
        let (index, holder) = (index.clone(), holder.clone());
        plinth_kit::tasks::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(
                    u64::try_from(PASS_LEASE_MS / 10).unwrap_or(60_000),
                ))
                .await;
                if let Err(error) = index
                    .take_collection_pass(&holder, now_ms() + PASS_LEASE_MS)
                    .await
                {
                    tracing::warn!(%error, "renewing the collection pass lease failed; retrying");
                }
            }
        })
    };
    let result = Pass {
        index,
        blobs,
        catalog,
        options,
        dry_run,
        holder: &holder,
    }
    .run()
    .await;
    keeper.abort();
    if let Err(error) = index.end_collection_pass(&holder).await {
        tracing::warn!(%error, "giving up the collection pass lease failed; it lapses by itself");
    }
    let mut report = result?;
    report.took_ms = u64::try_from(begun.elapsed().as_millis()).unwrap_or(u64::MAX);
    if !dry_run {
        index.compact().await?;
        metrics::counter!("plinth_gc_reclaimed_objects_total").increment(report.reclaimed_objects);
        metrics::counter!("plinth_gc_reclaimed_bytes_total").increment(report.reclaimed_bytes);
        metrics::histogram!("plinth_gc_pass_duration_seconds")
            .record(begun.elapsed().as_secs_f64());
        // A pass that stopped at its fence listed only part of the store.
        if !report.unfinished {
            metrics::gauge!("plinth_blob_store_bytes")
                .set(report.listed_bytes.saturating_sub(report.reclaimed_bytes) as f64);
            metrics::gauge!("plinth_blob_store_objects").set(
                report
                    .listed_objects
                    .saturating_sub(report.reclaimed_objects) as f64,
            );
        }
    }
    Ok(report)
}

struct Pass<'a> {
    index: &'a Index,
    blobs: &'a BlobStore,
    catalog: &'a dyn Catalog,
    options: GcOptions,
    dry_run: bool,
    holder: &'a str,
}

impl Pass<'_> {
    async fn run(&self) -> Result<Report, GcError> {
        let mut report = Report {
            dry_run: self.dry_run,
            ..Report::default()
        };
        let started = now_ms();
        let grace_ms = i64::try_from(self.options.grace.as_millis()).unwrap_or(i64::MAX);
        let cutoff = started.saturating_sub(grace_ms);
        let staging_age = self.options.grace.max(STAGING_MIN_AGE);
        let staging_cutoff =
            started.saturating_sub(i64::try_from(staging_age.as_millis()).unwrap_or(i64::MAX));

        // What the store holds, and what is old enough to be taken.
        let objects = self.blobs.inventory().await?;
        let mut by_digest: HashMap<Digest, StoredObject> = HashMap::new();
        let mut partials = Vec::new();
        let mut staging = Vec::new();
        let mut packs = Vec::new();
        for object in objects {
            report.listed_objects += 1;
            report.listed_bytes += object.size;
            let old = object.modified_ms <= cutoff;
            match object.kind {
                ObjectKind::Blob(digest) if old => {
                    by_digest.insert(digest, object);
                }
                ObjectKind::Partial(_) if old => partials.push(object),
                ObjectKind::Blob(_) | ObjectKind::Partial(_) => report.young_objects += 1,
                ObjectKind::Staging if object.modified_ms <= staging_cutoff => staging.push(object),
                ObjectKind::Pack(tree) if old => packs.push((tree, object)),
                ObjectKind::Staging | ObjectKind::Pack(_) | ObjectKind::Foreign => {}
            }
        }

        // The layers recorded before the catalog is asked: each belongs to a version the
        // catalog keeps (its tree a root) or to a build in progress (its tree held), unless
        // its version is gone.
        let recorded = self.index.recorded_layers().await?;
        // A first look at what the catalog keeps, without fences: what is left to check under
        // them is what this cannot show to be live.
        let first = self.catalog.begin(0).await?;
        let forgetting = self
            .forget(&first.deleted_environments, &mut report)
            .await?;
        self.forget_layers(&recorded, &first, &forgetting, &mut report)
            .await?;
        let mut marker = Marker::new(self.blobs);
        marker.expand(&parse_all(&first.trees)).await?;
        marker.keep(&parse_all(&first.blobs));
        let mut candidates: Vec<Digest> = by_digest
            .keys()
            .filter(|digest| !marker.live.contains(digest))
            .copied()
            .collect();
        let named = self.index.referenced(&candidates, &forgetting).await?;
        candidates.retain(|digest| !named.contains(digest));
        candidates.sort();

        // Partial copies go in the last round: only their digests' holds keep them.
        let mut rounds: Vec<&[Digest]> = candidates.chunks(ROUND).collect();
        if rounds.is_empty() && !partials.is_empty() {
            rounds.push(&[]);
        }
        let last = rounds.len().saturating_sub(1);
        for (number, round) in rounds.into_iter().enumerate() {
            let partials: &[StoredObject] = if number == last { &partials } else { &[] };
            let work = Round {
                blobs: round,
                partials,
            };
            if !self
                .round(work, &by_digest, &forgetting, &mut marker, &mut report)
                .await?
            {
                report.unfinished = true;
                break;
            }
            if !self
                .index
                .take_collection_pass(self.holder, now_ms() + PASS_LEASE_MS)
                .await?
            {
                tracing::warn!("the collection pass lease was lost; stopping this pass");
                report.unfinished = true;
                break;
            }
        }

        if !report.unfinished {
            for object in &staging {
                report.reclaimed_objects += 1;
                report.reclaimed_bytes += object.size;
            }
            if !self.dry_run && !staging.is_empty() {
                self.blobs.remove(&staging).await?;
            }
            // A pack goes with its version's tree: a node fetching it for a version that is
            // gone has nothing to mount.
            let dead: Vec<StoredObject> = packs
                .into_iter()
                .filter(|(tree, _)| !marker.live.contains(tree))
                .map(|(_, object)| object)
                .collect();
            for object in &dead {
                report.reclaimed_objects += 1;
                report.reclaimed_bytes += object.size;
            }
            if !self.dry_run && !dead.is_empty() {
                self.blobs.remove(&dead).await?;
            }
        }
        if !self.dry_run {
            let expired = self.index.drop_expired_work().await?;
            if expired > 0 {
                tracing::info!(
                    expired,
                    "forgot the holds of work that stopped renewing them"
                );
            }
        }
        Ok(report)
    }

    /// Forgets the files of environments the catalog deleted (a dry run only counts them);
    /// answers those whose rows a dry run must leave out of what names blobs.
    async fn forget(
        &self,
        deleted: &[String],
        report: &mut Report,
    ) -> Result<Vec<String>, GcError> {
        let present = self.index.with_source(deleted).await?;
        report.forgotten_environments = present.len() as u64;
        if self.dry_run {
            return Ok(present);
        }
        for environment in &present {
            self.index.drop_environment(environment).await?;
            tracing::info!(%environment, "forgot the files of a deleted environment");
        }
        Ok(Vec::new())
    }

    /// Forgets the recorded layers whose trees the catalog neither keeps nor has held, so
    /// their scopes' stored bytes stop counting versions retention retired.
    async fn forget_layers(
        &self,
        recorded: &[crate::persistence::RecordedLayer],
        roots: &CatalogRoots,
        forgetting: &[String],
        report: &mut Report,
    ) -> Result<(), GcError> {
        let kept: HashSet<&str> = roots
            .trees
            .iter()
            .chain(&roots.blobs)
            .map(String::as_str)
            .collect();
        for layer in recorded {
            if kept.contains(layer.layer_tree.as_str()) || forgetting.contains(&layer.environment) {
                continue;
            }
            report.forgotten_layers += 1;
            if self.dry_run {
                continue;
            }
            self.index
                .forget_layer(&layer.environment, layer.version, Some(layer.attempt))
                .await?;
            tracing::info!(
                environment = %layer.environment,
                version = layer.version,
                "forgot the layer of a version the catalog no longer keeps"
            );
        }
        Ok(())
    }

    /// One fenced round over `round`; false when it stopped at its fence's deadline.
    async fn round(
        &self,
        round: Round<'_>,
        by_digest: &HashMap<Digest, StoredObject>,
        forgetting: &[String],
        marker: &mut Marker<'_>,
        report: &mut Report,
    ) -> Result<bool, GcError> {
        let fence_until = if self.dry_run {
            0
        } else {
            let until = now_ms() + i64::from(FENCE_MS);
            self.index.set_fence(until).await?;
            until
        };
        let outcome = self
            .fenced(round, by_digest, forgetting, marker, report, fence_until)
            .await;
        if !self.dry_run {
            let catalog = self.catalog.end().await;
            let source = self.index.set_fence(0).await;
            if let Err(error) = catalog {
                tracing::warn!(%error, "lowering the catalog's fence failed; it falls by itself");
            }
            if let Err(error) = source {
                tracing::warn!(%error, "lowering the source's fence failed; it falls by itself");
            }
        }
        outcome
    }

    async fn fenced(
        &self,
        round: Round<'_>,
        by_digest: &HashMap<Digest, StoredObject>,
        forgetting: &[String],
        marker: &mut Marker<'_>,
        report: &mut Report,
        fence_until: i64,
    ) -> Result<bool, GcError> {
        let roots = self
            .catalog
            .begin(if self.dry_run { 0 } else { FENCE_MS })
            .await?;
        // Holds first, then what names blobs: work that commits in between has its blobs in
        // one or the other.
        let held = self.index.live_holds().await?;
        marker.expand(&parse_all(&roots.trees)).await?;
        marker
            .expand(&held.trees.iter().copied().collect::<Vec<_>>())
            .await?;
        marker.keep(&parse_all(&roots.blobs));
        marker.keep(&held.blobs.iter().copied().collect::<Vec<_>>());
        let named = self.index.referenced(round.blobs, forgetting).await?;
        let mut doomed: Vec<StoredObject> = round
            .blobs
            .iter()
            .filter(|digest| !marker.live.contains(digest) && !named.contains(digest))
            .filter_map(|digest| by_digest.get(digest).cloned())
            .collect();
        // A partial copy is being written only by someone who holds its blob; any other is
        // what a writer that died left.
        let held_now: HashSet<Digest> = parse_all(&roots.blobs)
            .into_iter()
            .chain(held.blobs.iter().copied())
            .collect();
        doomed.extend(round.partials.iter().filter(|object| {
            matches!(object.kind, ObjectKind::Partial(digest) if !held_now.contains(&digest))
        }).cloned());
        if doomed.is_empty() {
            return Ok(true);
        }
        if !self.dry_run {
            let deadline = fence_until.min(roots.fence_until_ms) - FENCE_MARGIN_MS;
            if now_ms() > deadline {
                tracing::warn!(
                    "a collection round ran out of fence before deleting; the rest waits for the next pass"
                );
                return Ok(false);
            }
            self.blobs.remove(&doomed).await?;
        }
        for object in &doomed {
            report.reclaimed_objects += 1;
            report.reclaimed_bytes += object.size;
        }
        Ok(true)
    }
}

/// What one fenced round looks at: blobs nothing was seen to name, and (in the last round)
/// partial copies.
#[derive(Clone, Copy)]
struct Round<'a> {
    blobs: &'a [Digest],
    partials: &'a [StoredObject],
}

/// Digests as the catalog gives them; one that does not parse names no blob.
fn parse_all(digests: &[String]) -> Vec<Digest> {
    digests
        .iter()
        .filter_map(|digest| match digest.parse() {
            Ok(digest) => Some(digest),
            Err(_) => {
                tracing::warn!(%digest, "the catalog keeps something that is not a digest; passed over");
                None
            }
        })
        .collect()
}

/// What is live: kept blobs, and every tree expanded into what it names (each tree read once
/// per pass).
struct Marker<'a> {
    blobs: &'a BlobStore,
    live: HashSet<Digest>,
    expanded: HashSet<Digest>,
}

impl<'a> Marker<'a> {
    fn new(blobs: &'a BlobStore) -> Self {
        Marker {
            blobs,
            live: HashSet::new(),
            expanded: HashSet::new(),
        }
    }

    fn keep(&mut self, digests: &[Digest]) {
        self.live.extend(digests.iter().copied());
    }

    /// Keeps each tree and everything it names. A tree that is not in the store names
    /// nothing there any more (said at ERROR: whatever uses it cannot be materialized); one
    /// that cannot be read or decoded stops the pass, since what it names is unknown.
    async fn expand(&mut self, trees: &[Digest]) -> Result<(), GcError> {
        let fresh: Vec<Digest> = trees
            .iter()
            .filter(|tree| self.expanded.insert(**tree))
            .copied()
            .collect();
        self.live.extend(fresh.iter().copied());
        let blobs = self.blobs;
        let mut members = futures::stream::iter(fresh.into_iter().map(|tree| async move {
            let bytes = match blobs.get(&tree).await {
                Ok(blob) => blob.into_bytes().await.map_err(|error| GcError::UnreadableTree {
                    digest: tree,
                    reason: error.to_string(),
                })?,
                Err(BlobError::NotFound(_)) => {
                    tracing::error!(%tree, "a kept tree is missing from the blob store: what uses it cannot be materialized");
                    return Ok(Vec::new());
                }
                Err(error) => {
                    return Err(GcError::UnreadableTree {
                        digest: tree,
                        reason: error.to_string(),
                    });
                }
            };
            let decoded = Tree::decode(&bytes).map_err(|error| GcError::UnreadableTree {
                digest: tree,
                reason: error.to_string(),
            })?;
            Ok(decoded
                .entries
                .iter()
                .filter(|entry| entry.kind == TreeEntryKind::File)
                .filter_map(|entry| entry.file_digest())
                .collect::<Vec<Digest>>())
        }))
        .buffer_unordered(PARALLEL_TREES);
        while let Some(named) = members.try_next().await? {
            self.live.extend(named);
        }
        Ok(())
    }
}

/// The catalog over gRPC (`CollectionService`), as the source service asks it.
pub struct GrpcCatalog {
    client: CollectionClient,
}

type CollectionClient =
    plinth_proto::catalog::v1::collection_service_client::CollectionServiceClient<
        tonic::service::interceptor::InterceptedService<
            plinth_kit::grpc::Transport,
            plinth_kit::grpc::ClientInterceptor,
        >,
    >;

impl std::fmt::Debug for GrpcCatalog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrpcCatalog").finish_non_exhaustive()
    }
}

impl GrpcCatalog {
    /// The catalog at `transport`, called with `interceptor`'s credential (the `source`
    /// role's).
    pub fn new(
        transport: plinth_kit::grpc::Transport,
        interceptor: plinth_kit::grpc::ClientInterceptor,
    ) -> Self {
        GrpcCatalog {
            client:
                plinth_proto::catalog::v1::collection_service_client::CollectionServiceClient::with_interceptor(
                    transport,
                    interceptor,
                )
                .max_decoding_message_size(64 * 1024 * 1024),
        }
    }
}

impl Catalog for GrpcCatalog {
    fn begin(&self, fence_ms: u32) -> BoxFuture<'_, Result<CatalogRoots, GcError>> {
        let mut client = self.client.clone();
        Box::pin(async move {
            let roots = client
                .begin_collection(plinth_proto::catalog::v1::BeginCollectionRequest { fence_ms })
                .await
                .map_err(|status| GcError::Catalog(status.message().to_owned()))?
                .into_inner();
            Ok(CatalogRoots {
                trees: roots.trees,
                blobs: roots.blobs,
                deleted_environments: roots.deleted_environments,
                fence_until_ms: roots.fence_until_ms,
            })
        })
    }

    fn end(&self) -> BoxFuture<'_, Result<(), GcError>> {
        let mut client = self.client.clone();
        Box::pin(async move {
            client
                .end_collection(plinth_proto::catalog::v1::EndCollectionRequest {})
                .await
                .map_err(|status| GcError::Catalog(status.message().to_owned()))?;
            Ok(())
        })
    }
}
