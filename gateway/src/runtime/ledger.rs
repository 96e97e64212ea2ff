//! Holding a claim of the catalog's run-at-most-once ledger while its work runs: a Novo call's
//! idempotency key and a Brain operation are claimed under a lease, and their runner renews
//! it every third of the lease so a long call is not settled as abandoned under it. The
//! rules (what a repeat answers, when a claim is abandoned) are the catalog's; this is only
//! the runner's side of the lease, one loop for both adapters.

use std::future::Future;
use std::time::Duration;

use plinth_kit::tasks::CancellationToken;

/// What one renewal found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Renewed {
    /// False once the claim has its answer, was settled, or is another's: stop renewing.
    pub held: bool,
    /// A cancellation was asked for (Brain: through another replica).
    pub cancel_requested: bool,
}

/// Why [`hold`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Released {
    /// `stop` was cancelled: the work ended.
    Stopped,
    /// The catalog says the claim is not held any more.
    Lost,
}

/// Renews a claim every third of `lease` (at least every 100 ms) until `stop` is cancelled
/// or the catalog says it is not held; a renewal that fails or takes longer than that third
/// is tried again at the next (past the lease, a repeat may settle the claim as unknown, and
/// the next renewal then says so). A cancellation asked for through the lease cancels
/// `cancel`. `what` names the claim in logs.
pub(crate) async fn hold<F, Fut>(
    what: &'static str,
    lease: Duration,
    stop: CancellationToken,
    cancel: Option<CancellationToken>,
    mut renew: F,
) -> Released
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Renewed, tonic::Status>>,
{
    let every = (lease / 3).max(Duration::from_millis(100));
    loop {
        tokio::select! {
            () = stop.cancelled() => return Released::Stopped,
            () = tokio::time::sleep(every) => {}
        }
        match tokio::time::timeout(every, renew()).await {
            Ok(Ok(renewed)) if !renewed.held => {
                tracing::warn!(
                    claim = what,
                    "a claim was settled or answered while its work ran; renewals stop"
                );
                return Released::Lost;
            }
            Ok(Ok(renewed)) => {
                if renewed.cancel_requested
                    && let Some(cancel) = &cancel
                {
                    cancel.cancel();
                }
            }
            Ok(Err(status)) => {
                tracing::warn!(claim = what, error = %status.message(), "renewing a claim failed; retrying");
            }
            Err(_) => {
                tracing::warn!(claim = what, "renewing a claim timed out; retrying");
            }
        }
    }
}

/// A lease as the catalog takes it, in milliseconds.
pub(crate) fn lease_ms(lease: Duration) -> i64 {
    i64::try_from(lease.as_millis()).unwrap_or(i64::MAX)
}
