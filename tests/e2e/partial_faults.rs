//! The partial faults of a split deployment, each under the scale-out test's workload through
//! both gateways (two of every service as real processes, see `scale_out.rs`):
//!
//! - one catalog's database blackholed for 20 s (a forwarder between that catalog and
//!   PostgreSQL holds every connection and forwards nothing, as a network that drops packets
//!   does): only requests sent in its first seconds may fail, no node's heartbeat goes late,
//!   and no build loses its lease;
//! - the S3-protocol store stopped for 20 s (every service's forwarder to it closes every
//!   connection): no request answers 500, the gateways and nodes stay ready, and builds in
//!   progress are ready once it is back;
//! - the gateways cut off from one node for 20 s (both reach it through a forwarder, advertised
//!   as its address, that holds every connection and forwards nothing; its heartbeats still
//!   reach the catalogs): no request waits longer than its deadline, no session is placed on
//!   that node once a call to it has timed out, and its mark is lifted once it answers.
//!
//! Every acknowledged write reads back afterwards, as in `scale_out.rs`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::scale_out::{Workload, fleet_stores, now_ms, psql, start_fleet};

/// How long each fault lasts.
const FAULT: Duration = Duration::from_secs(20);
/// The deadline of quick calls between services in this deployment
/// (`internal.call_timeout_ms`).
const CALL_TIMEOUT: Duration = Duration::from_secs(2);
/// From the start of the database fault, how long requests may still fail: a request sent
/// before the sick catalog knows it is sick (its readiness check is bounded at 1 s and runs
/// twice a second) may wait on it until its deadline. A second more for a loaded machine.
const NOTICED_WITHIN: Duration = Duration::from_secs(3);
/// `catalog.node_ttl_ms`, the default.
const NODE_TTL_MS: i64 = 3000;
/// The gateways' deadlines on calls to nodes in the partition test
/// (`gateway.node_call_timeout_ms`, `gateway.node_attach_timeout_ms`).
const NODE_CALL_TIMEOUT: Duration = Duration::from_millis(1500);
const NODE_ATTACH_TIMEOUT: Duration = Duration::from_secs(8);
/// The longest one request may wait while a node is cut off: a create whose attach on it
/// passed its deadline, placed once more on the other node, and seconds for a loaded machine.
/// A request that waits on the node with no deadline waits until the client gives up (15 s).
const LONGEST_WAIT: Duration = Duration::from_millis(12_500);

/// What a forwarder does with connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Forwards both ways.
    Up,
    /// Holds every connection, old and new, and forwards nothing: packets dropped.
    Blackholed,
    /// Closes every connection, old and new: the server is gone.
    Down,
}

/// A loopback TCP forwarder to `upstream` whose [`Mode`] the test sets.
struct Forwarder {
    addr: SocketAddr,
    mode: Arc<watch::Sender<Mode>>,
    accepting: tokio::task::JoinHandle<()>,
}

impl Forwarder {
    async fn start(upstream: SocketAddr) -> Forwarder {
        Self::start_to(Arc::new(std::sync::OnceLock::from(upstream))).await
    }

    /// A forwarder to whatever `upstream` is set to (a node that listens on port 0, and
    /// advertises this forwarder's address, sets it once it listens); until then it closes
    /// every connection.
    async fn start_to(upstream: Arc<std::sync::OnceLock<SocketAddr>>) -> Forwarder {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("address");
        let mode = Arc::new(watch::channel(Mode::Up).0);
        let accepting = {
            let mode = mode.clone();
            plinth_kit::tasks::spawn(async move {
                while let Ok((client, _)) = listener.accept().await {
                    if let Some(upstream) = upstream.get().copied() {
                        plinth_kit::tasks::spawn(forward(client, upstream, mode.subscribe()));
                    }
                }
            })
        };
        Forwarder {
            addr,
            mode,
            accepting,
        }
    }

    fn set(&self, mode: Mode) {
        self.mode.send_replace(mode);
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

async fn forward(mut client: TcpStream, upstream: SocketAddr, mut mode: watch::Receiver<Mode>) {
    let now = *mode.borrow_and_update();
    match now {
        Mode::Down => return,
        Mode::Blackholed => {
            // Held silent until the fault ends; then closed, and the client connects again.
            let _ = mode.wait_for(|mode| *mode != Mode::Blackholed).await;
            return;
        }
        Mode::Up => {}
    }
    let Ok(mut server) = TcpStream::connect(upstream).await else {
        return;
    };
    let blackholed = tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => false,
        changed = mode.wait_for(|mode| *mode != Mode::Up) => {
            changed.is_ok_and(|mode| *mode == Mode::Blackholed)
        }
    };
    if blackholed {
        // Both ends held silent until the fault ends; then closed.
        let _ = mode.wait_for(|mode| *mode != Mode::Blackholed).await;
    }
}

/// `host:port` of a URL's authority (after any `user:password@`).
fn authority(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = rest.split(['/', '?']).next().unwrap_or(rest);
    authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host)
        .to_owned()
}

fn socket(authority: &str) -> SocketAddr {
    use std::net::ToSocketAddrs as _;
    authority
        .to_socket_addrs()
        .expect("the address resolves")
        .next()
        .expect("an address")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blackholed_catalog_database_and_a_stopped_blob_store_cost_only_calls_in_flight() {
    let Some((database_url, blob_url)) = fleet_stores().await else {
        return;
    };
    let postgres = authority(&database_url);
    let database = Forwarder::start(socket(&postgres)).await;
    let catalog_one_database = database_url.replacen(&postgres, &database.addr.to_string(), 1);
    let endpoint = std::env::var("PLINTH_TEST_S3_ENDPOINT").expect("the S3 test server");
    let store = Forwarder::start(socket(&authority(&endpoint))).await;
    let blob_url = blob_url.replacen(
        &authority(&endpoint),
        &store.addr.to_string(),
        // The endpoint is the only place the address appears.
        1,
    );
    let fleet = start_fleet(
        &database_url,
        [&catalog_one_database, &database_url],
        &blob_url,
        &format!(
            "[internal]\ncall_timeout_ms = {}\n",
            CALL_TIMEOUT.as_millis()
        ),
        [None, None],
    )
    .await;
    let workload = Workload::start(&fleet);
    let outcomes = workload.outcomes.clone();
    tokio::time::sleep(Duration::from_secs(4)).await;
    let mut report = Vec::new();

    // 1. Catalog 1's database blackholed.
    let blackholed = Instant::now();
    let blackholed_ms = now_ms();
    database.set(Mode::Blackholed);
    let mut late_seen: Vec<String> = Vec::new();
    while blackholed.elapsed() < FAULT {
        let late = psql(
            &fleet.database_url,
            &format!(
                "SELECT name FROM nodes WHERE heartbeat_at_ms < {}",
                now_ms() - NODE_TTL_MS
            ),
        );
        if !late.is_empty() {
            late_seen.push(format!(
                "{:.1} s: {late}",
                blackholed.elapsed().as_secs_f64()
            ));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    database.set(Mode::Up);
    let healed = Instant::now();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let (sent, failed, what) = outcomes.count(blackholed, healed);
    let (_, failed_after, what_after) =
        outcomes.count(blackholed + NOTICED_WITHIN, healed + Duration::from_secs(5));
    report.push(format!(
        "catalog-1's database blackholed for {} s: {failed} of {sent} requests failed, {failed_after} of them sent {} s or more after it",
        FAULT.as_secs(),
        NOTICED_WITHIN.as_secs()
    ));
    for failure in &what {
        report.push(format!(
            "  {}",
            failure.chars().take(200).collect::<String>()
        ));
    }
    let retried_builds = psql(
        &fleet.database_url,
        &format!(
            "SELECT count(*) FROM builds WHERE environment_id = '{}' AND attempt > 1 AND queued_at_ms > {}",
            fleet.builds,
            blackholed_ms - 60_000
        ),
    );

    // 2. The blob store stopped.
    let stopped = Instant::now();
    store.set(Mode::Down);
    let mut not_ready: Vec<String> = Vec::new();
    let ready_urls: Vec<String> = fleet
        .gateways
        .iter()
        .chain(fleet.node_admins.iter())
        .map(|address| format!("http://{address}/readyz"))
        .collect();
    while stopped.elapsed() < FAULT {
        for url in &ready_urls {
            match fleet.client.get(url).send().await {
                Ok(response) if response.status() == 200 => {}
                Ok(response) => {
                    let status = response.status();
                    let body = response.text().await.unwrap_or_default();
                    not_ready.push(format!("{url}: {status} {body}"));
                }
                Err(error) => not_ready.push(format!("{url}: {error}")),
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    store.set(Mode::Up);
    let back = Instant::now();
    tokio::time::sleep(Duration::from_secs(10)).await;
    let (sent_b, failed_b, what_b) = outcomes.count(stopped, back + Duration::from_secs(10));
    let internal_errors: Vec<&String> = what_b
        .iter()
        .filter(|what| what.contains("500 Internal Server Error"))
        .collect();
    report.push(format!(
        "the blob store stopped for {} s: {failed_b} of {sent_b} requests failed (none may be a 500)",
        FAULT.as_secs()
    ));
    let mut kinds = std::collections::BTreeMap::<String, usize>::new();
    for failure in &what_b {
        *kinds
            .entry(failure.chars().take(160).collect())
            .or_default() += 1;
    }
    for (failure, count) in kinds {
        report.push(format!("  {count} × {failure}"));
    }

    let ends = workload.finish(&fleet).await;
    report.push(format!(
        "{} builds followed to their end, all ready",
        ends.len()
    ));
    println!("{}", report.join("\n"));

    assert_eq!(
        failed_after,
        0,
        "requests sent {NOTICED_WITHIN:?} or more after catalog-1's database was blackholed failed: {what_after:?}\n{}",
        report.join("\n")
    );
    assert!(
        late_seen.is_empty(),
        "nodes went late while catalog-1's database was blackholed: {late_seen:?}\n{}",
        fleet.services_log()
    );
    assert_eq!(
        retried_builds, "0",
        "a build lost its lease while catalog-1's database was blackholed"
    );
    assert!(
        internal_errors.is_empty(),
        "requests answered 500 while the blob store was stopped: {internal_errors:?}"
    );
    assert!(
        not_ready.is_empty(),
        "gateways or nodes went not ready while the blob store was stopped: {not_ready:?}"
    );
    assert!(
        !ends.is_empty(),
        "no build ended across the faults\n{}",
        report.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_the_gateways_cannot_reach_costs_requests_a_deadline_and_gets_no_sessions() {
    let Some((database_url, blob_url)) = fleet_stores().await else {
        return;
    };
    // Node 2 listens behind a forwarder, whose address is the one it advertises.
    let node_two: Arc<std::sync::OnceLock<SocketAddr>> = Arc::default();
    let front = Forwarder::start_to(node_two.clone()).await;
    let fleet = start_fleet(
        &database_url,
        [&database_url, &database_url],
        &blob_url,
        &format!(
            "[gateway]\nnode_call_timeout_ms = {}\nnode_attach_timeout_ms = {}\n",
            NODE_CALL_TIMEOUT.as_millis(),
            NODE_ATTACH_TIMEOUT.as_millis()
        ),
        [None, Some((node_two, format!("http://{}", front.addr)))],
    )
    .await;
    let node_two_id = psql(
        &fleet.database_url,
        "SELECT id FROM nodes WHERE name = 'node-2'",
    );
    let sessions_on_node_two = |from_ms: i64, to_ms: i64| -> i64 {
        psql(
            &fleet.database_url,
            &format!(
                "SELECT count(*) FROM sessions WHERE node_id = '{node_two_id}' \
                 AND created_at_ms > {from_ms} AND created_at_ms < {to_ms}"
            ),
        )
        .parse()
        .expect("a count")
    };
    // A session held on node 1 makes node 2 the less loaded, where placement sends the
    // workload's sessions (each ended before the next) until node 2 is held suspect.
    let node_one_id = psql(
        &fleet.database_url,
        "SELECT id FROM nodes WHERE name = 'node-1'",
    );
    for attempt in 0.. {
        assert!(attempt < 20, "no session was placed on node 1");
        let (status, created) = crate::helpers::send(
            fleet
                .client
                .post(format!("{}/v1/sessions", fleet.base(0)))
                .bearer_auth("tok-acme")
                .json(&serde_json::json!({ "environment": fleet.sessions })),
        )
        .await;
        assert_eq!(status, 201, "{created}");
        let id = created["id"].as_str().expect("id");
        let node = psql(
            &fleet.database_url,
            &format!("SELECT node_id FROM sessions WHERE id = '{id}'"),
        );
        if node == node_one_id {
            break;
        }
        let (status, ended) = crate::helpers::send(
            fleet
                .client
                .delete(format!("{}/v1/sessions/{id}", fleet.base(0)))
                .bearer_auth("tok-acme"),
        )
        .await;
        assert_eq!(status, 200, "{ended}");
    }
    let workload = Workload::start(&fleet);
    let outcomes = workload.outcomes.clone();
    // Node 2 takes the workload's sessions before the partition.
    let started_ms = now_ms();
    let waiting = Instant::now();
    while sessions_on_node_two(started_ms, i64::MAX) == 0 {
        assert!(
            waiting.elapsed() < Duration::from_secs(60),
            "node 2 took none of the workload's sessions\n{}",
            fleet.services_log()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    // The partition: what the gateways send node 2 goes nowhere, and nothing comes back.
    let cut = Instant::now();
    front.set(Mode::Blackholed);
    // When the catalog first holds node 2 suspect (a gateway's call to it timed out), and
    // whether its heartbeats, which do not cross the partition, stayed on time.
    let mut suspect_since: Option<(Instant, i64)> = None;
    let mut late_seen = Vec::new();
    while cut.elapsed() < FAULT {
        let now = now_ms();
        let row = psql(
            &fleet.database_url,
            &format!(
                "SELECT suspect_until_ms > {now}, heartbeat_at_ms < {} FROM nodes WHERE id = '{node_two_id}'",
                now - NODE_TTL_MS
            ),
        );
        if row.starts_with('t') && suspect_since.is_none() {
            suspect_since = Some((Instant::now(), now));
        }
        if row.ends_with('t') {
            late_seen.push(format!("{:.1} s", cut.elapsed().as_secs_f64()));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let healed_ms = now_ms();
    front.set(Mode::Up);
    let healed = Instant::now();
    // Node 2 answers the gateways' probes again, which lift the mark: it may take sessions.
    loop {
        let now = now_ms();
        let suspect = psql(
            &fleet.database_url,
            &format!("SELECT suspect_until_ms > {now} FROM nodes WHERE id = '{node_two_id}'"),
        );
        if suspect == "f" {
            break;
        }
        assert!(
            healed.elapsed() < Duration::from_secs(30),
            "node 2 was still held suspect 30 s after the partition healed\n{}",
            fleet.services_log()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let back = Instant::now();
    let ends = workload.finish(&fleet).await;

    let (suspect_at, suspect_ms) = suspect_since.unwrap_or_else(|| {
        panic!(
            "no gateway held node 2 suspect while it was cut off\n{}",
            fleet.services_log()
        )
    });
    let (sent, failed, what) = outcomes.count(cut, back);
    let (_, _, failed_after) = outcomes.count(suspect_at + NOTICED_WITHIN, back);
    let placed_during = sessions_on_node_two(suspect_ms, healed_ms);
    let slow = outcomes.slower_than(cut - Duration::from_secs(20), back, LONGEST_WAIT);
    println!(
        "node 2 cut off from the gateways for {} s, held suspect after {:.1} s: {failed} of {sent} requests failed; {} builds followed to their end\n  {}",
        FAULT.as_secs(),
        (suspect_at - cut).as_secs_f64(),
        ends.len(),
        what.join("\n  ")
    );
    assert!(
        slow.is_empty(),
        "requests waited longer than their deadline on the partitioned node: {slow:?}"
    );
    assert_eq!(
        placed_during, 0,
        "sessions were placed on node 2 after a call to it had timed out"
    );
    assert!(
        failed_after.is_empty(),
        "requests sent {NOTICED_WITHIN:?} or more after node 2 was held suspect failed: {failed_after:?}"
    );
    // What failed was a call to node 2 in a session placed there before the partition:
    // `503` naming the node, never a 500 or a client that gave up.
    for failure in &what {
        assert!(
            failure.starts_with("session:") && failure.contains(" 503 "),
            "{failure}"
        );
    }
    assert!(
        late_seen.is_empty(),
        "node 2's heartbeats went late although they do not cross the partition: {late_seen:?}"
    );
}
