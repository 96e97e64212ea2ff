//! The sandbox's file system: an allow-listed root, built from what it may see, never the
//! host's root minus a deny-list (a deny-list misses the next configured path).
//!
//! [`RootSpec`] says what is shown; [`RootPlan::new`] turns it, before any fork, into a list of
//! steps on C strings ([`Step`]); [`RootPlan::enter`] runs them in the process that owns the new
//! mount namespace, with raw system calls only (it may run in a child sharing the node's
//! memory: nothing is allocated and no lock is taken). The root it builds:
//!
//! | path | what | how |
//! |---|---|---|
//! | `/usr`, `/bin`, `/sbin`, `/lib*`, `/etc`, `/opt` | the host's, where they exist | recursive bind, every mount read-only, `nosuid`, `nodev` |
//! | `/etc`, when the spec gives a copy of it (sessions) | the host's files tools read, [`ETC_ALLOWED`] ([`copy_etc`]), not the rest (a global `npmrc` or `pip.conf` with a registry's credentials) | bind of the copy, read-only |
//! | a covered path beneath those (the data directory, a config file, …) | nothing | an empty read-only tmpfs, or `/dev/null` for a file |
//! | read-only binds (`/env/<slug>`) | the version | bind remounted read-only, or a read-only overlay of its layers |
//! | writable binds (`/home/session`) | the working directory | bind, `nosuid`, `nodev` |
//! | read-only file binds (a session's `/etc/passwd`, `/etc/group`) | a file of the caller's, over the host's | bind remounted read-only |
//! | `/tmp`, `/dev/shm` | private | tmpfs of a given size (charged to the session's memory cgroup); or, for `/tmp`, a host directory of the sandbox's own (a build's, where pip builds wheels), bind, `nosuid`, `nodev` |
//! | `/dev` | `null`, `zero`, `full`, `random`, `urandom`, `tty`, its own `pts`, `fd`/`stdin`/`stdout`/`stderr` links | a small tmpfs, host nodes bound onto files, read-only |
//! | `/proc` | the sandbox's own processes | a new procfs (the builder of the root is the PID namespace's first process), `hidepid=2` so the keeper (root) is not listed |
//! | `/var/tmp` | `/tmp` | a link (unless a bind is shown beneath it) |
//! | everything else (`/root`, `/home`, `/var`, `/srv`, `/mnt`, `/run`, `/sys`, the data directory wherever it is) | absent | not in the root at all |
//!
//! The root itself is a tmpfs mounted over `/env` while it is built (the host's `/env` holds
//! nothing the sandbox needs), entered with `pivot_root`, and made read-only last. The host
//! keeps no mount of it: everything lives in the sandbox's mount namespace.

use std::ffi::{CStr, CString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rustix::fs::Mode;
use rustix::io::Errno;
use rustix::mount::{MountFlags, MountPropagationFlags, UnmountFlags};

/// Host directories a sandbox sees read-only, where the host has them.
pub const SYSTEM_DIRS: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt",
];

/// Device nodes a sandbox gets, bound from the host's `/dev`.
const DEVICES: &[&str] = &["null", "zero", "full", "random", "urandom", "tty"];

/// Where the new root is built (a tmpfs over it, in the sandbox's mount namespace only).
const BUILD_AT: &str = "/env";

/// What of the host's `/etc` a session sees (see [`copy_etc`]): name resolution and the
/// network's names, the users' and groups' databases (each session's own are bound over
/// them), TLS roots, the dynamic linker's cache, the time zone, the system's identity, file
/// types, shell start-up files, Debian's `alternatives` links (`/usr/bin/editor`, `awk`,
/// `pager`… point through them) and Python's site configuration. Not there: whatever
/// configures a tool with credentials or the host's own services (`npmrc`, `pip.conf`,
/// `gitconfig`, `environment`, `ssh`, `shadow`, `machine-id`, databases, daemons).
pub const ETC_ALLOWED: &[&str] = &[
    "passwd",
    "group",
    "hosts",
    "hostname",
    "resolv.conf",
    "nsswitch.conf",
    "host.conf",
    "gai.conf",
    "protocols",
    "services",
    "networks",
    "rpc",
    "ssl",
    "ca-certificates",
    "ca-certificates.conf",
    "pki",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "localtime",
    "timezone",
    "locale.alias",
    "os-release",
    "debian_version",
    "lsb-release",
    "alpine-release",
    "redhat-release",
    "mime.types",
    "magic",
    "magic.mime",
    "alternatives",
    "shells",
    "profile",
    "bash.bashrc",
    "inputrc",
    "terminfo",
    "mtab",
    "python3",
    "python3.9",
    "python3.10",
    "python3.11",
    "python3.12",
    "python3.13",
    "python3.14",
];

/// Directories a link in `/etc` may point into and be kept as a link: they are shown (or,
/// for `/proc`, the sandbox's own). A link elsewhere (`resolv.conf` into `/run`) is copied
/// as what it points to.
const LINK_INTO: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/opt", "/proc",
];

/// A file larger than this is not copied into a session's `/etc`.
const ETC_FILE_LIMIT: u64 = 16 * 1024 * 1024;

/// Makes `into` (made if missing, emptied first) a copy of what [`ETC_ALLOWED`] names in
/// the host's `/etc`, for [`RootSpec::etc`]: files copied with their modes, directories
/// copied through, links kept where they point into a shown directory (or `/proc`) and
/// otherwise replaced by a copy of what they point to. Only what anyone may read is copied
/// (`/etc/ssl/private` is not).
pub fn copy_etc(into: &Path) -> std::io::Result<()> {
    copy_etc_from(Path::new("/etc"), into, ETC_ALLOWED)
}

/// [`copy_etc`] from `etc`.
pub fn copy_etc_from(etc: &Path, into: &Path, allowed: &[&str]) -> std::io::Result<()> {
    match std::fs::remove_dir_all(into) {
        Err(error) if error.kind() != std::io::ErrorKind::NotFound => return Err(error),
        _ => {}
    }
    std::fs::create_dir_all(into)?;
    std::fs::set_permissions(into, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    for name in allowed {
        copy_entry(
            &etc.join(name),
            &into.join(name),
            &Path::new("/etc").join(name),
            0,
        )?;
    }
    Ok(())
}

/// Copies `from` (file, directory or link) to `to`, which the sandbox sees at `inside`, as
/// [`copy_etc`] says; nothing for what is missing or not readable by anyone.
fn copy_entry(from: &Path, to: &Path, inside: &Path, depth: usize) -> std::io::Result<()> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    if depth > 8 {
        return Ok(());
    }
    let Ok(meta) = std::fs::symlink_metadata(from) else {
        return Ok(());
    };
    if meta.file_type().is_symlink() {
        let target = std::fs::read_link(from)?;
        let resolved = inside.parent().unwrap_or(Path::new("/")).join(&target);
        let lexical = normalize(&resolved);
        if LINK_INTO.iter().any(|dir| lexical.starts_with(dir)) {
            return std::os::unix::fs::symlink(&target, to);
        }
        // Elsewhere (`/run`, `/var`): what it points to, if that is readable.
        return match std::fs::canonicalize(from) {
            Ok(real) if !real.starts_with(from) => copy_entry(&real, to, inside, depth + 1),
            _ => Ok(()),
        };
    }
    let mode = meta.mode();
    if meta.is_dir() {
        if mode & 0o005 != 0o005 {
            return Ok(());
        }
        std::fs::create_dir(to)?;
        for entry in std::fs::read_dir(from)? {
            let entry = entry?;
            let name = entry.file_name();
            copy_entry(
                &entry.path(),
                &to.join(&name),
                &inside.join(&name),
                depth + 1,
            )?;
        }
        std::fs::set_permissions(to, std::fs::Permissions::from_mode(mode & 0o755))
    } else if meta.is_file() {
        if mode & 0o004 == 0 || meta.len() > ETC_FILE_LIMIT {
            return Ok(());
        }
        std::fs::copy(from, to)?;
        std::fs::set_permissions(to, std::fs::Permissions::from_mode(mode & 0o755))
    } else {
        Ok(())
    }
}

/// `path` with `.` and `..` worked out lexically.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    for part in path.components() {
        match part {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::Normal(name) => out.push(name),
            _ => {}
        }
    }
    out
}

/// What a sandbox's file system shows.
#[derive(Debug, Clone, Default)]
pub struct RootSpec {
    /// Host paths never shown, even beneath a system directory (the data directory, the node's
    /// state, a configuration file): covered when they fall beneath one.
    pub cover: Vec<PathBuf>,
    /// Host directories shown at a path of their own: `(host, inside, read_only)`.
    pub binds: Vec<Bind>,
    /// Size of the private `/tmp`, in bytes.
    pub tmp_bytes: u64,
    /// A host directory of the sandbox's own shown read-write at `/tmp` instead of a tmpfs
    /// (`tmp_bytes` is then unused): builds write much there (pip builds wheels in `/tmp`),
    /// more than memory should hold. Sessions keep the tmpfs, charged to their memory limit.
    pub tmp_host: Option<PathBuf>,
    /// Size of the private `/dev/shm`, in bytes.
    pub shm_bytes: u64,
    /// A copy of the host's `/etc` made by [`copy_etc`], shown read-only at `/etc` instead of
    /// the host's (`None`: the host's whole `/etc`, as builds get it).
    pub etc: Option<PathBuf>,
}

/// A host directory, or file, shown inside the sandbox. A file may be shown over one of a
/// system directory (a session's own `/etc/passwd`), where the host has a file of that name.
#[derive(Debug, Clone)]
pub struct Bind {
    /// The host directory or file (for an overlay, its topmost layer).
    pub host: PathBuf,
    /// Lower layers under `host`, topmost first: shown as one read-only overlay.
    pub lower: Vec<PathBuf>,
    /// Where it appears (absolute).
    pub inside: PathBuf,
    /// Whether it is read-only.
    pub read_only: bool,
}

/// One thing the builder of the root does.
#[derive(Debug)]
pub enum Step {
    /// Makes every mount private, so nothing reaches the host.
    Private,
    /// A tmpfs: where, options, flags.
    Tmpfs(CString, CString, MountFlags),
    /// A directory.
    Mkdir(CString),
    /// An empty file to bind a node onto.
    Touch(CString),
    /// A symbolic link: target, where.
    Symlink(CString, CString),
    /// A bind: from, to, recursive.
    Bind(CString, CString, bool),
    /// A bind's per-mount flags, read-only unless said.
    Remount(CString, MountFlags),
    /// A read-only overlay: where, its `lowerdir=` options.
    Overlay(CString, CString),
    /// The sandbox's own devpts instance.
    Devpts(CString),
    /// The sandbox's own procfs.
    Proc(CString),
    /// Enters the new root and drops the old one.
    PivotRoot,
    /// Makes the root read-only.
    RootReadOnly,
}

impl Step {
    /// What it does, for an error message.
    pub fn describe(&self) -> (&'static str, &CStr) {
        match self {
            Step::Private => ("making mounts private", c"/"),
            Step::Tmpfs(path, _, _) => ("mounting a tmpfs on", path),
            Step::Mkdir(path) => ("making the directory", path),
            Step::Touch(path) => ("making the file", path),
            Step::Symlink(_, path) => ("making the link", path),
            Step::Bind(_, path, _) => ("binding", path),
            Step::Remount(path, _) => ("setting the mount flags of", path),
            Step::Overlay(path, _) => ("mounting the overlay on", path),
            Step::Devpts(path) => ("mounting devpts on", path),
            Step::Proc(path) => ("mounting proc on", path),
            Step::PivotRoot => ("entering the new root", c"/"),
            Step::RootReadOnly => ("making the root read-only", c"/"),
        }
    }
}

/// Why a plan could not be made.
#[derive(Debug, thiserror::Error)]
pub enum RootError {
    /// A path holds a NUL byte or is relative.
    #[error("the sandbox cannot show {0}: paths must be absolute, without NUL bytes")]
    Path(PathBuf),
    /// A file is to be shown beneath a system directory where the host has none.
    #[error(
        "the sandbox cannot show a file at {0}: the host has no file there, and its system \
         directories are shown read-only"
    )]
    NoPlace(PathBuf),
    /// The host's mount table could not be read.
    #[error("reading the host's mounts: {0}")]
    Mounts(std::io::Error),
}

/// A step that failed while the root was built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Failure {
    /// Its index in [`RootPlan::steps`].
    pub step: usize,
    /// The kernel's answer.
    pub errno: Errno,
}

/// The steps that build a sandbox's root, ready to run after a fork.
#[derive(Debug)]
pub struct RootPlan {
    /// In order.
    pub steps: Vec<Step>,
}

fn c(path: &Path) -> Result<CString, RootError> {
    if !path.is_absolute() {
        return Err(RootError::Path(path.to_owned()));
    }
    CString::new(path.as_os_str().as_bytes()).map_err(|_| RootError::Path(path.to_owned()))
}

/// `inside` as built: beneath [`BUILD_AT`].
fn staged(inside: &Path) -> PathBuf {
    let relative = inside.strip_prefix("/").unwrap_or(inside);
    Path::new(BUILD_AT).join(relative)
}

/// A host mount point and the flags a read-only remount of it must keep.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostMount {
    /// Where it is mounted.
    pub point: PathBuf,
    /// `nosuid`, `nodev`, `noexec` as it had them.
    pub flags: MountFlags,
}

/// The host's mount points from `/proc/self/mountinfo` text.
pub fn host_mounts(mountinfo: &[u8]) -> Vec<HostMount> {
    let mut mounts = Vec::new();
    for line in mountinfo.split(|byte| *byte == b'\n') {
        let fields: Vec<&[u8]> = line.split(|byte| *byte == b' ').collect();
        if fields.len() < 6 {
            continue;
        }
        let point = unescape(fields[4]);
        let mut flags = MountFlags::empty();
        for option in fields[5].split(|byte| *byte == b',') {
            match option {
                b"nosuid" => flags |= MountFlags::NOSUID,
                b"nodev" => flags |= MountFlags::NODEV,
                b"noexec" => flags |= MountFlags::NOEXEC,
                _ => {}
            }
        }
        mounts.push(HostMount {
            point: PathBuf::from(std::ffi::OsStr::from_bytes(&point)),
            flags,
        });
    }
    mounts
}

/// mountinfo writes space, tab, newline and backslash in paths as `\ooo` octal escapes.
pub(crate) fn unescape(field: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(field.len());
    let mut i = 0;
    while i < field.len() {
        if field[i] == b'\\'
            && let Some(octal) = field.get(i + 1..i + 4)
            && octal.iter().all(|digit| (b'0'..=b'7').contains(digit))
        {
            out.push(octal.iter().fold(0u8, |value, digit| {
                value.wrapping_mul(8).wrapping_add(digit - b'0')
            }));
            i += 4;
        } else {
            out.push(field[i]);
            i += 1;
        }
    }
    out
}

impl RootPlan {
    /// The steps for `spec`, reading the host's file system and mount table now.
    pub fn new(spec: &RootSpec) -> Result<Self, RootError> {
        let mountinfo = std::fs::read("/proc/self/mountinfo").map_err(RootError::Mounts)?;
        Self::with_mounts(spec, &host_mounts(&mountinfo))
    }

    /// The steps for `spec` given the host's mounts.
    pub fn with_mounts(spec: &RootSpec, mounts: &[HostMount]) -> Result<Self, RootError> {
        let quiet = MountFlags::NOSUID | MountFlags::NODEV;
        let mut steps = vec![
            Step::Private,
            Step::Tmpfs(
                c(Path::new(BUILD_AT))?,
                CString::from(c"mode=0755,size=1m"),
                quiet,
            ),
        ];
        let mut shown = Vec::new();
        for dir in SYSTEM_DIRS {
            let host = Path::new(dir);
            if let (true, Some(copy)) = (*dir == "/etc", &spec.etc) {
                let target = c(&staged(host))?;
                steps.push(Step::Mkdir(target.clone()));
                steps.push(Step::Bind(c(copy)?, target.clone(), false));
                steps.push(Step::Remount(target, MountFlags::RDONLY | quiet));
                continue;
            }
            let Ok(meta) = std::fs::symlink_metadata(host) else {
                continue;
            };
            let target = staged(host);
            if meta.file_type().is_symlink() {
                let link = std::fs::read_link(host).map_err(|_| RootError::Path(host.into()))?;
                let link = CString::new(link.as_os_str().as_bytes())
                    .map_err(|_| RootError::Path(host.into()))?;
                steps.push(Step::Symlink(link, c(&target)?));
                continue;
            }
            if !meta.is_dir() {
                continue;
            }
            shown.push(host.to_owned());
            steps.push(Step::Mkdir(c(&target)?));
            steps.push(Step::Bind(c(host)?, c(&target)?, true));
            // Every mount of the recursive bind read-only, keeping the flags it had (a bind
            // remount sets every per-mount flag at once).
            let top_flags = mounts
                .iter()
                .filter(|mount| host.starts_with(&mount.point))
                .max_by_key(|mount| mount.point.as_os_str().len())
                .map_or(MountFlags::empty(), |mount| mount.flags);
            steps.push(Step::Remount(
                c(&target)?,
                MountFlags::RDONLY | quiet | top_flags,
            ));
            for mount in mounts
                .iter()
                .filter(|mount| mount.point != host && mount.point.starts_with(host))
            {
                steps.push(Step::Remount(
                    c(&staged(&mount.point))?,
                    MountFlags::RDONLY | quiet | mount.flags,
                ));
            }
        }
        for covered in &spec.cover {
            if !shown.iter().any(|dir| covered.starts_with(dir)) {
                continue;
            }
            let target = c(&staged(covered))?;
            match std::fs::metadata(covered) {
                Ok(meta) if meta.is_dir() => steps.push(Step::Tmpfs(
                    target,
                    CString::from(c"mode=000,size=4k"),
                    quiet | MountFlags::NOEXEC | MountFlags::RDONLY,
                )),
                Ok(_) => steps.push(Step::Bind(CString::from(c"/dev/null"), target, false)),
                Err(_) => {}
            }
        }
        let mut made: Vec<PathBuf> = Vec::new();
        let mut make_parents = |steps: &mut Vec<Step>, inside: &Path| -> Result<(), RootError> {
            let mut path = PathBuf::from("/");
            for part in inside.components().skip(1) {
                path.push(part);
                if !made.contains(&path) {
                    made.push(path.clone());
                    steps.push(Step::Mkdir(c(&staged(&path))?));
                }
            }
            Ok(())
        };
        for bind in &spec.binds {
            let target = c(&staged(&bind.inside))?;
            let is_file = std::fs::metadata(&bind.host).is_ok_and(|meta| meta.is_file());
            // Where a file over one of `/etc`'s is looked for: in the copy shown there.
            let place = match (&spec.etc, bind.inside.strip_prefix("/etc")) {
                (Some(copy), Ok(relative)) => Some(copy.join(relative)),
                _ => None,
            };
            if is_file && (place.is_some() || shown.iter().any(|dir| bind.inside.starts_with(dir)))
            {
                // A file over one of a system directory (`/etc/passwd`): nothing can be made
                // there (it is the host's, read-only), so the host must have a file in place.
                let place = place.as_deref().unwrap_or(&bind.inside);
                if !std::fs::metadata(place).is_ok_and(|meta| meta.is_file()) {
                    return Err(RootError::NoPlace(bind.inside.clone()));
                }
            } else if is_file {
                if let Some(parent) = bind.inside.parent() {
                    make_parents(&mut steps, parent)?;
                }
                steps.push(Step::Touch(target.clone()));
            } else {
                make_parents(&mut steps, &bind.inside)?;
            }
            if bind.lower.is_empty() {
                steps.push(Step::Bind(c(&bind.host)?, target.clone(), false));
                let flags = if bind.read_only {
                    MountFlags::RDONLY | quiet
                } else {
                    quiet
                };
                steps.push(Step::Remount(target, flags));
            } else {
                // The cache makes layers only where its path needs no escaping here.
                let layers: Vec<String> = std::iter::once(&bind.host)
                    .chain(bind.lower.iter())
                    .map(|path| path.to_string_lossy().into_owned())
                    .collect();
                let options = CString::new(format!("lowerdir={}", layers.join(":")))
                    .map_err(|_| RootError::Path(bind.host.clone()))?;
                steps.push(Step::Overlay(target, options));
            }
        }
        let shm = CString::new(format!("mode=1777,size={}", spec.shm_bytes.max(4096)))
            .map_err(|_| RootError::Path("/dev/shm".into()))?;
        make_parents(&mut steps, Path::new("/tmp"))?;
        let tmp_target = c(&staged(Path::new("/tmp")))?;
        match &spec.tmp_host {
            Some(host) => {
                steps.push(Step::Bind(c(host)?, tmp_target.clone(), false));
                steps.push(Step::Remount(tmp_target, quiet));
            }
            None => {
                let tmp = CString::new(format!("mode=1777,size={}", spec.tmp_bytes.max(4096)))
                    .map_err(|_| RootError::Path("/tmp".into()))?;
                steps.push(Step::Tmpfs(tmp_target, tmp, quiet));
            }
        }
        // `/var/tmp` is `/tmp`, unless something is shown beneath it (a build's find-links).
        if !spec
            .binds
            .iter()
            .any(|bind| bind.inside.starts_with("/var/tmp"))
        {
            make_parents(&mut steps, Path::new("/var"))?;
            steps.push(Step::Symlink(
                CString::from(c"../tmp"),
                c(&staged(Path::new("/var/tmp")))?,
            ));
        }
        let dev = staged(Path::new("/dev"));
        make_parents(&mut steps, Path::new("/dev"))?;
        steps.push(Step::Tmpfs(
            c(&dev)?,
            CString::from(c"mode=0755,size=64k"),
            MountFlags::NOSUID | MountFlags::NOEXEC,
        ));
        for device in DEVICES {
            if Path::new("/dev").join(device).exists() {
                steps.push(Step::Touch(c(&dev.join(device))?));
                steps.push(Step::Bind(
                    c(&Path::new("/dev").join(device))?,
                    c(&dev.join(device))?,
                    false,
                ));
            }
        }
        for (target, name) in [
            ("/proc/self/fd", "fd"),
            ("/proc/self/fd/0", "stdin"),
            ("/proc/self/fd/1", "stdout"),
            ("/proc/self/fd/2", "stderr"),
            ("pts/ptmx", "ptmx"),
        ] {
            let target = CString::new(target).map_err(|_| RootError::Path(dev.clone()))?;
            steps.push(Step::Symlink(target, c(&dev.join(name))?));
        }
        steps.push(Step::Mkdir(c(&dev.join("shm"))?));
        steps.push(Step::Tmpfs(c(&dev.join("shm"))?, shm, quiet));
        steps.push(Step::Mkdir(c(&dev.join("pts"))?));
        steps.push(Step::Devpts(c(&dev.join("pts"))?));
        steps.push(Step::Remount(
            c(&dev)?,
            MountFlags::RDONLY | MountFlags::NOSUID | MountFlags::NOEXEC,
        ));
        make_parents(&mut steps, Path::new("/proc"))?;
        steps.push(Step::Proc(c(&staged(Path::new("/proc")))?));
        steps.push(Step::Mkdir(c(&staged(Path::new("/.old-root")))?));
        steps.push(Step::PivotRoot);
        steps.push(Step::RootReadOnly);
        Ok(RootPlan { steps })
    }

    /// Builds the root and enters it. Runs in the process that owns the sandbox's new mount
    /// namespace (and, for `/proc`, is its PID namespace's first process), as root; raw system
    /// calls only.
    pub fn enter(&self) -> Result<(), Failure> {
        use rustix::mount::{mount, mount_bind, mount_bind_recursive, mount_change, mount_remount};
        const EMPTY: &CStr = c"";
        for (index, step) in self.steps.iter().enumerate() {
            let failed = |errno: Errno| Failure { step: index, errno };
            match step {
                Step::Private => mount_change(
                    c"/",
                    MountPropagationFlags::PRIVATE | MountPropagationFlags::REC,
                ),
                Step::Tmpfs(path, options, flags) => {
                    mount(c"plinth", &**path, c"tmpfs", *flags, &**options)
                }
                Step::Mkdir(path) => match rustix::fs::mkdir(&**path, Mode::from_raw_mode(0o755)) {
                    Ok(()) | Err(Errno::EXIST) => Ok(()),
                    Err(errno) => Err(errno),
                },
                Step::Touch(path) => rustix::fs::open(
                    &**path,
                    rustix::fs::OFlags::CREATE
                        | rustix::fs::OFlags::WRONLY
                        | rustix::fs::OFlags::CLOEXEC,
                    Mode::from_raw_mode(0o644),
                )
                .map(drop),
                Step::Symlink(target, path) => rustix::fs::symlink(&**target, &**path),
                Step::Bind(from, to, true) => mount_bind_recursive(&**from, &**to),
                Step::Bind(from, to, false) => mount_bind(&**from, &**to),
                Step::Remount(path, flags) => {
                    mount_remount(&**path, MountFlags::BIND | *flags, EMPTY)
                }
                Step::Overlay(path, options) => mount(
                    c"overlay",
                    &**path,
                    c"overlay",
                    MountFlags::RDONLY | MountFlags::NOSUID | MountFlags::NODEV,
                    &**options,
                ),
                Step::Devpts(path) => mount(
                    c"devpts",
                    &**path,
                    c"devpts",
                    MountFlags::NOSUID | MountFlags::NOEXEC,
                    c"newinstance,ptmxmode=0666,mode=0620",
                ),
                // hidepid=2: the sandbox's processes see only their own uid's processes, not
                // the keeper (root), whose command line is the node's (they share memory).
                Step::Proc(path) => mount(
                    c"proc",
                    &**path,
                    c"proc",
                    MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
                    c"hidepid=2",
                ),
                Step::PivotRoot => pivot(),
                Step::RootReadOnly => mount_remount(
                    c"/",
                    MountFlags::RDONLY | MountFlags::NOSUID | MountFlags::NODEV,
                    c"mode=0755,size=1m",
                ),
            }
            .map_err(failed)?;
        }
        Ok(())
    }
}

/// Enters [`BUILD_AT`] as the root; the old root is detached and its mount point removed.
fn pivot() -> Result<(), Errno> {
    rustix::process::pivot_root(c"/env", c"/env/.old-root")?;
    rustix::process::chdir(c"/")?;
    rustix::mount::unmount(c"/.old-root", UnmountFlags::DETACH)?;
    rustix::fs::rmdir(c"/.old-root")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_points_and_flags_are_read_with_escapes() {
        let text = b"22 1 8:1 / / rw,relatime - ext4 /dev/vda rw\n\
                     30 22 0:5 / /usr/lib\\040x rw,nosuid,nodev - tmpfs t rw\n\
                     31 22 0:6 / /etc/hosts ro,noexec - ext4 /dev/vda rw\n";
        let mounts = host_mounts(text);
        assert_eq!(mounts.len(), 3);
        assert_eq!(mounts[1].point, PathBuf::from("/usr/lib x"));
        assert_eq!(mounts[1].flags, MountFlags::NOSUID | MountFlags::NODEV);
        assert_eq!(mounts[2].flags, MountFlags::NOEXEC);
    }

    #[test]
    fn the_plan_shows_only_what_it_names_and_covers_what_it_must_hide() {
        let config = tempfile::NamedTempFile::new_in("/etc").ok();
        let mut cover = vec![PathBuf::from("/var/lib/plinth")];
        if let Some(config) = &config {
            cover.push(config.path().to_owned());
        }
        let spec = RootSpec {
            cover,
            binds: vec![
                Bind {
                    host: "/srv/cache/v1".into(),
                    lower: Vec::new(),
                    inside: "/env/demo".into(),
                    read_only: true,
                },
                Bind {
                    host: "/srv/sessions/s/work".into(),
                    lower: Vec::new(),
                    inside: "/home/session".into(),
                    read_only: false,
                },
            ],
            tmp_bytes: 1 << 20,
            tmp_host: None,
            shm_bytes: 1 << 20,
            etc: None,
        };
        let plan = RootPlan::with_mounts(&spec, &[]).expect("plan");
        let binds: Vec<String> = plan
            .steps
            .iter()
            .filter_map(|step| match step {
                Step::Bind(from, to, _) => Some(format!(
                    "{} -> {}",
                    from.to_string_lossy(),
                    to.to_string_lossy()
                )),
                _ => None,
            })
            .collect();
        assert!(binds.contains(&"/usr -> /env/usr".to_owned()), "{binds:?}");
        assert!(
            binds.contains(&"/srv/cache/v1 -> /env/env/demo".to_owned()),
            "{binds:?}"
        );
        assert!(
            binds.contains(&"/srv/sessions/s/work -> /env/home/session".to_owned()),
            "{binds:?}"
        );
        assert!(
            !binds
                .iter()
                .any(|bind| bind.starts_with("/var ") || bind.starts_with("/root")),
            "{binds:?}"
        );
        // A path outside every shown directory needs no cover; a file inside one is covered.
        assert!(
            !binds.iter().any(|bind| bind.contains("/var/lib/plinth")),
            "{binds:?}"
        );
        if let Some(config) = &config {
            let covered = format!("/dev/null -> /env{}", config.path().display());
            assert!(binds.contains(&covered), "{binds:?}");
        }
        // The version read-only, the working directory writable.
        let remounts: Vec<(String, bool)> = plan
            .steps
            .iter()
            .filter_map(|step| match step {
                Step::Remount(path, flags) => Some((
                    path.to_string_lossy().into_owned(),
                    flags.contains(MountFlags::RDONLY),
                )),
                _ => None,
            })
            .collect();
        assert!(
            remounts.contains(&("/env/env/demo".to_owned(), true)),
            "{remounts:?}"
        );
        assert!(
            remounts.contains(&("/env/home/session".to_owned(), false)),
            "{remounts:?}"
        );
        assert!(matches!(plan.steps.last(), Some(Step::RootReadOnly)));
        assert!(
            plan.steps.iter().any(
                |step| matches!(step, Step::Tmpfs(path, _, _) if path.as_c_str() == c"/env/tmp")
            ),
            "sessions' /tmp is a tmpfs"
        );
    }

    #[test]
    fn a_file_is_shown_over_the_hosts_read_only_or_where_nothing_is() {
        let ours = tempfile::NamedTempFile::new().expect("test setup");
        let file = |inside: &str| Bind {
            host: ours.path().to_owned(),
            lower: Vec::new(),
            inside: inside.into(),
            read_only: true,
        };
        let spec = RootSpec {
            binds: vec![file("/etc/passwd"), file("/plinth/etc/motd")],
            ..RootSpec::default()
        };
        let plan = RootPlan::with_mounts(&spec, &[]).expect("plan");
        let host = ours.path().to_string_lossy().into_owned();
        let at = |target: &CStr| -> Vec<&Step> {
            plan.steps
                .iter()
                .filter(|step| match step {
                    Step::Mkdir(path)
                    | Step::Touch(path)
                    | Step::Bind(_, path, _)
                    | Step::Remount(path, _) => path.as_c_str() == target,
                    _ => false,
                })
                .collect()
        };
        // Over the host's file, beneath the read-only /etc: bound, nothing made.
        assert!(
            matches!(
                at(c"/env/etc/passwd").as_slice(),
                [Step::Bind(from, _, false), Step::Remount(_, flags)]
                    if from.to_string_lossy() == host && flags.contains(MountFlags::RDONLY)
            ),
            "{:?}",
            at(c"/env/etc/passwd")
        );
        // Elsewhere: its parents and an empty file to bind onto.
        assert!(!at(c"/env/plinth/etc").is_empty());
        assert!(
            matches!(
                at(c"/env/plinth/etc/motd").as_slice(),
                [Step::Touch(_), Step::Bind(_, _, false), Step::Remount(_, _)]
            ),
            "{:?}",
            at(c"/env/plinth/etc/motd")
        );
        // Beneath a system directory where the host has no file, nothing can be made.
        let spec = RootSpec {
            binds: vec![file("/etc/plinth-no-such-file")],
            ..RootSpec::default()
        };
        assert!(matches!(
            RootPlan::with_mounts(&spec, &[]),
            Err(RootError::NoPlace(_))
        ));
    }

    #[test]
    fn a_host_directory_can_be_the_sandboxs_tmp() {
        let spec = RootSpec {
            tmp_host: Some("/srv/builds/b1/tmp".into()),
            ..RootSpec::default()
        };
        let plan = RootPlan::with_mounts(&spec, &[]).expect("plan");
        let at_tmp: Vec<&Step> = plan
            .steps
            .iter()
            .filter(|step| match step {
                Step::Tmpfs(path, _, _) | Step::Bind(_, path, _) | Step::Remount(path, _) => {
                    path.as_c_str() == c"/env/tmp"
                }
                _ => false,
            })
            .collect();
        assert!(
            matches!(
                at_tmp.as_slice(),
                [Step::Bind(from, _, false), Step::Remount(_, flags)]
                    if from.as_c_str() == c"/srv/builds/b1/tmp" && !flags.contains(MountFlags::RDONLY)
            ),
            "{at_tmp:?}"
        );
        let link_at_var_tmp = |plan: &RootPlan| {
            plan.steps.iter().any(
                |step| matches!(step, Step::Symlink(_, path) if path.as_c_str() == c"/env/var/tmp"),
            )
        };
        assert!(link_at_var_tmp(&plan), "/var/tmp is /tmp");
        // Unless something is shown beneath it: then it is a directory holding only that.
        let spec = RootSpec {
            binds: vec![Bind {
                host: "/var/tmp/find-links".into(),
                lower: Vec::new(),
                inside: "/var/tmp/find-links".into(),
                read_only: true,
            }],
            ..spec
        };
        let plan = RootPlan::with_mounts(&spec, &[]).expect("plan");
        assert!(!link_at_var_tmp(&plan));
    }

    #[test]
    fn the_etc_copy_holds_what_is_allowed_and_readable_and_nothing_else() {
        use std::os::unix::fs::PermissionsExt;
        let host = tempfile::tempdir().expect("host");
        let run = tempfile::tempdir().expect("run");
        let etc = host.path().join("etc");
        std::fs::create_dir_all(etc.join("ssl/certs")).expect("ssl");
        std::fs::create_dir_all(etc.join("ssl/private")).expect("private");
        std::fs::set_permissions(
            etc.join("ssl/private"),
            std::fs::Permissions::from_mode(0o700),
        )
        .expect("mode");
        std::fs::write(etc.join("ssl/private/key.pem"), "key").expect("key");
        std::fs::write(etc.join("ssl/certs/ca.crt"), "roots").expect("roots");
        std::fs::write(etc.join("hosts"), "127.0.0.1 localhost\n").expect("hosts");
        std::fs::write(etc.join("npmrc"), "//registry/:_authToken=secret\n").expect("npmrc");
        std::fs::write(etc.join("shadow"), "root:x").expect("shadow");
        std::fs::set_permissions(etc.join("shadow"), std::fs::Permissions::from_mode(0o640))
            .expect("mode");
        std::os::unix::fs::symlink("../usr/lib/os-release", etc.join("os-release")).expect("link");
        std::fs::write(run.path().join("resolv.conf"), "nameserver 10.0.0.1\n").expect("resolv");
        std::os::unix::fs::symlink(run.path().join("resolv.conf"), etc.join("resolv.conf"))
            .expect("link");
        let copy = host.path().join("copy");
        std::fs::create_dir_all(copy.join("stale")).expect("stale");
        copy_etc_from(
            &etc,
            &copy,
            &[
                "hosts",
                "ssl",
                "os-release",
                "resolv.conf",
                "shadow",
                "missing",
            ],
        )
        .expect("copied");
        let mut found: Vec<String> = Vec::new();
        fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
            for entry in std::fs::read_dir(dir).expect("list").flatten() {
                let path = entry.path();
                out.push(
                    path.strip_prefix(root)
                        .expect("beneath")
                        .display()
                        .to_string(),
                );
                if entry.file_type().expect("type").is_dir() {
                    walk(root, &path, out);
                }
            }
        }
        walk(&copy, &copy, &mut found);
        found.sort();
        assert_eq!(
            found,
            [
                "hosts",
                "os-release",
                "resolv.conf",
                "ssl",
                "ssl/certs",
                "ssl/certs/ca.crt"
            ]
        );
        // A link into /usr stays a link; one elsewhere is a copy of its target.
        assert_eq!(
            std::fs::read_link(copy.join("os-release")).expect("link"),
            Path::new("../usr/lib/os-release")
        );
        assert!(
            !std::fs::symlink_metadata(copy.join("resolv.conf"))
                .expect("file")
                .is_symlink()
        );
        assert_eq!(
            std::fs::read_to_string(copy.join("resolv.conf")).expect("resolv"),
            "nameserver 10.0.0.1\n"
        );
    }
}
