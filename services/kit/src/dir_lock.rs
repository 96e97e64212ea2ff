//! One process per directory of state: an exclusive `flock` on a lock file inside it, held for
//! the process's life (the kernel lets it go when the process ends, however it ends). The file
//! names its holder (pid, command, listen address), so the process refused can say whom it
//! met and what to do.

use std::io::{Read as _, Seek as _, Write as _};
use std::path::{Path, PathBuf};

/// A held lock; dropping it (or the process ending) releases it.
#[derive(Debug)]
pub struct DirLock {
    file: std::fs::File,
    path: PathBuf,
    command: String,
}

/// Who holds a lock, as its file says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Holder {
    /// Its process id.
    pub pid: Option<u32>,
    /// The command it runs (`serve`, `catalog`, …).
    pub command: Option<String>,
    /// The address it listens on, once it does.
    pub listen: Option<String>,
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let command = self.command.as_deref().unwrap_or("plinth");
        match self.pid {
            Some(pid) => write!(f, "`plinth {command}` (pid {pid}")?,
            None => write!(f, "`plinth {command}` (pid unknown")?,
        }
        match &self.listen {
            Some(listen) => write!(f, ", listening on {listen})"),
            None => write!(f, ", no listen address yet)"),
        }
    }
}

/// Why a lock was not taken.
#[derive(Debug, thiserror::Error)]
pub enum DirLockError {
    /// Another process holds it.
    #[error(
        "{dir} is in use by another Plinth process, {holder}: stop that process{stop}, or give this one another directory{flag}",
        stop = .holder.kill_hint()
    )]
    InUse {
        /// The directory.
        dir: PathBuf,
        /// Who holds it.
        holder: Box<Holder>,
        /// How to give another directory (` with --data-dir`).
        flag: String,
    },
    /// The directory or its lock file cannot be made or locked.
    #[error("cannot lock {path}: {source}")]
    Io {
        /// The lock file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

impl DirLockError {
    /// Who holds the lock, when another process does.
    pub fn holder(&self) -> Option<&Holder> {
        match self {
            DirLockError::InUse { holder, .. } => Some(holder),
            DirLockError::Io { .. } => None,
        }
    }
}

impl DirLock {
    /// Makes `dir` if needed and takes `<dir>/<file>` exclusively for `command` (this
    /// process), at once or not at all. `flag` says how the user gives another directory
    /// (`--data-dir`), for the refusal's message.
    pub fn acquire(
        dir: &Path,
        file: &str,
        command: &str,
        flag: &str,
    ) -> Result<Self, DirLockError> {
        let path = dir.join(file);
        let fail = |source| DirLockError::Io {
            path: path.clone(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(fail)?;
        let mut opened = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&path)
            .map_err(fail)?;
        match rustix::fs::flock(
            &opened,
            rustix::fs::FlockOperation::NonBlockingLockExclusive,
        ) {
            Ok(()) => {}
            Err(rustix::io::Errno::WOULDBLOCK) => {
                let mut said = String::new();
                let _ = opened.read_to_string(&mut said);
                let holder = Holder::parse(&said);
                return Err(DirLockError::InUse {
                    dir: dir.to_owned(),
                    flag: if flag.is_empty() {
                        String::new()
                    } else {
                        format!(" with {flag}")
                    },
                    holder: Box::new(holder),
                });
            }
            Err(error) => return Err(fail(error.into())),
        }
        let lock = DirLock {
            file: opened,
            path: path.clone(),
            command: command.to_owned(),
        };
        lock.write(None).map_err(fail)?;
        Ok(lock)
    }

    /// Records the address this process listens on, for the message another one gets.
    pub fn listening(&self, address: &str) {
        if let Err(error) = self.write(Some(address)) {
            tracing::warn!(path = %self.path.display(), %error, "cannot record the listen address in the lock file");
        }
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn write(&self, listen: Option<&str>) -> std::io::Result<()> {
        let mut text = format!("pid={}\ncommand={}\n", std::process::id(), self.command);
        if let Some(listen) = listen {
            text.push_str(&format!("listen={listen}\n"));
        }
        let mut file = &self.file;
        file.set_len(0)?;
        file.rewind()?;
        file.write_all(text.as_bytes())?;
        file.flush()
    }
}

impl Holder {
    /// ` (kill <pid>)` when the pid is known, for a message that says how to stop it.
    pub fn kill_hint(&self) -> String {
        self.pid
            .map(|pid| format!(" (kill {pid})"))
            .unwrap_or_default()
    }

    /// Reads a lock file's `key=value` lines; anything else is ignored.
    pub fn parse(text: &str) -> Self {
        let mut holder = Holder::default();
        for line in text.lines() {
            let Some((key, value)) = line.split_once('=') else {
                continue;
            };
            let value = value.trim();
            if value.is_empty() {
                continue;
            }
            match key.trim() {
                "pid" => holder.pid = value.parse().ok(),
                "command" => holder.command = Some(value.to_owned()),
                "listen" => holder.listen = Some(value.to_owned()),
                _ => {}
            }
        }
        holder
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_on_a_directory_is_refused_naming_the_holder() {
        let dir = tempfile::tempdir().expect("dir");
        let first = DirLock::acquire(dir.path(), "x.lock", "serve", "--data-dir").expect("first");
        first.listening("127.0.0.1:8080");
        let refused =
            DirLock::acquire(dir.path(), "x.lock", "serve", "--data-dir").expect_err("held");
        let holder = refused.holder().expect("a holder");
        assert_eq!(holder.pid, Some(std::process::id()));
        assert_eq!(holder.listen.as_deref(), Some("127.0.0.1:8080"));
        let message = refused.to_string();
        assert!(
            message.contains(&format!("pid {}", std::process::id()))
                && message.contains("127.0.0.1:8080")
                && message.contains("--data-dir"),
            "{message}"
        );
        drop(first);
        DirLock::acquire(dir.path(), "x.lock", "serve", "--data-dir").expect("free again");
    }

    #[test]
    fn a_lock_file_of_another_shape_names_no_one() {
        assert_eq!(Holder::parse("garbage\n\u{0}\npid=x\n"), Holder::default());
    }
}
