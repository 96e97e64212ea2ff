//! Layers: what a build produced, described entry by entry (ARCHITECTURE §2, §3.5), and the
//! packages in it.
//!
//! [`scan`] walks the built directory without following any link: a symlink is recorded as a
//! symlink with its target text, wherever it points (an installer's link that escapes the root
//! is the node's to refuse or keep, never the builder's to follow). Regular files are hashed
//! while streaming, several at a time. Anything else (FIFOs, sockets, devices) and names that are not UTF-8 are
//! skipped and counted. The scan runs after every build process is dead (the sandbox's PID
//! namespace ends with its command), so nothing can swap a file under it; all the same, every
//! path is resolved beneath the scanned directory following no link, and only regular files
//! are opened ([`crate::beneath`]).
//!
//! Packages are read from the files, never by running a package manager:
//! `.venv/lib/python*/site-packages/*.dist-info/METADATA` (`Name:`/`Version:`, manager `pip`) and
//! `package.json` of every package under `node_modules/` (scoped `@scope/name` and nested
//! `node_modules` included, `.bin` and other dot-directories not), manager `npm`.

use std::io::Read;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use rustix::fs::FileType;

use crate::beneath;

use plinth_blobs::Digest;
use serde::Serialize;
use sha2::Digest as _;

/// Package metadata files larger than this are not read (a METADATA's long description can be
/// big, but its headers come first; a package.json this big is not a package's).
const METADATA_MAX_BYTES: u64 = 1024 * 1024;
/// At most this many threads hash a layer's files.
const HASH_THREADS: usize = 8;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum EntryKind {
    #[serde(rename = "file")]
    File,
    #[serde(rename = "dir")]
    Directory,
    #[serde(rename = "symlink")]
    Symlink,
}

/// One entry of a layer; `path` is relative to the layer's root, `/`-separated.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LayerEntry {
    pub path: String,
    pub kind: EntryKind,
    /// Any execute bit is set (files only).
    pub executable: bool,
    /// Bytes of a file; 0 for directories and symlinks.
    pub size: u64,
    /// A file's content digest.
    #[serde(serialize_with = "serialize_digest")]
    pub digest: Option<Digest>,
    /// A symlink's target, as written.
    pub target: Option<String>,
}

/// An installed package.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct Package {
    /// `pip` or `npm`.
    pub manager: String,
    pub name: String,
    pub version: String,
}

/// A built directory, described.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Layer {
    /// Every entry under the root (not the root itself), sorted by path.
    pub entries: Vec<LayerEntry>,
    /// Installed packages, deduplicated, sorted by manager, name, version.
    pub packages: Vec<Package>,
    /// The total size of the files.
    pub bytes: u64,
    /// Entries left out: not a file, directory or symlink, or a name that is not UTF-8 (a
    /// directory counts once, with everything under it).
    pub skipped: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum LayerError {
    #[error("reading {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

fn serialize_digest<S: serde::Serializer>(
    digest: &Option<Digest>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    match digest {
        Some(digest) => serializer.serialize_some(&digest.to_string()),
        None => serializer.serialize_none(),
    }
}

/// Describes every entry under `dir` and the packages installed there. Blocking: run it on a
/// blocking thread.
pub fn scan(dir: &Path) -> Result<Layer, LayerError> {
    let io = |path: &Path| {
        let path = dir.join(path);
        move |source| LayerError::Io { path, source }
    };
    let root = beneath::open_root(dir).map_err(io(Path::new("")))?;
    let mut entries = Vec::new();
    // (index in `entries`, path relative to `dir`) of every regular file.
    let mut files: Vec<(usize, PathBuf)> = Vec::new();
    let mut skipped = 0u64;
    let mut failed = None;
    let walked = beneath::walk(&root, "", &mut |walked| {
        if failed.is_some() {
            return false;
        }
        // Layer paths are UTF-8: a name that is not is skipped with all beneath it.
        let Some(path) = walked.rel.to_str().map(str::to_owned) else {
            skipped += 1;
            return false;
        };
        let entry = match beneath::kind(walked.stat) {
            FileType::Symlink => {
                let target = match beneath::read_link(walked.dir, walked.name) {
                    Ok(target) => target,
                    Err(error) => {
                        failed = Some((walked.rel.to_owned(), error));
                        return false;
                    }
                };
                let Some(target) = target.to_str().map(str::to_owned) else {
                    skipped += 1;
                    return false;
                };
                LayerEntry {
                    path,
                    kind: EntryKind::Symlink,
                    executable: false,
                    size: 0,
                    digest: None,
                    target: Some(target),
                }
            }
            FileType::Directory => LayerEntry {
                path,
                kind: EntryKind::Directory,
                executable: false,
                size: 0,
                digest: None,
                target: None,
            },
            FileType::RegularFile => {
                // Hashed below, with the others.
                files.push((entries.len(), walked.rel.to_owned()));
                LayerEntry {
                    path,
                    kind: EntryKind::File,
                    executable: walked.stat.st_mode & 0o111 != 0,
                    size: 0,
                    digest: None,
                    target: None,
                }
            }
            _ => {
                skipped += 1;
                return false;
            }
        };
        entries.push(entry);
        true
    });
    if let Some((path, source)) = failed {
        return Err(io(&path)(source));
    }
    walked.map_err(io(Path::new("")))?;
    let mut bytes = 0u64;
    for ((index, _), hashed) in files.iter().zip(hash_files(dir, &root, &files)?) {
        let (size, digest) = hashed;
        bytes += size;
        entries[*index].size = size;
        entries[*index].digest = Some(digest);
    }
    entries.sort_unstable_by(|a, b| a.path.cmp(&b.path));
    let packages = packages(&root, &entries);
    Ok(Layer {
        entries,
        packages,
        bytes,
        skipped,
    })
}

/// The size and digest of each file, in order, hashed on as many threads as there are cores
/// (up to [`HASH_THREADS`]): a layer is thousands of small files, and each costs system calls
/// as well as hashing.
fn hash_files(
    dir: &Path,
    root: &OwnedFd,
    files: &[(usize, PathBuf)],
) -> Result<Vec<(u64, Digest)>, LayerError> {
    let hash = |path: &PathBuf| {
        hash_file(root, path).map_err(|source| LayerError::Io {
            path: dir.join(path),
            source,
        })
    };
    let threads = std::thread::available_parallelism()
        .map_or(1, std::num::NonZero::get)
        .min(HASH_THREADS)
        .min(files.len() / 64 + 1);
    if threads <= 1 {
        return files.iter().map(|(_, path)| hash(path)).collect();
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let mut hashed: Vec<Option<(u64, Digest)>> = vec![None; files.len()];
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    let mut done = Vec::new();
                    loop {
                        let at = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some((_, path)) = files.get(at) else {
                            return Ok(done);
                        };
                        done.push((at, hash(path)?));
                    }
                })
            })
            .collect();
        for worker in workers {
            let done = worker.join().map_err(|_| LayerError::Io {
                path: PathBuf::new(),
                source: std::io::Error::other("a hashing thread panicked"),
            })??;
            for (at, result) in done {
                hashed[at] = Some(result);
            }
        }
        Ok(())
    })?;
    // Every index was taken by some thread, and every thread finished without an error.
    Ok(hashed.into_iter().flatten().collect())
}

/// The size and digest of the file `path` beneath `root`, read in chunks (files can be far
/// larger than memory).
fn hash_file(root: &OwnedFd, path: &Path) -> std::io::Result<(u64, Digest)> {
    let (mut file, _) = beneath::open_regular(root, path)?;
    let mut hasher = sha2::Sha256::new();
    let mut buffer = vec![0u8; 256 * 1024];
    let mut size = 0u64;
    loop {
        let read = match file.read(&mut buffer) {
            Ok(0) => break,
            Ok(read) => read,
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(error) => return Err(error),
        };
        hasher.update(&buffer[..read]);
        size += read as u64;
    }
    Ok((size, Digest::from_bytes(hasher.finalize().into())))
}

/// The packages among `entries`. A metadata file that cannot be read or parsed names no package
/// (a broken package's files are still in the layer; its name is just not listed).
fn packages(root: &OwnedFd, entries: &[LayerEntry]) -> Vec<Package> {
    let mut packages: Vec<Package> = entries
        .iter()
        .filter(|entry| entry.kind == EntryKind::File && entry.size <= METADATA_MAX_BYTES)
        .filter_map(|entry| {
            if is_dist_info_metadata(&entry.path) {
                let text = read_text(root, &entry.path)?;
                let (name, version) = parse_metadata(&text)?;
                Some(package("pip", name, version))
            } else if is_npm_package_json(&entry.path) {
                let text = read_text(root, &entry.path)?;
                let (name, version) = parse_package_json(&text)?;
                Some(package("npm", name, version))
            } else {
                None
            }
        })
        .collect();
    packages.sort_unstable();
    packages.dedup();
    packages
}

fn package(manager: &str, name: String, version: String) -> Package {
    Package {
        manager: manager.to_owned(),
        name,
        version,
    }
}

fn read_text(root: &OwnedFd, path: &str) -> Option<String> {
    let bytes = beneath::read_small(root, path, METADATA_MAX_BYTES)?;
    String::from_utf8(bytes).ok()
}

/// `.venv/lib/python<X>/site-packages/<dist>.dist-info/METADATA`.
fn is_dist_info_metadata(path: &str) -> bool {
    let parts: Vec<&str> = path.split('/').collect();
    matches!(
        parts.as_slice(),
        [".venv", "lib", python, "site-packages", dist_info, "METADATA"]
            if python.starts_with("python") && dist_info.ends_with(".dist-info")
    )
}

/// `node_modules/<pkg>[/node_modules/<pkg>]…/package.json`, where `<pkg>` is `name` or
/// `@scope/name` and never a dot-directory (`.bin`, `.cache`).
fn is_npm_package_json(path: &str) -> bool {
    let Some(dir) = path.strip_suffix("/package.json") else {
        return false;
    };
    let parts: Vec<&str> = dir.split('/').collect();
    let mut rest = parts.as_slice();
    if rest.is_empty() {
        return false;
    }
    while !rest.is_empty() {
        let [modules, name, tail @ ..] = rest else {
            return false;
        };
        if *modules != "node_modules" || name.is_empty() || name.starts_with('.') {
            return false;
        }
        rest = tail;
        if name.starts_with('@') {
            let [scoped, tail @ ..] = rest else {
                return false;
            };
            if scoped.is_empty() || scoped.starts_with('.') {
                return false;
            }
            rest = tail;
        }
    }
    true
}

/// `Name` and `Version` from core metadata's header block (RFC 822 style: it ends at the first
/// empty line; the description may follow).
fn parse_metadata(text: &str) -> Option<(String, String)> {
    let mut name = None;
    let mut version = None;
    for line in text.lines() {
        if line.is_empty() {
            break;
        }
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        if key.eq_ignore_ascii_case("name") && name.is_none() && !value.is_empty() {
            name = Some(value.to_owned());
        } else if key.eq_ignore_ascii_case("version") && version.is_none() && !value.is_empty() {
            version = Some(value.to_owned());
        }
    }
    Some((name?, version?))
}

fn parse_package_json(text: &str) -> Option<(String, String)> {
    #[derive(serde::Deserialize)]
    struct PackageJson {
        name: Option<String>,
        version: Option<String>,
    }
    let parsed: PackageJson = serde_json::from_str(text).ok()?;
    let name = parsed.name.filter(|name| !name.is_empty())?;
    let version = parsed.version.filter(|version| !version.is_empty())?;
    Some((name, version))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::fs::symlink;

    fn write(root: &Path, path: &str, content: &str) {
        let path = root.join(path);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(path, content).expect("write");
    }

    fn entry<'a>(layer: &'a Layer, path: &str) -> &'a LayerEntry {
        layer
            .entries
            .iter()
            .find(|entry| entry.path == path)
            .unwrap_or_else(|| panic!("no entry {path}"))
    }

    #[test]
    fn files_directories_and_symlinks_are_described_without_following_links() {
        let outside = tempfile::tempdir().expect("tempdir");
        write(outside.path(), "secret", "do not read");
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        write(root, "a.txt", "hello");
        write(root, "bin/tool", "#!/bin/sh\n");
        std::fs::set_permissions(
            root.join("bin/tool"),
            std::fs::Permissions::from_mode(0o755),
        )
        .expect("chmod");
        std::fs::create_dir(root.join("empty")).expect("mkdir");
        symlink("../a.txt", root.join("bin/link")).expect("symlink");
        symlink(outside.path(), root.join("escape")).expect("symlink");
        symlink(outside.path().join("secret"), root.join("escape-file")).expect("symlink");
        let status = std::process::Command::new("mkfifo")
            .arg(root.join("fifo"))
            .status()
            .expect("mkfifo");
        assert!(status.success());

        let layer = scan(root).expect("scan");
        let paths: Vec<&str> = layer
            .entries
            .iter()
            .map(|entry| entry.path.as_str())
            .collect();
        assert_eq!(
            paths,
            [
                "a.txt",
                "bin",
                "bin/link",
                "bin/tool",
                "empty",
                "escape",
                "escape-file"
            ]
        );
        let text = entry(&layer, "a.txt");
        assert_eq!(text.kind, EntryKind::File);
        assert_eq!(text.size, 5);
        assert_eq!(text.digest, Some(Digest::of(b"hello")));
        assert!(!text.executable);
        assert!(entry(&layer, "bin/tool").executable);
        assert_eq!(entry(&layer, "bin").kind, EntryKind::Directory);
        assert_eq!(entry(&layer, "empty").kind, EntryKind::Directory);
        let link = entry(&layer, "bin/link");
        assert_eq!(link.kind, EntryKind::Symlink);
        assert_eq!(link.target.as_deref(), Some("../a.txt"));
        assert_eq!(link.digest, None);
        let escape = entry(&layer, "escape");
        assert_eq!(escape.kind, EntryKind::Symlink);
        assert_eq!(
            escape.target.as_deref(),
            Some(outside.path().to_str().expect("utf-8"))
        );
        assert_eq!(entry(&layer, "escape-file").kind, EntryKind::Symlink);
        assert_eq!(layer.skipped, 1, "the fifo");
        assert_eq!(layer.bytes, 5 + 10);
        assert!(layer.packages.is_empty());

        let json = serde_json::to_value(&layer).expect("json");
        assert_eq!(json["entries"][0]["kind"], "file");
        assert_eq!(
            json["entries"][0]["digest"],
            Digest::of(b"hello").to_string()
        );
        assert_eq!(json["entries"][1]["kind"], "dir");
    }

    #[test]
    fn many_files_are_hashed_in_parallel_each_to_its_own_entry() {
        let dir = tempfile::tempdir().expect("tempdir");
        for n in 0..500 {
            write(dir.path(), &format!("d{}/f{n}", n % 7), &"x".repeat(n));
        }
        let layer = scan(dir.path()).expect("scan");
        for n in 0..500 {
            let file = entry(&layer, &format!("d{}/f{n}", n % 7));
            assert_eq!(file.size, n as u64);
            assert_eq!(file.digest, Some(Digest::of("x".repeat(n).as_bytes())));
        }
        assert_eq!(layer.bytes, (0..500u64).sum::<u64>());
        assert_eq!(layer.entries.len(), 507);
    }

    #[test]
    fn packages_come_from_dist_info_and_node_modules() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        let site = ".venv/lib/python3.11/site-packages";
        write(
            root,
            &format!("{site}/tinypkg-1.0.dist-info/METADATA"),
            "Metadata-Version: 2.1\nName: tinypkg\nVersion: 1.0\n\nName: not-this\n",
        );
        write(
            root,
            &format!("{site}/Other_Pkg-2.0.dist-info/METADATA"),
            "Metadata-Version: 2.1\nName: Other_Pkg\nSummary: x\nVersion: 2.0\n",
        );
        write(
            root,
            &format!("{site}/broken.dist-info/METADATA"),
            "Name: broken\n",
        );
        write(
            root,
            "node_modules/a/package.json",
            r#"{"name":"a","version":"1.0.0"}"#,
        );
        write(
            root,
            "node_modules/a/lib/package.json",
            r#"{"name":"not-a-package","version":"9"}"#,
        );
        write(
            root,
            "node_modules/@scope/b/package.json",
            r#"{"name":"@scope/b","version":"2.0.0"}"#,
        );
        write(
            root,
            "node_modules/a/node_modules/c/package.json",
            r#"{"name":"c","version":"0.1.0"}"#,
        );
        write(
            root,
            "node_modules/@scope/b/node_modules/@x/d/package.json",
            r#"{"name":"@x/d","version":"4.0.0"}"#,
        );
        write(
            root,
            "node_modules/c/package.json",
            r#"{"name":"c","version":"0.1.0"}"#,
        );
        write(
            root,
            "node_modules/.bin/package.json",
            r#"{"name":"bin","version":"1"}"#,
        );
        write(root, "node_modules/bad/package.json", "not json");
        write(root, "package.json", r#"{"name":"project","version":"1"}"#);
        write(
            root,
            "sub/node_modules/e/package.json",
            r#"{"name":"e","version":"1"}"#,
        );

        let layer = scan(root).expect("scan");
        let found: Vec<(&str, &str, &str)> = layer
            .packages
            .iter()
            .map(|p| (p.manager.as_str(), p.name.as_str(), p.version.as_str()))
            .collect();
        assert_eq!(
            found,
            [
                ("npm", "@scope/b", "2.0.0"),
                ("npm", "@x/d", "4.0.0"),
                ("npm", "a", "1.0.0"),
                ("npm", "c", "0.1.0"),
                ("pip", "Other_Pkg", "2.0"),
                ("pip", "tinypkg", "1.0"),
            ]
        );
    }

    #[test]
    fn package_paths_are_matched_exactly() {
        assert!(is_npm_package_json("node_modules/a/package.json"));
        assert!(is_npm_package_json("node_modules/@s/a/package.json"));
        assert!(is_npm_package_json(
            "node_modules/a/node_modules/@s/b/package.json"
        ));
        assert!(!is_npm_package_json("node_modules/package.json"));
        assert!(!is_npm_package_json("node_modules/@s/package.json"));
        assert!(!is_npm_package_json("node_modules/a/x/package.json"));
        assert!(!is_npm_package_json("node_modules/.bin/package.json"));
        assert!(!is_npm_package_json("package.json"));
        assert!(is_dist_info_metadata(
            ".venv/lib/python3.12/site-packages/x-1.dist-info/METADATA"
        ));
        assert!(!is_dist_info_metadata(
            ".venv/lib/python3.12/site-packages/x/y.dist-info/METADATA"
        ));
        assert!(!is_dist_info_metadata(
            "lib/python3.12/site-packages/x-1.dist-info/METADATA"
        ));
    }
}
