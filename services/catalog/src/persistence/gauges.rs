//! What the fleet looks like right now, for the catalog's gauges: one read of a few counts.

use sqlx::Row;

use super::{Store, StoreError};

/// Counts the catalog reports as gauges (see [`crate::background::gauges`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counts {
    /// Builds waiting for a builder.
    pub builds_queued: i64,
    /// Builds a builder holds.
    pub builds_running: i64,
    /// When the oldest queued build was queued; 0 when none is.
    pub oldest_queued_at_ms: i64,
    /// Nodes whose last heartbeat is recent enough for sessions, not held suspect, and that
    /// did not leave on purpose.
    pub nodes_live: i64,
    /// Nodes whose last heartbeat is recent enough for sessions, but held suspect: a gateway
    /// could not reach them, so they get no new sessions.
    pub nodes_suspect: i64,
    /// Nodes heard from within the last hour, but not recently enough for sessions; a node
    /// that left on purpose (`plinth node --drain`) is not late.
    pub nodes_late: i64,
    /// Sessions not yet ended.
    pub sessions_live: i64,
}

/// A node silent for longer than this is taken for removed, not late.
const GONE_AFTER_MS: i64 = 60 * 60 * 1000;

impl Store {
    /// The counts as of `now_ms`, with nodes heard from since `live_since_ms` counted live (or
    /// suspect, while a gateway's mark on them lasts).
    pub async fn counts(&self, now_ms: i64, live_since_ms: i64) -> Result<Counts, StoreError> {
        let row = sqlx::query(
            "SELECT \
             (SELECT COUNT(*) FROM builds WHERE status = 'queued') AS builds_queued, \
             (SELECT COUNT(*) FROM builds WHERE status = 'building') AS builds_running, \
             (SELECT COALESCE(MIN(queued_at_ms), 0) FROM builds WHERE status = 'queued') AS oldest, \
             (SELECT COUNT(*) FROM nodes WHERE heartbeat_at_ms >= $1 AND left_at_ms = 0 \
             AND suspect_until_ms <= $3) AS nodes_live, \
             (SELECT COUNT(*) FROM nodes WHERE heartbeat_at_ms >= $1 AND left_at_ms = 0 \
             AND suspect_until_ms > $3) AS nodes_suspect, \
             (SELECT COUNT(*) FROM nodes WHERE heartbeat_at_ms < $1 AND heartbeat_at_ms >= $2 \
             AND left_at_ms = 0) AS nodes_late, \
             (SELECT COUNT(*) FROM sessions WHERE status = 'active') AS sessions_live",
        )
        .bind(live_since_ms)
        .bind(now_ms - GONE_AFTER_MS)
        .bind(now_ms)
        .fetch_one(&self.db.reader)
        .await?;
        Ok(Counts {
            builds_queued: row.try_get("builds_queued")?,
            builds_running: row.try_get("builds_running")?,
            oldest_queued_at_ms: row.try_get("oldest")?,
            nodes_live: row.try_get("nodes_live")?,
            nodes_suspect: row.try_get("nodes_suspect")?,
            nodes_late: row.try_get("nodes_late")?,
            sessions_live: row.try_get("sessions_live")?,
        })
    }
}
