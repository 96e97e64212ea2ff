//! The catalog's view of the fleet as gauges: builds queued and running, the age of the oldest
//! queued build, nodes live, suspect and late, sessions live. Every replica reads the same database and
//! reports the same figures; dashboards and alerts take their `max`.

use std::time::Duration;

use plinth_kit::clock::now_ms;
use plinth_kit::tasks::CancellationToken;

use crate::domain::sessions::NodeTtl;
use crate::persistence::Store;

/// How often the gauges are read: about a Prometheus scrape interval.
pub const EVERY: Duration = Duration::from_secs(10);

/// Sets the gauges now and every [`EVERY`] until `shutdown`. A database that does not answer
/// leaves the last figures (readiness reports the database itself).
pub async fn report(store: Store, nodes: NodeTtl, shutdown: CancellationToken) {
    // The takeover counters exist from the start, so a rate over them is 0, not absent.
    for outcome in ["requeued", "failed"] {
        metrics::counter!("plinth_build_lease_takeovers_total", "outcome" => outcome).increment(0);
    }
    loop {
        let now = now_ms();
        match store.counts(now, nodes.live_since_ms()).await {
            Ok(counts) => {
                let gauge = |name: &'static str, state: &'static str, value: i64| {
                    metrics::gauge!(name, "state" => state).set(value as f64);
                };
                gauge("plinth_builds", "queued", counts.builds_queued);
                gauge("plinth_builds", "running", counts.builds_running);
                gauge("plinth_nodes", "live", counts.nodes_live);
                gauge("plinth_nodes", "suspect", counts.nodes_suspect);
                gauge("plinth_nodes", "late", counts.nodes_late);
                let oldest = if counts.oldest_queued_at_ms > 0 {
                    (now - counts.oldest_queued_at_ms).max(0) as f64 / 1000.0
                } else {
                    0.0
                };
                metrics::gauge!("plinth_build_queue_oldest_seconds").set(oldest);
                metrics::gauge!("plinth_sessions_live").set(counts.sessions_live as f64);
            }
            Err(error) => {
                tracing::debug!(%error, "cannot read the fleet's counts; keeping the last")
            }
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(EVERY) => {}
        }
    }
}
