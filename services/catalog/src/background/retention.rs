//! Retention, run by each catalog replica every so often: what it keeps and removes is in
//! `persistence::retention`. Replicas running it at once do no harm: every batch is one
//! conditional statement, and a row deleted by one is simply not found by the other.

use std::time::Duration;

use plinth_kit::tasks::CancellationToken;

use crate::persistence::{RetentionPolicy, Retired, Store};

/// Applies `policy` every `every` until `shutdown` (first after one period, not at start: a
/// restarting fleet does not all retire at once). A database that does not answer is logged
/// and tried again next period.
pub async fn run(
    store: Store,
    policy: RetentionPolicy,
    every: Duration,
    shutdown: CancellationToken,
) {
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(every) => {}
        }
        match store.apply_retention(policy).await {
            Ok(retired) => log(&retired),
            Err(error) => {
                tracing::warn!(%error, "retention failed; it runs again next period");
            }
        }
    }
}

/// Says what a retention pass removed, when it removed anything.
pub fn log(retired: &Retired) {
    if retired.is_empty() {
        return;
    }
    tracing::info!(
        versions = retired.versions,
        sessions = retired.sessions,
        tasks = retired.tasks,
        adapter_runs = retired.adapter_runs,
        idempotency_keys = retired.idempotency_keys,
        request_keys = retired.request_keys,
        novo_signatures = retired.novo_signatures,
        brain_operations = retired.brain_operations,
        brain_bindings = retired.brain_bindings,
        deleted_environments = retired.deleted_environments,
        build_holds = retired.build_holds,
        "retention removed what it no longer keeps"
    );
}
