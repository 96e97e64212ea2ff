//! Client-side balancing across a service's replicas.
//!
//! A client is given one URL or several, comma-separated (`http://catalog-a:7001,http://catalog-b:7001`).
//! Each host name is resolved to all its addresses and resolved again every few seconds, so one
//! name of a Kubernetes headless Service reaches every pod behind it as pods come and go. Calls
//! go round-robin over the replicas that answer. A replica whose connection fails is set aside
//! for a while (twice as long each time it fails again, up to `MAX_SET_ASIDE`) and tried again
//! after that; while any other answers, callers do not wait on it.
//!
//! A call that fails at the transport is tried again on another replica when that is safe:
//! when the connection could not be made (the request never left), or when the method is
//! declared idempotent in its proto (`option idempotency_level = …`). Either way only a call
//! whose request is one message can be sent again; a client-streaming call is not buffered.
//! An answer with a gRPC status is the service's answer and is never retried here.
//!
//! Why not tonic's `Channel::balance_list`: its power-of-two-choices balancer counts a lazily
//! connecting endpoint as ready whatever its state, so a dead replica keeps getting its share
//! of calls, each failing; and it neither resolves names again nor retries.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::BodyExt as _;
use tonic::body::Body;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};
use tower::ServiceExt as _;

/// How long names are trusted before they are resolved again.
const RESOLVE_EVERY: Duration = Duration::from_secs(5);
/// How long resolving may hold up a call when nothing was resolved yet.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a replica whose connection just failed is passed over.
const FIRST_SET_ASIDE: Duration = Duration::from_millis(500);
/// The longest a failing replica is passed over before it is tried again.
const MAX_SET_ASIDE: Duration = Duration::from_secs(8);
/// Attempts at one call, the first included.
const MAX_ATTEMPTS: usize = 3;
/// How long a connection may take; a replica that vanished without a reset (a pod gone from a
/// network) costs this much once before it is set aside.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why a service is not taken to be serving ([`Replicas::any_serving`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotServing {
    /// The service's names resolve to no address; the names, as configured.
    #[error("no address is known for {0}: the name resolves to none")]
    NoAddress(String),
    /// No replica says SERVING: each replica's name, and what it answered instead.
    #[error("{}", replicas_answered(.0))]
    Replicas(Vec<(String, Unhealthy)>),
    /// The service in this process does not say SERVING
    /// ([`Transport::any_serving`](crate::grpc::Transport::any_serving)).
    #[error("{0}")]
    InProcess(Unhealthy),
}

/// `name: answer; name: answer`.
fn replicas_answered(answers: &[(String, Unhealthy)]) -> String {
    answers
        .iter()
        .map(|(name, answer)| format!("{name}: {answer}"))
        .collect::<Vec<_>>()
        .join("; ")
}

/// One health check's answer other than SERVING.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unhealthy {
    /// No answer within the time the check had.
    #[error("no answer within {} s", .0.as_secs_f32())]
    NoAnswer(Duration),
    /// The call failed with a gRPC status; its message.
    #[error("{0}")]
    Failed(String),
    /// An answer with another status than SERVING (NOT_SERVING, SERVICE_UNKNOWN, UNKNOWN).
    #[error("{}", .0.as_str_name())]
    Status(tonic_health::pb::health_check_response::ServingStatus),
}

/// What a health `check` call answered, given `within` at most: `Ok` for SERVING.
pub(crate) async fn health_answer(
    check: impl Future<
        Output = Result<tonic::Response<tonic_health::pb::HealthCheckResponse>, tonic::Status>,
    >,
    within: Duration,
) -> Result<(), Unhealthy> {
    match tokio::time::timeout(within, check).await {
        Err(_) => Err(Unhealthy::NoAnswer(within)),
        Ok(Err(status)) => Err(Unhealthy::Failed(status.message().to_owned())),
        Ok(Ok(answer)) => match answer.into_inner().status() {
            tonic_health::pb::health_check_response::ServingStatus::Serving => Ok(()),
            other => Err(Unhealthy::Status(other)),
        },
    }
}

/// How often a connection with no traffic is pinged (HTTP/2 PING), and how long an answer may
/// take before the connection is taken for dead and closed: what notices a peer that went
/// silent (a partition, a host gone without a reset) while a call waits on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeepAlive {
    /// Between pings.
    pub interval: Duration,
    /// For a ping's answer.
    pub timeout: Duration,
}

impl Default for KeepAlive {
    /// Every 30 s, 20 s for the answer.
    fn default() -> Self {
        KeepAlive {
            interval: Duration::from_secs(30),
            timeout: Duration::from_secs(20),
        }
    }
}

/// Why a list of service URLs cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    /// Nothing between the commas.
    #[error("no URL given")]
    Empty,
    /// Not `http://host:port` or `https://host:port`.
    #[error(
        "{0:?} is not a service URL: write http://host:port or https://host:port, several separated by commas"
    )]
    Invalid(String),
    /// `http` beside `https`.
    #[error("{0:?} mixes http:// and https:// URLs: the replicas of one service speak one of them")]
    MixedSchemes(String),
    /// An `https://` URL with no CA to verify it by.
    #[error(
        "{0} is https, but no CA is configured to verify it: set `internal.tls.ca` (PLINTH_INTERNAL_TLS_CA)"
    )]
    NoCa(String),
    /// The URL or TLS settings are not usable by the transport.
    #[error("{0}")]
    Transport(#[from] tonic::transport::Error),
}

/// One URL of the list.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Target {
    https: bool,
    host: String,
    port: u16,
    /// Set when the host is an address, which is not resolved.
    ip: Option<IpAddr>,
}

impl Target {
    fn parse(url: &str) -> Result<Target, TargetError> {
        let invalid = || TargetError::Invalid(url.to_owned());
        let uri: http::Uri = url.parse().map_err(|_| invalid())?;
        let https = match uri.scheme_str() {
            Some("http") => false,
            Some("https") => true,
            _ => return Err(invalid()),
        };
        if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
            return Err(invalid());
        }
        let host = uri
            .host()
            .filter(|host| !host.is_empty())
            .ok_or_else(invalid)?;
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        let ip = host.parse().ok();
        Ok(Target {
            https,
            host,
            port,
            ip,
        })
    }

    /// The URL naming `address`, or the host itself when `address` is `None`.
    fn url(&self, address: Option<SocketAddr>) -> String {
        let scheme = if self.https { "https" } else { "http" };
        match address {
            Some(address) => format!("{scheme}://{address}"),
            None => match self.ip {
                Some(IpAddr::V6(ip)) => format!("{scheme}://[{ip}]:{}", self.port),
                _ => format!("{scheme}://{}:{}", self.host, self.port),
            },
        }
    }
}

/// The URLs of a comma-separated list, as a client of the service takes it.
fn targets(urls: &str) -> Result<Vec<Target>, TargetError> {
    let targets = urls
        .split(',')
        .map(str::trim)
        .filter(|url| !url.is_empty())
        .map(Target::parse)
        .collect::<Result<Vec<_>, _>>()?;
    let Some(first) = targets.first() else {
        return Err(TargetError::Empty);
    };
    if targets.iter().any(|target| target.https != first.https) {
        return Err(TargetError::MixedSchemes(urls.to_owned()));
    }
    Ok(targets)
}

/// What a client may do again with a method: whether its request is one message (so it can be
/// sent again) and whether the service declares it idempotent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CallRule {
    /// The request is one message.
    pub unary_request: bool,
    /// `idempotency_level` is `IDEMPOTENT` or `NO_SIDE_EFFECTS`.
    pub idempotent: bool,
    /// Its work grows with the data it covers (see [`LONG_CALLS`]).
    pub long: bool,
}

/// How long a call between services may take before its caller stops waiting (and the server
/// stops working on it, where the server caps its calls, see
/// [`crate::grpc::GrpcServer::cap_calls`]): `quick` for a call whose request is one message,
/// `long` for those of [`LONG_CALLS`]. A streamed request is bounded by its own limits; a
/// streamed answer's first message must come within the deadline, the rest by their own
/// limits. A caller may set a shorter deadline on one call (`grpc-timeout`, as tonic's
/// `Request::set_timeout` writes it): a heartbeat does, to reach another replica in time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Deadlines {
    /// Most calls: a few database statements.
    pub quick: Duration,
    /// Calls whose work grows with what they cover.
    pub long: Duration,
}

impl Default for Deadlines {
    fn default() -> Self {
        Deadlines {
            quick: Duration::from_secs(5),
            long: Duration::from_secs(120),
        }
    }
}

impl Deadlines {
    /// The deadline of a call under `rule`; `None` for a streamed request.
    pub fn of(&self, rule: CallRule) -> Option<Duration> {
        match (rule.unary_request, rule.long) {
            (false, _) => None,
            (true, false) => Some(self.quick),
            (true, true) => Some(self.long),
        }
    }
}

/// Methods whose work grows with the data they cover (a whole tree, a collection round, an
/// environment's every file): they get [`Deadlines::long`].
pub const LONG_CALLS: &[&str] = &[
    // Holds an empty poll for work up to 20 s.
    "/plinth.catalog.v1.CatalogService/ClaimBuild",
    "/plinth.catalog.v1.CatalogService/CompleteBuild",
    "/plinth.catalog.v1.CatalogService/DeleteEnvironment",
    "/plinth.catalog.v1.CollectionService/HoldBlobs",
    "/plinth.catalog.v1.CollectionService/BeginCollection",
    "/plinth.catalog.v1.CollectionService/EndCollection",
    "/plinth.source.v1.SourceService/ListTree",
    "/plinth.source.v1.SourceService/Delete",
    "/plinth.source.v1.SourceService/Snapshot",
    "/plinth.source.v1.SourceService/Stats",
    "/plinth.source.v1.SourceService/DropEnvironment",
    "/plinth.source.v1.SourceService/RecordLayer",
    "/plinth.source.v1.SourceService/ForgetLayer",
    "/plinth.source.v1.SourceService/Usage",
    "/plinth.source.v1.SourceService/GetOrigin",
    "/plinth.node.v1.NodeService/Attach",
    "/plinth.node.v1.NodeService/Detach",
    "/plinth.node.v1.NodeService/Materialize",
];

/// The rule of every method the client may call, read from descriptor sets, and the
/// deadlines calls get.
#[derive(Clone, Debug, Default)]
pub struct CallRules(Arc<HashMap<String, CallRule>>, Deadlines);

impl CallRules {
    /// The methods of every service in `descriptor_sets`, and the standard health check.
    pub fn from_descriptor_sets(descriptor_sets: &[&[u8]]) -> CallRules {
        use prost::Message as _;
        let mut rules = HashMap::new();
        for bytes in descriptor_sets {
            let Ok(set) = prost_types::FileDescriptorSet::decode(*bytes) else {
                tracing::error!("a descriptor set does not decode; its methods are never retried");
                continue;
            };
            for file in &set.file {
                let package = file.package();
                for service in &file.service {
                    for method in &service.method {
                        let path = if package.is_empty() {
                            format!("/{}/{}", service.name(), method.name())
                        } else {
                            format!("/{package}.{}/{}", service.name(), method.name())
                        };
                        let level = method
                            .options
                            .as_ref()
                            .map(|options| options.idempotency_level())
                            .unwrap_or_default();
                        let long = LONG_CALLS.contains(&path.as_str());
                        rules.insert(
                            path,
                            CallRule {
                                unary_request: !method.client_streaming(),
                                idempotent: level
                                    != prost_types::method_options::IdempotencyLevel::IdempotencyUnknown,
                                long,
                            },
                        );
                    }
                }
            }
        }
        // The health check changes nothing, though its proto does not say so.
        rules.insert(
            "/grpc.health.v1.Health/Check".to_owned(),
            CallRule {
                unary_request: true,
                idempotent: true,
                long: false,
            },
        );
        CallRules(Arc::new(rules), Deadlines::default())
    }

    /// The same rules, calls given `deadlines`.
    #[must_use]
    pub fn with_deadlines(mut self, deadlines: Deadlines) -> CallRules {
        self.1 = deadlines;
        self
    }

    /// The deadlines calls get.
    pub fn deadlines(&self) -> Deadlines {
        self.1
    }

    /// The rule of the method at `path` (the default, a call never sent again, for one not
    /// described).
    pub fn rule_of(&self, path: &str) -> CallRule {
        self.0.get(path).copied().unwrap_or_default()
    }
}

/// One replica: a lazily connecting channel to one address, and how it has fared.
impl Replica {
    /// Names this replica as the server of the call `span` is the client span of
    /// (OpenTelemetry's `server.address` and `server.port`).
    fn describe_in(&self, span: &tracing::Span) {
        match self.address {
            Some(address) => {
                span.record("server.address", address.ip().to_string());
                span.record("server.port", i64::from(address.port()));
            }
            None => {
                if let Some(authority) = self
                    .name
                    .parse::<http::Uri>()
                    .ok()
                    .and_then(|uri| uri.authority().cloned())
                {
                    span.record("server.address", authority.host());
                    if let Some(port) = authority.port_u16() {
                        span.record("server.port", i64::from(port));
                    }
                }
            }
        }
    }
}

struct Replica {
    /// Which URL of the list it came from.
    target: usize,
    /// The address it was resolved to; `None`: reached by its URL as written.
    address: Option<SocketAddr>,
    /// For logs.
    name: String,
    channel: Channel,
    health: Mutex<Health>,
}

#[derive(Default)]
struct Health {
    /// Failures since it last answered.
    failures: u32,
    /// Passed over until then.
    set_aside_until: Option<Instant>,
    /// A health check is on its way to it.
    probing: bool,
}

impl Replica {
    fn answered(&self) {
        let mut health = lock(&self.health);
        if health.failures > 0 {
            tracing::info!(replica = %self.name, "a replica answers again");
        }
        *health = Health::default();
    }

    fn failed(&self, error: &BoxError) {
        let mut health = lock(&self.health);
        health.failures = health.failures.saturating_add(1);
        let set_aside = FIRST_SET_ASIDE
            .saturating_mul(1 << health.failures.saturating_sub(1).min(8))
            .min(MAX_SET_ASIDE);
        if health.failures == 1 {
            tracing::warn!(replica = %self.name, error = %chain(error.as_ref()), "a replica failed; calls go to the others for now");
        }
        health.set_aside_until = Some(Instant::now() + set_aside);
    }

    /// Until when it is passed over; `None`: it may be called now.
    fn set_aside_until(&self, now: Instant) -> Option<Instant> {
        lock(&self.health)
            .set_aside_until
            .filter(|until| *until > now)
    }

    /// Whether it answered since it last failed.
    fn healthy(&self) -> bool {
        lock(&self.health).failures == 0
    }

    /// Sends it a health check when it failed, its set-aside ran out and none is on its way:
    /// a replica that failed gets calls again only once it answers one, so no call (a
    /// streamed upload, which cannot be sent twice) is lost finding out whether it is back.
    fn probe_if_due(self: &Arc<Self>, now: Instant) {
        {
            let mut health = lock(&self.health);
            if health.failures == 0
                || health.probing
                || health.set_aside_until.is_some_and(|until| until > now)
            {
                return;
            }
            health.probing = true;
        }
        let replica = Arc::clone(self);
        let round = crate::telemetry::idle("replica.probe");
        crate::tasks::spawn(tracing::Instrument::instrument(
            async move {
                let mut client =
                    tonic_health::pb::health_client::HealthClient::new(replica.channel.clone());
                let check = client.check(tonic_health::pb::HealthCheckRequest::default());
                // The server's overall status: a replica whose database does not answer reports
                // NOT_SERVING there (see `GrpcServer::report_health`) and stays set aside.
                let answered = matches!(
                    tokio::time::timeout(CONNECT_TIMEOUT + Duration::from_secs(1), check).await,
                    Ok(Ok(answer)) if answer.get_ref().status()
                        == tonic_health::pb::health_check_response::ServingStatus::Serving
                );
                if answered {
                    replica.answered();
                } else {
                    replica.failed(&BoxError::from("its health check got no answer"));
                }
                lock(&replica.health).probing = false;
            },
            round,
        ));
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

struct State {
    replicas: Vec<Arc<Replica>>,
    /// Round-robin position.
    next: usize,
    /// When the names were last resolved; `None`: never.
    resolved_at: Option<Instant>,
    /// A call failed since: the names may point elsewhere now (a pod replaced).
    stale: bool,
    /// A resolution runs in the background.
    resolving: bool,
}

struct Pool {
    targets: Vec<Target>,
    tls: Option<ClientTlsConfig>,
    rules: CallRules,
    keep_alive: KeepAlive,
    state: Mutex<State>,
    /// Whether any target is a name, resolved again from time to time.
    resolves: bool,
}

/// Every replica of one service, balanced client-side (see the module's documentation).
#[derive(Clone)]
pub struct Replicas(Arc<Pool>);

impl std::fmt::Debug for Replicas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replicas")
            .field("replicas", &self.known())
            .finish()
    }
}

impl Replicas {
    /// Replicas at the comma-separated `urls`; `tls` verifies `https://` ones. Nothing is
    /// connected or resolved until the first call, so services can start in any order.
    pub fn new(
        urls: &str,
        tls: Option<ClientTlsConfig>,
        rules: CallRules,
    ) -> Result<Replicas, TargetError> {
        Self::with_keep_alive(urls, tls, rules, KeepAlive::default())
    }

    /// As [`Replicas::new`], pinging each connection as `keep_alive` says.
    pub fn with_keep_alive(
        urls: &str,
        tls: Option<ClientTlsConfig>,
        rules: CallRules,
        keep_alive: KeepAlive,
    ) -> Result<Replicas, TargetError> {
        let targets = targets(urls)?;
        if targets[0].https && tls.is_none() {
            return Err(TargetError::NoCa(urls.to_owned()));
        }
        let resolves = targets.iter().any(|target| target.ip.is_none());
        let pool = Pool {
            targets,
            tls,
            rules,
            keep_alive,
            state: Mutex::new(State {
                replicas: Vec::new(),
                next: 0,
                resolved_at: None,
                stale: false,
                resolving: false,
            }),
            resolves,
        };
        // Every URL makes a channel now, so a bad one is reported at start-up; addresses are
        // kept, names wait for the first call to be resolved.
        let mut replicas = Vec::new();
        for (index, target) in pool.targets.iter().enumerate() {
            let address = target.ip.map(|ip| SocketAddr::new(ip, target.port));
            let replica = pool.replica(index, address)?;
            if address.is_some() {
                replicas.push(replica);
            }
        }
        lock(&pool.state).replicas = replicas;
        Ok(Replicas(Arc::new(pool)))
    }

    /// Sends `request` to a replica, and to another when the first failed and sending again
    /// is safe.
    pub async fn call(
        &self,
        request: http::Request<Body>,
    ) -> Result<http::Response<Body>, BoxError> {
        let pool = &self.0;
        let rule = pool.rules.rule_of(request.uri().path());
        // The caller's own deadline, when it set one, else the method's. A replica that does
        // not answer within it is set aside as a dead one is (a process that hangs, a network
        // that drops its packets), and the call goes to another when that is safe.
        let deadline = request
            .headers()
            .get("grpc-timeout")
            .and_then(|value| grpc_timeout(value.as_bytes()))
            .or_else(|| {
                pool.rules
                    .1
                    .of(rule)
                    .map(|deadline| deadline + SERVER_FIRST)
            });
        let (parts, body) = request.into_parts();
        // A one-message request is read whole so it can be sent again; tonic has encoded it
        // already, so this costs a copy of bytes that are in memory anyway. A streamed one is
        // sent once.
        let (replay, mut streamed) = if rule.unary_request {
            let bytes: Bytes = body.collect().await.map_err(BoxError::from)?.to_bytes();
            (Some(bytes), None)
        } else {
            (None, Some(body))
        };
        let mut tried: Vec<Arc<Replica>> = Vec::new();
        let mut last_error: Option<BoxError> = None;
        // The last `UNAVAILABLE` answer of a replica that is up but sick (its database does
        // not answer), given to the caller when no other replica answers better.
        let mut last_unavailable: Option<http::Response<Body>> = None;
        loop {
            let Some(replica) = pool.pick(&tried).await else {
                if let Some(response) = last_unavailable {
                    return Ok(response);
                }
                // Every replica was tried: the caller gets the last one's failure as it was
                // (a refused connection stays `unavailable`).
                return Err(last_error.unwrap_or_else(|| {
                    format!(
                        "no address is known for {}: the name resolves to none",
                        pool.describe()
                    )
                    .into()
                }));
            };
            replica.describe_in(&tracing::Span::current());
            let body = match &replay {
                Some(bytes) => Body::new(http_body_util::Full::new(bytes.clone())),
                // Taken on the only attempt a streamed request gets.
                None => streamed.take().unwrap_or_else(Body::empty),
            };
            let mut request = http::Request::new(body);
            *request.method_mut() = parts.method.clone();
            *request.uri_mut() = parts.uri.clone();
            *request.version_mut() = parts.version;
            *request.headers_mut() = parts.headers.clone();
            *request.extensions_mut() = parts.extensions.clone();
            let attempt = async {
                match replica.channel.clone().ready_oneshot().await {
                    Ok(mut channel) => tower::Service::call(&mut channel, request).await,
                    Err(error) => Err(error),
                }
                .map_err(BoxError::from)
            };
            let result = match deadline {
                Some(deadline) => match tokio::time::timeout(deadline, attempt).await {
                    Ok(result) => result,
                    Err(_) => {
                        let error = BoxError::from(format!(
                            "{} did not answer {} within {:.1} s",
                            replica.name,
                            parts.uri.path(),
                            deadline.as_secs_f64()
                        ));
                        replica.failed(&error);
                        if replay.is_some() && rule.idempotent && tried.len() + 1 < MAX_ATTEMPTS {
                            tracing::debug!(replica = %replica.name, path = parts.uri.path(), "a replica did not answer in time; sending the call again to another");
                            tried.push(replica);
                            last_unavailable = Some(unavailable_answer(&error.to_string()));
                            continue;
                        }
                        return Ok(unavailable_answer(&error.to_string()));
                    }
                },
                None => attempt.await,
            };
            match result {
                Ok(response)
                    if unavailable(&response)
                        && refused(&response)
                        && replay.is_some()
                        && tried.len() + 1 < MAX_ATTEMPTS =>
                {
                    // Refused before any work (the replica knows it cannot serve): any call
                    // whose request can be sent again goes to another replica.
                    replica.failed(&BoxError::from("it refused the call: it cannot serve"));
                    tracing::debug!(replica = %replica.name, path = parts.uri.path(), "a replica refused a call it cannot serve; sending it to another");
                    tried.push(replica);
                    last_unavailable = Some(response);
                }
                Ok(response)
                    if unavailable(&response)
                        && replay.is_some()
                        && rule.idempotent
                        && tried.len() + 1 < MAX_ATTEMPTS =>
                {
                    // Up but sick: set aside as a dead one is, and the call sent again.
                    replica.failed(&BoxError::from("it answered UNAVAILABLE"));
                    tracing::debug!(replica = %replica.name, path = parts.uri.path(), "a replica answered UNAVAILABLE; sending the call again to another");
                    tried.push(replica);
                    last_unavailable = Some(response);
                }
                Ok(response) => {
                    if unavailable(&response) {
                        replica.failed(&BoxError::from("it answered UNAVAILABLE"));
                    } else {
                        replica.answered();
                    }
                    return Ok(response);
                }
                Err(error) => {
                    replica.failed(&error);
                    pool.mark_stale();
                    let never_sent = never_sent(error.as_ref());
                    // The caller's own deadline (`grpc-timeout`), which the channel keeps too.
                    let late = timed_out(error.as_ref()).then(|| {
                        unavailable_answer(&format!(
                            "{} did not answer {} within the call's deadline",
                            replica.name,
                            parts.uri.path()
                        ))
                    });
                    let again = replay.is_some()
                        && (never_sent || rule.idempotent)
                        && tried.len() + 1 < MAX_ATTEMPTS;
                    if !again {
                        return match late {
                            Some(answer) => Ok(answer),
                            None => Err(error),
                        };
                    }
                    tracing::debug!(replica = %replica.name, path = parts.uri.path(), never_sent, "sending a call again to another replica");
                    tried.push(replica);
                    match late {
                        Some(answer) => last_unavailable = Some(answer),
                        None => last_error = Some(error),
                    }
                }
            }
        }
    }

    /// Answers `Ok` when at least one replica reports `service` SERVING within `within`;
    /// otherwise what each answered. Every replica is asked at once: one sick replica of
    /// several leaves its callers ready, as their calls go to the others.
    pub async fn any_serving(&self, service: &str, within: Duration) -> Result<(), NotServing> {
        let pool = &self.0;
        pool.refresh().await;
        let replicas: Vec<Arc<Replica>> = lock(&pool.state).replicas.clone();
        if replicas.is_empty() {
            return Err(NotServing::NoAddress(pool.describe()));
        }
        let checks = replicas.iter().map(|replica| async move {
            let mut client =
                tonic_health::pb::health_client::HealthClient::new(replica.channel.clone());
            let check = client.check(tonic_health::pb::HealthCheckRequest {
                service: service.to_owned(),
            });
            (replica.name.clone(), health_answer(check, within).await)
        });
        let answers = futures::future::join_all(checks).await;
        if answers.iter().any(|(_, answer)| answer.is_ok()) {
            return Ok(());
        }
        Err(NotServing::Replicas(
            answers
                .into_iter()
                .filter_map(|(name, answer)| Some((name, answer.err()?)))
                .collect(),
        ))
    }

    /// The replicas known now, by name and address.
    pub fn known(&self) -> Vec<String> {
        lock(&self.0.state)
            .replicas
            .iter()
            .map(|replica| replica.name.clone())
            .collect()
    }
}

impl Pool {
    fn describe(&self) -> String {
        self.targets
            .iter()
            .map(|target| target.url(None))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn replica(
        &self,
        target_index: usize,
        address: Option<SocketAddr>,
    ) -> Result<Arc<Replica>, TargetError> {
        let target = &self.targets[target_index];
        let url = target.url(address);
        let mut endpoint = Endpoint::from_shared(url.clone())?;
        if target.https {
            let tls = self
                .tls
                .clone()
                .ok_or_else(|| TargetError::NoCa(url.clone()))?
                // Certificates name the service, not the address it was resolved to.
                .domain_name(target.host.clone());
            endpoint = endpoint.tls_config(tls)?;
        }
        let channel = endpoint
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(self.keep_alive.interval)
            .keep_alive_timeout(self.keep_alive.timeout)
            .keep_alive_while_idle(true)
            .connect_lazy();
        Ok(Arc::new(Replica {
            target: target_index,
            address,
            name: match address {
                Some(address) if target.ip.is_none() => format!("{} ({address})", target.host),
                _ => url,
            },
            channel,
            health: Mutex::new(Health::default()),
        }))
    }

    /// A replica not in `tried`: the next healthy one, round-robin; when none is healthy, one
    /// that failed, whose set-aside ran out first; `None` when all were tried. Replicas that
    /// failed are health-checked in the background meanwhile.
    async fn pick(self: &Arc<Self>, tried: &[Arc<Replica>]) -> Option<Arc<Replica>> {
        self.refresh().await;
        let now = Instant::now();
        let mut state = lock(&self.state);
        for replica in &state.replicas {
            replica.probe_if_due(now);
        }
        let untried: Vec<&Arc<Replica>> = state
            .replicas
            .iter()
            .filter(|replica| !tried.iter().any(|t| Arc::ptr_eq(t, replica)))
            .collect();
        let ready: Vec<&Arc<Replica>> = untried
            .iter()
            .copied()
            .filter(|replica| replica.healthy())
            .collect();
        let chosen = if ready.is_empty() {
            untried
                .iter()
                .min_by_key(|replica| replica.set_aside_until(now))
                .map(|replica| Arc::clone(replica))
        } else {
            Some(Arc::clone(ready[state.next % ready.len()]))
        };
        state.next = state.next.wrapping_add(1);
        chosen
    }

    /// Resolves the names when they are due: waiting for it when no replica is known yet,
    /// in the background otherwise.
    async fn refresh(self: &Arc<Self>) {
        if !self.resolves {
            return;
        }
        let empty = {
            let mut state = lock(&self.state);
            let due = state.stale
                || state
                    .resolved_at
                    .is_none_or(|at| at.elapsed() >= RESOLVE_EVERY);
            if state.replicas.is_empty() {
                true
            } else if due && !state.resolving {
                state.resolving = true;
                state.stale = false;
                false
            } else {
                return;
            }
        };
        if empty {
            let _ = tokio::time::timeout(RESOLVE_TIMEOUT, self.resolve()).await;
        } else {
            let pool = Arc::clone(self);
            crate::tasks::spawn(async move {
                pool.resolve().await;
                lock(&pool.state).resolving = false;
            });
        }
    }

    /// A call failed; the names are resolved again soon (at most once a second for this).
    fn mark_stale(&self) {
        if self.resolves {
            let mut state = lock(&self.state);
            if state
                .resolved_at
                .is_some_and(|at| at.elapsed() >= Duration::from_secs(1))
            {
                state.stale = true;
            }
        }
    }

    /// Resolves every name, keeping the replicas (their connections and health) whose address
    /// is still there. A name that does not resolve keeps what it had; one that never
    /// resolved is reached by its name (its connection resolves it then).
    async fn resolve(&self) {
        let previous: Vec<Arc<Replica>> = lock(&self.state).replicas.clone();
        let mut next: Vec<Arc<Replica>> = Vec::new();
        for (index, target) in self.targets.iter().enumerate() {
            let addresses: Vec<Option<SocketAddr>> = match target.ip {
                Some(ip) => vec![Some(SocketAddr::new(ip, target.port))],
                None => match tokio::net::lookup_host((target.host.as_str(), target.port)).await {
                    Ok(found) => {
                        let mut found: Vec<SocketAddr> = found.collect();
                        found.sort();
                        found.dedup();
                        found.into_iter().map(Some).collect()
                    }
                    Err(error) => {
                        tracing::warn!(host = %target.host, %error, "a service name does not resolve; keeping its last addresses");
                        let kept: Vec<Arc<Replica>> = previous
                            .iter()
                            .filter(|replica| replica.target == index)
                            .cloned()
                            .collect();
                        if !kept.is_empty() {
                            next.extend(kept);
                            continue;
                        }
                        vec![None]
                    }
                },
            };
            for address in addresses {
                let known = previous
                    .iter()
                    .find(|replica| replica.target == index && replica.address == address)
                    .cloned();
                let replica = match known {
                    Some(replica) => replica,
                    None => match self.replica(index, address) {
                        Ok(replica) => replica,
                        Err(_) => continue,
                    },
                };
                next.push(replica);
            }
        }
        let mut state = lock(&self.state);
        let names = |replicas: &[Arc<Replica>]| -> Vec<String> {
            replicas
                .iter()
                .map(|replica| replica.name.clone())
                .collect()
        };
        if names(&state.replicas) != names(&next) {
            tracing::info!(replicas = ?names(&next), "service replicas resolved");
        }
        state.replicas = next;
        state.resolved_at = Some(Instant::now());
    }
}

/// Whether a gRPC answer is a trailers-only `UNAVAILABLE` (code 14): the replica is up but
/// cannot serve (its database or blob store does not answer), and said so before answering
/// anything.
fn unavailable(response: &http::Response<Body>) -> bool {
    response
        .headers()
        .get("grpc-status")
        .is_some_and(|status| status.as_bytes() == b"14")
}

/// The header a server sets on a refusal made before any work (see
/// [`crate::grpc::GrpcServer::refuse_while_not_ready`]): the call may be sent to another
/// replica whatever its method.
pub const REFUSED_HEADER: &str = "plinth-refused";

/// Whether an answer is such a refusal.
fn refused(response: &http::Response<Body>) -> bool {
    response.headers().contains_key(REFUSED_HEADER)
}

/// How much longer than a server's own cap a client waits, so the server's answer (which
/// says why) arrives first when the server is there to give it.
const SERVER_FIRST: Duration = Duration::from_secs(1);

/// A trailers-only `UNAVAILABLE` answer saying `message`, as a server gives one.
pub(crate) fn unavailable_answer(message: &str) -> http::Response<Body> {
    tonic::Status::unavailable(message).into_http()
}

/// A `grpc-timeout` header's duration (`<digits><unit>`, units `H M S m u n`).
pub fn grpc_timeout(value: &[u8]) -> Option<Duration> {
    let (&unit, digits) = value.split_last()?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let amount: u64 = std::str::from_utf8(digits).ok()?.parse().ok()?;
    Some(match unit {
        b'H' => Duration::from_secs(amount.saturating_mul(3600)),
        b'M' => Duration::from_secs(amount.saturating_mul(60)),
        b'S' => Duration::from_secs(amount),
        b'm' => Duration::from_millis(amount),
        b'u' => Duration::from_micros(amount),
        b'n' => Duration::from_nanos(amount),
        _ => return None,
    })
}

/// Whether the call failed before its request left: the connection could not be made.
fn never_sent(error: &(dyn std::error::Error + 'static)) -> bool {
    caused_by::<tonic::ConnectError>(error)
}

/// Whether the call ran out of the deadline its caller set.
fn timed_out(error: &(dyn std::error::Error + 'static)) -> bool {
    caused_by::<tonic::TimeoutExpired>(error)
}

/// Whether `error` or one of its causes is an `E`.
fn caused_by<E: std::error::Error + 'static>(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut current = Some(error);
    while let Some(error) = current {
        if error.downcast_ref::<E>().is_some() {
            return true;
        }
        current = error.source();
    }
    false
}

/// An error with its causes, for a log line.
fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut current = error.source();
    while let Some(cause) = current {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        current = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use tonic_health::ServingStatus;
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_client::HealthClient;

    use super::*;
    use crate::grpc::Transport;

    /// A health server on loopback whose service `who` answers `status`, so a test can tell
    /// which replica answered. It runs on a runtime of its own, so killing it drops its
    /// listener and every connection at once, as a killed process would.
    async fn replica(status: ServingStatus) -> (SocketAddr, Killer) {
        replica_at("127.0.0.1:0".parse().expect("an address"), status).await
    }

    /// Ends its replica when told, or when dropped.
    struct Killer(
        Option<std::sync::mpsc::Sender<()>>,
        Option<std::thread::JoinHandle<()>>,
    );

    impl Killer {
        fn kill(mut self) {
            self.0.take();
            if let Some(thread) = self.1.take() {
                let _ = thread.join();
            }
        }
    }

    impl Drop for Killer {
        fn drop(&mut self) {
            self.0.take();
        }
    }

    async fn replica_at(address: SocketAddr, status: ServingStatus) -> (SocketAddr, Killer) {
        let listener = std::net::TcpListener::bind(address).expect("a loopback port");
        listener
            .set_nonblocking(true)
            .expect("a non-blocking listener");
        let address = listener.local_addr().expect("the listener's address");
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let (started, up) = tokio::sync::oneshot::channel();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .expect("a runtime");
            runtime.spawn(async move {
                let listener =
                    tokio::net::TcpListener::from_std(listener).expect("a tokio listener");
                let (reporter, service) = tonic_health::server::health_reporter();
                reporter.set_service_status("who", status).await;
                let _ = started.send(());
                let _ = tonic::transport::Server::builder()
                    .add_service(service)
                    .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
                    .await;
            });
            // Until told (or the handle is dropped); then the runtime and all it holds go.
            let _ = stopped.recv();
            runtime.shutdown_background();
        });
        up.await.expect("the replica started");
        (address, Killer(Some(stop), Some(thread)))
    }

    fn client(urls: &str) -> (Replicas, HealthClient<Transport>) {
        let replicas = Replicas::new(
            urls,
            None,
            CallRules::from_descriptor_sets(&[tonic_health::pb::FILE_DESCRIPTOR_SET]),
        )
        .expect("replicas");
        (
            replicas.clone(),
            HealthClient::new(Transport::remote(replicas)),
        )
    }

    async fn who(client: &mut HealthClient<Transport>) -> Result<i32, tonic::Status> {
        let answer = client
            .check(HealthCheckRequest {
                service: "who".to_owned(),
            })
            .await?;
        Ok(answer.into_inner().status)
    }

    const A: i32 = ServingStatus::Serving as i32;
    const B: i32 = ServingStatus::NotServing as i32;

    #[tokio::test]
    async fn calls_go_to_every_replica_and_none_fails_while_one_is_dead() {
        let (a, a_server) = replica(ServingStatus::Serving).await;
        let (b, _b_server) = replica(ServingStatus::NotServing).await;
        let (_, mut client) = client(&format!("http://{a}, http://{b}"));
        let mut answers = Vec::new();
        for _ in 0..10 {
            answers.push(who(&mut client).await.expect("an answer"));
        }
        assert_eq!(
            answers.iter().filter(|&&x| x == A).count(),
            5,
            "{answers:?}"
        );
        assert_eq!(
            answers.iter().filter(|&&x| x == B).count(),
            5,
            "{answers:?}"
        );

        // Killed: its connections reset, its port refuses.
        a_server.kill();
        for call in 0..20 {
            let answer = who(&mut client).await;
            assert_eq!(answer.ok(), Some(B), "call {call} after the kill");
        }
    }

    #[tokio::test]
    async fn a_call_that_never_left_is_sent_to_another_replica_whatever_the_method() {
        // Nothing listens on `dead`'s port: every connection is refused, so no request left.
        let dead = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a loopback port");
            listener.local_addr().expect("the listener's address")
        };
        let (b, _b_server) = replica(ServingStatus::NotServing).await;
        let (_, mut client) = client(&format!("http://{dead},http://{b}"));
        // Watch is not idempotent (it holds a stream open); it is still sent again, since the
        // first replica never received it.
        for _ in 0..4 {
            let mut stream = client
                .watch(HealthCheckRequest {
                    service: "who".to_owned(),
                })
                .await
                .expect("watch reaches the live replica")
                .into_inner();
            let first = stream
                .message()
                .await
                .expect("a message")
                .expect("the stream is open");
            assert_eq!(first.status, B);
        }
    }

    #[tokio::test]
    async fn a_lone_dead_replica_answers_unavailable() {
        let dead = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a loopback port");
            listener.local_addr().expect("the listener's address")
        };
        let (_, mut client) = client(&format!("http://{dead}"));
        for _ in 0..3 {
            let status = who(&mut client).await.expect_err("nothing listens");
            // What callers retry elsewhere on (a session placed on a dead node, say).
            assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
        }
    }

    /// A loopback port that accepts connections and never says anything on them: a process
    /// that hangs, or a network that drops its answers. Open until the returned sender is
    /// dropped.
    fn blackhole() -> (SocketAddr, std::sync::mpsc::Sender<()>) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        let address = listener.local_addr().expect("the listener's address");
        let (keep, stop) = std::sync::mpsc::channel::<()>();
        std::thread::spawn(move || {
            listener.set_nonblocking(true).expect("non-blocking");
            let mut held = Vec::new();
            while let Err(std::sync::mpsc::TryRecvError::Empty) = stop.try_recv() {
                if let Ok((socket, _)) = listener.accept() {
                    held.push(socket);
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        });
        (address, keep)
    }

    fn quick_client(urls: &str, quick: Duration) -> HealthClient<Transport> {
        let replicas = Replicas::new(
            urls,
            None,
            CallRules::from_descriptor_sets(&[tonic_health::pb::FILE_DESCRIPTOR_SET])
                .with_deadlines(Deadlines { quick, long: quick }),
        )
        .expect("replicas");
        HealthClient::new(Transport::remote(replicas))
    }

    #[tokio::test]
    async fn a_replica_that_never_answers_is_passed_for_another_within_the_deadline() {
        let (hung, _open) = blackhole();
        let (b, _b_server) = replica(ServingStatus::NotServing).await;
        // The deadline given is the server's; the client waits a second more.
        let mut client = quick_client(
            &format!("http://{hung},http://{b}"),
            Duration::from_millis(200),
        );
        for call in 0..6 {
            let answer = tokio::time::timeout(Duration::from_secs(60), who(&mut client))
                .await
                .expect("the call answers rather than hanging");
            assert_eq!(answer.ok(), Some(B), "call {call}");
        }
    }

    #[tokio::test]
    async fn a_call_that_cannot_go_elsewhere_answers_unavailable_at_its_deadline() {
        let (hung, _open) = blackhole();
        let mut client = quick_client(&format!("http://{hung}"), Duration::from_millis(200));
        // Also what a caller's own shorter deadline does: `grpc-timeout` on the request.
        let mut own = tonic::Request::new(HealthCheckRequest {
            service: "who".to_owned(),
        });
        own.set_timeout(Duration::from_millis(100));
        for answer in [
            tokio::time::timeout(Duration::from_secs(60), who(&mut client)).await,
            tokio::time::timeout(Duration::from_secs(60), async {
                client
                    .check(own)
                    .await
                    .map(|answer| answer.into_inner().status)
            })
            .await,
        ] {
            let status = answer
                .expect("the call answers rather than hanging")
                .expect_err("nothing answers");
            assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
            assert!(status.message().contains("did not answer"), "{status:?}");
        }
    }

    #[test]
    fn grpc_timeout_headers_are_read_as_grpc_writes_them() {
        assert_eq!(grpc_timeout(b"250m"), Some(Duration::from_millis(250)));
        assert_eq!(grpc_timeout(b"2S"), Some(Duration::from_secs(2)));
        assert_eq!(grpc_timeout(b"1H"), Some(Duration::from_secs(3600)));
        assert_eq!(grpc_timeout(b"500u"), Some(Duration::from_micros(500)));
        for bad in [&b""[..], b"m", b"12", b"1x", b"-1S", b"123456789S"] {
            assert_eq!(grpc_timeout(bad), None, "{bad:?}");
        }
    }

    #[tokio::test]
    async fn a_replica_that_comes_back_gets_calls_again() {
        let (a, a_server) = replica(ServingStatus::Serving).await;
        let (b, _b_server) = replica(ServingStatus::NotServing).await;
        let (_, mut client) = client(&format!("http://{a},http://{b}"));
        assert!(who(&mut client).await.is_ok());
        a_server.kill();
        for _ in 0..4 {
            assert_eq!(who(&mut client).await.ok(), Some(B));
        }
        // Back on the same address; the set-aside runs out and calls reach it again.
        let (_, _a_again) = replica_at(a, ServingStatus::Serving).await;
        let deadline = Instant::now() + MAX_SET_ASIDE + Duration::from_secs(5);
        loop {
            if who(&mut client).await.ok() == Some(A) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the replica never got a call again"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// A replica that is up but sick: every health call answers `UNAVAILABLE`, as a service
    /// whose database does not answer does.
    struct Sick;

    #[tonic::async_trait]
    impl tonic_health::pb::health_server::Health for Sick {
        async fn check(
            &self,
            _: tonic::Request<HealthCheckRequest>,
        ) -> Result<tonic::Response<tonic_health::pb::HealthCheckResponse>, tonic::Status> {
            Err(tonic::Status::unavailable("the database did not answer"))
        }

        type WatchStream =
            tokio_stream::Empty<Result<tonic_health::pb::HealthCheckResponse, tonic::Status>>;

        async fn watch(
            &self,
            _: tonic::Request<HealthCheckRequest>,
        ) -> Result<tonic::Response<Self::WatchStream>, tonic::Status> {
            Err(tonic::Status::unavailable("the database did not answer"))
        }
    }

    async fn sick_replica() -> (SocketAddr, tokio::task::JoinHandle<()>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a loopback port");
        let address = listener.local_addr().expect("the listener's address");
        let server = crate::tasks::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(tonic_health::pb::health_server::HealthServer::new(Sick))
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
                .await;
        });
        (address, server)
    }

    #[tokio::test]
    async fn a_sick_replica_is_set_aside_and_its_idempotent_calls_answered_by_another() {
        let (a, _a_server) = replica(ServingStatus::Serving).await;
        let (sick, sick_server) = sick_replica().await;
        let (_, mut both) = client(&format!("http://{sick},http://{a}"));
        for call in 0..10 {
            assert_eq!(who(&mut both).await.ok(), Some(A), "call {call}");
        }
        // Alone, its answer is what the caller gets: unavailable, saying why.
        let (_, mut alone) = client(&format!("http://{sick}"));
        let status = who(&mut alone).await.expect_err("a sick replica's answer");
        assert_eq!(status.code(), tonic::Code::Unavailable);
        assert_eq!(status.message(), "the database did not answer");
        sick_server.abort();
    }

    #[tokio::test]
    async fn a_name_is_resolved_to_its_addresses() {
        let (a, _a_server) = replica(ServingStatus::Serving).await;
        let (replicas, mut client) = client(&format!("http://localhost:{}", a.port()));
        assert_eq!(who(&mut client).await.expect("an answer"), A);
        let known = replicas.known();
        assert!(
            known.iter().any(|name| name == &format!("localhost ({a})")),
            "{known:?}"
        );
        // Every address the name has is a replica (::1 as well, where the host has it); one
        // that refuses costs no failed call.
        for _ in 0..6 {
            assert_eq!(who(&mut client).await.expect("an answer"), A);
        }
    }

    fn parse_urls(urls: &str) -> Result<Vec<String>, TargetError> {
        Ok(targets(urls)?
            .iter()
            .map(|target| target.url(None))
            .collect())
    }

    #[test]
    fn lists_of_urls_are_checked() {
        assert_eq!(
            parse_urls("http://a:7001, http://b:7001,").expect("two URLs"),
            ["http://a:7001", "http://b:7001"]
        );
        assert_eq!(
            parse_urls("http://[::1]:7001").expect("an IPv6 URL"),
            ["http://[::1]:7001"]
        );
        for (urls, says) in [
            ("", "no URL given"),
            (" , ", "no URL given"),
            ("a:7001", "is not a service URL"),
            ("ftp://a:7001", "is not a service URL"),
            ("http://a:7001/path", "is not a service URL"),
            ("http://a:7001,https://b:7001", "mixes http:// and https://"),
        ] {
            let error = parse_urls(urls).expect_err("refused").to_string();
            assert!(error.contains(says), "{urls:?}: {error}");
        }
        let error = Replicas::new("https://a:7001", None, CallRules::default())
            .expect_err("refused")
            .to_string();
        assert!(error.contains("no CA is configured"), "{error}");
    }
}
