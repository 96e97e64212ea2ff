//! What the git import tests run against: real repositories, `git http-backend` behind a small
//! HTTP/1.1 server on a listener the test makes (on loopback, or inside a network namespace
//! the test creates), and a loopback listener that only counts who connects to it.
//!
//! Nothing here sends traffic beyond loopback and the namespaces the tests make.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// Whether the machine lets the test make network namespaces (root). Not root outside CI: the
/// test says why and skips. Not root under CI (`CI` set): the test fails.
pub fn require_root() -> bool {
    if rustix::process::geteuid().is_root() {
        return true;
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "this test makes a network namespace and needs root; CI runs as root"
    );
    eprintln!("skipping: this test makes a network namespace and needs root");
    false
}

fn git(dir: &Path, args: &[&str]) {
    let output = Command::new("git")
        .current_dir(dir)
        .args([
            "-c",
            "user.name=Test",
            "-c",
            "user.email=test@example.com",
            "-c",
            "init.defaultBranch=main",
            "-c",
            "core.compression=0",
        ])
        .args(args)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .output()
        .expect("git runs");
    assert!(
        output.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A directory holding `repo.git`, a bare repository whose `main` has one commit of `files`.
pub fn repository(files: &[(&str, &[u8])]) -> tempfile::TempDir {
    repository_with_links(files, &[])
}

/// [`repository`] with symlinks too (path, target).
pub fn repository_with_links(files: &[(&str, &[u8])], links: &[(&str, &str)]) -> tempfile::TempDir {
    let root = tempfile::tempdir().expect("repository root");
    let work = root.path().join("work");
    std::fs::create_dir_all(&work).expect("work tree");
    git(&work, &["init", "--quiet"]);
    for (path, content) in files {
        let path = work.join(path);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).expect("mkdir");
        }
        std::fs::write(path, content).expect("write");
    }
    for (path, target) in links {
        let path = work.join(path);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).expect("mkdir");
        }
        std::os::unix::fs::symlink(target, path).expect("symlink");
    }
    git(&work, &["add", "."]);
    git(&work, &["commit", "--quiet", "-m", "first"]);
    git(
        root.path(),
        &["clone", "--quiet", "--bare", "work", "repo.git"],
    );
    std::fs::remove_dir_all(&work).expect("remove the work tree");
    root
}

/// `len` bytes nothing compresses.
pub fn noise(len: usize) -> Vec<u8> {
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut bytes = Vec::with_capacity(len + 8);
    while bytes.len() < len {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        bytes.extend_from_slice(&state.to_le_bytes());
    }
    bytes.truncate(len);
    bytes
}

/// What the server answers.
#[derive(Debug, Clone)]
pub enum Answer {
    /// The repositories under its root, through `git http-backend`; with `pause_after`, a
    /// response stops after that many body bytes until the test calls
    /// [`GitServer::release`].
    Serve { pause_after: Option<u64> },
    /// A redirect to `location` followed by the path asked for.
    Redirect { status: u16, location: String },
    /// The files under its root as they are, git's "dumb" HTTP protocol (the repository
    /// needs `git update-server-info`, see [`serve_dumb`]).
    Static,
}

/// Makes `repo.git` under `root` servable over dumb HTTP.
pub fn serve_dumb(root: &Path) {
    git(&root.join("repo.git"), &["update-server-info"]);
}

/// A git server on a listener the test made.
pub struct GitServer {
    requests: Arc<AtomicUsize>,
    sent: Arc<AtomicU64>,
    gate: Arc<(Mutex<bool>, Condvar)>,
}

impl GitServer {
    /// Serves `root` (or redirects) on `listener` until the test process ends.
    pub fn start(listener: TcpListener, root: &Path, answer: Answer) -> GitServer {
        let server = GitServer {
            requests: Arc::default(),
            sent: Arc::default(),
            gate: Arc::default(),
        };
        let (requests, sent, gate) = (
            server.requests.clone(),
            server.sent.clone(),
            server.gate.clone(),
        );
        let root = root.to_path_buf();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                requests.fetch_add(1, Ordering::SeqCst);
                let (root, answer, sent, gate) =
                    (root.clone(), answer.clone(), sent.clone(), gate.clone());
                std::thread::spawn(move || {
                    let _ = serve(stream, &root, &answer, &sent, &gate);
                });
            }
        });
        server
    }

    /// Connections accepted.
    pub fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }

    /// Response body bytes written so far, over all connections.
    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::SeqCst)
    }

    /// Lets paused responses go on.
    pub fn release(&self) {
        let (open, wake) = &*self.gate;
        *open.lock().expect("gate") = true;
        wake.notify_all();
    }
}

/// Bytes per write of a response body.
pub const CHUNK: usize = 64 * 1024;

fn serve(
    stream: TcpStream,
    root: &Path,
    answer: &Answer,
    sent: &AtomicU64,
    gate: &(Mutex<bool>, Condvar),
) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut request_line = String::new();
    reader.read_line(&mut request_line)?;
    let mut parts = request_line.split_whitespace();
    let method = parts.next().unwrap_or("").to_owned();
    let target = parts.next().unwrap_or("/").to_owned();
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 || line.trim_end().is_empty() {
            break;
        }
        if let Some((name, value)) = line.trim_end().split_once(':') {
            headers.push((name.trim().to_ascii_lowercase(), value.trim().to_owned()));
        }
    }
    let header = |name: &str| {
        headers
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.clone())
    };
    let mut out = stream;
    if let Answer::Redirect { status, location } = answer {
        return write!(
            out,
            "HTTP/1.1 {status} Moved\r\nLocation: {location}{target}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        );
    }
    if let Answer::Static = answer {
        let relative = target
            .split('?')
            .next()
            .unwrap_or("")
            .trim_start_matches('/');
        let file = root.join(relative);
        return match (relative.contains(".."), std::fs::read(&file)) {
            (false, Ok(bytes)) => {
                write!(
                    out,
                    "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    bytes.len()
                )?;
                out.write_all(&bytes)
            }
            _ => write!(
                out,
                "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            ),
        };
    }
    let Answer::Serve { pause_after } = answer else {
        return Ok(());
    };
    let length: usize = header("content-length")
        .and_then(|value| value.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0u8; length];
    reader.read_exact(&mut body)?;
    let (path, query) = target.split_once('?').unwrap_or((&target, ""));
    let mut backend = Command::new("git")
        .arg("http-backend")
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", root)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_PROJECT_ROOT", root)
        .env("GIT_HTTP_EXPORT_ALL", "1")
        .env("REQUEST_METHOD", &method)
        .env("PATH_INFO", path)
        .env("QUERY_STRING", query)
        .env("CONTENT_TYPE", header("content-type").unwrap_or_default())
        .env("CONTENT_LENGTH", length.to_string())
        .env(
            "HTTP_CONTENT_ENCODING",
            header("content-encoding").unwrap_or_default(),
        )
        .env(
            "HTTP_GIT_PROTOCOL",
            header("git-protocol").unwrap_or_default(),
        )
        .env("REMOTE_ADDR", "127.0.0.1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let mut stdin = backend.stdin.take().expect("stdin");
    std::thread::spawn(move || {
        let _ = stdin.write_all(&body);
    });
    let mut cgi = BufReader::new(backend.stdout.take().expect("stdout"));
    let mut status = "200 OK".to_owned();
    let mut response_headers = String::new();
    loop {
        let mut line = String::new();
        if cgi.read_line(&mut line)? == 0 || line.trim_end().is_empty() {
            break;
        }
        match line.trim_end().split_once(':') {
            Some((name, value)) if name.eq_ignore_ascii_case("status") => {
                status = value.trim().to_owned();
            }
            _ => response_headers.push_str(&format!("{}\r\n", line.trim_end())),
        }
    }
    write!(
        out,
        "HTTP/1.1 {status}\r\n{response_headers}Connection: close\r\n\r\n"
    )?;
    let mut buffer = vec![0u8; CHUNK];
    let mut written: u64 = 0;
    loop {
        if pause_after.is_some_and(|pause| written >= pause) {
            let (open, wake) = gate;
            let guard = open.lock().expect("gate");
            // Whatever happens, paused responses go on within 30 s (and the test, which reads
            // what was sent before it releases them, then sees everything sent).
            let (mut guard, _) = wake
                .wait_timeout_while(guard, Duration::from_secs(30), |open| !*open)
                .expect("gate");
            *guard = true;
        }
        let read = cgi.read(&mut buffer)?;
        if read == 0 {
            break;
        }
        out.write_all(&buffer[..read])?;
        written += read as u64;
        sent.fetch_add(read as u64, Ordering::SeqCst);
    }
    let _ = backend.wait();
    Ok(())
}

/// A loopback listener (IPv4 and, where the machine has it, IPv6) that accepts, counts and
/// hangs up: where an attack that reached the service's own host would land.
pub struct Victim {
    /// Its port, the same on both addresses.
    pub port: u16,
    connections: Arc<AtomicUsize>,
}

impl Victim {
    pub fn start() -> Victim {
        let v4 = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("loopback listener");
        let port = v4.local_addr().expect("address").port();
        let connections = Arc::new(AtomicUsize::new(0));
        let mut listeners = vec![v4];
        listeners.extend(TcpListener::bind((Ipv6Addr::LOCALHOST, port)).ok());
        for listener in listeners {
            let connections = connections.clone();
            std::thread::spawn(move || {
                for stream in listener.incoming() {
                    connections.fetch_add(1, Ordering::SeqCst);
                    drop(stream);
                }
            });
        }
        Victim { port, connections }
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }

    pub fn reset(&self) {
        self.connections.store(0, Ordering::SeqCst);
    }
}

/// A network namespace of the test's own, joined to this one by a veth pair, with an address
/// from 198.18.0.0/15 (benchmarking) on each end. Removed on drop, with its veth pair.
pub struct Namespace {
    name: String,
    /// The namespace's address, reachable from here (this end has the one before it).
    pub inside: Ipv4Addr,
}

static NAMESPACES: AtomicUsize = AtomicUsize::new(0);

fn ip(args: &[&str]) -> std::process::Output {
    Command::new("ip").args(args).output().expect("ip runs")
}

fn ip_ok(args: &[&str]) {
    let output = ip(args);
    assert!(
        output.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

impl Namespace {
    pub fn create() -> Namespace {
        let pid = std::process::id();
        let serial = NAMESPACES.fetch_add(1, Ordering::SeqCst);
        let name = format!("plinth-git-{pid}-{serial}");
        let (outside_if, inside_if) = (format!("pg{pid}o{serial}"), format!("pg{pid}i{serial}"));
        let taken = String::from_utf8_lossy(&ip(&["-4", "-o", "addr", "show"]).stdout).into_owned();
        // A /30 of 198.18.0.0/15 that no interface of this machine uses yet.
        let (outside, inside) = (0..32_768u32)
            .map(|n| (pid.wrapping_mul(64).wrapping_add(serial as u32 * 4099 + n)) % 32_768)
            .map(|subnet| {
                let base = u32::from(Ipv4Addr::new(198, 18, 0, 0)) + subnet * 4;
                (Ipv4Addr::from(base + 1), Ipv4Addr::from(base + 2))
            })
            .find(|(outside, inside)| {
                !taken.contains(&format!(" {outside}/")) && !taken.contains(&format!(" {inside}/"))
            })
            .expect("a free subnet");
        ip_ok(&["netns", "add", &name]);
        let namespace = Namespace { name, inside };
        let ns = namespace.name.as_str();
        ip_ok(&[
            "link",
            "add",
            &outside_if,
            "type",
            "veth",
            "peer",
            "name",
            &inside_if,
            "netns",
            ns,
        ]);
        ip_ok(&["addr", "add", &format!("{outside}/30"), "dev", &outside_if]);
        ip_ok(&["link", "set", &outside_if, "up"]);
        ip_ok(&[
            "-n",
            ns,
            "addr",
            "add",
            &format!("{inside}/30"),
            "dev",
            &inside_if,
        ]);
        ip_ok(&["-n", ns, "link", "set", &inside_if, "up"]);
        ip_ok(&["-n", ns, "link", "set", "lo", "up"]);
        namespace
    }

    /// A listener on the namespace's address (port 0: any free one).
    pub fn listen(&self, port: u16) -> TcpListener {
        let handle = std::fs::File::open(PathBuf::from("/run/netns").join(&self.name))
            .expect("the namespace's handle");
        plinth_sandbox::egress::listen_in(
            handle.as_fd(),
            SocketAddr::new(IpAddr::V4(self.inside), port),
        )
        .expect("a listener inside the namespace")
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        let _ = ip(&["netns", "del", &self.name]);
    }
}

/// The processes working in `dir` or beneath it (a fetch's `git` processes all do).
pub fn processes_within(dir: &Path) -> Vec<String> {
    let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    std::fs::read_dir("/proc")
        .expect("/proc")
        .flatten()
        .filter(|entry| entry.file_name().to_string_lossy().parse::<u32>().is_ok())
        .filter_map(|entry| {
            let cwd = std::fs::read_link(entry.path().join("cwd")).ok()?;
            let command = std::fs::read(entry.path().join("cmdline")).ok()?;
            cwd.starts_with(&dir)
                .then(|| String::from_utf8_lossy(&command).replace('\0', " "))
        })
        .collect()
}
