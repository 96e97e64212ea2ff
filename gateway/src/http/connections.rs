//! The gateway's connections, bounded so that no client holds the process's descriptors or
//! memory by opening connections and saying little on them:
//!
//! - **headers in time**: a request's headers must arrive within `header_timeout` of the
//!   connection's opening (of the end of the previous answer, on an HTTP/1 connection kept
//!   alive), or the connection is closed. A connection that has not yet shown which HTTP it
//!   speaks, or an HTTP/2 connection that opens no stream, is under the same bound;
//! - **idle connections closed**: an HTTP/2 connection with no request in flight for
//!   `idle_timeout` is closed (GOAWAY), and one whose peer stops answering pings is closed
//!   too; an HTTP/1 connection waiting for its next request is closed at `header_timeout`;
//! - **connections counted**: at most `max_connections` at once, and at most
//!   `max_connections_per_client` from one client address; a connection past either is
//!   answered `503` with `Connection: close` and closed at once, before it costs more than
//!   the descriptor it arrived on. A terminal's WebSocket counts until it closes.
//!
//! Requests themselves are bounded by the edge (`edge.rs`): rate, in flight, deadline.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use plinth_kit::tasks::CancellationToken;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, mpsc};
use tokio::time::Instant;
use tower::ServiceExt as _;

use crate::http::edge::Holding;

/// The bounds, as configured.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    /// How long a request's headers may take to arrive.
    pub header_timeout: Duration,
    /// How long an HTTP/2 connection may stay open with no request in flight.
    pub idle_timeout: Duration,
    /// Connections open at once.
    pub max_connections: usize,
    /// Connections open at once from one client address.
    pub max_connections_per_client: usize,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            header_timeout: Duration::from_secs(20),
            idle_timeout: Duration::from_secs(60),
            max_connections: 4096,
            max_connections_per_client: 1024,
        }
    }
}

/// The open connections, in all and by client address.
#[derive(Debug, Default)]
struct Counts {
    total: AtomicUsize,
    by_client: Mutex<HashMap<IpAddr, usize>>,
}

/// A connection's place in the counts, given back when it is dropped.
#[derive(Debug)]
struct Place {
    counts: Arc<Counts>,
    client: IpAddr,
}

impl Counts {
    /// A place for a connection from `client`, or which limit refuses it.
    fn admit(
        self: &Arc<Self>,
        client: IpAddr,
        limits: &ConnectionLimits,
    ) -> Result<Place, &'static str> {
        let mut by_client = self
            .by_client
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if self.total.load(Ordering::Relaxed) >= limits.max_connections.max(1) {
            return Err("max_connections");
        }
        let open = by_client.entry(client).or_insert(0);
        if *open >= limits.max_connections_per_client.max(1) {
            return Err("max_connections_per_client");
        }
        *open += 1;
        self.total.fetch_add(1, Ordering::Relaxed);
        metrics::gauge!("plinth_gateway_connections").increment(1.0);
        Ok(Place {
            counts: self.clone(),
            client,
        })
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut by_client = self
            .counts
            .by_client
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(open) = by_client.get_mut(&self.client) {
            *open = open.saturating_sub(1);
            if *open == 0 {
                by_client.remove(&self.client);
            }
        }
        self.counts.total.fetch_sub(1, Ordering::Relaxed);
        metrics::gauge!("plinth_gateway_connections").decrement(1.0);
    }
}

/// A connection's socket with its place: the place is held as long as the socket is, through
/// an upgrade to a WebSocket too.
struct Counted {
    stream: TcpStream,
    _place: Place,
}

impl AsyncRead for Counted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Counted {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

/// What a connection is doing: requests in flight (until their answers' last byte), and
/// since when it has had none.
#[derive(Debug)]
struct Activity {
    in_flight: AtomicUsize,
    served: AtomicBool,
    idle_since: Mutex<Instant>,
    changed: Notify,
}

impl Activity {
    fn new() -> Arc<Self> {
        Arc::new(Activity {
            in_flight: AtomicUsize::new(0),
            served: AtomicBool::new(false),
            idle_since: Mutex::new(Instant::now()),
            changed: Notify::new(),
        })
    }

    /// When the connection may be closed for want of requests, if it has none in flight.
    fn idle_deadline(&self, limits: &ConnectionLimits) -> Option<Instant> {
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return None;
        }
        let since = *self
            .idle_since
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let bound = if self.served.load(Ordering::Acquire) {
            limits.idle_timeout
        } else {
            limits.header_timeout
        };
        Some(since + bound)
    }
}

/// One request in flight on a connection.
struct Busy(Arc<Activity>);

impl Busy {
    fn new(activity: &Arc<Activity>) -> Self {
        activity.served.store(true, Ordering::Release);
        activity.in_flight.fetch_add(1, Ordering::AcqRel);
        activity.changed.notify_one();
        Busy(activity.clone())
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        if self.0.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            *self
                .0
                .idle_since
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner()) = Instant::now();
        }
        self.0.changed.notify_one();
    }
}

/// The router, for one connection, counting its requests in flight.
#[derive(Clone)]
struct Tracked {
    app: Router,
    activity: Arc<Activity>,
    client: IpAddr,
}

impl hyper::service::Service<http::Request<Incoming>> for Tracked {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn call(&self, mut request: http::Request<Incoming>) -> Self::Future {
        let busy = Busy::new(&self.activity);
        let app = self.app.clone();
        request
            .extensions_mut()
            .insert(crate::http::edge::ClientAddress(self.client));
        Box::pin(async move {
            let response = app.oneshot(request.map(Body::new)).await?;
            Ok(response.map(|body| Body::new(Holding { body, _held: busy })))
        })
    }
}

/// Every reason a connection is refused or closed for, so each series exists from the start.
pub(crate) const REFUSAL_REASONS: [&str; 3] = [
    "max_connections",
    "max_connections_per_client",
    "connection_idle",
];

/// Serves `app` on `listener` within `limits` until `shutdown` is cancelled, then waits for
/// the open connections to finish what they are answering.
pub(crate) async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ConnectionLimits,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    metrics::gauge!("plinth_gateway_connections").set(0.0);
    let counts = Arc::new(Counts::default());
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .keep_alive(true);
    // A peer that stops answering pings is gone; its connection is closed.
    let ping = limits
        .idle_timeout
        .min(Duration::from_secs(20))
        .max(Duration::from_secs(1));
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(ping)
        .keep_alive_timeout(ping)
        .max_concurrent_streams(256);
    let builder = Arc::new(builder);
    // Each connection holds a sender; when all are gone, every connection has ended.
    let (open, mut ended) = mpsc::channel::<()>(1);
    let mut last_warned: Option<Instant> = None;
    loop {
        let accepted = tokio::select! {
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(error) => {
                if !connection_error(&error) {
                    // Out of descriptors (or memory): the connections already open are
                    // served, and accepting resumes shortly.
                    if last_warned.is_none_or(|at| at.elapsed() > Duration::from_secs(10)) {
                        tracing::warn!(%error, "the gateway cannot accept a connection; retrying");
                        last_warned = Some(Instant::now());
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                continue;
            }
        };
        let client = canonical(peer);
        let place = match counts.admit(client, &limits) {
            Ok(place) => place,
            Err(reason) => {
                refuse(stream, reason, &limits);
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let io = TokioIo::new(Counted {
            stream,
            _place: place,
        });
        let activity = Activity::new();
        let service = Tracked {
            app: app.clone(),
            activity: activity.clone(),
            client,
        };
        let builder = builder.clone();
        let shutdown = shutdown.clone();
        let open = open.clone();
        plinth_kit::tasks::spawn(async move {
            let connection = builder.serve_connection_with_upgrades(io, service);
            watch(connection, &activity, &limits, &shutdown).await;
            drop(open);
        });
    }
    drop(open);
    let _ = ended.recv().await;
    Ok(())
}

/// Drives one connection, closing it when it stays without a request past its bound and
/// asking it to finish when the server stops.
async fn watch(
    connection: auto::UpgradeableConnection<'_, TokioIo<Counted>, Tracked, TokioExecutor>,
    activity: &Arc<Activity>,
    limits: &ConnectionLimits,
    shutdown: &CancellationToken,
) {
    tokio::pin!(connection);
    let mut stopping = false;
    // After asking an idle connection to close, how long it may take before it is dropped.
    let mut close_by: Option<Instant> = None;
    loop {
        let idle = if close_by.is_none() && !stopping {
            activity.idle_deadline(limits)
        } else {
            None
        };
        tokio::select! {
            result = connection.as_mut() => {
                if let Err(error) = result {
                    tracing::debug!(error = %error, "gateway connection ended");
                }
                return;
            }
            () = shutdown.cancelled(), if !stopping => {
                stopping = true;
                connection.as_mut().graceful_shutdown();
            }
            () = activity.changed.notified() => {}
            () = tokio::time::sleep_until(idle.unwrap_or_else(Instant::now)), if idle.is_some() => {
                // Nothing was asked in time: close it, kindly first.
                if activity.idle_deadline(limits).is_some_and(|at| at <= Instant::now()) {
                    metrics::counter!("plinth_gateway_refused_total", "reason" => "connection_idle").increment(1);
                    connection.as_mut().graceful_shutdown();
                    close_by = Some(Instant::now() + Duration::from_secs(1));
                }
            }
            () = tokio::time::sleep_until(close_by.unwrap_or_else(Instant::now)), if close_by.is_some() => {
                return;
            }
        }
    }
}

/// The client's address as counted: an IPv4 address reached over IPv6 is the IPv4 address.
fn canonical(peer: SocketAddr) -> IpAddr {
    peer.ip().to_canonical()
}

/// Answers a connection past a limit `503` and closes it, without waiting for anything.
fn refuse(stream: TcpStream, reason: &'static str, limits: &ConnectionLimits) {
    metrics::counter!("plinth_gateway_refused_total", "reason" => reason).increment(1);
    let limit = if reason == "max_connections" {
        limits.max_connections
    } else {
        limits.max_connections_per_client
    };
    let body = format!(
        "{{\"error\":{{\"code\":\"unavailable\",\"message\":\"the gateway has as many \
         connections open as it takes ({limit}, gateway.{reason}); retry shortly\",\
         \"detail\":{{\"retry_after_ms\":1000}}}}}}"
    );
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         retry-after: 1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    // Whatever fits in the socket's buffer now; the connection closes either way.
    let _ = stream.try_write(answer.as_bytes());
}

/// Whether an accept error concerns only the connection being accepted (it went away), not
/// the listener or the process.
fn connection_error(error: &std::io::Error) -> bool {
    matches!(
        error.kind(),
        std::io::ErrorKind::ConnectionRefused
            | std::io::ErrorKind::ConnectionAborted
            | std::io::ErrorKind::ConnectionReset
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_are_counted_in_all_and_by_client_and_given_back() {
        let limits = ConnectionLimits {
            max_connections: 3,
            max_connections_per_client: 2,
            ..ConnectionLimits::default()
        };
        let counts = Arc::new(Counts::default());
        let a: IpAddr = "192.0.2.1".parse().expect("address");
        let b: IpAddr = "192.0.2.2".parse().expect("address");
        let first = counts.admit(a, &limits).expect("first");
        let _second = counts.admit(a, &limits).expect("second");
        assert_eq!(
            counts.admit(a, &limits).expect_err("a third from a"),
            "max_connections_per_client"
        );
        let _third = counts.admit(b, &limits).expect("b has its own");
        assert_eq!(
            counts.admit(b, &limits).expect_err("full"),
            "max_connections"
        );
        drop(first);
        counts.admit(a, &limits).expect("a place was given back");
        assert_eq!(
            canonical("[::ffff:192.0.2.1]:80".parse().expect("mapped")),
            a,
            "an IPv4 client over IPv6 is the same client"
        );
    }
}
