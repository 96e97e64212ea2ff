//! A session's name: the `passwd` and `group` files its sandbox shows over the host's.
//!
//! A session runs as a uid of the node's range that the host does not name, and much
//! everyday software asks for the name of its uid: `whoami` and `id -un` fail without one,
//! Python's `getpass.getuser()` raises, and pytest falls back to `/tmp/pytest-of-unknown`.
//! So each sandbox shows, read-only at `/etc/passwd` and `/etc/group`, the host's files with
//! one more entry: [`USER`], the session's uid and gid, its working directory as home. The
//! files are written by the node (root) beside the session's record, outside the working
//! directory, so the session can read them and never change them.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// Every session's user (and group) name: sessions never see each other, so one name serves
/// them all, and it matches where they see their home, `/home/session`.
pub const USER: &str = "session";

/// The files written for one session, shown at [`HOST_PASSWD`] and [`HOST_GROUP`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// Its `passwd`.
    pub passwd: PathBuf,
    /// Its `group`.
    pub group: PathBuf,
}

/// The host's user database, and where the session's is shown.
pub const HOST_PASSWD: &str = "/etc/passwd";
/// The host's group database, and where the session's is shown.
pub const HOST_GROUP: &str = "/etc/group";

/// The host's `passwd` text without any entry of [`USER`] or of `uid` (which would hide or
/// contradict the session's), then the session's entry.
pub fn passwd(host: &str, uid: u32, gid: u32, home: &str) -> String {
    let mut text = kept_lines(host, uid);
    text.push_str(&format!(
        "{USER}:x:{uid}:{gid}:Plinth session:{home}:/bin/sh\n"
    ));
    text
}

/// The host's `group` text without any entry of [`USER`] or of `gid`, then the session's
/// group.
pub fn group(host: &str, gid: u32) -> String {
    let mut text = kept_lines(host, gid);
    text.push_str(&format!("{USER}:x:{gid}:\n"));
    text
}

/// Lines of a `name:x:id:…` file whose name is not [`USER`] and whose id is not `id`.
fn kept_lines(host: &str, id: u32) -> String {
    let mut text = String::with_capacity(host.len() + 64);
    for line in host.lines() {
        let mut fields = line.split(':');
        let name = fields.next().unwrap_or_default();
        let number = fields.nth(1).and_then(|field| field.parse::<u32>().ok());
        if name == USER || number == Some(id) {
            continue;
        }
        text.push_str(line);
        text.push('\n');
    }
    text
}

/// Writes the session's files into `dir` (its session directory, root's) for `uid` (also its
/// gid) with `home` as its home, each replaced atomically and readable by all; answers where
/// they are. A host without one of the databases gets none of that file (the sandbox shows
/// the host's `/etc`, and nothing can be put there): `None`.
pub fn write(dir: &Path, uid: u32, home: &str) -> std::io::Result<Option<Identity>> {
    let read = |path: &str| match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(error) => Err(std::io::Error::new(
            error.kind(),
            format!("reading {path}: {error}"),
        )),
    };
    let (Some(host_passwd), Some(host_group)) = (read(HOST_PASSWD)?, read(HOST_GROUP)?) else {
        return Ok(None);
    };
    let identity = Identity {
        passwd: dir.join("passwd"),
        group: dir.join("group"),
    };
    place(&identity.passwd, &passwd(&host_passwd, uid, uid, home))?;
    place(&identity.group, &group(&host_group, uid))?;
    Ok(Some(identity))
}

fn place(path: &Path, text: &str) -> std::io::Result<()> {
    let mut staging = path.as_os_str().to_owned();
    staging.push(".tmp");
    let staging = PathBuf::from(staging);
    std::fs::write(&staging, text)?;
    std::fs::set_permissions(&staging, std::fs::Permissions::from_mode(0o644))?;
    std::fs::rename(&staging, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_session_is_named_once_and_the_hosts_entries_stay() {
        let host = "root:x:0:0:root:/root:/bin/bash\n\
                    session:x:1000:1000::/home/session:/bin/sh\n\
                    squatter:x:200001:200001::/nonexistent:/usr/sbin/nologin\n\
                    nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin";
        let text = passwd(host, 200_001, 200_001, "/home/session");
        assert_eq!(
            text,
            "root:x:0:0:root:/root:/bin/bash\n\
             nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n\
             session:x:200001:200001:Plinth session:/home/session:/bin/sh\n"
        );
        let text = group("root:x:0:\nsession:x:7:\nusers:x:100:", 200_001);
        assert_eq!(text, "root:x:0:\nusers:x:100:\nsession:x:200001:\n");
    }

    #[test]
    fn the_files_are_written_beside_the_record_readable_by_all() {
        let dir = tempfile::tempdir().expect("test setup");
        let Some(identity) = write(dir.path(), 200_002, "/home/session").expect("written") else {
            // A host without /etc/passwd or /etc/group: nothing to show.
            return;
        };
        let text = std::fs::read_to_string(&identity.passwd).expect("passwd");
        assert!(
            text.ends_with("session:x:200002:200002:Plinth session:/home/session:/bin/sh\n"),
            "{text}"
        );
        let mode = std::fs::metadata(&identity.group)
            .expect("group")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o644);
        // Written again (a restarted node), it is replaced, not appended to.
        write(dir.path(), 200_002, "/home/session").expect("written again");
        let again = std::fs::read_to_string(&identity.passwd).expect("passwd");
        assert_eq!(again, text);
    }
}
