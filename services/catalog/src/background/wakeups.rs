//! Waking `ClaimBuild` calls that wait for work. A build queued (or given back) through this
//! catalog wakes them in-process. On PostgreSQL, where several catalog replicas share the
//! queue, each replica also listens on [`BUILD_QUEUED_CHANNEL`], which every queuing
//! transaction notifies as it commits, so a builder long-polling one replica hears at once of
//! a build queued through another. While that listener has no connection, waiting claims look
//! at the queue every so often instead (see [`Wakeups::complete`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use plinth_kit::tasks::CancellationToken;
use sqlx::postgres::PgListener;
use tokio::sync::Notify;
use tokio::sync::futures::Notified;

use crate::persistence::BUILD_QUEUED_CHANNEL;

/// How long the listener waits before connecting again after its connection failed.
const RECONNECT_PAUSE: Duration = Duration::from_secs(1);

/// What wakes waiting claims, shared by the service and the listener.
#[derive(Debug)]
pub struct Wakeups {
    notify: Notify,
    /// Whether every build that becomes claimable is announced through `notify`.
    complete: AtomicBool,
}

impl Wakeups {
    /// For one catalog process that sees every queuing itself (SQLite): nothing to listen to.
    pub fn in_process() -> Arc<Self> {
        Arc::new(Wakeups {
            notify: Notify::new(),
            complete: AtomicBool::new(true),
        })
    }

    /// For a replica that hears of other replicas' builds only through [`listen`], which has
    /// not connected yet.
    pub fn shared() -> Arc<Self> {
        Arc::new(Wakeups {
            notify: Notify::new(),
            complete: AtomicBool::new(false),
        })
    }

    /// Wakes every claim waiting now.
    pub fn wake(&self) {
        self.notify.notify_waiters();
    }

    /// A future that completes at the next [`Wakeups::wake`]; enable it before looking at the
    /// queue, so that a wake between the look and the wait is not lost.
    pub fn notified(&self) -> Notified<'_> {
        self.notify.notified()
    }

    /// Whether a waiting claim hears of every build that becomes claimable (other than by a
    /// lease running out, which it times itself). When not, it must poll.
    pub fn complete(&self) -> bool {
        self.complete.load(Ordering::Acquire)
    }
}

/// Listens on [`BUILD_QUEUED_CHANNEL`] with a connection of its own until `shutdown`, waking
/// waiting claims at each notification. A dropped connection is made again; once it is, waiters
/// are woken once, since a notification sent meanwhile was lost.
pub async fn listen(url: String, wakeups: Arc<Wakeups>, shutdown: CancellationToken) {
    let mut failures = 0u32;
    while !shutdown.is_cancelled() {
        let listener = async {
            let mut listener = PgListener::connect(&url).await?;
            listener.listen(BUILD_QUEUED_CHANNEL).await?;
            Ok::<_, sqlx::Error>(listener)
        };
        let mut listener = tokio::select! {
            () = shutdown.cancelled() => return,
            listener = listener => match listener {
                Ok(listener) => listener,
                Err(error) => {
                    failures += 1;
                    // Once at WARN, then quietly: readiness already says the database is away.
                    if failures == 1 {
                        tracing::warn!(%error, "cannot listen for builds queued through other catalogs; waiting builders poll the queue until this reconnects");
                    } else {
                        tracing::debug!(%error, failures, "listening for queued builds still fails");
                    }
                    tokio::select! {
                        () = shutdown.cancelled() => return,
                        () = tokio::time::sleep(RECONNECT_PAUSE) => continue,
                    }
                }
            },
        };
        if failures > 0 {
            tracing::info!("listening for queued builds again");
        }
        failures = 0;
        wakeups.complete.store(true, Ordering::Release);
        // Whatever was announced while nobody listened is looked for now.
        wakeups.wake();
        loop {
            let received = tokio::select! {
                () = shutdown.cancelled() => return,
                received = listener.try_recv() => received,
            };
            match received {
                Ok(Some(_)) => wakeups.wake(),
                // `None`: the connection was lost (notifications meanwhile are gone).
                Ok(None) => {
                    tracing::warn!(
                        "the connection listening for queued builds was lost; reconnecting"
                    );
                    break;
                }
                Err(error) => {
                    tracing::warn!(%error, "listening for queued builds failed; reconnecting");
                    break;
                }
            }
        }
        wakeups.complete.store(false, Ordering::Release);
        // Waiters switch to polling now rather than at the end of their wait.
        wakeups.wake();
    }
}
