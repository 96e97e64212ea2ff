#![allow(clippy::disallowed_methods)] // This crate sits below plinth-kit and its tests spawn plain servers.
//! The proxy as a sandbox meets it. Traffic goes only to loopback and into namespaces made
//! here: refused destinations are documentation, private and metadata addresses that the
//! proxy must not dial, and the test connector ([`LoopbackOnly`]) records every address it is
//! asked for but opens a socket only to loopback, so no packet could leave even if the policy
//! were wrong. Names are answered by [`TableResolver`], never by DNS (except `localhost`).

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::proxy::BoxFuture;
use super::*;

/// Answers names from a table; a name with several answers gives the next one each time
/// (the last one for ever after), as a rebinding DNS server would.
#[derive(Default)]
struct TableResolver {
    answers: Mutex<HashMap<String, VecDeque<Vec<IpAddr>>>>,
    lookups: AtomicUsize,
}

impl TableResolver {
    fn answer(self, name: &str, answers: &[&[&str]]) -> TableResolver {
        let answers = answers
            .iter()
            .map(|ips| {
                ips.iter()
                    .map(|ip| ip.parse().expect("a literal"))
                    .collect()
            })
            .collect();
        self.answers
            .lock()
            .expect("not poisoned")
            .insert(name.to_owned(), answers);
        self
    }
}

impl Resolve for TableResolver {
    fn resolve<'a>(&'a self, name: &'a str) -> BoxFuture<'a, io::Result<Vec<IpAddr>>> {
        self.lookups.fetch_add(1, Ordering::SeqCst);
        let mut answers = self.answers.lock().expect("not poisoned");
        let answer = match answers.get_mut(name) {
            Some(queue) if queue.len() > 1 => queue.pop_front().ok_or(io::ErrorKind::NotFound),
            Some(queue) => queue.front().cloned().ok_or(io::ErrorKind::NotFound),
            None => Err(io::ErrorKind::NotFound),
        };
        Box::pin(std::future::ready(answer.map_err(io::Error::from)))
    }
}

/// Records every address the proxy asks for; dials only loopback.
#[derive(Default)]
struct LoopbackOnly {
    asked: Mutex<Vec<SocketAddr>>,
}

impl LoopbackOnly {
    fn asked(&self) -> Vec<SocketAddr> {
        self.asked.lock().expect("not poisoned").clone()
    }
}

impl Connect for LoopbackOnly {
    fn connect(&self, to: Permitted) -> BoxFuture<'_, io::Result<TcpStream>> {
        let addr = to.addr();
        self.asked.lock().expect("not poisoned").push(addr);
        Box::pin(async move {
            if !addr.ip().is_loopback() {
                return Err(io::Error::new(
                    io::ErrorKind::ConnectionRefused,
                    "the tests dial loopback only",
                ));
            }
            TcpStream::connect(addr).await
        })
    }
}

/// An HTTP server on the node's loopback that answers every request with its request line,
/// and counts the connections it accepted.
struct Origin {
    addr: SocketAddr,
    accepted: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

impl Origin {
    async fn start() -> Origin {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("bound");
        let accepted = Arc::new(AtomicUsize::new(0));
        let counter = accepted.clone();
        let task = tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                counter.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let head = read_head(&mut stream).await;
                    let line = head.lines().next().unwrap_or_default().to_owned();
                    let body = format!("origin saw: {line}\n{head}");
                    let response = format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = stream.write_all(response.as_bytes()).await;
                    let _ = stream.shutdown().await;
                });
            }
        });
        Origin {
            addr,
            accepted,
            task,
        }
    }

    fn port(&self) -> u16 {
        self.addr.port()
    }

    fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for Origin {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Reads up to the end of a request head (at most 16 KiB), as text.
async fn read_head(stream: &mut TcpStream) -> String {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") && head.len() < 16 * 1024 {
        match stream.read(&mut byte).await {
            Ok(1) => head.push(byte[0]),
            _ => break,
        }
    }
    String::from_utf8_lossy(&head).into_owned()
}

/// A proxy on the node's loopback (or on a listener given), with the test seams.
struct Running {
    addr: SocketAddr,
    resolver: Arc<TableResolver>,
    connector: Arc<LoopbackOnly>,
    shutdown: CancellationToken,
    served: Option<JoinHandle<()>>,
}

impl Running {
    async fn start(policy: EgressPolicy, resolver: TableResolver, limits: Limits) -> Running {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        Running::on(listener, policy, resolver, limits)
    }

    fn on(
        listener: TcpListener,
        policy: EgressPolicy,
        resolver: TableResolver,
        limits: Limits,
    ) -> Running {
        let addr = listener.local_addr().expect("bound");
        let resolver = Arc::new(resolver);
        let connector = Arc::new(LoopbackOnly::default());
        let shutdown = CancellationToken::new();
        let proxy = Proxy::new("session-test", Arc::new(policy), resolver.clone())
            .with_connector(connector.clone())
            .with_limits(limits);
        let served = tokio::spawn(proxy.serve(listener, shutdown.clone()));
        Running {
            addr,
            resolver,
            connector,
            shutdown,
            served: Some(served),
        }
    }

    fn lookups(&self) -> usize {
        self.resolver.lookups.load(Ordering::SeqCst)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

fn allowing(entries: &[String]) -> EgressPolicy {
    EgressPolicy::from_config(entries, &[]).expect("valid entries")
}

/// Sends `request` to the proxy and reads until it closes.
async fn exchange(proxy: SocketAddr, request: &str) -> String {
    let mut stream = TcpStream::connect(proxy)
        .await
        .expect("connect to the proxy");
    stream
        .write_all(request.as_bytes())
        .await
        .expect("send the request");
    read_to_close(&mut stream).await
}

async fn read_to_close(stream: &mut TcpStream) -> String {
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer))
        .await
        .expect("the proxy answers and closes")
        .expect("read the answer");
    String::from_utf8_lossy(&answer).into_owned()
}

fn status(answer: &str) -> &str {
    answer.split(' ').nth(1).unwrap_or_default()
}

#[tokio::test]
async fn a_tunnel_reaches_an_allowed_server_and_carries_bytes_both_ways() {
    let origin = Origin::start().await;
    let proxy = Running::start(
        allowing(&[format!("127.0.0.1:{}", origin.port())]),
        TableResolver::default(),
        Limits::default(),
    )
    .await;
    let mut stream = TcpStream::connect(proxy.addr).await.expect("connect");
    let request = format!(
        "CONNECT 127.0.0.1:{0} HTTP/1.1\r\nHost: 127.0.0.1:{0}\r\n\r\n",
        origin.port()
    );
    stream.write_all(request.as_bytes()).await.expect("send");
    let established = b"HTTP/1.1 200 Connection established\r\n\r\n";
    let mut answer = vec![0u8; established.len()];
    stream.read_exact(&mut answer).await.expect("read");
    assert_eq!(answer, established);
    stream
        .write_all(b"GET /through HTTP/1.1\r\nHost: origin\r\n\r\n")
        .await
        .expect("send through the tunnel");
    let answer = read_to_close(&mut stream).await;
    assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
    assert!(
        answer.contains("origin saw: GET /through HTTP/1.1"),
        "{answer}"
    );
    assert_eq!(proxy.connector.asked(), vec![origin.addr]);
}

#[tokio::test]
async fn an_absolute_form_request_reaches_an_allowed_server_in_origin_form() {
    let origin = Origin::start().await;
    let proxy = Running::start(
        allowing(&[format!("127.0.0.1:{}", origin.port())]),
        TableResolver::default(),
        Limits::default(),
    )
    .await;
    let answer = exchange(
        proxy.addr,
        &format!(
            "GET http://127.0.0.1:{}/path?x=1 HTTP/1.1\r\nHost: elsewhere\r\nProxy-Connection: keep-alive\r\nAccept: */*\r\n\r\n",
            origin.port()
        ),
    )
    .await;
    assert_eq!(status(&answer), "200", "{answer}");
    assert!(
        answer.contains("origin saw: GET /path?x=1 HTTP/1.1"),
        "{answer}"
    );
    assert!(
        answer.contains(&format!("Host: 127.0.0.1:{}\r\n", origin.port())),
        "{answer}"
    );
    assert!(answer.contains("Connection: close\r\n"), "{answer}");
    assert!(answer.contains("Accept: */*\r\n"), "{answer}");
    assert!(!answer.contains("Proxy-Connection"), "{answer}");
    assert_eq!(origin.accepted(), 1);
}

#[tokio::test]
async fn refused_destinations_are_answered_403_without_any_connection() {
    let origin = Origin::start().await;
    let port = origin.port();
    let resolver = TableResolver::default()
        .answer("metadata.google.internal", &[&["169.254.169.254"]])
        .answer("loopback.test", &[&["127.0.0.1", "::1"]])
        .answer("private.test", &[&["10.0.0.7", "fd00::7"]]);
    let proxy = Running::start(EgressPolicy::default(), resolver, Limits::default()).await;
    let cases = [
        (
            "CONNECT 10.1.2.3:443 HTTP/1.1\r\n\r\n".to_owned(),
            "10.1.2.3 is a private address",
        ),
        (
            "GET http://10.1.2.3/ HTTP/1.1\r\n\r\n".to_owned(),
            "10.1.2.3 is a private address",
        ),
        (
            "GET http://169.254.169.254/latest/meta-data/ HTTP/1.1\r\n\r\n".to_owned(),
            "169.254.169.254 is the cloud metadata address",
        ),
        (
            "GET http://metadata.google.internal/computeMetadata/v1/ HTTP/1.1\r\n\r\n".to_owned(),
            "metadata.google.internal resolves to an address the sandbox may not reach (the cloud metadata address)",
        ),
        (
            "GET http://100.100.100.200/latest/meta-data/ HTTP/1.1\r\n\r\n".to_owned(),
            "a shared (carrier-grade NAT) address",
        ),
        (
            "GET http://[fd00:ec2::254]/latest/meta-data/ HTTP/1.1\r\n\r\n".to_owned(),
            "fd00:ec2::254 is a unique local address",
        ),
        (
            format!("GET http://127.0.0.1:{port}/ HTTP/1.1\r\n\r\n"),
            "127.0.0.1 is a loopback address",
        ),
        (
            format!("GET http://[::1]:{port}/ HTTP/1.1\r\n\r\n"),
            "::1 is a loopback address",
        ),
        (
            format!("CONNECT 0.0.0.0:{port} HTTP/1.1\r\n\r\n"),
            "0.0.0.0 is the unspecified address",
        ),
        (
            format!("GET http://[::ffff:127.0.0.1]:{port}/ HTTP/1.1\r\n\r\n"),
            "::ffff:127.0.0.1 is the IPv4-mapped form of 127.0.0.1, a loopback address",
        ),
        (
            format!("CONNECT [64:ff9b::7f00:1]:{port} HTTP/1.1\r\n\r\n"),
            "the NAT64 form of 127.0.0.1",
        ),
        (
            format!("GET http://[2002:7f00:1::]:{port}/ HTTP/1.1\r\n\r\n"),
            "the 6to4 form of 127.0.0.1",
        ),
        (
            format!("CONNECT loopback.test:{port} HTTP/1.1\r\n\r\n"),
            "loopback.test resolves to an address the sandbox may not reach (a loopback address)",
        ),
        (
            "GET http://PRIVATE.test./ HTTP/1.1\r\n\r\n".to_owned(),
            "private.test resolves to an address the sandbox may not reach (a private address)",
        ),
    ];
    for (request, why) in cases {
        let answer = exchange(proxy.addr, &request).await;
        assert_eq!(status(&answer), "403", "{request:?}: {answer}");
        assert!(answer.contains(why), "{request:?}: {answer}");
        assert!(
            answer.contains("the sandbox may reach only the internet"),
            "{answer}"
        );
        // A refused name's internal resolution is not echoed.
        if request.contains(".test") || request.contains(".internal") {
            for resolved in ["127.0.0.1", "::1", "10.0.0.7", "fd00::7", "169.254.169.254"] {
                assert!(!answer.contains(resolved), "{answer}");
            }
        }
    }
    assert_eq!(
        proxy.connector.asked(),
        vec![],
        "nothing refused was dialled"
    );
    assert_eq!(origin.accepted(), 0);
}

#[tokio::test]
async fn a_name_is_resolved_once_and_only_the_address_checked_is_dialled() {
    // The first answer is the internet, every later one is loopback: a proxy that resolved
    // again to connect would reach the node.
    let origin = Origin::start().await;
    let port = origin.port();
    let resolver =
        TableResolver::default().answer("rebind.test", &[&["93.184.215.14"], &["127.0.0.1"]]);
    let proxy = Running::start(EgressPolicy::default(), resolver, Limits::default()).await;
    let answer = exchange(
        proxy.addr,
        &format!("GET http://rebind.test:{port}/ HTTP/1.1\r\n\r\n"),
    )
    .await;
    // The test connector refuses to dial off the machine: the proxy reports it as a failure to
    // connect to the address it checked.
    assert_eq!(status(&answer), "502", "{answer}");
    assert!(answer.contains("93.184.215.14"), "{answer}");
    assert_eq!(proxy.lookups(), 1);
    assert_eq!(
        proxy.connector.asked(),
        vec![SocketAddr::new(
            "93.184.215.14".parse().expect("literal"),
            port
        )]
    );
    assert_eq!(origin.accepted(), 0);
}

#[tokio::test]
async fn of_a_names_addresses_only_those_that_pass_are_dialled() {
    let resolver = TableResolver::default().answer(
        "mixed.test",
        &[&["127.0.0.1", "10.0.0.1", "169.254.169.254", "1.1.1.1"]],
    );
    let proxy = Running::start(EgressPolicy::default(), resolver, Limits::default()).await;
    let answer = exchange(proxy.addr, "CONNECT mixed.test:443 HTTP/1.1\r\n\r\n").await;
    assert_eq!(status(&answer), "502", "{answer}");
    assert_eq!(
        proxy.connector.asked(),
        vec!["1.1.1.1:443".parse::<SocketAddr>().expect("literal")]
    );
}

#[tokio::test]
async fn a_name_allowed_by_configuration_reaches_its_private_address() {
    let origin = Origin::start().await;
    let resolver = TableResolver::default().answer("mirror.test", &[&["127.0.0.1"]]);
    let policy = allowing(&[format!("mirror.test:{}", origin.port())]);
    let proxy = Running::start(policy, resolver, Limits::default()).await;
    let answer = exchange(
        proxy.addr,
        &format!(
            "GET http://mirror.test:{}/simple/ HTTP/1.1\r\n\r\n",
            origin.port()
        ),
    )
    .await;
    assert_eq!(status(&answer), "200", "{answer}");
    assert!(
        answer.contains("origin saw: GET /simple/ HTTP/1.1"),
        "{answer}"
    );
    // The same address asked for by number is not the allowed name.
    let answer = exchange(
        proxy.addr,
        &format!("GET http://127.0.0.1:{}/ HTTP/1.1\r\n\r\n", origin.port()),
    )
    .await;
    assert_eq!(status(&answer), "403", "{answer}");
    assert_eq!(origin.accepted(), 1);
}

#[tokio::test]
async fn a_destination_that_does_not_answer_is_a_502() {
    let closed = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = closed.local_addr().expect("bound").port();
    drop(closed);
    let proxy = Running::start(
        allowing(&[format!("127.0.0.1:{port}")]),
        TableResolver::default(),
        Limits::default(),
    )
    .await;
    let answer = exchange(
        proxy.addr,
        &format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n"),
    )
    .await;
    assert_eq!(status(&answer), "502", "{answer}");
    assert!(answer.contains("cannot connect to 127.0.0.1"), "{answer}");
    let answer = exchange(proxy.addr, "GET http://unknown.test/ HTTP/1.1\r\n\r\n").await;
    assert_eq!(status(&answer), "502", "{answer}");
    assert!(answer.contains("cannot resolve unknown.test"), "{answer}");
}

#[tokio::test]
async fn malformed_requests_are_answered_400() {
    let proxy = Running::start(
        EgressPolicy::default(),
        TableResolver::default(),
        Limits::default(),
    )
    .await;
    for request in [
        "GET / HTTP/1.1\r\nHost: 10.0.0.1\r\n\r\n",
        "GET https://example.org/ HTTP/1.1\r\n\r\n",
        "GET http://allowed@10.0.0.1/ HTTP/1.1\r\n\r\n",
        "CONNECT example.org HTTP/1.1\r\n\r\n",
        "\u{1}\u{2}\u{3}\r\n\r\n",
    ] {
        let answer = exchange(proxy.addr, request).await;
        assert_eq!(status(&answer), "400", "{request:?}: {answer}");
    }
    assert_eq!(proxy.connector.asked(), vec![]);
    assert_eq!(proxy.lookups(), 0);
}

#[tokio::test]
async fn a_head_larger_than_the_limit_is_answered_431() {
    let proxy = Running::start(
        EgressPolicy::default(),
        TableResolver::default(),
        Limits::default(),
    )
    .await;
    let request = format!(
        "GET http://1.1.1.1/ HTTP/1.1\r\nX-Filler: {}\r\n\r\n",
        "a".repeat(17 * 1024)
    );
    let answer = exchange(proxy.addr, &request).await;
    assert_eq!(status(&answer), "431", "{answer}");
    assert_eq!(proxy.connector.asked(), vec![]);
}

#[tokio::test]
async fn a_client_that_sends_no_head_in_time_is_answered_408() {
    let limits = Limits {
        head_timeout: Duration::from_millis(100),
        ..Limits::default()
    };
    let proxy = Running::start(EgressPolicy::default(), TableResolver::default(), limits).await;
    let answer = exchange(proxy.addr, "GET http://1.1.1.1/ HTTP/1.1\r\n").await;
    assert_eq!(status(&answer), "408", "{answer}");
}

#[tokio::test]
async fn connections_beyond_the_cap_wait_for_a_free_slot() {
    let limits = Limits {
        max_connections: 1,
        ..Limits::default()
    };
    let proxy = Running::start(EgressPolicy::default(), TableResolver::default(), limits).await;
    let holder = TcpStream::connect(proxy.addr).await.expect("connect");
    let mut waiting = TcpStream::connect(proxy.addr).await.expect("connect");
    waiting
        .write_all(b"CONNECT 10.0.0.1:443 HTTP/1.1\r\n\r\n")
        .await
        .expect("send");
    let mut answer = Vec::new();
    let early =
        tokio::time::timeout(Duration::from_millis(300), waiting.read_to_end(&mut answer)).await;
    assert!(early.is_err(), "answered while the only slot was held");
    drop(holder);
    let answer = read_to_close(&mut waiting).await;
    assert_eq!(status(&answer), "403", "{answer}");
}

#[tokio::test]
async fn shutting_down_closes_open_tunnels_and_ends_serving() {
    let origin = Origin::start().await;
    let mut proxy = Running::start(
        allowing(&[format!("127.0.0.1:{}", origin.port())]),
        TableResolver::default(),
        Limits::default(),
    )
    .await;
    let mut tunnel = TcpStream::connect(proxy.addr).await.expect("connect");
    tunnel
        .write_all(format!("CONNECT 127.0.0.1:{} HTTP/1.1\r\n\r\n", origin.port()).as_bytes())
        .await
        .expect("send");
    let mut established = [0u8; 12];
    tunnel.read_exact(&mut established).await.expect("read");
    assert_eq!(&established, b"HTTP/1.1 200");
    proxy.shutdown.cancel();
    let served = proxy.served.take().expect("serving");
    tokio::time::timeout(Duration::from_secs(10), served)
        .await
        .expect("serve returns")
        .expect("serve did not panic");
    let rest = read_to_close(&mut tunnel).await;
    assert_eq!(rest, " Connection established\r\n\r\n");
}

#[tokio::test]
async fn the_system_resolver_answers_localhost_and_the_proxy_refuses_it() {
    let ips = SystemResolver
        .resolve("localhost")
        .await
        .expect("localhost");
    assert!(
        !ips.is_empty() && ips.iter().all(|ip| ip.is_loopback()),
        "{ips:?}"
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("bound");
    let shutdown = CancellationToken::new();
    let served = tokio::spawn(serve(
        listener,
        Arc::new(EgressPolicy::default()),
        Arc::new(SystemResolver),
        "session-test",
        shutdown.clone(),
    ));
    let answer = exchange(addr, "GET http://localhost:9/ HTTP/1.1\r\n\r\n").await;
    assert_eq!(status(&answer), "403", "{answer}");
    // The refusal names the host and why, never the address it resolved to.
    assert!(answer.contains("localhost resolves to"), "{answer}");
    assert!(!answer.contains("127.0.0.1"), "{answer}");
    shutdown.cancel();
    served.await.expect("serve did not panic");
}

#[test]
fn the_proxy_environment_names_the_proxy_for_every_tool_and_keeps_loopback_direct() {
    let env: HashMap<String, String> = proxy_env(DEFAULT_PROXY_ADDR).into_iter().collect();
    for name in [
        "http_proxy",
        "https_proxy",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "npm_config_proxy",
        "npm_config_https_proxy",
    ] {
        assert_eq!(
            env.get(name).map(String::as_str),
            Some("http://127.0.0.1:3128"),
            "{name}"
        );
    }
    assert_eq!(
        env.get("NO_PROXY").map(String::as_str),
        Some("localhost,127.0.0.1,::1")
    );
    let v6: HashMap<String, String> = proxy_env("[::1]:3128".parse().expect("literal"))
        .into_iter()
        .collect();
    assert_eq!(
        v6.get("https_proxy").map(String::as_str),
        Some("http://[::1]:3128")
    );
}

#[test]
fn the_nodes_addresses_include_its_loopback() {
    let addresses = node_addresses().expect("getifaddrs");
    assert!(
        addresses.contains(&"127.0.0.1".parse::<IpAddr>().expect("literal")),
        "{addresses:?}"
    );
}

// In network namespaces made here.

/// A new network namespace, held by a descriptor; the thread that made it ends.
fn new_netns() -> Arc<OwnedFd> {
    Arc::new(new_namespace().expect("a new network namespace (the tests run as root)"))
}

/// A sandbox's network: its own namespace, with the proxy listening on its
/// `127.0.0.1:3128`, served from the node.
struct Sandbox {
    netns: Arc<OwnedFd>,
    proxy: Running,
}

impl Sandbox {
    fn start(policy: EgressPolicy, resolver: TableResolver) -> Sandbox {
        let netns = new_netns();
        let listener = listen_in(netns.as_fd(), DEFAULT_PROXY_ADDR).expect("listen in the sandbox");
        listener.set_nonblocking(true).expect("non-blocking");
        let listener = TcpListener::from_std(listener).expect("a tokio listener");
        let proxy = Running::on(listener, policy, resolver, Limits::default());
        Sandbox { netns, proxy }
    }

    /// Runs curl inside the sandbox's network namespace, with only `env` for environment;
    /// answers its exit code and output (the body, then the status on a line of its own).
    async fn curl(&self, env: &[(String, String)], args: &[&str]) -> (i32, String) {
        use std::os::unix::process::CommandExt;
        let mut command = std::process::Command::new("curl");
        command
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .envs(env.iter().cloned())
            .args(["-sS", "--max-time", "10", "-w", "\n%{http_code}"])
            .args(args);
        let netns = self.netns.clone();
        // SAFETY: between fork and exec the child only makes the setns system call, on a
        // descriptor the parent keeps open; nothing is allocated or locked.
        #[allow(unsafe_code)]
        unsafe {
            command.pre_exec(move || {
                rustix::thread::move_into_link_name_space(
                    netns.as_fd(),
                    Some(rustix::thread::LinkNameSpaceType::Network),
                )
                .map_err(io::Error::from)
            });
        }
        let output = tokio::task::spawn_blocking(move || command.output())
            .await
            .expect("curl's thread did not panic")
            .expect("curl runs");
        (
            output.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&output.stdout).into_owned(),
        )
    }
}

const PROXY: &str = "http://127.0.0.1:3128";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_in_a_sandbox_reaches_an_allowed_server_through_the_proxy() {
    let origin = Origin::start().await;
    let resolver = TableResolver::default().answer("origin.test", &[&["127.0.0.1"]]);
    let policy = allowing(&[
        format!("127.0.0.1:{}", origin.port()),
        format!("origin.test:{}", origin.port()),
    ]);
    let sandbox = Sandbox::start(policy, resolver);

    let url = format!("http://127.0.0.1:{}/plain", origin.port());
    let (code, out) = sandbox.curl(&[], &["-x", PROXY, &url]).await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("origin saw: GET /plain HTTP/1.1"), "{out}");
    assert!(out.ends_with("\n200"), "{out}");

    let url = format!("http://127.0.0.1:{}/tunnel", origin.port());
    let (code, out) = sandbox
        .curl(&[], &["-x", PROXY, "--proxytunnel", &url])
        .await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("origin saw: GET /tunnel HTTP/1.1"), "{out}");

    // As a sandboxed command runs: no flags, only the environment.
    let url = format!("http://origin.test:{}/from-env", origin.port());
    let (code, out) = sandbox.curl(&proxy_env(DEFAULT_PROXY_ADDR), &[&url]).await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("origin saw: GET /from-env HTTP/1.1"), "{out}");
    assert_eq!(origin.accepted(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_in_a_sandbox_is_refused_the_nodes_loopback_without_an_allowance() {
    let origin = Origin::start().await;
    let sandbox = Sandbox::start(EgressPolicy::default(), TableResolver::default());
    let url = format!("http://127.0.0.1:{}/", origin.port());
    let (code, out) = sandbox.curl(&[], &["-x", PROXY, &url]).await;
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("plinth egress: 127.0.0.1 is a loopback address"),
        "{out}"
    );
    assert!(out.ends_with("\n403"), "{out}");
    let (code, out) = sandbox
        .curl(
            &[],
            &["-x", PROXY, "--proxytunnel", "-w", "%{http_connect}", &url],
        )
        .await;
    assert_eq!(code, 56, "curl reports the refused tunnel: {out}");
    assert!(out.ends_with("403"), "{out}");
    assert_eq!(origin.accepted(), 0);
    assert_eq!(sandbox.proxy.connector.asked(), vec![]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_in_a_sandbox_cannot_reach_private_metadata_or_disguised_loopback_addresses() {
    let origin = Origin::start().await;
    let port = origin.port();
    let resolver = TableResolver::default().answer("sneaky.test", &[&["127.0.0.1"]]);
    let sandbox = Sandbox::start(EgressPolicy::default(), resolver);
    for url in [
        "http://10.1.2.3/".to_owned(),
        "http://169.254.169.254/latest/meta-data".to_owned(),
        format!("http://[::ffff:127.0.0.1]:{port}/"),
        format!("http://sneaky.test:{port}/"),
    ] {
        let (code, out) = sandbox.curl(&[], &["-x", PROXY, &url]).await;
        assert_eq!(code, 0, "{url}: {out}");
        assert!(out.ends_with("\n403"), "{url}: {out}");
        assert!(out.starts_with("plinth egress: "), "{url}: {out}");
    }
    assert_eq!(sandbox.proxy.connector.asked(), vec![]);
    assert_eq!(origin.accepted(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inside_a_sandbox_the_nodes_loopback_is_not_there() {
    let origin = Origin::start().await;
    let sandbox = Sandbox::start(EgressPolicy::default(), TableResolver::default());
    let url = format!("http://127.0.0.1:{}/", origin.port());
    let (code, out) = sandbox.curl(&[], &["--noproxy", "*", &url]).await;
    assert_eq!(code, 7, "curl could not connect: {out}");
    assert_eq!(origin.accepted(), 0);
    // The proxy is the one thing there.
    let (code, out) = sandbox.curl(&[], &["--noproxy", "*", PROXY]).await;
    assert_eq!(code, 0, "{out}");
    assert!(out.ends_with("\n400"), "{out}");
}

#[test]
fn a_new_namespace_is_not_the_callers() {
    let ours = rustix::fs::stat("/proc/thread-self/ns/net").expect("our namespace");
    let netns = new_namespace().expect("a new network namespace (the tests run as root)");
    let made = rustix::fs::fstat(&netns).expect("its namespace");
    assert_ne!(made.st_ino, ours.st_ino);
    // The caller stays where it was.
    let after = rustix::fs::stat("/proc/thread-self/ns/net").expect("our namespace");
    assert_eq!(after.st_ino, ours.st_ino);
    // Its loopback is not ours: the port we listen on is free there.
    let host = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let taken = host.local_addr().expect("bound");
    let inside = listen_in(netns.as_fd(), taken).expect("the same address, in the namespace");
    assert_eq!(inside.local_addr().expect("bound"), taken);
}

#[test]
fn a_new_namespace_has_no_loopback_until_it_is_brought_up() {
    std::thread::spawn(|| {
        // SAFETY: only this thread, which ends right after, moves to the new namespace.
        #[allow(unsafe_code)]
        unsafe {
            rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::NEWNET)
                .expect("unshare (the tests run as root)");
        }
        // The address is there (binding works) but nothing reaches it while lo is down.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("bound");
        assert!(
            std::net::TcpStream::connect(addr).is_err(),
            "loopback answered while down"
        );
        loopback_up().expect("bring lo up");
        loopback_up().expect("bringing lo up twice is harmless");
        std::net::TcpStream::connect(addr).expect("loopback answers");
    })
    .join()
    .expect("the namespace thread's assertions hold");
}
