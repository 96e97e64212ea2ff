//! Git imports as an attacker would try them, with the real `git` program against a real git
//! server (`git http-backend`): a name that answers a public address to the check and
//! loopback afterwards, a server that redirects to loopback, a repository larger than the
//! fetch may be, and fetch directories a killed service left behind.
//!
//! The "public" server runs inside a network namespace the test makes, at an address the test
//! declares public for itself alone; the victim is a listener on this machine's loopback.

use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use plinth_blobs::BlobStore;
use plinth_sandbox::egress::proxy::BoxFuture;
use plinth_source::archive::Limits;
use plinth_source::git::address::{self, Resolve};
use plinth_source::git::{self, GitError, GitPolicy};
use plinth_source::import::{ImportError, Imported};

use crate::git_server::{
    Answer, CHUNK, GitServer, Namespace, Victim, noise, processes_within, repository,
    repository_with_links, require_root, serve_dumb,
};

/// Answers `first` to the first question and `then` to every later one, and counts them.
struct Rebinding {
    first: IpAddr,
    then: IpAddr,
    asked: AtomicUsize,
}

impl Resolve for Rebinding {
    fn resolve<'a>(&'a self, _name: &'a str) -> BoxFuture<'a, std::io::Result<Vec<IpAddr>>> {
        let asked = self.asked.fetch_add(1, Ordering::SeqCst);
        let answer = if asked == 0 { self.first } else { self.then };
        Box::pin(std::future::ready(Ok(vec![answer])))
    }
}

/// The service's policy for http, except that `public` counts as a public address.
fn policy_declaring_public(public: Ipv4Addr) -> GitPolicy {
    let public = IpAddr::V4(public);
    GitPolicy {
        allowed_schemes: vec!["http".into(), "https".into()],
        classify: Arc::new(move |ip| {
            if ip == public {
                None
            } else {
                address::refusal(ip)
            }
        }),
        ..GitPolicy::default()
    }
}

fn limits() -> Limits {
    Limits {
        max_entries: 10_000,
        max_total_bytes: 1 << 30,
        max_file_bytes: 1 << 30,
    }
}

/// Holds nothing: no collection runs over these tests' memory stores.
struct Unheld;

impl plinth_blobs::Holder for Unheld {
    fn hold<'a>(
        &'a self,
        _digests: &'a [plinth_blobs::Digest],
    ) -> futures::future::BoxFuture<'a, Result<(), plinth_blobs::BlobError>> {
        Box::pin(std::future::ready(Ok(())))
    }
}

async fn import(policy: &GitPolicy, spool: &Path, url: &str) -> Result<Imported, ImportError> {
    let blobs = BlobStore::open("memory://", spool.join("blobs")).expect("blob store");
    git::import(&blobs, spool, limits(), policy, url, "main", &Unheld).await
}

fn paths(imported: &Imported) -> Vec<&str> {
    imported.entries.iter().map(|e| e.path.as_str()).collect()
}

/// What is left in the spool's fetch directories.
fn fetch_leftovers(spool: &Path) -> Vec<String> {
    std::fs::read_dir(spool.join("git"))
        .map(|entries| {
            entries
                .flatten()
                .map(|entry| entry.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_that_rebinds_to_loopback_after_the_check_never_reaches_loopback() {
    if !require_root() {
        return;
    }
    let victim = Victim::start();
    let namespace = Namespace::create();
    let root = repository(&[("README.md", b"served from the namespace\n")]);
    let server = GitServer::start(
        namespace.listen(victim.port),
        root.path(),
        Answer::Serve { pause_after: None },
    );
    let url = format!("http://localhost:{}/repo.git", victim.port);

    // The attack is real: a `git` that resolves the name itself lands on the victim.
    let direct = tokio::process::Command::new("git")
        .args(["ls-remote", &url])
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .output()
        .await
        .expect("git runs");
    assert!(!direct.status.success());
    assert!(victim.connections() > 0, "the set-up must reach loopback");
    victim.reset();

    let rebinding = Arc::new(Rebinding {
        first: IpAddr::V4(namespace.inside),
        then: IpAddr::V4(Ipv4Addr::LOCALHOST),
        asked: AtomicUsize::new(0),
    });
    let policy = GitPolicy {
        resolver: rebinding.clone(),
        ..policy_declaring_public(namespace.inside)
    };
    let spool = tempfile::tempdir().expect("spool");
    let imported = import(&policy, spool.path(), &url)
        .await
        .expect("the import is served by the address checked");

    assert_eq!(paths(&imported), ["README.md"]);
    assert_eq!(victim.connections(), 0, "nothing reached loopback");
    assert!(server.requests() >= 2, "the checked server answered");
    assert_eq!(rebinding.asked.load(Ordering::SeqCst), 1, "resolved once");
    assert!(fetch_leftovers(spool.path()).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redirect_to_loopback_is_not_followed_and_the_import_asks_for_the_final_url() {
    if !require_root() {
        return;
    }
    let victim = Victim::start();
    let namespace = Namespace::create();
    let root = repository(&[("README.md", b"unreachable\n")]);
    let policy = policy_declaring_public(namespace.inside);
    for status in [301, 302, 307, 308] {
        let listener = namespace.listen(0);
        let port = listener.local_addr().expect("address").port();
        let server = GitServer::start(
            listener,
            root.path(),
            Answer::Redirect {
                status,
                location: format!("http://127.0.0.1:{}", victim.port),
            },
        );
        let spool = tempfile::tempdir().expect("spool");
        let url = format!("http://{}:{port}/repo.git", namespace.inside);
        let error = import(&policy, spool.path(), &url)
            .await
            .expect_err("a redirect fails the import");

        assert!(
            matches!(error, ImportError::Git(GitError::Redirected { status: got }) if got == status),
            "{status}: {error}"
        );
        let message = error.to_string();
        assert!(
            message.contains("redirect") && message.contains("final URL"),
            "{message}"
        );
        assert!(server.requests() >= 1, "the first server was asked");
        assert_eq!(
            victim.connections(),
            0,
            "{status}: the redirect was not followed"
        );
        assert!(fetch_leftovers(spool.path()).is_empty());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fetch_past_its_cap_is_stopped_while_the_server_is_still_sending() {
    const CAP: u64 = 1024 * 1024;
    const PAUSE_AFTER: u64 = 4 * 1024 * 1024;
    const BLOB: usize = 24 * 1024 * 1024;
    let root = repository(&[("big.bin", &noise(BLOB)), ("small.txt", b"small\n")]);
    let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("listener");
    let port = listener.local_addr().expect("address").port();
    let server = GitServer::start(
        listener,
        root.path(),
        Answer::Serve {
            pause_after: Some(PAUSE_AFTER),
        },
    );
    let policy = GitPolicy {
        allowed_schemes: vec!["http".into()],
        allow_private_addresses: true,
        max_fetch_bytes: CAP,
        fetch_timeout: Duration::from_secs(600),
        ..GitPolicy::default()
    };
    let spool = tempfile::tempdir().expect("spool");
    let result = import(
        &policy,
        spool.path(),
        &format!("http://127.0.0.1:{port}/repo.git"),
    )
    .await;
    // Read before the server may go on: a fetch that was not stopped cannot finish while the
    // server holds the rest of the pack back.
    let sent = server.sent();
    server.release();

    let error = result.expect_err("refused");
    assert!(
        matches!(error, ImportError::Git(GitError::TooLarge { max: CAP })),
        "{error}"
    );
    assert!(
        sent <= PAUSE_AFTER + CHUNK as u64 && sent < BLOB as u64 / 2,
        "the fetch was stopped mid-pack (server sent {sent} bytes)"
    );
    assert!(fetch_leftovers(spool.path()).is_empty());
    // Every process of the fetch was stopped, not `git` alone (SIGKILL is delivered at once,
    // but a process may take a moment to be gone).
    let lingering = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let lingering = processes_within(spool.path());
            if lingering.is_empty() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(
        lingering.is_ok(),
        "still running: {:?}",
        processes_within(spool.path())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repository_within_the_cap_imports_over_http() {
    let root = repository(&[("src/app.py", b"print('app')\n"), ("README.md", b"# hi\n")]);
    let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("listener");
    let port = listener.local_addr().expect("address").port();
    let _server = GitServer::start(listener, root.path(), Answer::Serve { pause_after: None });
    let policy = GitPolicy {
        allowed_schemes: vec!["http".into()],
        allow_private_addresses: true,
        max_fetch_bytes: 1024 * 1024,
        ..GitPolicy::default()
    };
    let spool = tempfile::tempdir().expect("spool");
    let imported = import(
        &policy,
        spool.path(),
        &format!("http://127.0.0.1:{port}/repo.git"),
    )
    .await
    .expect("imported");
    assert_eq!(paths(&imported), ["README.md", "src", "src/app.py"]);
    assert!(fetch_leftovers(spool.path()).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repository_on_a_dumb_http_server_imports_with_its_commit() {
    let root = repository(&[("src/app.py", b"print('app')\n"), ("README.md", b"# hi\n")]);
    serve_dumb(root.path());
    let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("listener");
    let port = listener.local_addr().expect("address").port();
    let _server = GitServer::start(listener, root.path(), Answer::Static);
    let policy = GitPolicy {
        allowed_schemes: vec!["http".into()],
        allow_private_addresses: true,
        max_fetch_bytes: 1024 * 1024,
        ..GitPolicy::default()
    };
    let spool = tempfile::tempdir().expect("spool");
    let imported = import(
        &policy,
        spool.path(),
        &format!("http://127.0.0.1:{port}/repo.git"),
    )
    .await
    .expect("a dumb server gets a whole fetch instead of a shallow one");
    assert_eq!(paths(&imported), ["README.md", "src", "src/app.py"]);
    let origin = imported.origin.expect("a git import has an origin");
    assert_eq!(origin.commit.len(), 40, "{origin:?}");
    assert_eq!(origin.reference, "main");
    assert!(fetch_leftovers(spool.path()).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn git_links_inside_the_root_are_kept_and_escaping_ones_dropped_and_counted() {
    let root = repository_with_links(
        &[
            ("docs/guide.md", b"# guide\n"),
            ("tests/fixtures/data.txt", b"x\n"),
        ],
        &[
            ("README.md", "docs/guide.md"),
            ("tests/fixtures/root", "../.."),
            ("escape", "../outside"),
            ("absolute", "/etc/passwd"),
            ("tests/chained", "fixtures/root/.."),
        ],
    );
    let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("listener");
    let port = listener.local_addr().expect("address").port();
    let _server = GitServer::start(listener, root.path(), Answer::Serve { pause_after: None });
    let policy = GitPolicy {
        allowed_schemes: vec!["http".into()],
        allow_private_addresses: true,
        ..GitPolicy::default()
    };
    let spool = tempfile::tempdir().expect("spool");
    let imported = import(
        &policy,
        spool.path(),
        &format!("http://127.0.0.1:{port}/repo.git"),
    )
    .await
    .expect("imported");
    let links: Vec<(&str, Option<&str>)> = imported
        .entries
        .iter()
        .filter(|entry| entry.kind == plinth_source::persistence::Kind::Symlink)
        .map(|entry| (entry.path.as_str(), entry.target.as_deref()))
        .collect();
    assert_eq!(
        links,
        [
            ("README.md", Some("docs/guide.md")),
            ("tests/fixtures/root", Some("../.."))
        ]
    );
    assert_eq!(
        imported.skipped.get("symlink"),
        Some(&3),
        "{:?}",
        imported.skipped
    );
    assert_eq!(
        imported.origin.map(|origin| origin.describe.len()),
        Some(7),
        "no tag: the abbreviated commit"
    );
}

/// A process standing for a fetch that outlived its service; killed when the test ends,
/// whatever the service did.
struct Orphan(std::process::Child);

impl Drop for Orphan {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_removes_fetches_a_killed_run_left_when_it_starts() {
    use std::os::unix::process::ExitStatusExt;

    let data = tempfile::tempdir().expect("data dir");
    let spool = data.path().join("spool");
    let left = spool.join("git").join("fetch-killed");
    std::fs::create_dir_all(left.join("objects/pack")).expect("mkdir");
    std::fs::write(left.join("objects/pack/tmp_pack_abc"), noise(4096)).expect("half a pack");
    // A fetch that outlived the service that ran it: a process working in its directory.
    let mut orphan = Orphan(
        std::process::Command::new("sleep")
            .arg("600")
            .current_dir(&left)
            .spawn()
            .expect("sleep runs"),
    );
    let elsewhere = spool.join("upload.part");
    std::fs::write(&elsewhere, b"not a fetch").expect("write");

    let options = plinth_source::SourceOptions {
        database_url: format!(
            "sqlite://{}?mode=rwc",
            data.path().join("source.db").display()
        ),
        max_connections: 2,
        blob_url: format!("file://{}", data.path().join("blobs").display()),
        spool_dir: spool.clone(),
        limits: plinth_source::SourceLimits::default(),
        git: GitPolicy::default(),
        internal: plinth_kit::grpc::Internal::default(),
        local: None,
        quotas: plinth_kit::quota::Quotas::default(),
        collection: plinth_source::gc::GcOptions::default(),
        collector: None,
    };
    let grpc = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("listener");
    let shutdown = plinth_kit::tasks::CancellationToken::new();
    let service =
        plinth_kit::tasks::spawn(plinth_source::run(options, grpc, None, shutdown.clone()));

    let status = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            if let Ok(Some(status)) = orphan.0.try_wait() {
                return status;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the left fetch was stopped");
    assert_eq!(status.signal(), Some(9), "killed");
    tokio::time::timeout(Duration::from_secs(60), async {
        while left.exists() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the left directory was removed");
    assert_eq!(std::fs::read(&elsewhere).expect("kept"), b"not a fetch");

    shutdown.cancel();
    service
        .await
        .expect("joined")
        .expect("the service ran and stopped");
}
