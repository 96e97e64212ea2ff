//! Clients to node agents: transports by address, shared by the REST handlers, the workspace
//! adapters and terminals.
//!
//! Every call to a node has a deadline for its answer's head ([`NodeCallLimits`]): `Attach`
//! (and `Materialize`) the long one, as it may fetch a version from the blob store; every
//! other call the short one, streams included (an `Exec`'s output and a terminal then run as
//! long as their own limits allow, and a connection that goes silent meanwhile is noticed by
//! HTTP/2 keep-alive pings). A call may carry its own deadline (`grpc-timeout`, as
//! `RunCommand` does with its command's time limit). A node that misses a deadline, or whose
//! connection fails, is held suspect: the caller is answered `unavailable` naming the node, the
//! catalog is told (placement passes over the node, however recent its heartbeats), and the
//! node is probed every second until it answers, which clears the mark. A mark the gateway
//! stops renewing lapses in the catalog by itself.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use plinth_kit::grpc::{ClientInterceptor, Internal, KeepAlive, Transport};
use plinth_kit::{ErrorCode, PlinthError};
use plinth_proto::catalog::v1 as pb;
use plinth_proto::node::v1::node_service_client::NodeServiceClient;
use plinth_proto::node::v1::workspace_service_client::WorkspaceServiceClient;
use tonic::body::Body;
use tonic::service::interceptor::InterceptedService;
use tracing::Instrument as _;

use crate::http::error::ApiError;

/// Most bytes of a working-directory file through the API.
pub const MAX_SESSION_FILE_BYTES: usize = 64 * 1024 * 1024;

pub(crate) type WorkspaceClient =
    WorkspaceServiceClient<InterceptedService<NodeChannel, ClientInterceptor>>;
type NodeClient = NodeServiceClient<InterceptedService<NodeChannel, ClientInterceptor>>;

/// How often the nodes held suspect are probed.
const PROBE_EVERY: Duration = Duration::from_secs(1);
/// The longest a probe waits for its answer.
const PROBE_WITHIN: Duration = Duration::from_secs(1);
/// The slowest link between a gateway and a node a file's bytes are given time for, in
/// bytes a second (a 64 MiB file: 8 s on top of the unary deadline).
const SLOWEST_LINK: usize = 8 * 1024 * 1024;
/// Calls that may fetch a version from the blob store before they answer.
const SLOW_CALLS: [&str; 2] = [
    "/plinth.node.v1.NodeService/Attach",
    "/plinth.node.v1.NodeService/Materialize",
];

/// Deadlines on calls to node agents, and how long a node that missed one is held suspect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeCallLimits {
    /// A unary call's answer, and a stream's response head (`gateway.node_call_timeout_ms`).
    pub call: Duration,
    /// An `Attach`'s answer (`gateway.node_attach_timeout_ms`).
    pub attach: Duration,
    /// How long the catalog holds a node suspect unless this gateway renews the mark
    /// (`gateway.node_suspect_ms`).
    pub suspect_for: Duration,
}

impl Default for NodeCallLimits {
    fn default() -> Self {
        NodeCallLimits {
            call: Duration::from_secs(5),
            attach: Duration::from_secs(60),
            suspect_for: Duration::from_secs(30),
        }
    }
}

impl NodeCallLimits {
    /// Pings on node connections: every two call deadlines (at least a second), answered within
    /// one, so a connection that went silent under a stream is closed within three.
    pub fn keep_alive(&self) -> KeepAlive {
        let timeout = self.call.max(Duration::from_secs(1));
        KeepAlive {
            interval: timeout * 2,
            timeout,
        }
    }

    /// The deadline of a call: its own (`grpc-timeout`), else the one of its kind.
    fn deadline(&self, request: &http::Request<Body>) -> Duration {
        if let Some(own) = request
            .headers()
            .get("grpc-timeout")
            .and_then(|value| plinth_kit::grpc::grpc_timeout(value.as_bytes()))
        {
            return own;
        }
        if SLOW_CALLS.contains(&request.uri().path()) {
            self.attach
        } else {
            self.call
        }
    }
}

/// Transports to node agents, by address: those in this process given at the start, the
/// others channels made on first use and shared.
pub struct NodeClients {
    shared: Arc<Shared>,
}

struct Shared {
    interceptor: ClientInterceptor,
    internal: Internal,
    limits: NodeCallLimits,
    channels: Mutex<HashMap<String, Transport>>,
    /// Where marks are recorded.
    catalog: crate::runtime::SessionClient,
    /// The nodes held suspect, by address.
    suspects: Mutex<HashMap<String, Suspect>>,
    /// Whether the probe task runs.
    probing: AtomicBool,
    /// One per node address, held while its mark is written, so writes about one node land
    /// in the order made (a renewal never lands after the clearing that followed it).
    writing: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

/// A node held suspect.
struct Suspect {
    /// Set once the catalog was told (or telling it failed): callers that found the node
    /// silent answer only after that, so a session created after their answer is not placed
    /// on it.
    reported: Arc<tokio::sync::OnceCell<()>>,
    /// When the mark was last written, for renewing it.
    renewed_at: Instant,
}

impl NodeClients {
    /// Only `local` nodes known yet; every call carries `interceptor`'s credential, and
    /// `https://` nodes are reached with `internal`'s TLS. Calls have `limits`' deadlines;
    /// nodes that miss them are marked suspect through `catalog`.
    pub(crate) fn new(
        interceptor: ClientInterceptor,
        internal: Internal,
        local: Vec<(String, Transport)>,
        limits: NodeCallLimits,
        catalog: crate::runtime::SessionClient,
    ) -> Self {
        NodeClients {
            shared: Arc::new(Shared {
                interceptor,
                internal,
                limits,
                channels: Mutex::new(local.into_iter().collect()),
                catalog,
                suspects: Mutex::new(HashMap::new()),
                probing: AtomicBool::new(false),
                writing: Mutex::new(HashMap::new()),
            }),
        }
    }

    pub(crate) fn client(&self, address: &str) -> Result<NodeClient, ApiError> {
        Ok(NodeServiceClient::with_interceptor(
            self.channel(address)?,
            self.shared.interceptor.clone(),
        )
        .max_decoding_message_size(Self::LIMIT)
        .max_encoding_message_size(Self::LIMIT))
    }

    /// A workspace client for the node at `address` (the same channel).
    pub(crate) fn workspace(&self, address: &str) -> Result<WorkspaceClient, ApiError> {
        Ok(WorkspaceServiceClient::with_interceptor(
            self.channel(address)?,
            self.shared.interceptor.clone(),
        )
        .max_decoding_message_size(Self::LIMIT)
        .max_encoding_message_size(Self::LIMIT))
    }

    /// The deadline of unary calls, for callers that add a limit of their own to it.
    pub(crate) fn call_timeout(&self) -> Duration {
        self.shared.limits.call
    }

    /// A call carrying `bytes` to the node (a file written): the unary deadline, and the
    /// time those bytes take at [`SLOWEST_LINK`] on top, so a large file over a slow link is
    /// not taken for a node that does not answer.
    pub(crate) fn carrying<T>(&self, message: T, bytes: usize) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        let transfer = Duration::from_secs_f64(bytes as f64 / SLOWEST_LINK as f64);
        request.set_timeout(self.shared.limits.call.saturating_add(transfer));
        request
    }

    const LIMIT: usize = MAX_SESSION_FILE_BYTES + 64 * 1024;

    fn channel(&self, address: &str) -> Result<NodeChannel, ApiError> {
        let inner = self.shared.transport(address)?;
        Ok(NodeChannel {
            inner,
            address: address.into(),
            shared: self.shared.clone(),
        })
    }
}

impl Shared {
    fn transport(&self, address: &str) -> Result<Transport, ApiError> {
        let mut channels = lock(&self.channels);
        let channel = match channels.get(address) {
            Some(channel) => channel.clone(),
            None => {
                let channel = self
                    .internal
                    .connect_with(address, self.limits.keep_alive())
                    .map(Transport::remote)
                    .map_err(|error| {
                        PlinthError::new(
                            ErrorCode::Unavailable,
                            format!("the session's node ({address}) cannot be reached: {error}"),
                        )
                    })?;
                channels.insert(address.to_owned(), channel.clone());
                channel
            }
        };
        Ok(channel)
    }

    /// `address` did not answer: holds it suspect, here and in the catalog, and probes it
    /// until it answers. Returns once the catalog was told (by this call or another's).
    async fn mark(self: &Arc<Self>, address: &str, why: &str) {
        let reported = {
            let mut suspects = lock(&self.suspects);
            match suspects.get(address) {
                Some(suspect) => suspect.reported.clone(),
                None => {
                    let reported = Arc::new(tokio::sync::OnceCell::new());
                    suspects.insert(
                        address.to_owned(),
                        Suspect {
                            reported: reported.clone(),
                            renewed_at: Instant::now(),
                        },
                    );
                    metrics::counter!("plinth_gateway_nodes_marked_suspect_total").increment(1);
                    tracing::warn!(node = %address, %why, "a node does not answer; no new sessions go to it until it answers again");
                    reported
                }
            }
        };
        reported
            .get_or_init(|| self.report(address, self.limits.suspect_for))
            .await;
        if !self.probing.swap(true, Ordering::AcqRel) {
            // Routine, and long-lived: not worth a trace, nor part of this call's (see
            // `telemetry::idle`).
            plinth_kit::tasks::spawn(
                probe(self.clone()).instrument(plinth_kit::telemetry::idle("gateway.node_probe")),
            );
        }
    }

    /// `address` answered a call: a mark on it is cleared.
    fn answered(self: &Arc<Self>, address: &str) {
        let suspect = {
            let mut suspects = lock(&self.suspects);
            // Cheap when no node is suspect, which is nearly always.
            if suspects.is_empty() {
                return;
            }
            suspects.remove(address)
        };
        if let Some(suspect) = suspect {
            let shared = self.clone();
            let address = address.to_owned();
            plinth_kit::tasks::spawn(async move { shared.cleared(&address, suspect).await });
        }
    }

    /// Clears the mark of `address`, once the catalog has its report (so the clearing is
    /// not overtaken by the mark it clears).
    async fn cleared(&self, address: &str, suspect: Suspect) {
        suspect.reported.get_or_init(|| async {}).await;
        tracing::info!(node = %address, "a node held suspect answers again; it takes new sessions");
        self.report(address, Duration::ZERO).await;
    }

    /// Tells the catalog `address` is suspect for `suspect_for` (zero: no longer). A catalog
    /// that does not answer in time is not waited for: the mark lapses, or is written again
    /// with the next renewal.
    async fn report(&self, address: &str, suspect_for: Duration) {
        let writing = self.writing(address);
        let _writing = writing.lock().await;
        self.write(address, suspect_for).await;
    }

    fn writing(&self, address: &str) -> Arc<tokio::sync::Mutex<()>> {
        lock(&self.writing)
            .entry(address.to_owned())
            .or_default()
            .clone()
    }

    /// Renews the mark of `address`, unless it was cleared meanwhile.
    async fn renew(&self, address: &str) {
        let writing = self.writing(address);
        let _writing = writing.lock().await;
        let held = match lock(&self.suspects).get_mut(address) {
            Some(suspect) => {
                suspect.renewed_at = Instant::now();
                true
            }
            None => false,
        };
        if held {
            self.write(address, self.limits.suspect_for).await;
        }
    }

    async fn write(&self, address: &str, suspect_for: Duration) {
        let mut catalog = self.catalog.clone();
        let request = pb::MarkNodeSuspectRequest {
            address: address.to_owned(),
            suspect_for_ms: u64::try_from(suspect_for.as_millis()).unwrap_or(u64::MAX),
        };
        let within = self.limits.call.max(Duration::from_secs(1));
        match tokio::time::timeout(within, catalog.mark_node_suspect(request)).await {
            Ok(Ok(answer)) if answer.get_ref().nodes == 0 => {
                tracing::debug!(node = %address, "the catalog has no node registered at this address")
            }
            Ok(Ok(_)) => {}
            Ok(Err(status)) => {
                tracing::warn!(node = %address, error = %status.message(), "cannot tell the catalog about a node's mark; retrying with the next probe")
            }
            Err(_) => {
                tracing::warn!(node = %address, "the catalog did not take a node's mark in time; retrying with the next probe")
            }
        }
    }
}

/// Probes the nodes held suspect every [`PROBE_EVERY`] until none is: one that answers a
/// health check is cleared; the others' marks are renewed every third of their term.
async fn probe(shared: Arc<Shared>) {
    loop {
        tokio::time::sleep(PROBE_EVERY).await;
        let suspects: Vec<(String, Instant)> = lock(&shared.suspects)
            .iter()
            .map(|(address, suspect)| (address.clone(), suspect.renewed_at))
            .collect();
        if suspects.is_empty() {
            shared.probing.store(false, Ordering::Release);
            // A node marked between the read and the store would have found the task running.
            if lock(&shared.suspects).is_empty() || shared.probing.swap(true, Ordering::AcqRel) {
                return;
            }
            continue;
        }
        let probes = suspects.into_iter().map(|(address, renewed_at)| {
            let shared = shared.clone();
            async move {
                let answered = match shared.transport(&address) {
                    Ok(transport) => {
                        let mut health =
                            tonic_health::pb::health_client::HealthClient::new(transport);
                        let check = health.check(tonic_health::pb::HealthCheckRequest::default());
                        matches!(tokio::time::timeout(PROBE_WITHIN, check).await, Ok(Ok(_)))
                    }
                    Err(_) => false,
                };
                if answered {
                    let removed = lock(&shared.suspects).remove(&address);
                    if let Some(suspect) = removed {
                        shared.cleared(&address, suspect).await;
                    }
                } else if renewed_at.elapsed() >= shared.limits.suspect_for / 3 {
                    shared.renew(&address).await;
                }
            }
        });
        futures::future::join_all(probes).await;
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The channel to one node, with the deadlines of [`NodeCallLimits`]: a call whose answer's
/// head does not come in time is answered `unavailable` naming the node, and the node is
/// marked suspect.
#[derive(Clone)]
pub(crate) struct NodeChannel {
    inner: Transport,
    address: Arc<str>,
    shared: Arc<Shared>,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl tower::Service<http::Request<Body>> for NodeChannel {
    type Response = http::Response<Body>;
    type Error = BoxError;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Self::Response, Self::Error>> + Send>,
    >;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let deadline = self.shared.limits.deadline(&request);
        let answer = self.inner.call(request);
        let (address, shared) = (self.address.clone(), self.shared.clone());
        Box::pin(async move {
            match tokio::time::timeout(deadline, answer).await {
                Ok(Ok(response)) => {
                    shared.answered(&address);
                    Ok(response)
                }
                Ok(Err(error)) => {
                    // Refused, reset, or closed by keep-alive: answered as tonic would
                    // (`unavailable`), naming the node.
                    let error = error.to_string();
                    shared.mark(&address, &error).await;
                    Ok(tonic::Status::from(unreachable(&address, &error)).into_http())
                }
                Err(_) => {
                    shared.mark(&address, "no answer within the deadline").await;
                    Ok(tonic::Status::from(did_not_answer(&address, deadline)).into_http())
                }
            }
        })
    }
}

/// What a caller is answered when a node missed a call's deadline.
fn did_not_answer(address: &str, deadline: Duration) -> PlinthError {
    PlinthError::new(
        ErrorCode::Unavailable,
        format!(
            "the session's node ({address}) did not answer in time (within {} ms): it is unreachable from this gateway or overloaded; new sessions go to other nodes meanwhile; retry",
            deadline.as_millis()
        ),
    )
    .with_detail(serde_json::json!({ crate::http::error::RETRY_AFTER_MS: 1000 }))
}

/// What a caller is answered when a node's connection failed.
fn unreachable(address: &str, error: &str) -> PlinthError {
    PlinthError::new(
        ErrorCode::Unavailable,
        format!("the session's node ({address}) cannot be reached: {error}; retry"),
    )
    .with_detail(serde_json::json!({ crate::http::error::RETRY_AFTER_MS: 1000 }))
}

/// Shared handle to node channels.
pub type Nodes = Arc<NodeClients>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keep_alive_notices_a_silent_connection_within_three_call_deadlines() {
        let limits = NodeCallLimits {
            call: Duration::from_millis(400),
            ..NodeCallLimits::default()
        };
        let keep_alive = limits.keep_alive();
        assert_eq!(keep_alive.timeout, Duration::from_secs(1));
        assert_eq!(keep_alive.interval, Duration::from_secs(2));
    }
}
