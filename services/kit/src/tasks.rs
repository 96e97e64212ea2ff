//! Spawning and shutdown. Every spawned task carries the span it was spawned from, and a
//! background task that ends with an error says so loudly; shutdown is one
//! [`CancellationToken`] that every loop honours.

use std::future::Future;

pub use tokio_util::sync::CancellationToken;
use tracing::Instrument;

/// Spawns a task inside the current span.
pub fn spawn<F>(future: F) -> tokio::task::JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    // The one place a task is spawned: everything else comes through here (clippy.toml).
    #[allow(clippy::disallowed_methods)]
    tokio::spawn(future.instrument(tracing::Span::current()))
}

/// Spawns a long-lived background task; if it fails, the failure is logged at ERROR with the
/// task's name, since nothing else would notice.
pub fn spawn_background<F, E>(name: &'static str, future: F) -> tokio::task::JoinHandle<()>
where
    F: Future<Output = Result<(), E>> + Send + 'static,
    E: std::fmt::Display + Send + 'static,
{
    spawn(async move {
        if let Err(error) = future.await {
            tracing::error!(task = name, %error, "background task failed");
        }
    })
}

/// Cancels `token` on Ctrl-C or SIGTERM, so a process stops cleanly under a terminal or an
/// orchestrator.
pub fn cancel_on_signal(token: CancellationToken) {
    spawn(async move {
        let ctrl_c = tokio::signal::ctrl_c();
        #[cfg(unix)]
        {
            let mut term = match tokio::signal::unix::signal(
                tokio::signal::unix::SignalKind::terminate(),
            ) {
                Ok(term) => term,
                Err(error) => {
                    tracing::error!(%error, "cannot listen for SIGTERM; only Ctrl-C stops the process");
                    let _ = ctrl_c.await;
                    token.cancel();
                    return;
                }
            };
            tokio::select! {
                _ = ctrl_c => {}
                _ = term.recv() => {}
            }
        }
        #[cfg(not(unix))]
        let _ = ctrl_c.await;
        tracing::info!("shutting down");
        token.cancel();
    });
}
