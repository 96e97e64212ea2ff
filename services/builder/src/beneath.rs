//! Reading what a build wrote, as the builder (root) must: beneath a directory's descriptor,
//! following no link at all.
//!
//! A build can write its scratch directory (the project tree, `.venv`, `node_modules`), its
//! download cache (kept per scope between builds) and its HOME and `/tmp`; and whatever it
//! leaves there may be a symbolic link to anywhere on the host, a FIFO that never answers, or a
//! file far larger than memory. So every read or walk the builder makes there resolves its
//! path with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)` from the
//! descriptor of a directory the builder made itself: a link anywhere on the way is an error
//! (`ELOOP`), never followed. A file is first opened `O_PATH` and checked with `fstat`; only a
//! regular file is then opened for reading, through that descriptor (a FIFO or device is
//! never opened), and callers read a bounded amount of it.

use std::ffi::{OsStr, OsString};
use std::io::{Read, Seek};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags, Stat};
use rustix::io::Errno;

/// How paths beneath a directory are resolved: never above it, through no link.
const RESOLVE: ResolveFlags = ResolveFlags::BENEATH
    .union(ResolveFlags::NO_SYMLINKS)
    .union(ResolveFlags::NO_MAGICLINKS);

/// Opens a directory the builder made (the scratch directory, the cache's home): the
/// descriptor everything else here is resolved from. Its own last component is not followed.
pub fn open_root(path: &Path) -> std::io::Result<OwnedFd> {
    Ok(rustix::fs::open(
        path,
        OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        Mode::empty(),
    )?)
}

/// The directory `rel` beneath `dir` (`""`: `dir` itself). A link on the way is `ELOOP`, a
/// non-directory `ENOTDIR`.
pub fn open_dir(dir: impl AsFd, rel: impl AsRef<Path>) -> std::io::Result<OwnedFd> {
    let rel = rel.as_ref();
    let rel = if rel.as_os_str().is_empty() {
        Path::new(".")
    } else {
        rel
    };
    Ok(rustix::fs::openat2(
        dir,
        rel,
        OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        Mode::empty(),
        RESOLVE,
    )?)
}

/// The status of `rel` beneath `dir` itself (a link is reported as a link), or `None` when it
/// or a directory on the way is absent, or the way holds a link or a non-directory.
pub fn lstat(dir: impl AsFd, rel: impl AsRef<Path>) -> std::io::Result<Option<Stat>> {
    let rel = rel.as_ref();
    let (parent, name) = split(rel);
    let parent = match open_dir(dir, parent) {
        Ok(parent) => parent,
        Err(error) if absent(&error) => return Ok(None),
        Err(error) => return Err(error),
    };
    match rustix::fs::statat(&parent, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(stat) => Ok(Some(stat)),
        Err(Errno::NOENT) => Ok(None),
        Err(errno) => Err(errno.into()),
    }
}

/// Whether an error means "nothing usable there": absent, a link (`ELOOP`) or a file (`ENOTDIR`)
/// where a directory should be.
pub fn absent(error: &std::io::Error) -> bool {
    matches!(
        error.raw_os_error(),
        Some(libc::ENOENT | libc::ELOOP | libc::ENOTDIR | libc::EXDEV)
    )
}

/// Opens the regular file `rel` beneath `dir` for reading, with its status; anything else (a
/// link, a FIFO, a socket, a device, a directory) is an error and is never opened.
pub fn open_regular(
    dir: impl AsFd,
    rel: impl AsRef<Path>,
) -> std::io::Result<(std::fs::File, Stat)> {
    let path = rustix::fs::openat2(
        dir,
        rel.as_ref(),
        OFlags::PATH | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        Mode::empty(),
        RESOLVE,
    )?;
    let stat = rustix::fs::fstat(&path)?;
    if kind(&stat) != FileType::RegularFile {
        return Err(std::io::Error::other("not a regular file"));
    }
    // Through the descriptor checked above, whatever the name holds now.
    let file = rustix::fs::open(
        format!("/proc/self/fd/{}", path.as_raw_fd()).as_str(),
        OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOCTTY | OFlags::NONBLOCK,
        Mode::empty(),
    )?;
    Ok((std::fs::File::from(file), stat))
}

/// At most `max` bytes of the regular file `rel` beneath `dir`; `None` when there is no
/// regular file there (absent, a link on the way, something else) or it is larger than `max`.
pub fn read_small(dir: impl AsFd, rel: impl AsRef<Path>, max: u64) -> Option<Vec<u8>> {
    let (file, stat) = open_regular(dir, rel).ok()?;
    if u64::try_from(stat.st_size).unwrap_or(u64::MAX) > max {
        return None;
    }
    let mut bytes = Vec::new();
    file.take(max).read_to_end(&mut bytes).ok()?;
    Some(bytes)
}

/// The last `max` bytes of `file` (at most), and whether anything before them was left out.
pub fn read_tail(file: &mut std::fs::File, max: u64) -> std::io::Result<(Vec<u8>, bool)> {
    let length = file.metadata()?.len();
    let skip = length.saturating_sub(max);
    file.seek(std::io::SeekFrom::Start(skip))?;
    let mut tail = Vec::new();
    file.take(max).read_to_end(&mut tail)?;
    Ok((tail, skip > 0))
}

/// The target of the link `rel` beneath `dir` (the link itself is not followed, nor any on the
/// way to it).
pub fn read_link(dir: impl AsFd, rel: impl AsRef<Path>) -> std::io::Result<PathBuf> {
    let (parent, name) = split(rel.as_ref());
    let parent = open_dir(dir, parent)?;
    let target = rustix::fs::readlinkat(&parent, name, Vec::new())?;
    Ok(PathBuf::from(OsString::from_vec(target.into_bytes())))
}

/// The names in the directory `dir` (not `.` and `..`), sorted, with their status (links not
/// followed). Names that vanish meanwhile are left out.
pub fn entries(dir: &OwnedFd) -> std::io::Result<Vec<(OsString, Stat)>> {
    let mut names = Vec::new();
    for entry in rustix::fs::Dir::read_from(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_bytes();
        if name != b"." && name != b".." {
            names.push(OsString::from_vec(name.to_vec()));
        }
    }
    names.sort();
    Ok(names
        .into_iter()
        .filter_map(|name| {
            let stat = rustix::fs::statat(dir, name.as_os_str(), AtFlags::SYMLINK_NOFOLLOW).ok()?;
            Some((name, stat))
        })
        .collect())
}

/// One entry met by [`walk`].
pub struct Walked<'a> {
    /// Its path relative to where the walk started.
    pub rel: &'a Path,
    /// Its name, in `dir`.
    pub name: &'a OsStr,
    /// Its status (a link is a link).
    pub stat: &'a Stat,
    /// The directory holding it.
    pub dir: &'a OwnedFd,
}

/// Walks the directory `rel` beneath `root` depth-first in name order, following no link;
/// `visit` sees every entry and answers whether to descend into it (only directories are
/// descended into). A directory that cannot be opened or read ends the walk with its error.
pub fn walk(
    root: impl AsFd,
    rel: impl AsRef<Path>,
    visit: &mut dyn FnMut(&Walked<'_>) -> bool,
) -> std::io::Result<()> {
    let first = open_dir(root, rel)?;
    let mut pending: Vec<(OwnedFd, PathBuf)> = vec![(first, PathBuf::new())];
    while let Some((dir, prefix)) = pending.pop() {
        let mut children = Vec::new();
        for (name, stat) in entries(&dir)? {
            let rel = prefix.join(&name);
            let descend = visit(&Walked {
                rel: &rel,
                name: &name,
                stat: &stat,
                dir: &dir,
            });
            if descend && kind(&stat) == FileType::Directory {
                children.push((open_dir(&dir, &name)?, rel));
            }
        }
        pending.extend(children.into_iter().rev());
    }
    Ok(())
}

/// The kind of a status.
pub fn kind(stat: &Stat) -> FileType {
    FileType::from_raw_mode(stat.st_mode)
}

/// `rel`'s parent (`""` for a single name) and its last name.
fn split(rel: &Path) -> (&Path, &OsStr) {
    let name = rel.file_name().unwrap_or(rel.as_os_str());
    let parent = rel.parent().unwrap_or(Path::new(""));
    (parent, name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_on_the_way_are_refused_and_only_regular_files_are_read() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (root, outside) = (dir.path().join("root"), dir.path().join("outside"));
        std::fs::create_dir_all(root.join("real")).expect("mkdir");
        std::fs::create_dir(&outside).expect("mkdir");
        std::fs::write(outside.join("secret"), "secret").expect("write");
        std::fs::write(root.join("real/file"), "mine").expect("write");
        std::os::unix::fs::symlink(&outside, root.join("link")).expect("symlink");
        std::os::unix::fs::symlink("real", root.join("inner")).expect("symlink");
        std::os::unix::fs::symlink(outside.join("secret"), root.join("real/to-secret"))
            .expect("symlink");
        rustix::fs::mkfifoat(
            rustix::fs::CWD,
            root.join("fifo"),
            Mode::from_raw_mode(0o600),
        )
        .expect("fifo");
        let fd = open_root(&root).expect("root");

        assert_eq!(
            read_small(&fd, "real/file", 10).as_deref(),
            Some(&b"mine"[..])
        );
        assert_eq!(read_small(&fd, "real/file", 2), None, "too large");
        for refused in [
            "link/secret",
            "inner/file",
            "real/to-secret",
            "../outside/secret",
            "fifo",
        ] {
            assert!(read_small(&fd, refused, 100).is_none(), "{refused}");
        }
        assert!(absent(&open_dir(&fd, "link").expect_err("a link")));
        assert!(lstat(&fd, "link/secret").expect("lstat").is_none());
        assert_eq!(
            lstat(&fd, "link").expect("lstat").map(|stat| kind(&stat)),
            Some(FileType::Symlink)
        );
        assert_eq!(
            read_link(&fd, "real/to-secret").expect("readlink"),
            outside.join("secret")
        );

        let mut seen = Vec::new();
        walk(&fd, "", &mut |walked| {
            seen.push(walked.rel.to_string_lossy().into_owned());
            true
        })
        .expect("walk");
        assert_eq!(
            seen,
            [
                "fifo",
                "inner",
                "link",
                "real",
                "real/file",
                "real/to-secret"
            ]
        );

        let (mut file, _) = open_regular(&fd, "real/file").expect("open");
        assert_eq!(
            read_tail(&mut file, 2).expect("tail"),
            (b"ne".to_vec(), true)
        );
    }
}
