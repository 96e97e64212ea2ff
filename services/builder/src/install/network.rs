//! The network (see the module documentation's heading of that name): a build's own
//! namespace with the egress proxy serving it.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use plinth_sandbox::egress::{DEFAULT_PROXY_ADDR, EgressPolicy};
use tokio_util::sync::{CancellationToken, DropGuard};
use tracing::Instrument;

/// A build's network namespace and the egress proxy serving the socket in it, for as long as
/// the build runs.
pub(super) struct Egress {
    pub(super) netns: Arc<OwnedFd>,
    /// Stops the proxy when the build is over (or abandoned).
    _stop: DropGuard,
}

impl Egress {
    pub(super) async fn start(policy: Arc<EgressPolicy>, label: String) -> std::io::Result<Egress> {
        // Two short-lived threads (one makes the namespace, one listens in it): off the
        // runtime.
        let (netns, listener) = tokio::task::spawn_blocking(|| {
            let netns = plinth_sandbox::egress::new_namespace()?;
            let listener = plinth_sandbox::egress::listen_in(netns.as_fd(), DEFAULT_PROXY_ADDR)?;
            listener.set_nonblocking(true)?;
            std::io::Result::Ok((netns, listener))
        })
        .await
        .map_err(|join| std::io::Error::other(join.to_string()))??;
        let listener = tokio::net::TcpListener::from_std(listener)?;
        let stop = CancellationToken::new();
        let serving = stop.clone();
        plinth_kit::tasks::spawn(
            async move {
                plinth_sandbox::egress::serve(
                    listener,
                    policy,
                    Arc::new(plinth_sandbox::egress::SystemResolver),
                    &label,
                    serving,
                )
                .await;
            }
            .instrument(tracing::Span::current()),
        );
        Ok(Egress {
            netns: Arc::new(netns),
            _stop: stop.drop_guard(),
        })
    }
}
