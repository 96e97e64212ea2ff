//! Test fixtures: a tiny wheel, a tiny npm package, a tools directory with uv, scratch
//! projects, and checks for what the tests need from the machine.
//!
//! Fixtures live under /var/tmp, not /tmp: the sandbox gives each build its own /tmp, so
//! anything a build must read (find-links, tarballs, tools) has to be elsewhere, and readable
//! by the build's uid along the whole path.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use plinth_builder::{InstallError, InstallOptions, InstallReport, install};
use sha2::Digest as _;

/// Whether a prerequisite is there. Missing outside CI: the test says why and skips. Missing
/// in CI (`CI` set): the test fails, so CI never passes by skipping.
pub fn require(what: &str, present: bool) -> bool {
    if present {
        return true;
    }
    if std::env::var_os("CI").is_some() {
        panic!("{what} is required to run this test in CI");
    }
    eprintln!("skipping: {what} is not available");
    false
}

/// Root: every test that runs the sandbox (namespaces, mounts, uid changes).
pub fn require_sandbox() -> bool {
    require("root", rustix::process::geteuid().is_root())
}

pub fn require_npm() -> bool {
    require(
        "npm",
        plinth_builder::install::find_executable("/usr/local/bin:/usr/bin:/bin", "npm").is_some(),
    )
}

pub fn require_python() -> bool {
    require(
        "python3 with venv",
        std::process::Command::new("/usr/bin/python3")
            .args(["-c", "import venv, ensurepip"])
            .status()
            .is_ok_and(|status| status.success()),
    )
}

/// The real uv binary (not a pyenv shim, which the build's uid could not run): where
/// `pip install uv` put it, else the first `uv` on PATH that is not a script.
pub fn find_uv() -> Option<PathBuf> {
    let from_python = std::process::Command::new("python3")
        .args(["-c", "import uv; print(uv.find_uv_bin())"])
        .output()
        .ok()
        .filter(|output| output.status.success())
        .map(|output| PathBuf::from(String::from_utf8_lossy(&output.stdout).trim()));
    if let Some(uv) = from_python.filter(|uv| uv.is_file()) {
        return Some(uv);
    }
    let path = std::env::var("PATH").unwrap_or_default();
    path.split(':')
        .map(|dir| Path::new(dir).join("uv"))
        .find(|uv| {
            std::fs::read(uv).is_ok_and(|bytes| bytes.len() > 2 && !bytes.starts_with(b"#!"))
        })
}

pub fn require_uv() -> Option<PathBuf> {
    let uv = find_uv();
    if require("uv (python3 -m pip install uv)", uv.is_some()) {
        uv
    } else {
        None
    }
}

/// A directory under /var/tmp that the build's uid can read.
pub fn readable_dir() -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix("plinth-builder-test-")
        .tempdir_in("/var/tmp")
        .expect("tempdir in /var/tmp");
    chmod(dir.path(), 0o755);
    dir
}

pub fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

pub fn write(root: &Path, path: &str, content: &str) {
    let path = root.join(path);
    std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
    std::fs::write(path, content).expect("write");
}

/// Packages to install from, and the tools to install them with.
pub struct Fixtures {
    pub dir: tempfile::TempDir,
}

impl Fixtures {
    /// `wheels/tinypkg-1.0-py3-none-any.whl`, `tinynpm-1.2.3.tgz`, and `tools/` (with uv when
    /// given).
    pub fn new(uv: Option<&Path>) -> Self {
        let dir = readable_dir();
        let wheels = dir.path().join("wheels");
        std::fs::create_dir(&wheels).expect("mkdir");
        chmod(&wheels, 0o755);
        write_wheel(&wheels.join("tinypkg-1.0-py3-none-any.whl"));
        write_npm_tarball(&dir.path().join("tinynpm-1.2.3.tgz"));
        let tools = dir.path().join("tools");
        std::fs::create_dir(&tools).expect("mkdir");
        chmod(&tools, 0o755);
        if let Some(uv) = uv {
            // A hard link costs nothing; a copy when the binary is on another file system.
            if std::fs::hard_link(uv, tools.join("uv")).is_err() {
                std::fs::copy(uv, tools.join("uv")).expect("copy uv");
            }
            chmod(&tools.join("uv"), 0o755);
        }
        Fixtures { dir }
    }

    pub fn wheels(&self) -> PathBuf {
        self.dir.path().join("wheels")
    }

    pub fn npm_tarball(&self) -> PathBuf {
        self.dir.path().join("tinynpm-1.2.3.tgz")
    }

    /// Offline options whose PATH starts with the tools directory; the fixtures (the npm
    /// tarball `package_json` names) are shown to builds read-only.
    pub fn options(&self) -> InstallOptions {
        InstallOptions {
            step_timeout: Duration::from_secs(120),
            path: format!(
                "{}:/usr/local/bin:/usr/bin:/bin",
                self.dir.path().join("tools").display()
            ),
            read_only_paths: vec![self.dir.path().to_owned()],
            ..InstallOptions::default()
        }
        .offline(&self.wheels())
    }

    /// A `package.json` depending on the tinynpm tarball.
    pub fn package_json(&self) -> String {
        format!(
            r#"{{"name":"demo","version":"1.0.0","dependencies":{{"tinynpm":"file:{}"}}}}"#,
            self.npm_tarball().display()
        )
    }
}

/// A wheel of `tinypkg` 1.0 with a `tinytool` console script.
fn write_wheel(path: &Path) {
    let mut files: Vec<(String, String)> = vec![
        (
            "tinypkg/__init__.py".into(),
            "def main():\n    print('tinytool ran')\n".into(),
        ),
        (
            "tinypkg-1.0.dist-info/METADATA".into(),
            "Metadata-Version: 2.1\nName: tinypkg\nVersion: 1.0\n".into(),
        ),
        (
            "tinypkg-1.0.dist-info/WHEEL".into(),
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
                .into(),
        ),
        (
            "tinypkg-1.0.dist-info/entry_points.txt".into(),
            "[console_scripts]\ntinytool = tinypkg:main\n".into(),
        ),
    ];
    let mut record = String::new();
    for (name, content) in &files {
        let hash = base64_urlsafe(&sha2::Sha256::digest(content.as_bytes()));
        record.push_str(&format!("{name},sha256={hash},{}\n", content.len()));
    }
    record.push_str("tinypkg-1.0.dist-info/RECORD,,\n");
    files.push(("tinypkg-1.0.dist-info/RECORD".into(), record));

    let mut zip = zip::ZipWriter::new(std::fs::File::create(path).expect("create wheel"));
    for (name, content) in &files {
        zip.start_file(name.as_str(), zip::write::SimpleFileOptions::default())
            .expect("zip entry");
        zip.write_all(content.as_bytes()).expect("zip write");
    }
    zip.finish().expect("zip finish");
    chmod(path, 0o644);
}

/// Unpadded URL-safe base64, as wheel RECORD files write hashes.
fn base64_urlsafe(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &byte)| n | u32::from(byte) << (16 - 8 * i));
        for i in 0..=chunk.len() {
            out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
        }
    }
    out
}

/// `tinynpm` 1.2.3 as `npm pack` would make it, with a `tinynpm` bin.
fn write_npm_tarball(path: &Path) {
    let file = std::fs::File::create(path).expect("create tarball");
    let mut tar = tar::Builder::new(flate2::write::GzEncoder::new(
        file,
        flate2::Compression::default(),
    ));
    let entries: [(&str, &str, u32); 2] = [
        (
            "package/package.json",
            r#"{"name":"tinynpm","version":"1.2.3","bin":{"tinynpm":"cli.js"}}"#,
            0o644,
        ),
        (
            "package/cli.js",
            "#!/usr/bin/env node\nconsole.log('tinynpm ran');\n",
            0o755,
        ),
    ];
    for (name, content, mode) in entries {
        let mut header = tar::Header::new_gnu();
        header.set_size(content.len() as u64);
        header.set_mode(mode);
        header.set_cksum();
        tar.append_data(&mut header, name, content.as_bytes())
            .expect("tar entry");
    }
    tar.into_inner()
        .expect("tar finish")
        .finish()
        .expect("gzip finish");
    chmod(path, 0o644);
}

/// A scratch directory with the given files, inside a directory of its own (the builder puts
/// its `.plinth-build-*` directory beside the scratch directory).
pub struct Scratch {
    pub parent: tempfile::TempDir,
    pub path: PathBuf,
}

impl Scratch {
    pub fn new(files: &[(&str, &str)]) -> Self {
        Self::new_in(&std::env::temp_dir(), files)
    }

    pub fn new_in(dir: &Path, files: &[(&str, &str)]) -> Self {
        let parent = tempfile::tempdir_in(dir).expect("tempdir");
        let path = parent.path().join("scratch");
        std::fs::create_dir(&path).expect("mkdir");
        for (name, content) in files {
            write(&path, name, content);
        }
        Scratch { parent, path }
    }

    pub fn read(&self, path: &str) -> String {
        std::fs::read_to_string(self.path.join(path))
            .unwrap_or_else(|error| panic!("reading {path}: {error}"))
    }
}

/// Runs `install`, collecting the log.
pub async fn build(
    scratch: &Scratch,
    slug: &str,
    options: &InstallOptions,
) -> (Result<InstallReport, InstallError>, String) {
    let mut log = Vec::new();
    let mut sink = |bytes: &[u8]| log.extend_from_slice(bytes);
    let result = install(&scratch.path, slug, options, &mut sink).await;
    (result, String::from_utf8_lossy(&log).into_owned())
}

/// Mount points under /env in this (the host's) mount namespace.
pub fn host_env_mounts() -> Vec<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .expect("mountinfo")
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .filter(|point| *point == "/env" || point.starts_with("/env/"))
        .map(str::to_owned)
        .collect()
}
