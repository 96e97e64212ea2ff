//! Git imports. The repository is fetched by the `git` program into a private bare
//! repository (no working tree, no checkout, so no hooks, submodules or LFS filters ever run),
//! then read object by object: `ls-tree` for the tree, `cat-file --batch` for the blobs.
//! libgit2 cannot speak HTTPS without OpenSSL, which this project does not link; `git`
//! itself is the reference implementation of the protocol.
//!
//! A fetch reaches what the URL names and nothing else:
//! - the scheme must be allowed (https only by default; `ext::` and friends never);
//! - an http(s) host is resolved once, here ([`address`]); every address must be public unless
//!   configuration allows private ones, and `git` is told those addresses
//!   (`http.curloptResolve`), so it never resolves the name itself (DNS rebinding);
//! - redirects are not followed (`http.followRedirects=false`): the import fails and says so;
//! - `git` reads no configuration but what is given here: no system or user gitconfig, no
//!   proxy, no credential helper, nothing of the service's environment but `PATH`;
//! - the bytes a fetch writes are watched while it runs, and past
//!   [`GitPolicy::max_fetch_bytes`] its whole process group is killed.
//!
//! Fetches write into directories of their own (`scratch`), which a start of the service
//! clears of anything a killed predecessor left.

pub mod address;
mod scratch;

use std::fmt;
use std::net::IpAddr;
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use plinth_blobs::{BlobStore, Digest, Holder};
use rustix::process::{Pid, Signal};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::Command;

use crate::archive::Limits;
pub use crate::import::GitError;
use crate::import::{ImportError, Imported};
use crate::links;
use crate::paths::{MAX_PATH_BYTES, SourcePath};
use crate::persistence::{IndexEntry, Kind, Origin};
use address::{Classify, Host, Pin, Resolve, SystemResolver};
use scratch::Scratch;

pub use scratch::remove_leftovers;

/// The default deadline of one fetch from a repository's server: 120 s.
pub const DEFAULT_FETCH_TIMEOUT: Duration = Duration::from_secs(120);

/// The default cap on the bytes one fetch may write: 1 GiB.
pub const DEFAULT_MAX_FETCH_BYTES: u64 = 1024 * 1024 * 1024;

/// How often a running fetch's bytes are counted.
const FETCH_WATCH_INTERVAL: Duration = Duration::from_millis(20);

/// What git imports may reach.
#[derive(Clone)]
pub struct GitPolicy {
    /// URL schemes allowed: some of `https`, `http`, `file`.
    pub allowed_schemes: Vec<String>,
    /// Whether hosts may resolve to loopback, private, link-local or other addresses that are
    /// not public.
    pub allow_private_addresses: bool,
    /// Longest a fetch may take (and resolving the URL's host, and each local `git` step);
    /// past it the import is answered [`GitError::TimedOut`].
    pub fetch_timeout: Duration,
    /// Most bytes one fetch may write (the pack as received, and its index).
    pub max_fetch_bytes: u64,
    /// Resolves URL hosts: the system's resolver.
    pub resolver: Arc<dyn Resolve>,
    /// Which addresses are public: [`address::refusal`].
    pub classify: Classify,
}

impl Default for GitPolicy {
    fn default() -> Self {
        GitPolicy {
            allowed_schemes: vec!["https".to_owned()],
            allow_private_addresses: false,
            fetch_timeout: DEFAULT_FETCH_TIMEOUT,
            max_fetch_bytes: DEFAULT_MAX_FETCH_BYTES,
            resolver: Arc::new(SystemResolver),
            classify: Arc::new(address::refusal),
        }
    }
}

impl fmt::Debug for GitPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GitPolicy")
            .field("allowed_schemes", &self.allowed_schemes)
            .field("allow_private_addresses", &self.allow_private_addresses)
            .field("fetch_timeout", &self.fetch_timeout)
            .field("max_fetch_bytes", &self.max_fetch_bytes)
            .finish_non_exhaustive()
    }
}

fn refused(message: impl Into<String>) -> ImportError {
    ImportError::Git(GitError::Refused(message.into()))
}

fn failed(message: impl Into<String>) -> ImportError {
    ImportError::Git(GitError::Failed(message.into()))
}

fn timed_out(timeout: Duration) -> ImportError {
    ImportError::Git(GitError::TimedOut {
        seconds: timeout.as_secs().max(1),
    })
}

/// What curl (under `git-remote-http(s)`) says when the server could not be reached or
/// failed on its side: the name did not resolve, the connection was refused, dropped or
/// timed out, TLS could not be set up, or the answer was a 5xx.
const UNREACHABLE: [&str; 12] = [
    "Could not resolve host",
    "Failed to connect to",
    "Couldn't connect to server",
    "Connection refused",
    "Connection timed out",
    "Operation timed out",
    "Connection reset by peer",
    "Empty reply from server",
    "Recv failure",
    "Send failure",
    "SSL connect error",
    "TLS connect error",
];

/// A failed fetch's last line, when it says the server could not be reached (see
/// [`UNREACHABLE`]) or answered a server error.
fn unreachable(stderr: &str) -> Option<String> {
    const STATUS: &str = "The requested URL returned error: ";
    let server_error = stderr.match_indices(STATUS).any(|(at, _)| {
        let start = at + STATUS.len();
        stderr
            .get(start..start + 3)
            .and_then(|status| status.parse::<u16>().ok())
            .is_some_and(|status| (500..600).contains(&status))
    });
    (server_error || UNREACHABLE.iter().any(|marker| stderr.contains(marker)))
        .then(|| last_line(stderr.as_bytes()))
}

/// A URL scheme git imports know.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    /// `https://`.
    Https,
    /// `http://`.
    Http,
    /// `file://`, a repository on the service's own disk.
    File,
}

impl Scheme {
    fn parse(text: &str) -> Option<Scheme> {
        match text {
            "https" => Some(Scheme::Https),
            "http" => Some(Scheme::Http),
            "file" => Some(Scheme::File),
            _ => None,
        }
    }

    /// The scheme as written in URLs and in `protocol.<name>.allow`.
    pub fn as_str(self) -> &'static str {
        match self {
            Scheme::Https => "https",
            Scheme::Http => "http",
            Scheme::File => "file",
        }
    }

    fn default_port(self) -> u16 {
        match self {
            Scheme::Http => 80,
            Scheme::Https | Scheme::File => 443,
        }
    }
}

/// A URL that passed the policy: its scheme and, when its host is a name, the addresses the
/// name resolved to, which are all `git` may connect to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The scheme.
    pub scheme: Scheme,
    /// The name's checked addresses; `None` for an address literal or a `file://` URL.
    pub pin: Option<Pin>,
}

/// Checks `url` against the policy, resolving its host (once) and checking every address.
pub async fn check_url(url: &str, policy: &GitPolicy) -> Result<Target, ImportError> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(refused(format!(
            "{url:?} is not a URL with a scheme such as https://"
        )));
    };
    let scheme = scheme.to_ascii_lowercase();
    let Some(known) = Scheme::parse(&scheme) else {
        return Err(refused(format!(
            "scheme {scheme:?} is never allowed; use https://"
        )));
    };
    if !policy
        .allowed_schemes
        .iter()
        .any(|allowed| allowed == &scheme)
    {
        return Err(refused(format!(
            "scheme {scheme:?} is not allowed here (allowed: {})",
            policy.allowed_schemes.join(", ")
        )));
    }
    if url.chars().any(|c| c.is_control() || c == ' ') || url.starts_with('-') {
        return Err(refused("the URL has spaces or control characters"));
    }
    if known == Scheme::File {
        return Ok(Target {
            scheme: known,
            pin: None,
        });
    }
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    if authority.contains('\\') {
        return Err(refused("the URL's host part has a backslash"));
    }
    let host_port = match authority.split_once('@') {
        Some((_, after)) if after.contains('@') => {
            return Err(refused("the URL's host part has more than one '@'"));
        }
        Some((_, host_port)) => host_port,
        None => authority,
    };
    let (host, port) = split_port(host_port, known.default_port())?;
    let host = Host::parse(host).map_err(|error| refused(error.to_string()))?;
    let (addresses, pin) = match host {
        Host::Ip(ip) => (vec![ip], None),
        Host::Name(name) => {
            let addresses = resolve(policy, &name).await?;
            let pin = Pin {
                name,
                port,
                addresses: addresses.clone(),
            };
            (addresses, Some(pin))
        }
    };
    if !policy.allow_private_addresses {
        for ip in &addresses {
            if let Some(why) = (policy.classify)(*ip) {
                // A name's resolution is not echoed: which internal address it leads to is
                // the service's network, not the importer's to learn.
                return Err(refused(match &pin {
                    Some(pin) => format!(
                        "{} resolves to an address that is not public; git imports reach public \
                         addresses only",
                        pin.name
                    ),
                    None => format!("{why}; git imports reach public addresses only"),
                }));
            }
        }
    }
    Ok(Target { scheme: known, pin })
}

/// Splits `host[:port]` or `[v6][:port]`; a port, when written, is 1 to 65535 in digits.
fn split_port(host_port: &str, default: u16) -> Result<(&str, u16), ImportError> {
    let bad_port = || refused(format!("{host_port:?} does not end in a port (1 to 65535)"));
    let (host, port) = match (host_port.starts_with('['), host_port.find(']')) {
        (true, Some(end)) => {
            let (host, after) = host_port.split_at(end + 1);
            match after {
                "" => (host, None),
                after => (host, Some(after.strip_prefix(':').ok_or_else(bad_port)?)),
            }
        }
        // An unclosed bracket: the host is refused as it is.
        (true, None) => (host_port, None),
        (false, _) => match host_port.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (host_port, None),
        },
    };
    let port = match port {
        None => default,
        Some(text) => text
            .parse::<u16>()
            .ok()
            .filter(|&port| port != 0 && text.bytes().all(|b| b.is_ascii_digit()))
            .ok_or_else(bad_port)?,
    };
    Ok((host, port))
}

async fn resolve(policy: &GitPolicy, name: &str) -> Result<Vec<IpAddr>, ImportError> {
    let answer = tokio::time::timeout(policy.fetch_timeout, policy.resolver.resolve(name))
        .await
        .map_err(|_| timed_out(policy.fetch_timeout))?
        .map_err(|error| {
            ImportError::Git(GitError::Unreachable(format!(
                "cannot resolve {name}: {error}"
            )))
        })?;
    let mut addresses: Vec<IpAddr> = Vec::with_capacity(answer.len());
    for ip in answer {
        if !addresses.contains(&ip) {
            addresses.push(ip);
        }
    }
    // An answer without an address is the name's (its DNS records), not the caller's: it
    // may pass later, as a failed lookup may.
    if addresses.is_empty() {
        return Err(ImportError::Git(GitError::Unreachable(format!(
            "{name} resolves to no address"
        ))));
    }
    Ok(addresses)
}

/// `git` with no configuration but this: nothing from the system, the user or the
/// environment (no proxy, credential helper, URL rewriting or trace), only `scheme` among
/// transports, no hooks, no redirects followed, every object checked on arrival.
fn git(repository: &Path, scheme: Scheme) -> Command {
    let mut command = Command::new("git");
    command
        .arg("-C")
        .arg(repository)
        .args(["-c", "protocol.allow=never"])
        .arg("-c")
        .arg(format!("protocol.{}.allow=always", scheme.as_str()))
        .args([
            "-c",
            "core.hooksPath=/dev/null",
            "-c",
            "transfer.fsckObjects=true",
        ])
        .args(["-c", "submodule.recurse=false", "-c", "credential.helper="])
        .args(["-c", "http.followRedirects=false", "-c", "http.proxy="])
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", repository)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_TERMINAL_PROMPT", "0")
        .env("GIT_LFS_SKIP_SMUDGE", "1")
        .env("GIT_PROTOCOL_FROM_USER", "0")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    command
}

async fn run(
    repository: &Path,
    scheme: Scheme,
    args: &[&str],
    what: &str,
    timeout: Duration,
) -> Result<Vec<u8>, ImportError> {
    let mut command = git(repository, scheme);
    command
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let output = tokio::time::timeout(timeout, command.output())
        .await
        .map_err(|_| {
            tracing::warn!(what, "a local git step passed the fetch deadline");
            timed_out(timeout)
        })?
        .map_err(|error| failed(format!("cannot run git for {what}: {error}")))?;
    if !output.status.success() {
        return Err(failed(format!("{what}: {}", last_line(&output.stderr))));
    }
    Ok(output.stdout)
}

fn last_line(stderr: &[u8]) -> String {
    String::from_utf8_lossy(stderr)
        .lines()
        .rev()
        .find(|line| !line.trim().is_empty())
        .unwrap_or("")
        .to_owned()
}

/// A fetch's processes: `git fetch` leads a process group of its own, holding the
/// `git-remote-http(s)`, `fetch-pack` and `index-pack` it runs, and the group is killed whole
/// when the fetch is stopped or abandoned (killing `git` alone would leave them downloading).
/// The group is only signalled while its leader is not yet reaped, so its id cannot have been
/// reused.
struct FetchGroup(Option<Pid>);

impl FetchGroup {
    fn kill(&mut self) {
        if let Some(group) = self.0.take() {
            let _ = rustix::process::kill_process_group(group, Signal::KILL);
        }
    }

    /// The leader was reaped: nothing to signal any more.
    fn ended(&mut self) {
        self.0 = None;
    }
}

impl Drop for FetchGroup {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The oldest `git` that honours `http.curloptResolve` (2.37); an older one ignores it
/// silently and would resolve the name itself.
const PIN_SINCE: (u32, u32) = (2, 37);

/// `git version 2.47.3` → `(2, 47)`.
fn parse_version(output: &str) -> Option<(u32, u32)> {
    let version = output.trim().strip_prefix("git version ")?;
    let mut numbers = version.split(['.', ' ', '-']);
    let major = numbers.next()?.parse().ok()?;
    let minor = numbers.next()?.parse().ok()?;
    Some((major, minor))
}

/// Refuses to fetch by name with a `git` too old to be pinned to the checked addresses.
async fn require_pinning_git() -> Result<(), ImportError> {
    static VERSION: tokio::sync::OnceCell<Option<(u32, u32)>> = tokio::sync::OnceCell::const_new();
    let version = VERSION
        .get_or_init(|| async {
            let output = Command::new("git")
                .arg("version")
                .env_clear()
                .env("PATH", std::env::var_os("PATH").unwrap_or_default())
                .stdin(Stdio::null())
                .output()
                .await
                .ok()?;
            parse_version(&String::from_utf8_lossy(&output.stdout))
        })
        .await;
    match version {
        Some(version) if *version >= PIN_SINCE => Ok(()),
        Some((major, minor)) => Err(failed(format!(
            "git {major}.{minor} cannot be held to the addresses checked (http.curloptResolve needs git {}.{} or newer); install a newer git on the source service's host",
            PIN_SINCE.0, PIN_SINCE.1
        ))),
        None => Err(failed(
            "cannot tell which git is installed (`git version` did not answer); install git on the source service's host",
        )),
    }
}

/// Runs `git fetch <args>` into `scratch`, connecting only to `target`'s checked addresses,
/// and stops it once `scratch` holds more than the policy's `max_fetch_bytes`.
async fn fetch(
    scratch: &Scratch,
    target: &Target,
    policy: &GitPolicy,
    args: &[&str],
) -> Result<(), ImportError> {
    let mut command = git(scratch.path(), target.scheme);
    if let Some(pin) = &target.pin {
        require_pinning_git().await?;
        command
            .arg("-c")
            .arg(format!("http.curloptResolve={}", pin.curl_resolve()));
    }
    // Always keep the pack as received, so the bytes on disk are the bytes fetched.
    command
        .args(["-c", "fetch.unpackLimit=1", "fetch"])
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .process_group(0);
    let mut child = command
        .spawn()
        .map_err(|error| failed(format!("cannot run git fetch: {error}")))?;
    let mut group = FetchGroup(
        child
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .and_then(Pid::from_raw),
    );
    let stderr = child
        .stderr
        .take()
        .map(|stderr| plinth_kit::tasks::spawn(read_head(stderr)));
    let max = policy.max_fetch_bytes;
    let too_large = || ImportError::Git(GitError::TooLarge { max });
    let deadline = tokio::time::sleep(policy.fetch_timeout);
    tokio::pin!(deadline);
    let mut watch = tokio::time::interval(FETCH_WATCH_INTERVAL);
    let status = loop {
        tokio::select! {
            status = child.wait() => {
                group.ended();
                break status.map_err(|error| failed(format!("git fetch: {error}")))?;
            }
            () = &mut deadline => {
                group.kill();
                let _ = child.wait().await;
                return Err(timed_out(policy.fetch_timeout));
            }
            _ = watch.tick() => {
                // A fresh bare repository: a few dozen entries to stat.
                if scratch.bytes() > max {
                    group.kill();
                    let _ = child.wait().await;
                    return Err(too_large());
                }
            }
        }
    };
    if scratch.bytes() > max {
        return Err(too_large());
    }
    if status.success() {
        return Ok(());
    }
    let stderr = match stderr {
        Some(task) => task.await.unwrap_or_default(),
        None => Vec::new(),
    };
    let text = String::from_utf8_lossy(&stderr);
    if let Some(status) = redirect_status(&text) {
        return Err(ImportError::Git(GitError::Redirected { status }));
    }
    if let Some(line) = unreachable(&text) {
        return Err(ImportError::Git(GitError::Unreachable(line)));
    }
    Err(failed(format!("git fetch: {}", last_line(&stderr))))
}

/// The first 64 KiB of a stream, the rest read and dropped so the writer never blocks.
async fn read_head(mut stream: impl AsyncRead + Unpin) -> Vec<u8> {
    let mut head = Vec::new();
    let _ = (&mut stream).take(64 * 1024).read_to_end(&mut head).await;
    let _ = tokio::io::copy(&mut stream, &mut tokio::io::sink()).await;
    head
}

/// The status of a redirect `git` reports having been answered (it says "The requested URL
/// returned error: 301" when it does not follow one).
fn redirect_status(stderr: &str) -> Option<u16> {
    const MARKER: &str = "The requested URL returned error: ";
    stderr.match_indices(MARKER).find_map(|(at, _)| {
        let start = at + MARKER.len();
        let status: u16 = stderr.get(start..start + 3)?.parse().ok()?;
        (300..400).contains(&status).then_some(status)
    })
}

/// Fetches `reference` (branch, tag or commit; empty: the default branch) of `url` and
/// stores every regular file of its tree as a blob, each held by `holder` first (see `gc`).
pub async fn import(
    blobs: &BlobStore,
    spool_dir: &Path,
    limits: Limits,
    policy: &GitPolicy,
    url: &str,
    reference: &str,
    holder: &dyn Holder,
) -> Result<Imported, ImportError> {
    let target = check_url(url, policy).await?;
    let scheme = target.scheme;
    if reference.starts_with('-') || reference.chars().any(|c| c.is_control() || c == ' ') {
        return Err(refused(format!(
            "{reference:?} is not a branch, tag or commit"
        )));
    }
    let scratch = Scratch::new(spool_dir)?;
    let repository = scratch.path();
    let timeout = policy.fetch_timeout;
    run(
        repository,
        scheme,
        &["init", "--bare", "--quiet", "."],
        "git init",
        timeout,
    )
    .await?;
    let wanted = if reference.is_empty() {
        "HEAD"
    } else {
        reference
    };
    let commit = fetch_commit(&scratch, &target, policy, url, wanted).await?;
    let tree = format!("{commit}^{{tree}}");
    let list = ["ls-tree", "-r", "-t", "-z", "--full-tree", tree.as_str()];
    let listing = run(repository, scheme, &list, "reading the tree", timeout).await?;

    let mut imported = Imported::default();
    let mut files: Vec<(SourcePath, bool, String)> = Vec::new();
    let mut symlinks: Vec<(SourcePath, String)> = Vec::new();
    let mut members: u64 = 0;
    for record in listing
        .split(|&b| b == 0)
        .filter(|record| !record.is_empty())
    {
        members += 1;
        if members > limits.max_entries {
            return Err(ImportError::Archive(
                crate::archive::ArchiveError::TooManyEntries {
                    max: limits.max_entries,
                },
            ));
        }
        let Some(tab) = record.iter().position(|&b| b == b'\t') else {
            return Err(failed("unexpected ls-tree output"));
        };
        let (meta, raw_path) = (&record[..tab], &record[tab + 1..]);
        let meta = String::from_utf8_lossy(meta);
        let mut fields = meta.split(' ');
        let (mode, kind, object) = (
            fields.next().unwrap_or(""),
            fields.next().unwrap_or(""),
            fields.next().unwrap_or(""),
        );
        let path = std::str::from_utf8(raw_path)
            .ok()
            .and_then(|p| SourcePath::parse(p).ok());
        match (mode, kind) {
            ("120000", "blob") => match path {
                Some(path) => symlinks.push((path, object.to_owned())),
                None => imported.skip("unsafe_path"),
            },
            ("120000", _) => imported.skip("symlink"),
            ("160000", _) => imported.skip("submodule"),
            (_, "tree") => match path {
                Some(path) => imported.entries.push(IndexEntry::directory(path)),
                None => imported.skip("unsafe_path"),
            },
            ("100644" | "100755" | "100664", "blob") => match path {
                Some(path) => files.push((path, mode == "100755", object.to_owned())),
                None => imported.skip("unsafe_path"),
            },
            _ => imported.skip("other"),
        }
    }
    let stored = store_blobs(repository, scheme, blobs, &files, limits, holder).await?;
    for ((path, executable, _), (digest, size)) in files.into_iter().zip(stored) {
        imported.entries.push(IndexEntry {
            path,
            kind: Kind::File,
            digest: Some(digest),
            size,
            executable,
            target: None,
        });
    }
    let objects: Vec<&str> = symlinks.iter().map(|(_, object)| object.as_str()).collect();
    let targets = read_link_targets(repository, scheme, &objects, timeout).await?;
    for ((path, _), target) in symlinks.into_iter().zip(targets) {
        match target.and_then(|target| links::kept_target(&path, &target)) {
            Some(target) => imported.entries.push(IndexEntry::symlink(path, target)),
            None => imported.skip("symlink"),
        }
    }
    imported.entries.sort_by(|a, b| a.path.cmp(&b.path));
    let described = describe(&scratch, &target, policy, url, &commit).await;
    if let Some(warning) = &described.warning {
        imported.warnings.push(warning.clone());
    }
    imported.origin = Some(Origin {
        commit,
        reference: reference.to_owned(),
        describe: described.describe,
        dirty: false,
        history_incomplete: described.warning.is_some(),
        recorded_at: 0,
        commits: described.commits,
    });
    Ok(imported)
}

/// Whether `wanted` can only be a commit id, full or abbreviated.
fn looks_like_commit_id(wanted: &str) -> bool {
    (4..=64).contains(&wanted.len()) && wanted.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Whether a failed fetch says the server only speaks git's "dumb" HTTP protocol (static
/// files), which cannot send a shallow history.
fn is_dumb_http(error: &ImportError) -> bool {
    matches!(error, ImportError::Git(GitError::Failed(message)) if message.contains("dumb http"))
}

/// Fetches what `wanted` names and answers the commit's full id.
///
/// First a shallow fetch of `wanted` (one commit: what the import needs). A server that
/// only speaks dumb HTTP cannot do shallow fetches, so the whole history of `wanted` is
/// fetched instead. Servers never resolve abbreviated ids, and some refuse even full ones in
/// a fetch, so a commit id that the shallow fetch could not get is looked for among every
/// branch and tag, fetched whole, and resolved here (`rev-parse`).
async fn fetch_commit(
    scratch: &Scratch,
    target: &Target,
    policy: &GitPolicy,
    url: &str,
    wanted: &str,
) -> Result<String, ImportError> {
    let options = ["--quiet", "--no-tags", "--no-recurse-submodules"];
    let shallow = [&options[..], &["--depth", "1", "--", url, wanted]].concat();
    let error = match fetch(scratch, target, policy, &shallow).await {
        Ok(()) => return rev_parse(scratch, target.scheme, "FETCH_HEAD", policy).await,
        Err(error @ ImportError::Git(GitError::Failed(_))) => error,
        Err(error) => return Err(error),
    };
    let dumb = is_dumb_http(&error);
    if !looks_like_commit_id(wanted) {
        if !dumb {
            return Err(error);
        }
        let whole = [&options[..], &["--", url, wanted]].concat();
        fetch(scratch, target, policy, &whole)
            .await
            .map_err(|error| dumb_failed(error, wanted))?;
        return rev_parse(scratch, target.scheme, "FETCH_HEAD", policy).await;
    }
    let everything = [
        &options[..],
        &[
            "--",
            url,
            "+refs/heads/*:refs/heads/*",
            "+refs/tags/*:refs/tags/*",
        ],
    ]
    .concat();
    fetch(scratch, target, policy, &everything)
        .await
        .map_err(|error| {
            if dumb {
                dumb_failed(error, wanted)
            } else {
                error
            }
        })?;
    rev_parse(scratch, target.scheme, wanted, policy)
        .await
        .map_err(|_| {
            refused(format!(
                "no single commit of the repository's branches and tags has the id {wanted:?}; \
                 give the full 40-character commit id (git rev-parse HEAD), or a branch or tag"
            ))
        })
}

/// A fetch from a dumb-HTTP server failed even without asking for a shallow history.
fn dumb_failed(error: ImportError, wanted: &str) -> ImportError {
    match error {
        ImportError::Git(GitError::Failed(message)) => failed(format!(
            "the server speaks only git's dumb HTTP protocol and fetching {wanted:?} from it failed ({message}); \
             serve the repository with git's smart HTTP (git http-backend) or import an archive"
        )),
        other => other,
    }
}

/// The full id of the commit `revision` names in the fetched repository.
async fn rev_parse(
    scratch: &Scratch,
    scheme: Scheme,
    revision: &str,
    policy: &GitPolicy,
) -> Result<String, ImportError> {
    let verify = format!("{revision}^{{commit}}");
    let args = [
        "rev-parse",
        "--verify",
        "--quiet",
        "--end-of-options",
        verify.as_str(),
    ];
    let output = run(
        scratch.path(),
        scheme,
        &args,
        "resolving the commit",
        policy.fetch_timeout,
    )
    .await?;
    let commit = String::from_utf8_lossy(&output).trim().to_owned();
    if !matches!(commit.len(), 40 | 64) || !commit.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(failed(format!("git answered {commit:?} for a commit id")));
    }
    Ok(commit)
}

/// What [`describe`] found.
struct Described {
    /// `git describe --tags --always --match '*[0-9]*'` of the commit.
    describe: String,
    /// Commits reachable from it; 0 when not known.
    commits: u64,
    /// Why the description is the commit alone, when the history or tags could not be had.
    warning: Option<String>,
}

/// `git describe --tags --always --match '*[0-9]*'` of `commit` (the tags setuptools-scm
/// considers: one without a digit is passed over) and the number of commits reaching it, for
/// builds that derive a version from git (setuptools-scm, hatch-vcs). Describing needs the
/// commits between `commit` and its nearest tag, which the shallow fetch did not bring: the
/// history of commits alone (`--filter=tree:0`, where the server allows filters) and every tag
/// are fetched now, within the same fetch cap. This is best effort: when it fails the import
/// still lands, the description is the abbreviated commit, as for a repository without tags,
/// and a warning says why (the import's answer carries it, the origin records it).
async fn describe(
    scratch: &Scratch,
    target: &Target,
    policy: &GitPolicy,
    url: &str,
    commit: &str,
) -> Described {
    let short = || commit.get(..7).unwrap_or(commit).to_owned();
    let incomplete = |why: String| Described {
        describe: short(),
        commits: 0,
        warning: Some(format!(
            "the history and tags of commit {} could not be fetched ({why}); its description \
             is the commit alone, so the version builds derive from git (setuptools-scm, \
             hatch-vcs) is not the one the repository's tags give",
            short()
        )),
    };
    let mut args = vec!["--quiet", "--no-recurse-submodules", "--filter=tree:0"];
    if scratch.path().join("shallow").exists() {
        args.push("--unshallow");
    }
    args.extend(["--", url, "+refs/tags/*:refs/tags/*"]);
    if let Err(error) = fetch(scratch, target, policy, &args).await {
        tracing::warn!(%error, "fetching the history for git describe failed; describing the commit alone");
        return incomplete(match error {
            ImportError::Git(GitError::TooLarge { max }) => {
                format!("fetching them passed the limit of {max} bytes, source.git_max_fetch_bytes")
            }
            error => error.to_string(),
        });
    }
    let describe = [
        "describe",
        "--tags",
        "--always",
        "--abbrev=7",
        "--match",
        "*[0-9]*",
        "--end-of-options",
        commit,
    ];
    let timeout = policy.fetch_timeout;
    let described = match run(
        scratch.path(),
        target.scheme,
        &describe,
        "describing the commit",
        timeout,
    )
    .await
    {
        Ok(output) => String::from_utf8_lossy(&output).trim().to_owned(),
        Err(error) => {
            tracing::warn!(%error, "git describe failed; describing the commit by its id");
            return incomplete(error.to_string());
        }
    };
    let count = ["rev-list", "--count", "--end-of-options", commit];
    let commits = run(
        scratch.path(),
        target.scheme,
        &count,
        "counting commits",
        timeout,
    )
    .await
    .ok()
    .and_then(|output| String::from_utf8_lossy(&output).trim().parse().ok())
    .unwrap_or(0);
    Described {
        describe: described,
        commits,
        warning: None,
    }
}

/// The contents of link objects (their targets) through one `git cat-file --batch`; `None`
/// for one longer than any path may be.
async fn read_link_targets(
    repository: &Path,
    scheme: Scheme,
    objects: &[&str],
    timeout: Duration,
) -> Result<Vec<Option<Vec<u8>>>, ImportError> {
    if objects.is_empty() {
        return Ok(Vec::new());
    }
    let (mut child, mut stdin, stdout) = cat_file_batch(repository, scheme)?;
    let request: Vec<u8> = objects
        .iter()
        .flat_map(|object| [object.as_bytes(), b"\n"].concat())
        .collect();
    let feeder = plinth_kit::tasks::spawn(async move {
        stdin.write_all(&request).await?;
        stdin.shutdown().await
    });
    let read = async {
        let mut reader = BufReader::new(stdout);
        let mut targets = Vec::with_capacity(objects.len());
        for object in objects {
            let mut header = String::new();
            reader.read_line(&mut header).await?;
            let mut fields = header.trim_end().split(' ');
            let (name, kind, size) = (
                fields.next().unwrap_or(""),
                fields.next().unwrap_or(""),
                fields.next().unwrap_or(""),
            );
            if name != *object || kind != "blob" {
                return Err(failed(format!(
                    "link object {object} is missing or not a blob"
                )));
            }
            let size: u64 = size
                .parse()
                .map_err(|_| failed("unexpected cat-file output"))?;
            let mut content = Vec::new();
            (&mut reader).take(size).read_to_end(&mut content).await?;
            if content.len() as u64 != size {
                return Err(failed("git cat-file ended early"));
            }
            let mut newline = [0u8; 1];
            reader.read_exact(&mut newline).await?;
            targets.push((content.len() <= MAX_PATH_BYTES).then_some(content));
        }
        Ok::<_, ImportError>(targets)
    };
    let targets = tokio::time::timeout(timeout, read)
        .await
        .map_err(|_| timed_out(timeout))??;
    feeder
        .await
        .map_err(|error| ImportError::Worker(error.to_string()))??;
    let _ = child.wait().await;
    Ok(targets)
}

/// Objects held against garbage collection in one transaction, at most.
const HOLD_BATCH: usize = 64;

/// An object read and not yet stored: its digest, bytes, and share of the memory budget.
type Pending = (Digest, Bytes, tokio::sync::OwnedSemaphorePermit);

/// Holds the objects read so far (one transaction), then stores each in the background.
async fn upload_pending(
    blobs: &BlobStore,
    holder: &dyn Holder,
    pending: &mut Vec<Pending>,
    uploads: &mut tokio::task::JoinSet<Result<plinth_blobs::Blob, plinth_blobs::BlobError>>,
) -> Result<(), ImportError> {
    if pending.is_empty() {
        return Ok(());
    }
    let digests: Vec<Digest> = pending.iter().map(|(digest, _, _)| *digest).collect();
    holder.hold(&digests).await?;
    for (_, bytes, permit) in pending.drain(..) {
        let blobs = blobs.clone();
        uploads.spawn(async move {
            let stored = blobs.put_bytes(bytes).await;
            drop(permit);
            stored
        });
    }
    Ok(())
}

/// `git cat-file --batch` in `repository`, with its standard input and output.
fn cat_file_batch(
    repository: &Path,
    scheme: Scheme,
) -> Result<
    (
        tokio::process::Child,
        tokio::process::ChildStdin,
        tokio::process::ChildStdout,
    ),
    ImportError,
> {
    let mut child = git(repository, scheme)
        .args(["cat-file", "--batch"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|error| failed(format!("cannot run git cat-file: {error}")))?;
    let stdin = child.stdin.take().ok_or_else(|| failed("no stdin"))?;
    let stdout = child.stdout.take().ok_or_else(|| failed("no stdout"))?;
    Ok((child, stdin, stdout))
}

/// Reads each blob through one `git cat-file --batch` and stores it.
async fn store_blobs(
    repository: &Path,
    scheme: Scheme,
    blobs: &BlobStore,
    files: &[(SourcePath, bool, String)],
    limits: Limits,
    holder: &dyn Holder,
) -> Result<Vec<(Digest, u64)>, ImportError> {
    let (mut child, mut stdin, stdout) = cat_file_batch(repository, scheme)?;
    let objects: Vec<String> = files.iter().map(|(_, _, object)| object.clone()).collect();
    let feeder = plinth_kit::tasks::spawn(async move {
        for object in objects {
            stdin.write_all(object.as_bytes()).await?;
            stdin.write_all(b"\n").await?;
        }
        stdin.shutdown().await
    });
    let mut reader = BufReader::new(stdout);
    let mut stored = Vec::with_capacity(files.len());
    let mut total: u64 = 0;
    let mut uploads = tokio::task::JoinSet::new();
    // Objects read, to be held in one transaction, then stored.
    let mut pending: Vec<Pending> = Vec::new();
    // Bytes read but not yet stored, in KiB: bounds memory whatever the repository holds.
    const BUDGET_KIB: u32 = 64 * 1024;
    let budget = Arc::new(tokio::sync::Semaphore::new(BUDGET_KIB as usize));
    for (path, _, object) in files {
        let mut header = String::new();
        reader.read_line(&mut header).await?;
        let mut fields = header.trim_end().split(' ');
        let (name, kind, size) = (
            fields.next().unwrap_or(""),
            fields.next().unwrap_or(""),
            fields.next().unwrap_or(""),
        );
        if name != object || kind != "blob" {
            return Err(failed(format!(
                "object {object} for {path} is missing or not a blob"
            )));
        }
        let size: u64 = size
            .parse()
            .map_err(|_| failed("unexpected cat-file output"))?;
        if size > limits.max_file_bytes {
            return Err(ImportError::Archive(
                crate::archive::ArchiveError::FileTooLarge {
                    path: path.to_string(),
                    max: limits.max_file_bytes,
                },
            ));
        }
        total += size;
        if total > limits.max_total_bytes {
            return Err(ImportError::Archive(
                crate::archive::ArchiveError::TooLarge {
                    max: limits.max_total_bytes,
                },
            ));
        }
        let kib = u32::try_from(size / 1024 + 1)
            .unwrap_or(BUDGET_KIB)
            .min(BUDGET_KIB);
        // Budget held by objects waiting to be held is given back before waiting for more.
        let permit = match budget.clone().try_acquire_many_owned(kib) {
            Ok(permit) => permit,
            Err(_) => {
                upload_pending(blobs, holder, &mut pending, &mut uploads).await?;
                budget
                    .clone()
                    .acquire_many_owned(kib)
                    .await
                    .map_err(|error| ImportError::Worker(error.to_string()))?
            }
        };
        let mut content = vec![0u8; usize::try_from(size).map_err(|_| failed("object too large"))?];
        reader.read_exact(&mut content).await?;
        let mut newline = [0u8; 1];
        reader.read_exact(&mut newline).await?;
        let bytes = Bytes::from(content);
        let digest = Digest::of(&bytes);
        stored.push((digest, size));
        pending.push((digest, bytes, permit));
        if pending.len() >= HOLD_BATCH {
            upload_pending(blobs, holder, &mut pending, &mut uploads).await?;
        }
        while let Some(done) = uploads.try_join_next() {
            done.map_err(|error| ImportError::Worker(error.to_string()))??;
        }
    }
    upload_pending(blobs, holder, &mut pending, &mut uploads).await?;
    while let Some(done) = uploads.join_next().await {
        done.map_err(|error| ImportError::Worker(error.to_string()))??;
    }
    feeder
        .await
        .map_err(|error| ImportError::Worker(error.to_string()))??;
    let _ = child.wait().await;
    Ok(stored)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// Answers every name with the same addresses, and counts the questions.
    struct Answer(Vec<IpAddr>, AtomicUsize);

    impl Resolve for Answer {
        fn resolve<'a>(
            &'a self,
            _name: &'a str,
        ) -> plinth_sandbox::egress::proxy::BoxFuture<'a, std::io::Result<Vec<IpAddr>>> {
            self.1.fetch_add(1, Ordering::SeqCst);
            Box::pin(std::future::ready(Ok(self.0.clone())))
        }
    }

    fn answering(addresses: &[&str]) -> (GitPolicy, Arc<Answer>) {
        let answer = Arc::new(Answer(
            addresses.iter().map(|a| a.parse().expect("ip")).collect(),
            AtomicUsize::new(0),
        ));
        let policy = GitPolicy {
            allowed_schemes: vec!["http".into(), "https".into()],
            resolver: answer.clone(),
            ..GitPolicy::default()
        };
        (policy, answer)
    }

    fn message(error: ImportError) -> String {
        error.to_string()
    }

    #[tokio::test]
    async fn a_name_that_resolves_to_no_address_is_out_of_reach_not_refused() {
        let (policy, asked) = answering(&[]);
        let error = check_url("https://empty.example/repo.git", &policy)
            .await
            .expect_err("nothing to reach");
        assert_eq!(asked.1.load(Ordering::SeqCst), 1);
        assert!(
            matches!(error, ImportError::Git(GitError::Unreachable(_))),
            "{error:?}"
        );
        assert!(message(error).contains("resolves to no address"));
    }

    #[tokio::test]
    async fn urls_are_checked_against_the_policy() {
        let strict = GitPolicy::default();
        for url in [
            "ext::sh -c touch% /tmp/pwned",
            "ssh://git@example.com/repo.git",
            "git://example.com/repo.git",
            "file:///etc",
            "http://example.com/repo.git",
            "https://127.0.0.1/repo.git",
            "https://[::1]/repo.git",
            "https://[::ffff:127.0.0.1]/repo.git",
            "https://10.0.0.8/repo.git",
            "https://169.254.169.254/latest",
            "https://user@192.168.1.1:8443/repo.git",
            "https://2130706433/repo.git",
            "https://0x7f.1/repo.git",
            "-oProxyCommand=evil",
        ] {
            assert!(
                check_url(url, &strict).await.is_err(),
                "{url} must be refused"
            );
        }
        let open = GitPolicy {
            allowed_schemes: vec!["file".into(), "http".into(), "https".into()],
            allow_private_addresses: true,
            ..GitPolicy::default()
        };
        assert_eq!(
            check_url("file:///srv/repo", &open).await.ok(),
            Some(Target {
                scheme: Scheme::File,
                pin: None
            })
        );
        assert_eq!(
            check_url("http://127.0.0.1:9/repo.git", &open).await.ok(),
            Some(Target {
                scheme: Scheme::Http,
                pin: None
            })
        );
        assert!(check_url("ext::sh", &open).await.is_err());
    }

    #[tokio::test]
    async fn a_name_is_resolved_once_and_pinned_to_every_address_it_gave() {
        let (policy, answer) = answering(&["140.82.112.3", "2606:4700::1111"]);
        for (url, port) in [
            ("https://Git.Example.com/org/repo.git", 443),
            ("http://git.example.com/org/repo.git", 80),
            (
                "https://user:secret@git.example.com:8443/repo.git?x#y",
                8443,
            ),
        ] {
            let target = check_url(url, &policy).await.expect(url);
            assert_eq!(
                target.pin.map(|pin| pin.curl_resolve()),
                Some(format!(
                    "git.example.com:{port}:140.82.112.3,[2606:4700::1111]"
                )),
                "{url}"
            );
        }
        assert_eq!(answer.1.load(Ordering::SeqCst), 3, "one lookup per URL");
    }

    #[test]
    fn what_git_says_of_a_server_out_of_reach_is_told_from_the_callers_mistakes() {
        for stderr in [
            "fatal: unable to access 'http://127.0.0.1:1/x.git/': Failed to connect to 127.0.0.1 port 1 after 0 ms: Couldn't connect to server\n",
            "fatal: unable to access 'https://nothing.invalid/x.git/': Could not resolve host: nothing.invalid\n",
            "error: RPC failed; HTTP 503 curl 22 The requested URL returned error: 503\nfatal: expected flush after ref listing\n",
            "fatal: unable to access 'https://git.example.com/x.git/': Recv failure: Connection reset by peer\n",
        ] {
            let line = unreachable(stderr).unwrap_or_else(|| panic!("{stderr}"));
            assert!(!line.is_empty() && !line.contains('\n'), "{line:?}");
        }
        for stderr in [
            "fatal: couldn't find remote ref no-such-branch\n",
            "fatal: repository 'https://git.example.com/x.git/' not found\n",
            "fatal: unable to access 'https://git.example.com/x.git/': The requested URL returned error: 404\n",
            "fatal: unable to access 'https://git.example.com/x.git/': The requested URL returned error: 301\n",
        ] {
            assert_eq!(unreachable(stderr), None, "{stderr}");
        }
    }

    #[tokio::test]
    async fn a_name_with_any_address_that_is_not_public_is_refused() {
        for addresses in [
            &["127.0.0.1"][..],
            &["140.82.112.3", "10.0.0.1"],
            &["2606:4700::1111", "::ffff:169.254.169.254"],
            &["64:ff9b::808:808"],
        ] {
            let (policy, _) = answering(addresses);
            let error = check_url("https://git.example.com/repo.git", &policy)
                .await
                .expect_err("refused");
            assert!(
                matches!(error, ImportError::Git(GitError::Refused(_))),
                "{addresses:?}: {error}"
            );
            let message = message(error);
            assert!(message.contains("git.example.com"), "{message}");
            // Which internal address the name resolved to is not echoed.
            for address in addresses {
                assert!(!message.contains(address), "{message}");
            }
        }
        let (mut policy, _) = answering(&["127.0.0.1"]);
        policy.allow_private_addresses = true;
        let target = check_url("http://git.example.com:8080/repo.git", &policy)
            .await
            .expect("allowed by configuration");
        assert_eq!(
            target.pin.map(|pin| pin.curl_resolve()).as_deref(),
            Some("git.example.com:8080:127.0.0.1"),
            "still pinned to the address checked"
        );
    }

    #[tokio::test]
    async fn authorities_another_parser_could_read_differently_are_refused() {
        let (policy, answer) = answering(&["140.82.112.3"]);
        for url in [
            "https://a@b@git.example.com/repo.git",
            "https://git.example.com./repo.git",
            "https://git.example.com:/repo.git",
            "https://git.example.com:+443/repo.git",
            "https://git.example.com:0/repo.git",
            "https://git.example.com:65536/repo.git",
            "https://git.example.com:443:443/repo.git",
            "https://[2606:4700::1111]x/repo.git",
            "https://evil.example\\@git.example.com/repo.git",
            "https:///repo.git",
        ] {
            assert!(
                matches!(
                    check_url(url, &policy).await,
                    Err(ImportError::Git(GitError::Refused(_)))
                ),
                "{url} must be refused"
            );
        }
        assert_eq!(answer.1.load(Ordering::SeqCst), 0, "nothing was resolved");
    }

    #[test]
    fn git_versions_are_read_for_the_pin() {
        assert_eq!(parse_version("git version 2.47.3\n"), Some((2, 47)));
        assert_eq!(parse_version("git version 2.37.0.windows.1"), Some((2, 37)));
        assert_eq!(parse_version("git version 2.34.1"), Some((2, 34)));
        assert!(parse_version("git version 2.34.1").is_some_and(|v| v < PIN_SINCE));
        assert_eq!(parse_version("not git"), None);
    }

    #[test]
    fn a_redirect_is_recognised_in_what_git_reports() {
        let stderr = "fatal: unable to access 'http://example.test/repo.git/': The requested URL returned error: 301\n";
        assert_eq!(redirect_status(stderr), Some(301));
        assert_eq!(
            redirect_status("The requested URL returned error: 302"),
            Some(302)
        );
        assert_eq!(
            redirect_status("The requested URL returned error: 404"),
            None
        );
        assert_eq!(redirect_status("The requested URL returned error: 3"), None);
        assert_eq!(redirect_status("fatal: repository not found"), None);
    }
}
