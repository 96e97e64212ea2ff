//! The sweep that ends sessions past their lifetime or idle limit, as `EndSession` ends a
//! session. Each catalog replica runs it; the end itself is one conditional UPDATE in the
//! store, so replicas sweeping at once never end a session twice. Nodes learn of the end from
//! their next heartbeat's answer and detach the session (processes and working directory).

use std::time::Duration;

use plinth_kit::clock::now_ms;
use plinth_kit::tasks::CancellationToken;

use crate::persistence::Store;

/// How often the sweep looks: a session outlives its limit by at most about this much (plus
/// its node's heartbeat period before its processes stop).
pub const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// Sessions ended per statement; a sweep that fills a batch goes on at once.
const BATCH: u32 = 500;

/// Ends sessions past their limits every [`SWEEP_EVERY`] until `shutdown`. A database that
/// does not answer is logged and tried again on the next round.
pub async fn end_sessions_past_their_limits(store: Store, shutdown: CancellationToken) {
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(SWEEP_EVERY) => {}
        }
        loop {
            match store.end_sessions_past_their_limits(now_ms(), BATCH).await {
                Ok(ended) => {
                    for id in &ended {
                        tracing::info!(session = %id, "session ended: past its lifetime or idle limit");
                    }
                    if ended.len() < BATCH as usize || shutdown.is_cancelled() {
                        break;
                    }
                }
                Err(error) => {
                    tracing::warn!(%error, "cannot end sessions past their limits; retrying");
                    break;
                }
            }
        }
    }
}
