//! File-system steps beneath a root directory's descriptor, for workspace calls made by the
//! node (root) on a session's behalf. Every path is resolved by `openat2(RESOLVE_BENEATH)`
//! from the root's descriptor; a file is first opened `O_PATH` and checked with `fstat`, and
//! only a regular file is then opened for reading (through its descriptor), so a FIFO or a
//! device is never opened. Writes walk parents without following any link, write a
//! temporary file, give it to the session's uid and rename it into place, so a reader never
//! sees half a file.

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;

use plinth_kit::{ErrorCode, PlinthError};
use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags, Stat};
use rustix::io::Errno;

/// Opens a root directory.
pub fn open_root(root: &Path) -> Result<OwnedFd, PlinthError> {
    rustix::fs::open(
        root,
        OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|errno| io_error("the workspace root", errno))
}

/// An error for `path`, in the workspace vocabulary.
pub fn errno_error(path: &str, errno: Errno) -> PlinthError {
    match errno {
        Errno::NOENT => PlinthError::new(
            ErrorCode::WorkspaceNotFound,
            format!("{path}: no such file or directory"),
        ),
        Errno::NOTDIR => PlinthError::new(
            ErrorCode::WorkspacePathInvalid,
            format!("{path}: a file is in the way of a directory"),
        ),
        Errno::ISDIR => PlinthError::new(
            ErrorCode::WorkspacePathInvalid,
            format!("{path}: is a directory"),
        ),
        Errno::LOOP | Errno::XDEV => PlinthError::new(
            ErrorCode::WorkspacePathInvalid,
            format!(
                "{path}: a symbolic link leads out of the workspace, or is in the way of a write (links are not followed when writing)"
            ),
        ),
        Errno::ROFS | Errno::ACCESS | Errno::PERM => PlinthError::new(
            ErrorCode::WorkspaceReadOnly,
            format!("{path}: not writable"),
        ),
        Errno::NAMETOOLONG => PlinthError::new(
            ErrorCode::WorkspacePathInvalid,
            format!("{path}: a name is too long"),
        ),
        other => io_error(path, other),
    }
}

fn io_error(path: &str, errno: Errno) -> PlinthError {
    PlinthError::internal(&std::io::Error::other(format!(
        "{path}: {}",
        std::io::Error::from(errno)
    )))
}

/// `rel` beneath `dir` (`O_PATH`), following links that stay beneath it, and its status.
pub fn lookup(dir: &OwnedFd, rel: &str, display: &str) -> Result<(OwnedFd, Stat), PlinthError> {
    let rel = if rel.is_empty() { "." } else { rel };
    let fd = rustix::fs::openat2(
        dir,
        rel,
        OFlags::PATH | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS,
    )
    .map_err(|errno| errno_error(display, errno))?;
    let stat = rustix::fs::fstat(&fd).map_err(|errno| errno_error(display, errno))?;
    Ok((fd, stat))
}

/// The kind of a status.
pub fn kind(stat: &Stat) -> FileType {
    FileType::from_raw_mode(stat.st_mode)
}

/// Modification time in ms since the epoch.
pub fn mtime_ms(stat: &Stat) -> i64 {
    stat.st_mtime
        .saturating_mul(1000)
        .saturating_add(i64::try_from(stat.st_mtime_nsec / 1_000_000).unwrap_or(0))
}

/// Opens a regular file found with [`lookup`] for reading, through its descriptor.
pub fn reopen(path_fd: &OwnedFd, display: &str) -> Result<std::fs::File, PlinthError> {
    let proc = format!("/proc/self/fd/{}", path_fd.as_raw_fd());
    let fd = rustix::fs::open(
        proc.as_str(),
        OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOCTTY,
        Mode::empty(),
    )
    .map_err(|errno| errno_error(display, errno))?;
    Ok(std::fs::File::from(fd))
}

/// Checks a status is a regular file the node may read for the session: in the working
/// directory, a file with several links must belong to the session's uid (a hard link to
/// someone else's file is not read with root's rights).
pub fn check_readable(stat: &Stat, display: &str, owner: Option<u32>) -> Result<(), PlinthError> {
    match kind(stat) {
        FileType::RegularFile => {}
        FileType::Directory => {
            return Err(PlinthError::new(
                ErrorCode::WorkspacePathInvalid,
                format!("{display}: is a directory"),
            ));
        }
        _ => {
            return Err(PlinthError::new(
                ErrorCode::WorkspacePathInvalid,
                format!(
                    "{display}: not a regular file (FIFOs, sockets and devices are never opened)"
                ),
            ));
        }
    }
    if let Some(uid) = owner
        && stat.st_nlink > 1
        && stat.st_uid != uid
    {
        return Err(PlinthError::new(
            ErrorCode::WorkspacePathInvalid,
            format!("{display}: a hard link to a file the session does not own"),
        ));
    }
    Ok(())
}

/// Reads a whole regular file, at most `max` bytes (`file_too_large` past it).
pub fn read_all(
    dir: &OwnedFd,
    rel: &str,
    display: &str,
    owner: Option<u32>,
    max: u64,
) -> Result<(Vec<u8>, Stat), PlinthError> {
    let (fd, stat) = lookup(dir, rel, display)?;
    check_readable(&stat, display, owner)?;
    let size = u64::try_from(stat.st_size).unwrap_or(0);
    if size > max {
        return Err(too_large(display, size, max));
    }
    let mut content = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
    reopen(&fd, display)?
        .take(max + 1)
        .read_to_end(&mut content)
        .map_err(|error| PlinthError::internal(&error))?;
    if content.len() as u64 > max {
        return Err(too_large(display, content.len() as u64, max));
    }
    Ok((content, stat))
}

fn too_large(display: &str, size: u64, max: u64) -> PlinthError {
    PlinthError::new(
        ErrorCode::FileTooLarge,
        format!("{display} is {size} bytes; at most {max} can be handled"),
    )
    .with_detail(serde_json::json!({ "max_bytes": max }))
}

/// What was at a path before a write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Previous {
    /// Nothing.
    Missing,
    /// A regular file with these bytes and this mode.
    File { content: Vec<u8>, mode: u32 },
}

/// Opens the parent directory of `parts` beneath `root`, making missing directories (owned
/// by `uid`) when `make` is set, following no link. Answers it and the last name.
pub fn parent<'a>(
    root: &OwnedFd,
    parts: &'a [String],
    display: &str,
    uid: u32,
    make: bool,
) -> Result<(OwnedFd, &'a str), PlinthError> {
    let (name, parents) = parts.split_last().ok_or_else(|| {
        PlinthError::new(
            ErrorCode::WorkspacePathInvalid,
            format!("{display}: names the workspace root, not a file"),
        )
    })?;
    let mut dir = rustix::io::dup(root).map_err(|errno| errno_error(display, errno))?;
    for part in parents {
        if make {
            match rustix::fs::mkdirat(&dir, part.as_str(), Mode::from_raw_mode(0o755)) {
                Ok(()) => {
                    let made = open_dir(&dir, part).map_err(|errno| errno_error(display, errno))?;
                    chown(&made, uid, display)?;
                    dir = made;
                    continue;
                }
                Err(Errno::EXIST) => {}
                Err(errno) => return Err(errno_error(display, errno)),
            }
        }
        dir = open_dir(&dir, part).map_err(|errno| errno_error(display, errno))?;
    }
    Ok((dir, name.as_str()))
}

/// Opens directory `name` beneath `dir`, following no link.
pub fn open_dir(dir: &OwnedFd, name: &str) -> Result<OwnedFd, Errno> {
    rustix::fs::openat2(
        dir,
        name,
        OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        Mode::empty(),
        ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS,
    )
}

fn chown(fd: &OwnedFd, uid: u32, display: &str) -> Result<(), PlinthError> {
    rustix::fs::fchown(
        fd,
        Some(rustix::process::Uid::from_raw(uid)),
        Some(rustix::process::Gid::from_raw(uid)),
    )
    .map_err(|errno| errno_error(display, errno))
}

/// The regular file at `name` in `dir` now, opened for reading, with its status; `None` when
/// nothing is there. A link or directory is refused (writes never go through or over them),
/// as is a hard link to a file `owner` does not own (it is not read with root's rights), and
/// a file past `max` bytes (`file_too_large`), before any byte of it is read.
pub fn open_previous(
    dir: &OwnedFd,
    name: &str,
    display: &str,
    owner: Option<u32>,
    max: u64,
) -> Result<Option<(std::fs::File, Stat)>, PlinthError> {
    if existing(dir, name, display)?.is_none() {
        return Ok(None);
    }
    let fd = rustix::fs::openat2(
        dir,
        name,
        OFlags::PATH | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        Mode::empty(),
        ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS,
    )
    .map_err(|errno| errno_error(display, errno))?;
    let stat = rustix::fs::fstat(&fd).map_err(|errno| errno_error(display, errno))?;
    check_readable(&stat, display, owner)?;
    let size = u64::try_from(stat.st_size).unwrap_or(u64::MAX);
    if size > max {
        return Err(replaced_too_large(display, size, max));
    }
    Ok(Some((reopen(&fd, display)?, stat)))
}

/// The status of the regular file at `name` in `dir`, not following a link; `None` when
/// nothing is there. A directory, a link or anything else in the way is refused: a write
/// never goes through or over one.
pub fn existing(dir: &OwnedFd, name: &str, display: &str) -> Result<Option<Stat>, PlinthError> {
    let stat = match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(stat) => stat,
        Err(Errno::NOENT) => return Ok(None),
        Err(errno) => return Err(errno_error(display, errno)),
    };
    match kind(&stat) {
        FileType::RegularFile => Ok(Some(stat)),
        FileType::Directory => Err(errno_error(display, Errno::ISDIR)),
        FileType::Symlink => Err(errno_error(display, Errno::LOOP)),
        _ => Err(PlinthError::new(
            ErrorCode::WorkspacePathInvalid,
            format!("{display}: not a regular file"),
        )),
    }
}

/// A file too large to be replaced: the workspace keeps what a write replaces, to undo it.
fn replaced_too_large(display: &str, size: u64, max: u64) -> PlinthError {
    PlinthError::new(
        ErrorCode::FileTooLarge,
        format!(
            "{display} is {size} bytes; a write keeps what it replaces so it can be undone, and \
             keeps at most {max} bytes: remove the file first (a command's `rm`), or write \
             another path"
        ),
    )
    .with_detail(serde_json::json!({ "max_bytes": max }))
}

/// What is at `name` in `dir` now, read whole (see [`open_previous`]; at most `max` bytes).
pub fn previous(
    dir: &OwnedFd,
    name: &str,
    display: &str,
    owner: Option<u32>,
    max: u64,
) -> Result<Previous, PlinthError> {
    let Some((file, stat)) = open_previous(dir, name, display, owner, max)? else {
        return Ok(Previous::Missing);
    };
    let mut content = Vec::with_capacity(usize::try_from(stat.st_size).unwrap_or(0));
    file.take(max + 1)
        .read_to_end(&mut content)
        .map_err(|error| PlinthError::internal(&error))?;
    if content.len() as u64 > max {
        // It grew after it was measured.
        return Err(replaced_too_large(display, content.len() as u64, max));
    }
    Ok(Previous::File {
        content,
        mode: stat.st_mode & 0o777,
    })
}

/// Writes `content` as `name` in `dir`: a temporary file owned by `uid`, then renamed over.
pub fn replace(
    dir: &OwnedFd,
    name: &str,
    content: &[u8],
    mode: u32,
    uid: u32,
    display: &str,
) -> Result<(), PlinthError> {
    let temporary = format!(".{name}.plinth-{}", uuid::Uuid::new_v4().simple());
    let fd = rustix::fs::openat2(
        dir,
        temporary.as_str(),
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        Mode::from_raw_mode(mode),
        ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS,
    )
    .map_err(|errno| errno_error(display, errno))?;
    let written = (|| {
        chown(&fd, uid, display)?;
        rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode))
            .map_err(|errno| errno_error(display, errno))?;
        let mut file = std::fs::File::from(fd);
        file.write_all(content)
            .and_then(|()| file.flush())
            .map_err(|error| PlinthError::internal(&error))?;
        rustix::fs::renameat(dir, temporary.as_str(), dir, name)
            .map_err(|errno| errno_error(display, errno))
    })();
    if written.is_err() {
        let _ = rustix::fs::unlinkat(dir, temporary.as_str(), AtFlags::empty());
    }
    written
}

/// Removes the file `name` in `dir`; a missing one is fine.
pub fn remove(dir: &OwnedFd, name: &str, display: &str) -> Result<(), PlinthError> {
    match rustix::fs::unlinkat(dir, name, AtFlags::empty()) {
        Ok(()) | Err(Errno::NOENT) => Ok(()),
        Err(errno) => Err(errno_error(display, errno)),
    }
}

/// One entry met by [`walk`].
#[derive(Debug, Clone)]
pub struct Walked {
    /// Its path relative to the base directory (`start/…/name`).
    pub rel: String,
    /// Its status (links not followed).
    pub stat: Stat,
}

/// What [`walk`] does after visiting an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Go on, into the entry when it is a directory.
    Descend,
    /// Go on, not into the entry.
    Skip,
    /// End the walk.
    Stop,
}

/// Walks the directory `start` (relative to `base`, `""` for `base` itself) depth-first in
/// name order, without following links; `visit` sees every entry with its directory's
/// descriptor, and `enter_dir` each directory (the start included) before its entries.
pub fn walk(
    base: &OwnedFd,
    start: &str,
    display: &str,
    mut enter_dir: impl FnMut(&str, &OwnedFd),
    mut visit: impl FnMut(&Walked, &OwnedFd) -> Step,
) -> Result<(), PlinthError> {
    let first = open_beneath_dir(base, start, display)?;
    let mut stack: Vec<(OwnedFd, String)> = vec![(first, start.to_owned())];
    while let Some((dir, prefix)) = stack.pop() {
        enter_dir(&prefix, &dir);
        let mut names: Vec<String> = Vec::new();
        let listing =
            rustix::fs::Dir::read_from(&dir).map_err(|errno| errno_error(display, errno))?;
        for entry in listing {
            let Ok(entry) = entry else { continue };
            let name = entry.file_name().to_string_lossy().into_owned();
            if name != "." && name != ".." {
                names.push(name);
            }
        }
        names.sort();
        let mut children = Vec::new();
        for name in names {
            let Ok(stat) = rustix::fs::statat(&dir, name.as_str(), AtFlags::SYMLINK_NOFOLLOW)
            else {
                continue;
            };
            let rel = if prefix.is_empty() {
                name.clone()
            } else {
                format!("{prefix}/{name}")
            };
            let walked = Walked { rel, stat };
            match visit(&walked, &dir) {
                Step::Stop => return Ok(()),
                Step::Skip => {}
                Step::Descend => {
                    if kind(&walked.stat) == FileType::Directory
                        && let Ok(child) = open_dir(&dir, &name)
                    {
                        children.push((child, walked.rel));
                    }
                }
            }
        }
        // Depth-first in name order: the first child is walked next.
        stack.extend(children.into_iter().rev());
    }
    Ok(())
}

/// Opens the directory `rel` beneath `base` (`""`: `base` itself), following links that
/// stay beneath it.
pub fn open_beneath_dir(base: &OwnedFd, rel: &str, display: &str) -> Result<OwnedFd, PlinthError> {
    if rel.is_empty() {
        return rustix::io::dup(base).map_err(|errno| errno_error(display, errno));
    }
    rustix::fs::openat2(
        base,
        rel,
        OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS,
    )
    .map_err(|errno| errno_error(display, errno))
}

/// Reads a regular file met by [`walk`] (`name` in `dir`), at most `max` bytes; `None` for
/// anything else, or a file past `max`.
pub fn read_entry(dir: &OwnedFd, name: &str, max: u64, owner: Option<u32>) -> Option<Vec<u8>> {
    let fd = rustix::fs::openat2(
        dir,
        name,
        OFlags::PATH | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        Mode::empty(),
        ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS,
    )
    .ok()?;
    let stat = rustix::fs::fstat(&fd).ok()?;
    check_readable(&stat, name, owner).ok()?;
    if u64::try_from(stat.st_size).unwrap_or(u64::MAX) > max {
        return None;
    }
    let mut content = Vec::new();
    reopen(&fd, name)
        .ok()?
        .take(max)
        .read_to_end(&mut content)
        .ok()?;
    Some(content)
}
