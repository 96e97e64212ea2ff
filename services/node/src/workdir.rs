//! Files of a session's working directory, read and written by the node (root) on the
//! session's behalf. The session owns that directory and can put symlinks anywhere in it, so
//! paths are never resolved by string checks alone: every step is `openat2` beneath the
//! directory's own descriptor (`RESOLVE_BENEATH`), parents are walked without following any
//! link, and the final component is never followed when writing or deleting.

use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::path::Path;

use rustix::fs::{AtFlags, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

/// Most bytes of one path.
pub const MAX_PATH_BYTES: usize = 4096;

/// Why a working-directory file call failed.
#[derive(Debug, thiserror::Error)]
pub enum WorkdirError {
    /// The path breaks the rules.
    #[error("invalid path {path:?}: {reason}")]
    InvalidPath {
        /// The path as given.
        path: String,
        /// Which rule.
        reason: &'static str,
    },
    /// Nothing there.
    #[error("{0:?} does not exist in the working directory")]
    NotFound(String),
    /// A file where a directory is needed, a directory where a file is, or a link.
    #[error("{path:?}: {reason}")]
    Conflict {
        /// The path.
        path: String,
        /// What is in the way.
        reason: &'static str,
    },
    /// Bigger than allowed.
    #[error("{path:?} is {size} bytes; at most {max} can be read")]
    TooLarge {
        /// The path.
        path: String,
        /// Its size.
        size: u64,
        /// The limit.
        max: u64,
    },
    /// The file system failed.
    #[error("{path:?}: {source}")]
    Io {
        /// The path.
        path: String,
        /// The error.
        source: std::io::Error,
    },
}

/// Checks a relative working-directory path; answers its components.
pub fn components(path: &str) -> Result<Vec<&str>, WorkdirError> {
    let invalid = |reason| WorkdirError::InvalidPath {
        path: path.to_owned(),
        reason,
    };
    if path.is_empty() {
        return Err(invalid("it is empty"));
    }
    if path.len() > MAX_PATH_BYTES {
        return Err(invalid("it is longer than 4096 bytes"));
    }
    if path.starts_with('/') {
        return Err(invalid("it must be relative to the working directory"));
    }
    if path.contains('\0') {
        return Err(invalid("it contains a NUL byte"));
    }
    if path.contains('\\') {
        return Err(invalid("it contains a backslash"));
    }
    let parts: Vec<&str> = path.split('/').collect();
    if parts.iter().any(|part| part.is_empty()) {
        return Err(invalid("it has an empty component"));
    }
    if parts.iter().any(|part| *part == "." || *part == "..") {
        return Err(invalid("it has a . or .. component"));
    }
    Ok(parts)
}

fn errno_error(path: &str, errno: Errno) -> WorkdirError {
    let path = path.to_owned();
    match errno {
        Errno::NOENT => WorkdirError::NotFound(path),
        Errno::NOTDIR => WorkdirError::Conflict {
            path,
            reason: "a file is in the way of a directory",
        },
        Errno::ISDIR => WorkdirError::Conflict {
            path,
            reason: "it is a directory",
        },
        Errno::LOOP | Errno::XDEV => WorkdirError::Conflict {
            path,
            reason: "a symbolic link is in the way (links are not followed out of, or within, the path)",
        },
        other => WorkdirError::Io {
            path,
            source: other.into(),
        },
    }
}

fn open_root(root: &Path, path: &str) -> Result<OwnedFd, WorkdirError> {
    rustix::fs::open(
        root,
        OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|errno| WorkdirError::Io {
        path: path.to_owned(),
        source: errno.into(),
    })
}

/// Opens directory `name` beneath `dir`, following no link.
fn open_dir(dir: &OwnedFd, name: &str) -> Result<OwnedFd, Errno> {
    rustix::fs::openat2(
        dir,
        name,
        OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        Mode::empty(),
        ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS,
    )
}

/// Reads a file of the working directory (at most `max` bytes).
pub fn read(root: &Path, path: &str, max: u64) -> Result<Vec<u8>, WorkdirError> {
    components(path)?;
    let dir = open_root(root, path)?;
    // Non-blocking: a FIFO the session made must not hold the node until a writer appears;
    // it is refused below, like anything that is not a regular file.
    let fd = rustix::fs::openat2(
        &dir,
        path,
        OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOCTTY | OFlags::NONBLOCK,
        Mode::empty(),
        ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS,
    )
    .map_err(|errno| errno_error(path, errno))?;
    let stat = rustix::fs::fstat(&fd).map_err(|errno| errno_error(path, errno))?;
    let kind = rustix::fs::FileType::from_raw_mode(stat.st_mode);
    if kind == rustix::fs::FileType::Directory {
        return Err(errno_error(path, Errno::ISDIR));
    }
    if kind != rustix::fs::FileType::RegularFile {
        return Err(WorkdirError::Conflict {
            path: path.to_owned(),
            reason: "it is not a regular file",
        });
    }
    let size = u64::try_from(stat.st_size).unwrap_or(0);
    if size > max {
        return Err(WorkdirError::TooLarge {
            path: path.to_owned(),
            size,
            max,
        });
    }
    let mut file = std::fs::File::from(fd);
    let mut content = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
    Read::by_ref(&mut file)
        .take(max + 1)
        .read_to_end(&mut content)
        .map_err(|source| WorkdirError::Io {
            path: path.to_owned(),
            source,
        })?;
    if content.len() as u64 > max {
        return Err(WorkdirError::TooLarge {
            path: path.to_owned(),
            size: content.len() as u64,
            max,
        });
    }
    Ok(content)
}

/// Writes a file of the working directory, making its parents; everything made is owned by
/// `uid`.
pub fn write(root: &Path, path: &str, content: &[u8], uid: u32) -> Result<u64, WorkdirError> {
    let parts = components(path)?;
    let owner = Some(rustix::process::Uid::from_raw(uid));
    let group = Some(rustix::process::Gid::from_raw(uid));
    let mut dir = open_root(root, path)?;
    let (name, parents) = parts
        .split_last()
        .ok_or_else(|| WorkdirError::InvalidPath {
            path: path.to_owned(),
            reason: "it is empty",
        })?;
    for part in parents {
        let made = match rustix::fs::mkdirat(&dir, *part, Mode::from_raw_mode(0o755)) {
            Ok(()) => true,
            Err(Errno::EXIST) => false,
            Err(errno) => return Err(errno_error(path, errno)),
        };
        dir = open_dir(&dir, part).map_err(|errno| errno_error(path, errno))?;
        if made {
            rustix::fs::fchown(&dir, owner, group).map_err(|errno| errno_error(path, errno))?;
        }
    }
    let fd = rustix::fs::openat2(
        &dir,
        *name,
        OFlags::WRONLY | OFlags::CREATE | OFlags::TRUNC | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        Mode::from_raw_mode(0o644),
        ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS,
    )
    .map_err(|errno| errno_error(path, errno))?;
    rustix::fs::fchown(&fd, owner, group).map_err(|errno| errno_error(path, errno))?;
    let mut file = std::fs::File::from(fd);
    file.write_all(content)
        .and_then(|()| file.flush())
        .map_err(|source| WorkdirError::Io {
            path: path.to_owned(),
            source,
        })?;
    Ok(content.len() as u64)
}

/// Deletes a file, link or whole directory of the working directory.
pub fn delete(root: &Path, path: &str) -> Result<(), WorkdirError> {
    let parts = components(path)?;
    let mut dir = open_root(root, path)?;
    let (name, parents) = parts
        .split_last()
        .ok_or_else(|| WorkdirError::InvalidPath {
            path: path.to_owned(),
            reason: "it is empty",
        })?;
    for part in parents {
        dir = open_dir(&dir, part).map_err(|errno| errno_error(path, errno))?;
    }
    match rustix::fs::unlinkat(&dir, *name, AtFlags::empty()) {
        Ok(()) => Ok(()),
        Err(Errno::ISDIR) => {
            // The directory's own descriptor names it, whatever happens to the path meanwhile;
            // std's `remove_dir_all` walks it without following links.
            use std::os::fd::AsRawFd;
            let beneath = format!("/proc/self/fd/{}/{name}", dir.as_raw_fd());
            std::fs::remove_dir_all(beneath).map_err(|source| WorkdirError::Io {
                path: path.to_owned(),
                source,
            })
        }
        Err(errno) => Err(errno_error(path, errno)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_follow_the_rules() {
        assert!(components("a/b.txt").is_ok());
        for bad in ["", "/etc/passwd", "a/../b", "./a", "a//b", "a\\b", "a\0b"] {
            assert!(components(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn links_out_of_the_directory_are_not_followed() {
        let root = tempfile::tempdir().expect("tempdir");
        let outside = tempfile::tempdir().expect("tempdir");
        std::fs::write(outside.path().join("secret"), "secret").expect("write");
        std::os::unix::fs::symlink(outside.path(), root.path().join("out")).expect("link");
        std::os::unix::fs::symlink(outside.path().join("secret"), root.path().join("s"))
            .expect("link");
        let uid = rustix::process::getuid().as_raw();
        assert!(read(root.path(), "out/secret", 1024).is_err());
        assert!(read(root.path(), "s", 1024).is_err());
        assert!(write(root.path(), "out/new", b"x", uid).is_err());
        assert!(write(root.path(), "s", b"x", uid).is_err());
        assert_eq!(
            std::fs::read_to_string(outside.path().join("secret")).expect("read"),
            "secret"
        );
        assert!(!outside.path().join("new").exists());
        // Deleting the link removes the link, not what it points at.
        delete(root.path(), "out").expect("delete");
        assert!(outside.path().join("secret").exists());
    }

    #[test]
    fn a_fifo_is_refused_without_waiting_for_a_writer() {
        let root = tempfile::tempdir().expect("tempdir");
        rustix::fs::mkfifoat(
            rustix::fs::CWD,
            root.path().join("pipe"),
            Mode::from_raw_mode(0o644),
        )
        .expect("mkfifo");
        assert!(matches!(
            read(root.path(), "pipe", 1024),
            Err(WorkdirError::Conflict { .. })
        ));
    }

    #[test]
    fn files_are_written_read_and_deleted() {
        let root = tempfile::tempdir().expect("tempdir");
        let uid = rustix::process::getuid().as_raw();
        write(root.path(), "a/b/c.txt", b"hello", uid).expect("write");
        assert_eq!(
            read(root.path(), "a/b/c.txt", 1024).expect("read"),
            b"hello"
        );
        assert!(matches!(
            read(root.path(), "a/b/c.txt", 2),
            Err(WorkdirError::TooLarge { .. })
        ));
        assert!(matches!(
            write(root.path(), "a/b/c.txt/d", b"x", uid),
            Err(WorkdirError::Conflict { .. })
        ));
        delete(root.path(), "a").expect("delete");
        assert!(matches!(
            read(root.path(), "a/b/c.txt", 1024),
            Err(WorkdirError::NotFound(_))
        ));
    }
}
