//! Files of a session's working directory through the files API (`GET`/`PUT`/`DELETE
//! /v1/sessions/{id}/files/{path}`), read and written by the node (root) on the session's
//! behalf. The path is checked against the API's rule here ([`components`]: relative, no `.`
//! or `..`); what makes it safe is the one implementation every file call of the node uses,
//! [`beneath`]: every step `openat2` beneath the directory's descriptor,
//! parents walked without following any link, a file checked before it is opened (never a
//! FIFO or a device, never a hard link to a file the session does not own), and a write
//! made as a temporary file renamed into place.

use std::path::Path;

use plinth_kit::{ErrorCode, PlinthError};
use rustix::fs::AtFlags;
use rustix::io::Errno;

use crate::workspace::beneath;

/// Most bytes of one path.
pub const MAX_PATH_BYTES: usize = 4096;

/// Checks a relative working-directory path; answers its components.
pub fn components(path: &str) -> Result<Vec<&str>, PlinthError> {
    let invalid = |reason: &str| PlinthError::invalid(format!("invalid path {path:?}: {reason}"));
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

/// The files API's words for what the workspace layer found: a missing path is `not_found`,
/// a path in the way or not allowed is `environment_invalid`, as the API's own path checks say.
fn for_files_api(error: PlinthError) -> PlinthError {
    match error.code {
        ErrorCode::WorkspaceNotFound => PlinthError::new(
            ErrorCode::NotFound,
            format!("{} (in the session's working directory)", error.message),
        ),
        ErrorCode::WorkspacePathInvalid | ErrorCode::WorkspaceReadOnly => {
            PlinthError::invalid(error.message)
        }
        _ => error,
    }
}

/// Reads a file of the working directory (at most `max` bytes); a file with several links
/// is read only if `owner` owns it.
pub fn read(root: &Path, path: &str, max: u64, owner: Option<u32>) -> Result<Vec<u8>, PlinthError> {
    components(path)?;
    let dir = beneath::open_root(root)?;
    beneath::read_all(&dir, path, path, owner, max)
        .map(|(content, _)| content)
        .map_err(for_files_api)
}

/// Writes a file of the working directory, making its parents; everything made is owned by
/// `uid`. A file written over keeps its mode; a link or directory in the way is refused.
pub fn write(root: &Path, path: &str, content: &[u8], uid: u32) -> Result<u64, PlinthError> {
    let parts: Vec<String> = components(path)?.into_iter().map(str::to_owned).collect();
    let written = (|| {
        let root = beneath::open_root(root)?;
        let (dir, name) = beneath::parent(&root, &parts, path, uid, true)?;
        let mode = beneath::existing(&dir, name, path)?.map_or(0o644, |stat| stat.st_mode & 0o7777);
        beneath::replace(&dir, name, content, mode, uid, path)
    })();
    written.map_err(for_files_api)?;
    Ok(content.len() as u64)
}

/// Deletes a file, link or whole directory of the working directory.
pub fn delete(root: &Path, path: &str) -> Result<(), PlinthError> {
    let parts: Vec<String> = components(path)?.into_iter().map(str::to_owned).collect();
    let deleted = (|| {
        let root = beneath::open_root(root)?;
        let (dir, name) = beneath::parent(&root, &parts, path, 0, false)?;
        match rustix::fs::unlinkat(&dir, name, AtFlags::empty()) {
            Ok(()) => Ok(()),
            Err(Errno::ISDIR) => {
                // The directory's own descriptor names it, whatever happens to the path
                // meanwhile; std's `remove_dir_all` walks it without following links.
                use std::os::fd::AsRawFd;
                let beneath = format!("/proc/self/fd/{}/{name}", dir.as_raw_fd());
                std::fs::remove_dir_all(beneath).map_err(|error| PlinthError::internal(&error))
            }
            Err(errno) => Err(beneath::errno_error(path, errno)),
        }
    })();
    deleted.map_err(for_files_api)
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
        assert!(read(root.path(), "out/secret", 1024, None).is_err());
        assert!(read(root.path(), "s", 1024, None).is_err());
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
    fn a_hard_link_to_a_file_the_session_does_not_own_is_not_read() {
        let root = tempfile::tempdir().expect("tempdir");
        std::fs::write(root.path().join("theirs"), "not yours").expect("write");
        std::fs::hard_link(root.path().join("theirs"), root.path().join("link")).expect("link");
        let owner = rustix::process::getuid().as_raw();
        // The file is the test's own: read through either name by its owner...
        assert_eq!(
            read(root.path(), "link", 1024, Some(owner)).expect("read"),
            b"not yours"
        );
        // ...and refused to anyone else, as it would be to a session whose uid it is not.
        assert_eq!(
            read(root.path(), "link", 1024, Some(owner.wrapping_add(1)))
                .map_err(|error| error.code),
            Err(ErrorCode::EnvironmentInvalid)
        );
    }

    #[test]
    fn a_fifo_is_refused_without_waiting_for_a_writer() {
        let root = tempfile::tempdir().expect("tempdir");
        rustix::fs::mkfifoat(
            rustix::fs::CWD,
            root.path().join("pipe"),
            rustix::fs::Mode::from_raw_mode(0o644),
        )
        .expect("mkfifo");
        assert_eq!(
            read(root.path(), "pipe", 1024, None).map_err(|error| error.code),
            Err(ErrorCode::EnvironmentInvalid)
        );
    }

    #[test]
    fn files_are_written_read_and_deleted() {
        let root = tempfile::tempdir().expect("tempdir");
        let uid = rustix::process::getuid().as_raw();
        write(root.path(), "a/b/c.txt", b"hello", uid).expect("write");
        assert_eq!(
            read(root.path(), "a/b/c.txt", 1024, None).expect("read"),
            b"hello"
        );
        fn code<T>(result: Result<T, PlinthError>) -> Result<(), ErrorCode> {
            result.map(|_| ()).map_err(|error| error.code)
        }
        assert_eq!(
            code(read(root.path(), "a/b/c.txt", 2, None)),
            Err(ErrorCode::FileTooLarge)
        );
        assert_eq!(
            code(write(root.path(), "a/b/c.txt/d", b"x", uid)),
            Err(ErrorCode::EnvironmentInvalid)
        );
        // Written over, a file keeps its mode.
        std::fs::set_permissions(
            root.path().join("a/b/c.txt"),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .expect("chmod");
        write(root.path(), "a/b/c.txt", b"again", uid).expect("write");
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(root.path().join("a/b/c.txt"))
                .expect("stat")
                .permissions(),
        );
        assert_eq!(mode & 0o777, 0o755);
        delete(root.path(), "a").expect("delete");
        assert_eq!(
            code(read(root.path(), "a/b/c.txt", 1024, None)),
            Err(ErrorCode::NotFound)
        );
    }
}
