//! The filtering HTTP proxy a sandbox's listening socket is served by.
//!
//! One connection carries one request. The proxy reads the request head (at most
//! [`Limits::max_head_bytes`], within [`Limits::head_timeout`]), works out the destination,
//! resolves a name once, checks every address with the [`EgressPolicy`] and connects only to
//! an address that passed: the [`Permitted`] value the check made is what the [`Connect`]
//! seam receives, so there is no second resolution for DNS to answer differently, and no
//! socket is opened for a refused address. Then:
//!
//! - `CONNECT host:port HTTP/1.1` answers `200 Connection established` and copies bytes both
//!   ways (HTTPS, `git` over HTTPS, anything tunnelled);
//! - `GET http://host:port/path HTTP/1.1` (any method, absolute form) sends the head on in
//!   origin form with `Connection: close` and without the hop-by-hop and proxy headers, then
//!   copies bytes both ways until either side closes. Keep-alive is not offered: the client
//!   sees the origin close after one response and opens a new connection for the next request,
//!   so every request is checked. Whatever else the client sends on that connection reaches
//!   the origin already checked, never another destination.
//!
//! Answers of its own: `400` for a malformed or unsupported request (`https://` in absolute
//! form: clients use `CONNECT` for that), `403` naming the refused address, `408` for a head
//! not complete in time, `431` for a head too large, `502` when resolving or connecting
//! fails or takes longer than its limit. Each is plain text and closes the connection.
//!
//! There is no UDP and no DNS for the sandbox: names are resolved here, by the node.

use std::fmt;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::policy::{EgressPolicy, Host, Permitted, Refusal};

/// A boxed future, as the seams return.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Resolves host names for the proxy. The node's is [`SystemResolver`]; tests answer from a
/// table.
pub trait Resolve: Send + Sync {
    /// The addresses of `name` (lower case, no trailing dot).
    fn resolve<'a>(&'a self, name: &'a str) -> BoxFuture<'a, io::Result<Vec<IpAddr>>>;
}

/// The node's resolver (`getaddrinfo`, on tokio's blocking pool).
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemResolver;

impl Resolve for SystemResolver {
    fn resolve<'a>(&'a self, name: &'a str) -> BoxFuture<'a, io::Result<Vec<IpAddr>>> {
        Box::pin(async move {
            let addrs = tokio::net::lookup_host((name, 0)).await?;
            Ok(addrs.map(|addr| addr.ip()).collect())
        })
    }
}

/// Opens the proxy's side of a connection. Takes a [`Permitted`], which only the policy
/// makes: an address that was not checked cannot be connected to.
pub trait Connect: Send + Sync {
    /// A TCP connection to the permitted address.
    fn connect(&self, to: Permitted) -> BoxFuture<'_, io::Result<TcpStream>>;
}

/// Plain TCP from the node.
#[derive(Debug, Clone, Copy, Default)]
pub struct TcpConnect;

impl Connect for TcpConnect {
    fn connect(&self, to: Permitted) -> BoxFuture<'_, io::Result<TcpStream>> {
        Box::pin(TcpStream::connect(to.addr()))
    }
}

/// What one sandbox's proxy may use.
#[derive(Debug, Clone)]
pub struct Limits {
    /// The largest request head read (request line and headers).
    pub max_head_bytes: usize,
    /// How long a client has to send its whole head.
    pub head_timeout: Duration,
    /// How long resolving a name may take.
    pub resolve_timeout: Duration,
    /// How long each connection attempt may take.
    pub connect_timeout: Duration,
    /// How many addresses of one name are tried.
    pub max_addresses: usize,
    /// How many connections the listener serves at once; more wait in the kernel's backlog.
    pub max_connections: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_head_bytes: 16 * 1024,
            head_timeout: Duration::from_secs(10),
            resolve_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(10),
            max_addresses: 8,
            max_connections: 64,
        }
    }
}

/// One sandbox's proxy: its policy, how it resolves and connects, its limits, and the
/// sandbox's id for the log.
pub struct Proxy {
    sandbox: String,
    policy: Arc<EgressPolicy>,
    resolver: Arc<dyn Resolve>,
    connector: Arc<dyn Connect>,
    limits: Limits,
}

impl fmt::Debug for Proxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Proxy")
            .field("sandbox", &self.sandbox)
            .field("policy", &self.policy)
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

impl Proxy {
    /// A proxy for the sandbox labelled `sandbox` (a session's or build's id), connecting with
    /// [`TcpConnect`] within the default [`Limits`].
    pub fn new(
        sandbox: impl Into<String>,
        policy: Arc<EgressPolicy>,
        resolver: Arc<dyn Resolve>,
    ) -> Proxy {
        Proxy {
            sandbox: sandbox.into(),
            policy,
            resolver,
            connector: Arc::new(TcpConnect),
            limits: Limits::default(),
        }
    }

    /// Connects through `connector` instead.
    pub fn with_connector(mut self, connector: Arc<dyn Connect>) -> Proxy {
        self.connector = connector;
        self
    }

    /// Uses `limits` instead of the defaults.
    pub fn with_limits(mut self, limits: Limits) -> Proxy {
        self.limits = limits;
        self
    }

    /// Serves `listener` until `shutdown` is cancelled; then closes every connection it holds
    /// and returns.
    pub async fn serve(self, listener: TcpListener, shutdown: CancellationToken) {
        let span = tracing::info_span!("egress", sandbox = %self.sandbox);
        let proxy = Arc::new(self);
        let slots = Arc::new(Semaphore::new(proxy.limits.max_connections.max(1)));
        let mut connections = JoinSet::new();
        async {
            loop {
                while let Some(done) = connections.try_join_next() {
                    report(done);
                }
                let slot = tokio::select! {
                    () = shutdown.cancelled() => break,
                    slot = slots.clone().acquire_owned() => slot,
                };
                // The semaphore is never closed.
                let Ok(slot) = slot else { break };
                let accepted = tokio::select! {
                    () = shutdown.cancelled() => break,
                    accepted = listener.accept() => accepted,
                };
                let client = match accepted {
                    Ok((client, _)) => client,
                    Err(error) => {
                        // Out of descriptors or memory, or a connection reset before it was
                        // accepted: wait a little rather than spin.
                        tracing::warn!(%error, "egress proxy cannot accept a connection");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let proxy = proxy.clone();
                let shutdown = shutdown.clone();
                connections.spawn(
                    async move {
                        let _slot = slot;
                        tokio::select! {
                            () = shutdown.cancelled() => {}
                            () = proxy.handle(client) => {}
                        }
                    }
                    .in_current_span(),
                );
            }
            while let Some(done) = connections.join_next().await {
                report(done);
            }
        }
        .instrument(span)
        .await;
    }

    async fn handle(&self, mut client: TcpStream) {
        let limits = &self.limits;
        let outcome = match tokio::time::timeout(
            limits.head_timeout,
            read_request(&mut client, limits.max_head_bytes),
        )
        .await
        {
            Err(_) => Err(Failure::HeadTimeout(limits.head_timeout)),
            Ok(Err(failure)) => Err(failure),
            Ok(Ok(request)) => self.relay(&mut client, request).await,
        };
        let Err(failure) = outcome else { return };
        match &failure {
            Failure::Refused { target, refusal } => {
                tracing::info!(destination = %target, %refusal, "egress refused");
            }
            Failure::Closed | Failure::Client(_) => {}
            failure => tracing::debug!(%failure, "egress request failed"),
        }
        if let Some((status, reason)) = failure.status() {
            answer(&mut client, status, reason, &failure).await;
        }
    }

    async fn relay(&self, client: &mut TcpStream, request: Request) -> Result<(), Failure> {
        let mut upstream = self.open(&request.target).await?;
        tracing::debug!(destination = %request.target, "egress connected");
        // Everything for the destination goes first, so that a failure to send it is still
        // answered with a status rather than inside an established tunnel.
        if let Some(head) = &request.forward {
            upstream.write_all(head).await.map_err(Failure::Upstream)?;
        }
        if !request.rest.is_empty() {
            upstream
                .write_all(&request.rest)
                .await
                .map_err(Failure::Upstream)?;
        }
        if request.forward.is_none() {
            client
                .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                .await
                .map_err(Failure::Client)?;
        }
        // Either side resetting ends the relay; nothing is left to answer.
        let _ = tokio::io::copy_bidirectional(client, &mut upstream).await;
        Ok(())
    }

    /// Resolves once, checks every address, connects to the first that passes and answers.
    async fn open(&self, target: &Target) -> Result<TcpStream, Failure> {
        let limits = &self.limits;
        let ips = match &target.host {
            Host::Ip(ip) => vec![*ip],
            Host::Name(name) => {
                match tokio::time::timeout(limits.resolve_timeout, self.resolver.resolve(name))
                    .await
                {
                    Err(_) => {
                        return Err(Failure::Resolve {
                            target: target.clone(),
                            error: io::Error::new(io::ErrorKind::TimedOut, "timed out"),
                        });
                    }
                    Ok(Err(error)) => {
                        return Err(Failure::Resolve {
                            target: target.clone(),
                            error,
                        });
                    }
                    Ok(Ok(ips)) => ips,
                }
            }
        };
        let mut refused = None;
        let mut failed = None;
        for ip in ips.into_iter().take(limits.max_addresses) {
            let addr = SocketAddr::new(ip, target.port);
            let permitted = match self.policy.permit(&target.host, addr) {
                Ok(permitted) => permitted,
                Err(refusal) => {
                    refused.get_or_insert(refusal);
                    continue;
                }
            };
            match tokio::time::timeout(limits.connect_timeout, self.connector.connect(permitted))
                .await
            {
                Ok(Ok(stream)) => return Ok(stream),
                Ok(Err(error)) => failed = Some((addr, error)),
                Err(_) => {
                    failed = Some((addr, io::Error::new(io::ErrorKind::TimedOut, "timed out")));
                }
            }
        }
        Err(match (failed, refused) {
            (Some((addr, error)), _) => Failure::Connect {
                target: target.clone(),
                addr,
                error,
            },
            (None, Some(refusal)) => Failure::Refused {
                target: target.clone(),
                refusal,
            },
            (None, None) => Failure::NoAddress(target.clone()),
        })
    }
}

/// Serves one sandbox's `listener` with `policy` until `shutdown` is cancelled, with the
/// default [`Limits`] and plain TCP; `sandbox` labels its log lines.
pub async fn serve(
    listener: TcpListener,
    policy: Arc<EgressPolicy>,
    resolver: Arc<dyn Resolve>,
    sandbox: &str,
    shutdown: CancellationToken,
) {
    Proxy::new(sandbox, policy, resolver)
        .serve(listener, shutdown)
        .await;
}

fn report(done: Result<(), tokio::task::JoinError>) {
    if let Err(error) = done
        && error.is_panic()
    {
        tracing::error!(%error, "an egress proxy connection panicked");
    }
}

/// Where a request goes: the host as the client named it and the port.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Target {
    host: Host,
    port: u16,
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.host, self.port)
    }
}

/// A request the proxy will carry.
#[derive(Debug)]
struct Request {
    target: Target,
    /// The head to send on, for absolute form; `None` for a tunnel.
    forward: Option<Vec<u8>>,
    /// What the client sent after its head.
    rest: Vec<u8>,
}

/// Why a request was not carried, and what the client is told.
#[derive(Debug, thiserror::Error)]
enum Failure {
    #[error("{0}")]
    Malformed(String),
    #[error("the request head is larger than {0} bytes")]
    HeadTooLarge(usize),
    #[error("no complete request head within {0:?}")]
    HeadTimeout(Duration),
    #[error("{}", refused_text(.target, .refusal))]
    Refused { target: Target, refusal: Refusal },
    #[error("cannot resolve {target}: {error}")]
    Resolve { target: Target, error: io::Error },
    #[error("{0} has no address")]
    NoAddress(Target),
    #[error("cannot connect to {target} ({addr}): {error}")]
    Connect {
        target: Target,
        addr: SocketAddr,
        error: io::Error,
    },
    #[error("sending to the destination: {0}")]
    Upstream(io::Error),
    #[error("the client closed the connection")]
    Closed,
    #[error("talking to the client: {0}")]
    Client(io::Error),
}

fn refused_text(target: &Target, refusal: &Refusal) -> String {
    match &target.host {
        Host::Ip(_) => format!("{refusal}; the sandbox may reach only the internet"),
        // Which address the name resolved to is not said: the node's resolver may know
        // internal names, and the sandbox has no business learning where they lead.
        Host::Name(name) => format!(
            "{name} resolves to an address the sandbox may not reach ({}); the sandbox may reach \
             only the internet",
            refusal.reason
        ),
    }
}

impl Failure {
    /// The status the client is answered with; `None` when it is gone.
    fn status(&self) -> Option<(u16, &'static str)> {
        Some(match self {
            Failure::Malformed(_) => (400, "Bad Request"),
            Failure::HeadTooLarge(_) => (431, "Request Header Fields Too Large"),
            Failure::HeadTimeout(_) => (408, "Request Timeout"),
            Failure::Refused { .. } => (403, "Forbidden"),
            Failure::Resolve { .. }
            | Failure::NoAddress(_)
            | Failure::Connect { .. }
            | Failure::Upstream(_) => (502, "Bad Gateway"),
            Failure::Closed | Failure::Client(_) => return None,
        })
    }
}

/// Answers with `status` and a one-line plain-text body, then closes. What the client still
/// sends is read (briefly, boundedly) so that closing does not reset the connection before
/// the client has read the answer.
async fn answer(client: &mut TcpStream, status: u16, reason: &str, failure: &Failure) {
    let body = format!("plinth egress: {failure}\n");
    let head = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    if client.write_all(head.as_bytes()).await.is_err()
        || client.write_all(body.as_bytes()).await.is_err()
        || client.shutdown().await.is_err()
    {
        return;
    }
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        let mut sink = [0u8; 4096];
        let mut drained = 0;
        while drained < 64 * 1024 {
            match client.read(&mut sink).await {
                Ok(0) | Err(_) => break,
                Ok(n) => drained += n,
            }
        }
    })
    .await;
}

/// Reads the request head and makes it a [`Request`].
async fn read_request(client: &mut TcpStream, max_head_bytes: usize) -> Result<Request, Failure> {
    let mut buffer = vec![0u8; max_head_bytes];
    let mut filled = 0;
    loop {
        if filled == buffer.len() {
            return Err(Failure::HeadTooLarge(max_head_bytes));
        }
        let read = client
            .read(&mut buffer[filled..])
            .await
            .map_err(Failure::Client)?;
        if read == 0 {
            return Err(Failure::Closed);
        }
        filled += read;
        if let Some(request) = parse(&buffer[..filled])? {
            return Ok(request);
        }
    }
}

/// Headers that belong to one hop (RFC 9110 §7.6.1) or to the proxy, dropped when sending
/// on. `Transfer-Encoding` stays: the body is relayed as it came.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "proxy-connection",
    "keep-alive",
    "proxy-authorization",
    "proxy-authenticate",
    "te",
    "trailer",
    "upgrade",
    "host",
];

/// The request in `bytes`, or `None` while its head is incomplete.
fn parse(bytes: &[u8]) -> Result<Option<Request>, Failure> {
    let malformed = |what: &str| Failure::Malformed(what.to_owned());
    let mut headers = [httparse::EMPTY_HEADER; 96];
    let mut request = httparse::Request::new(&mut headers);
    let head_len = match request.parse(bytes) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => {
            return Err(malformed("the request has too many header fields"));
        }
        Err(error) => {
            return Err(Failure::Malformed(format!(
                "the request is not HTTP/1.x: {error}"
            )));
        }
    };
    let (Some(method), Some(uri), Some(version)) = (request.method, request.path, request.version)
    else {
        return Err(malformed("the request line is incomplete"));
    };
    let rest = bytes[head_len..].to_vec();

    if method.eq_ignore_ascii_case("CONNECT") {
        let target = authority(uri, None)
            .ok_or_else(|| malformed("CONNECT needs host:port (a name, an IPv4 address or a bracketed IPv6 address, and a port)"))?;
        return Ok(Some(Request {
            target,
            forward: None,
            rest,
        }));
    }

    let scheme_end = uri.find("://");
    let scheme = scheme_end.map(|end| &uri[..end]);
    let Some(after_scheme) = scheme_end.map(|end| &uri[end + 3..]) else {
        return Err(malformed(
            "a proxy request names its destination: GET http://host/path (or CONNECT host:port)",
        ));
    };
    if !scheme.is_some_and(|scheme| scheme.eq_ignore_ascii_case("http")) {
        return Err(malformed(
            "only http:// is forwarded; for https:// clients use CONNECT",
        ));
    }
    let path_start = after_scheme
        .find(['/', '?', '#'])
        .unwrap_or(after_scheme.len());
    let (authority_text, path) = after_scheme.split_at(path_start);
    let target = authority(authority_text, Some(80))
        .ok_or_else(|| malformed("the URL's host is not a name, an IPv4 address or a bracketed IPv6 address with an optional port"))?;
    let path = path.split('#').next().unwrap_or_default();
    let path = match path {
        "" => "/".to_owned(),
        path if path.starts_with('?') => format!("/{path}"),
        path => path.to_owned(),
    };

    // Fields the client named in `Connection` are for this hop too.
    let named: Vec<String> = request
        .headers
        .iter()
        .filter(|header| header.name.eq_ignore_ascii_case("connection"))
        .filter_map(|header| std::str::from_utf8(header.value).ok())
        .flat_map(|value| value.split(','))
        .map(|name| name.trim().to_ascii_lowercase())
        .filter(|name| !matches!(name.as_str(), "transfer-encoding" | "content-length"))
        .collect();
    let mut head = Vec::with_capacity(head_len + 64);
    head.extend_from_slice(format!("{method} {path} HTTP/1.{version}\r\n").as_bytes());
    head.extend_from_slice(format!("Host: {authority_text}\r\n").as_bytes());
    for header in request.headers.iter() {
        let name = header.name.to_ascii_lowercase();
        if HOP_BY_HOP.contains(&name.as_str()) || named.contains(&name) {
            continue;
        }
        head.extend_from_slice(header.name.as_bytes());
        head.extend_from_slice(b": ");
        head.extend_from_slice(header.value);
        head.extend_from_slice(b"\r\n");
    }
    head.extend_from_slice(b"Connection: close\r\n\r\n");
    Ok(Some(Request {
        target,
        forward: Some(head),
        rest,
    }))
}

/// `host:port` (the port optional when `default_port` is given). No user information: `@` is
/// not a host character, so `http://allowed@10.0.0.1/` is malformed, never ambiguous.
fn authority(text: &str, default_port: Option<u16>) -> Option<Target> {
    let (host, port) = match text.rfind(':') {
        // A colon inside brackets belongs to an IPv6 address.
        Some(colon) if !text[colon..].contains(']') => (&text[..colon], Some(&text[colon + 1..])),
        _ => (text, None),
    };
    let port = match port {
        Some(port) => port.parse::<u16>().ok().filter(|&port| port != 0)?,
        None => default_port?,
    };
    Some(Target {
        host: Host::parse(host)?,
        port,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(text: &str) -> Result<Option<Request>, Failure> {
        parse(text.as_bytes())
    }

    #[test]
    fn connect_names_a_host_and_a_port() {
        let request = request("CONNECT [::1]:443 HTTP/1.1\r\nHost: x\r\n\r\nhello")
            .expect("well formed")
            .expect("complete");
        assert_eq!(
            request.target,
            Target {
                host: Host::Ip("::1".parse().expect("literal")),
                port: 443
            }
        );
        assert!(request.forward.is_none());
        assert_eq!(request.rest, b"hello");
    }

    #[test]
    fn an_absolute_form_request_is_sent_on_in_origin_form_without_hop_headers() {
        let request = request(
            "POST http://Example.org:8080?q=1#frag HTTP/1.1\r\nHost: evil.example\r\nProxy-Connection: keep-alive\r\nConnection: keep-alive, X-Secret\r\nX-Secret: 1\r\nProxy-Authorization: Basic eA==\r\nContent-Length: 4\r\nUser-Agent: t\r\n\r\nbody",
        )
        .expect("well formed")
        .expect("complete");
        assert_eq!(request.target.to_string(), "example.org:8080");
        let head = String::from_utf8(request.forward.expect("forwarded")).expect("text");
        assert_eq!(
            head,
            "POST /?q=1 HTTP/1.1\r\nHost: Example.org:8080\r\nContent-Length: 4\r\nUser-Agent: t\r\nConnection: close\r\n\r\n"
        );
        assert_eq!(request.rest, b"body");
    }

    #[test]
    fn an_incomplete_head_asks_for_more() {
        assert!(matches!(
            request("GET http://a/ HTTP/1.1\r\nHost: a\r\n"),
            Ok(None)
        ));
    }

    #[test]
    fn requests_the_proxy_cannot_carry_are_malformed() {
        for text in [
            "GET / HTTP/1.1\r\nHost: a\r\n\r\n",
            "GET https://a/ HTTP/1.1\r\n\r\n",
            "GET ftp://a/ HTTP/1.1\r\n\r\n",
            "GET http://user@10.0.0.1/ HTTP/1.1\r\n\r\n",
            "GET http://a:0/ HTTP/1.1\r\n\r\n",
            "GET http://a:99999/ HTTP/1.1\r\n\r\n",
            "GET http:///x HTTP/1.1\r\n\r\n",
            "GET http://[::1/ HTTP/1.1\r\n\r\n",
            "CONNECT a HTTP/1.1\r\n\r\n",
            "CONNECT ::1:443 HTTP/1.1\r\n\r\n",
            "CONNECT a b:443 HTTP/1.1\r\n\r\n",
            "HELLO\r\n\r\n",
            "GET http://a/ HTTP/2.0\r\n\r\n",
        ] {
            assert!(
                matches!(request(text), Err(Failure::Malformed(_))),
                "{text:?} was accepted"
            );
        }
    }

    #[test]
    fn a_url_without_a_port_goes_to_port_80() {
        let request = request("GET http://[2001:db8::1]/x HTTP/1.0\r\n\r\n")
            .expect("well formed")
            .expect("complete");
        assert_eq!(request.target.to_string(), "[2001:db8::1]:80");
        let head = String::from_utf8(request.forward.expect("forwarded")).expect("text");
        assert!(head.starts_with("GET /x HTTP/1.0\r\nHost: [2001:db8::1]\r\n"));
    }
}
