//! Garbage collection and retention as `plinth` configures and runs them: the `[gc]` section,
//! what the catalog and the source service are given, and `plinth gc`, which runs retention
//! and one collection pass in its own process against the configured databases and blob store
//! (beside running services or not: the pass lease and the fences are in the databases).

use std::time::Duration;

use anyhow::Context as _;
use plinth_source::gc::{Catalog, CatalogRoots, GcError, GcOptions, Report};

use crate::config::Config;

/// A boxed future, as [`Catalog`]'s methods answer.
type BoxFuture<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;

pub use crate::config::GcSection;

impl Config {
    /// How collection runs, for the source service and `plinth gc`.
    pub fn gc_options(&self) -> GcOptions {
        GcOptions {
            grace: Duration::from_secs(self.gc.grace_seconds),
            hold_ttl: Duration::from_secs(self.gc.hold_seconds.max(1)),
        }
    }

    /// How often passes and retention run by themselves; `None` when never.
    pub fn gc_every(&self) -> Option<Duration> {
        (self.gc.interval_seconds > 0).then(|| Duration::from_secs(self.gc.interval_seconds))
    }

    /// What retention keeps.
    pub fn retention(&self) -> plinth_catalog::RetentionPolicy {
        plinth_catalog::RetentionPolicy {
            keep_versions: self.catalog.keep_versions.max(1),
            retention_ms: i64::from(self.catalog.retention_days) * 24 * 3600 * 1000,
        }
    }
}

/// The catalog through its database, for `plinth gc` (a service asks it over gRPC).
pub struct DirectCatalog(pub plinth_catalog::Store);

impl Catalog for DirectCatalog {
    fn begin(&self, fence_ms: u32) -> BoxFuture<'_, Result<CatalogRoots, GcError>> {
        Box::pin(async move {
            let roots = self
                .0
                .begin_collection(i64::from(fence_ms))
                .await
                .map_err(|error| GcError::Catalog(error.to_string()))?;
            Ok(CatalogRoots {
                trees: roots.trees,
                blobs: roots.blobs,
                deleted_environments: roots.deleted_environments,
                fence_until_ms: roots.fence_until_ms,
            })
        })
    }

    fn end(&self) -> BoxFuture<'_, Result<(), GcError>> {
        Box::pin(async move {
            self.0
                .end_collection()
                .await
                .map_err(|error| GcError::Catalog(error.to_string()))
        })
    }
}

/// What `plinth gc` did.
#[derive(Debug, Clone)]
pub struct GcOutcome {
    /// What retention removed; `None` in a dry run (it runs only for real).
    pub retired: Option<plinth_catalog::Retired>,
    /// What the collection pass found and did.
    pub report: Report,
}

impl std::fmt::Display for GcOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let report = &self.report;
        match &self.retired {
            Some(retired) => writeln!(
                f,
                "retention removed {} versions, {} sessions, {} tasks, {} adapter runs, {} idempotency records, {} Brain operations, {} Brain bindings",
                retired.versions,
                retired.sessions,
                retired.tasks,
                retired.adapter_runs,
                retired.idempotency_keys,
                retired.brain_operations,
                retired.brain_bindings
            )?,
            None => writeln!(f, "retention: not run in a dry run")?,
        }
        writeln!(
            f,
            "listed {} objects, {} bytes",
            report.listed_objects, report.listed_bytes
        )?;
        let verb = if report.dry_run {
            "would reclaim"
        } else {
            "reclaimed"
        };
        writeln!(
            f,
            "{verb} {} objects, {} bytes",
            report.reclaimed_objects, report.reclaimed_bytes
        )?;
        writeln!(
            f,
            "kept {} unreferenced objects younger than the grace period",
            report.young_objects
        )?;
        if report.forgotten_environments > 0 {
            let verb = if report.dry_run {
                "would forget"
            } else {
                "forgot"
            };
            writeln!(
                f,
                "{verb} the files of {} deleted environments",
                report.forgotten_environments
            )?;
        }
        if report.forgotten_layers > 0 {
            let verb = if report.dry_run {
                "would stop counting"
            } else {
                "stopped counting"
            };
            writeln!(
                f,
                "{verb} {} layers of versions no longer kept in their scopes' stored bytes",
                report.forgotten_layers
            )?;
        }
        if report.unfinished {
            writeln!(f, "stopped early; the next pass takes the rest")?;
        }
        if report.dry_run {
            writeln!(f, "dry run: nothing was changed")?;
        }
        Ok(())
    }
}

/// Runs retention (unless `dry_run`) and one collection pass with `config`'s databases and
/// blob store, in this process.
pub async fn run_once(config: &Config, dry_run: bool) -> anyhow::Result<GcOutcome> {
    let catalog_url = config
        .catalog
        .database_url
        .clone()
        .context("the catalog's database URL is not resolved")?;
    let source_url = config
        .source
        .database_url
        .clone()
        .context("the source index's database URL is not resolved")?;
    let blob_url = config
        .source
        .blob_url
        .clone()
        .context("the blob URL is not resolved")?;
    let store = plinth_catalog::Store::connect_for_maintenance(&catalog_url, 2)
        .await
        .with_context(|| {
            format!(
                "cannot open the catalog's database {}",
                plinth_kit::config::redact_url(&catalog_url)
            )
        })?;
    let index = plinth_source::Index::connect(&source_url, 2)
        .await
        .with_context(|| {
            format!(
                "cannot open the source index {}",
                plinth_kit::config::redact_url(&source_url)
            )
        })?;
    // The pass needs the collection tables; a source that never ran has none yet.
    index
        .migrate()
        .await
        .context("migrating the source index")?;
    let spool = config
        .source
        .spool_dir
        .clone()
        .unwrap_or_else(|| config.data_dir.join("spool"));
    let blobs = plinth_blobs::BlobStore::open(&blob_url, spool).with_context(|| {
        format!(
            "cannot open the blob store {}",
            plinth_kit::config::redact_url(&blob_url)
        )
    })?;
    let retired = if dry_run {
        None
    } else {
        let retired = store.apply_retention(config.retention()).await.context(
            "retention failed (has the catalog run since this version? it adds the tables retention needs)",
        )?;
        plinth_catalog::retention::log(&retired);
        Some(retired)
    };
    let catalog = DirectCatalog(store.clone());
    let report = plinth_source::gc::collect(&index, &blobs, &catalog, config.gc_options(), dry_run)
        .await
        .context("garbage collection failed")?;
    store.close().await;
    index.close().await;
    Ok(GcOutcome { retired, report })
}

/// `plinth gc`: prints what was (or would be) reclaimed.
pub async fn command(config: &Config, dry_run: bool) -> anyhow::Result<()> {
    let outcome = run_once(config, dry_run).await?;
    print!("{outcome}");
    Ok(())
}
