//! Git imports. The repository is fetched by the `git` program into a private bare
//! repository (no working tree, no checkout, so no hooks, submodules or LFS filters ever run),
//! then read object by object: `ls-tree` for the tree, `cat-file --batch` for the blobs.
//! libgit2 cannot speak HTTPS without OpenSSL, which this project does not link; `git`
//! itself is the reference implementation of the protocol.
//!
//! URLs are checked first: the scheme must be allowed (https only by default; `ext::` and
//! friends never), and an http(s) host must not resolve to a loopback, private or link-local
//! address unless configuration allows it.

use std::net::IpAddr;
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use plinth_blobs::{BlobStore, Digest};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::Command;

use crate::archive::Limits;
use crate::import::{ImportError, Imported};
use crate::paths::SourcePath;
use crate::persistence::{IndexEntry, Kind};

/// What git imports may reach.
#[derive(Debug, Clone)]
pub struct GitPolicy {
    /// URL schemes allowed: some of `https`, `http`, `file`.
    pub allowed_schemes: Vec<String>,
    /// Whether hosts may resolve to loopback, private or link-local addresses.
    pub allow_private_addresses: bool,
    /// Longest a fetch may take.
    pub fetch_timeout: Duration,
}

impl Default for GitPolicy {
    fn default() -> Self {
        GitPolicy {
            allowed_schemes: vec!["https".to_owned()],
            allow_private_addresses: false,
            fetch_timeout: Duration::from_secs(300),
        }
    }
}

/// Why a git import was refused.
#[derive(Debug, thiserror::Error)]
pub enum GitError {
    /// The URL is not allowed.
    #[error("{0}")]
    Refused(String),
    /// `git` failed.
    #[error("git failed: {0}")]
    Failed(String),
}

fn refused(message: impl Into<String>) -> ImportError {
    ImportError::Git(GitError::Refused(message.into()))
}

fn failed(message: impl Into<String>) -> ImportError {
    ImportError::Git(GitError::Failed(message.into()))
}

/// Checks `url` against the policy.
pub async fn check_url(url: &str, policy: &GitPolicy) -> Result<String, ImportError> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(refused(format!(
            "{url:?} is not a URL with a scheme such as https://"
        )));
    };
    let scheme = scheme.to_ascii_lowercase();
    if !matches!(scheme.as_str(), "https" | "http" | "file") {
        return Err(refused(format!(
            "scheme {scheme:?} is never allowed; use https://"
        )));
    }
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
    if scheme == "file" {
        return Ok(scheme);
    }
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host_port = authority.rsplit('@').next().unwrap_or(authority);
    if host_port.is_empty() {
        return Err(refused("the URL has no host"));
    }
    let with_port = if host_port.starts_with('[') {
        if host_port.contains("]:") {
            host_port.to_owned()
        } else {
            format!("{host_port}:443")
        }
    } else if host_port.contains(':') {
        host_port.to_owned()
    } else {
        format!("{host_port}:443")
    };
    if !policy.allow_private_addresses {
        let addresses = tokio::net::lookup_host(with_port.as_str())
            .await
            .map_err(|error| refused(format!("cannot resolve {host_port}: {error}")))?;
        for address in addresses {
            if is_private(address.ip()) {
                return Err(refused(format!(
                    "{host_port} resolves to {}, a loopback, private or link-local address",
                    address.ip()
                )));
            }
        }
    }
    Ok(scheme)
}

fn is_private(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, ..] = v4.octets();
            v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_broadcast()
                || v4.is_multicast()
                || (a == 100 && (64..128).contains(&b))
        }
        IpAddr::V6(v6) => {
            let first = v6.segments()[0];
            v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (first & 0xfe00) == 0xfc00
                || (first & 0xffc0) == 0xfe80
                || v6
                    .to_ipv4_mapped()
                    .is_some_and(|v4| is_private(IpAddr::V4(v4)))
        }
    }
}

fn git(repository: &Path, scheme: &str) -> Command {
    let mut command = Command::new("git");
    command
        .arg("-C")
        .arg(repository)
        .args(["-c", "protocol.allow=never"])
        .arg("-c")
        .arg(format!("protocol.{scheme}.allow=always"))
        .args([
            "-c",
            "core.hooksPath=/dev/null",
            "-c",
            "transfer.fsckObjects=true",
        ])
        .args(["-c", "submodule.recurse=false", "-c", "credential.helper="])
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", repository)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_TERMINAL_PROMPT", "0")
        .env("GIT_LFS_SKIP_SMUDGE", "1")
        .env("GIT_PROTOCOL_FROM_USER", "0")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    command
}

async fn run(
    repository: &Path,
    scheme: &str,
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
        .map_err(|_| failed(format!("{what} took longer than {} s", timeout.as_secs())))?
        .map_err(|error| failed(format!("cannot run git for {what}: {error}")))?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let last = stderr
            .lines()
            .rev()
            .find(|line| !line.trim().is_empty())
            .unwrap_or("");
        return Err(failed(format!("{what}: {last}")));
    }
    Ok(output.stdout)
}

/// Fetches `reference` (branch, tag or commit; empty: the default branch) of `url` and
/// stores every regular file of its tree as a blob.
pub async fn import(
    blobs: &BlobStore,
    spool_dir: &Path,
    limits: Limits,
    policy: &GitPolicy,
    url: &str,
    reference: &str,
) -> Result<Imported, ImportError> {
    let scheme = check_url(url, policy).await?;
    if reference.starts_with('-') || reference.chars().any(|c| c.is_control() || c == ' ') {
        return Err(refused(format!(
            "{reference:?} is not a branch, tag or commit"
        )));
    }
    std::fs::create_dir_all(spool_dir)?;
    let scratch = tempfile::tempdir_in(spool_dir)?;
    let repository = scratch.path();
    let timeout = policy.fetch_timeout;
    run(
        repository,
        &scheme,
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
    let fetch = ["fetch", "--quiet", "--no-tags", "--no-recurse-submodules"];
    let shallow = [&fetch[..], &["--depth", "1", "--", url, wanted]].concat();
    let shallow = run(repository, &scheme, &shallow, "git fetch", timeout).await;
    if let Err(error) = shallow {
        // Some servers refuse a commit id in a shallow fetch; a full fetch can still find it.
        if !(wanted.len() >= 7 && wanted.bytes().all(|b| b.is_ascii_hexdigit())) {
            return Err(error);
        }
        let full = [&fetch[..], &["--", url, "+refs/*:refs/remotes/origin/*"]].concat();
        run(repository, &scheme, &full, "git fetch", timeout).await?;
        let resolve = ["update-ref", "FETCH_HEAD", wanted];
        run(
            repository,
            &scheme,
            &resolve,
            "resolving the commit",
            timeout,
        )
        .await?;
    }
    let list = [
        "ls-tree",
        "-r",
        "-t",
        "-z",
        "--full-tree",
        "FETCH_HEAD^{tree}",
    ];
    let listing = run(repository, &scheme, &list, "reading the tree", timeout).await?;

    let mut imported = Imported::default();
    let mut files: Vec<(SourcePath, bool, String)> = Vec::new();
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
    let stored = store_blobs(repository, &scheme, blobs, &files, limits).await?;
    for ((path, executable, _), (digest, size)) in files.into_iter().zip(stored) {
        imported.entries.push(IndexEntry {
            path,
            kind: Kind::File,
            digest: Some(digest),
            size,
            executable,
        });
    }
    imported.entries.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(imported)
}

/// Reads each blob through one `git cat-file --batch` and stores it.
async fn store_blobs(
    repository: &Path,
    scheme: &str,
    blobs: &BlobStore,
    files: &[(SourcePath, bool, String)],
    limits: Limits,
) -> Result<Vec<(Digest, u64)>, ImportError> {
    let mut child = git(repository, scheme)
        .args(["cat-file", "--batch"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|error| failed(format!("cannot run git cat-file: {error}")))?;
    let mut stdin = child.stdin.take().ok_or_else(|| failed("no stdin"))?;
    let stdout = child.stdout.take().ok_or_else(|| failed("no stdout"))?;
    let objects: Vec<String> = files.iter().map(|(_, _, object)| object.clone()).collect();
    let feeder = tokio::spawn(async move {
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
        let permit = budget
            .clone()
            .acquire_many_owned(kib)
            .await
            .map_err(|error| ImportError::Worker(error.to_string()))?;
        let mut content = vec![0u8; usize::try_from(size).map_err(|_| failed("object too large"))?];
        reader.read_exact(&mut content).await?;
        let mut newline = [0u8; 1];
        reader.read_exact(&mut newline).await?;
        let bytes = Bytes::from(content);
        stored.push((Digest::of(&bytes), size));
        let blobs = blobs.clone();
        uploads.spawn(async move {
            let stored = blobs.put_bytes(bytes).await;
            drop(permit);
            stored
        });
        while let Some(done) = uploads.try_join_next() {
            done.map_err(|error| ImportError::Worker(error.to_string()))??;
        }
    }
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
    use super::*;

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
            "https://10.0.0.8/repo.git",
            "https://169.254.169.254/latest",
            "https://user@192.168.1.1:8443/repo.git",
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
            check_url("file:///srv/repo", &open).await.ok().as_deref(),
            Some("file")
        );
        assert_eq!(
            check_url("http://127.0.0.1:9/repo.git", &open)
                .await
                .ok()
                .as_deref(),
            Some("http")
        );
        assert!(check_url("ext::sh", &open).await.is_err());
    }
}
