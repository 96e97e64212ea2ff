//! A session's command on a pseudo-terminal (`NodeService.Pty`): what a person's interactive
//! shell needs that `Exec`'s pipes cannot give (line editing, job control, `isatty`, a size).
//!
//! The command is prepared and started exactly as `Exec` starts one ([`Node::prepare`],
//! [`crate::spawn`]): the same sandbox, cgroup, uid, seccomp filter, environment and `cwd`
//! rules. Only its standard input, output and error differ: all three are the slave of a
//! terminal the node opens, which the command takes as its controlling terminal.
//!
//! Its end is `Exec`'s too (see `crate::grpc::node`): when the command exits, its answer is what it
//! wrote until then, and what it left running goes on until the session ends (the kernel
//! hangs up the terminal's foreground process group as the command, the terminal's session
//! leader, exits, as at any terminal: `nohup` and an interactive shell's own jobs survive
//! that); what that writes to the terminal afterwards is read and dropped. Stopped before its
//! end (its time limit, its caller gone, its session ended) it is killed whole.
//!
//! In an isolated session the terminal comes from the sandbox's own `devpts` (its
//! `/dev/pts/ptmx`, reached through the keeper's root), so the command sees it as
//! `/dev/pts/N` inside the sandbox and no terminal of the host is visible or reachable there.

use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use plinth_kit::{ErrorCode, PlinthError};
use plinth_proto::node::v1 as pb;
use tokio::io::unix::AsyncFd;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Status, Streaming};

use crate::isolation;
use crate::node::{Node, Prepared, cwd_refused, exec_result};

/// The stream of a terminal's output.
pub type PtyStream = ReceiverStream<Result<pb::PtyOutput, Status>>;

/// A terminal's size when its caller names none.
const DEFAULT_SIZE: (u16, u16) = (80, 24);
/// The largest number of columns or rows a terminal may have.
const MAX_CELLS: u32 = 1000;
/// `TERM` when the caller sets none: what terminals people use today emulate.
const DEFAULT_TERM: &str = "xterm-256color";
/// The end-of-file character of a terminal in its default (canonical) mode: Ctrl-D.
const EOF_CHARACTER: u8 = 0x04;
/// The most read from a terminal once its command has ended: more than the kernel buffers
/// between the two ends (what the command wrote is all there), little enough that output
/// written after it by what it left running cannot hold the answer.
const TERMINAL_DRAIN_BYTES: usize = 1024 * 1024;

fn output(output: pb::pty_output::Output) -> pb::PtyOutput {
    pb::PtyOutput {
        output: Some(output),
    }
}

/// A size as sent (0 and out-of-range values clamped: a resize is never worth ending a shell
/// over).
fn winsize(size: Option<&pb::PtySize>) -> rustix::termios::Winsize {
    let (default_cols, default_rows) = DEFAULT_SIZE;
    let cells = |value: u32, default: u16| match value {
        0 => default,
        value => u16::try_from(value.min(MAX_CELLS)).unwrap_or(default),
    };
    rustix::termios::Winsize {
        ws_col: size.map_or(default_cols, |size| cells(size.cols, default_cols)),
        ws_row: size.map_or(default_rows, |size| cells(size.rows, default_rows)),
        ws_xpixel: 0,
        ws_ypixel: 0,
    }
}

/// Opens a terminal: its master (non-blocking) for the node, its slave for the command,
/// owned by the command's uid. `sandbox`: the session's, whose own `devpts` it comes from.
fn open_terminal(
    sandbox: Option<&isolation::Sandbox>,
    uid: Option<u32>,
    size: rustix::termios::Winsize,
) -> std::io::Result<(OwnedFd, OwnedFd)> {
    use rustix::pty::OpenptFlags;
    let master = match sandbox {
        Some(sandbox) => {
            use rustix::fs::{OFlags, ResolveFlags};
            let root = rustix::fs::open(
                format!("/proc/{}/root", sandbox.keeper.pid().as_raw_nonzero()),
                OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
                rustix::fs::Mode::empty(),
            )?;
            // Resolved as the sandbox sees its tree, following no link: the sandbox's files
            // cannot point the node at one of its own.
            let master = rustix::fs::openat2(
                &root,
                "dev/pts/ptmx",
                OFlags::RDWR | OFlags::NOCTTY | OFlags::CLOEXEC | OFlags::NONBLOCK,
                rustix::fs::Mode::empty(),
                ResolveFlags::IN_ROOT | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
            )?;
            // A pseudo-terminal multiplexer (character device 5:2) and nothing else.
            let stat = rustix::fs::fstat(&master)?;
            let is_ptmx = rustix::fs::FileType::from_raw_mode(stat.st_mode)
                == rustix::fs::FileType::CharacterDevice
                && rustix::fs::major(stat.st_rdev) == 5
                && rustix::fs::minor(stat.st_rdev) == 2;
            if !is_ptmx {
                return Err(std::io::Error::other(
                    "the sandbox's /dev/pts/ptmx is not a terminal multiplexer",
                ));
            }
            master
        }
        None => {
            let master = rustix::pty::openpt(
                OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC,
            )?;
            let flags = rustix::fs::fcntl_getfl(&master)?;
            rustix::fs::fcntl_setfl(&master, flags | rustix::fs::OFlags::NONBLOCK)?;
            master
        }
    };
    rustix::pty::unlockpt(&master)?;
    // The slave from the master itself, not by its path: nothing can swap the path between.
    let slave = rustix::pty::ioctl_tiocgptpeer(
        &master,
        OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC,
    )?;
    if let Some(uid) = uid {
        // As `login` does: the terminal is its user's (`mesg`, `write` and `tty` agree).
        rustix::fs::fchown(
            &slave,
            Some(rustix::fs::Uid::from_raw(uid)),
            Some(rustix::fs::Gid::from_raw(uid)),
        )?;
    }
    rustix::termios::tcsetwinsize(&master, size)?;
    Ok((master, slave))
}

/// The interactive shell of a terminal started without a command: bash where the sandbox
/// has it (the host's `/bin` is the sandbox's), else sh. Not a login shell: `/etc/profile`
/// would replace the session's `PATH`.
fn interactive_shell() -> Vec<std::ffi::CString> {
    if std::path::Path::new("/bin/bash").exists() {
        vec![c"/bin/bash".to_owned(), c"-i".to_owned()]
    } else {
        vec![c"/bin/sh".to_owned(), c"-i".to_owned()]
    }
}

/// Reads what the command wrote to the terminal: `Ok(None)` once every slave is closed (the
/// kernel answers EIO then).
async fn read_master(
    master: &AsyncFd<OwnedFd>,
    buffer: &mut [u8],
) -> std::io::Result<Option<usize>> {
    loop {
        let mut ready = master.readable().await?;
        match ready.try_io(|fd| rustix::io::read(fd.get_ref(), &mut *buffer).map_err(Into::into)) {
            Ok(Ok(0)) => return Ok(None),
            Ok(Ok(read)) => return Ok(Some(read)),
            Ok(Err(error)) if error.raw_os_error() == Some(libc::EIO) => return Ok(None),
            Ok(Err(error)) => return Err(error),
            Err(_would_block) => continue,
        }
    }
}

/// Types `bytes` at the terminal, waiting while its input queue is full.
async fn write_master(master: &AsyncFd<OwnedFd>, mut bytes: &[u8]) -> std::io::Result<()> {
    while !bytes.is_empty() {
        let mut ready = master.writable().await?;
        match ready.try_io(|fd| rustix::io::write(fd.get_ref(), bytes).map_err(Into::into)) {
            Ok(Ok(written)) => bytes = &bytes[written..],
            Ok(Err(error)) => return Err(error),
            Err(_would_block) => continue,
        }
    }
    Ok(())
}

/// Feeds the caller's input to the terminal until the caller's stream ends; answers then
/// (the caller left, or broke the stream).
async fn feed(mut inputs: Streaming<pb::PtyRequest>, master: Arc<AsyncFd<OwnedFd>>) {
    loop {
        let input = match inputs.message().await {
            Ok(Some(pb::PtyRequest { input: Some(input) })) => input,
            Ok(Some(_)) => continue,
            Ok(None) | Err(_) => return,
        };
        let written = match input {
            pb::pty_request::Input::Stdin(bytes) => write_master(&master, &bytes).await,
            pb::pty_request::Input::Resize(size) => {
                // The kernel sends SIGWINCH to the terminal's foreground process group.
                rustix::termios::tcsetwinsize(master.get_ref(), winsize(Some(&size)))
                    .map_err(Into::into)
            }
            pb::pty_request::Input::CloseStdin(true) => {
                write_master(&master, &[EOF_CHARACTER]).await
            }
            pb::pty_request::Input::CloseStdin(false) => Ok(()),
            // Only the first message starts; a second start changes nothing.
            pb::pty_request::Input::Start(_) => Ok(()),
        };
        if let Err(error) = written {
            // The command ended and closed the terminal: what is typed after goes nowhere.
            tracing::debug!(%error, "terminal input not delivered");
        }
    }
}

/// Reads and drops what a terminal's command left running writes to it, until the last of
/// it closes the terminal (the master reads EIO) or the session ends.
async fn drain_left(master: Arc<AsyncFd<OwnedFd>>, ended: plinth_kit::tasks::CancellationToken) {
    let mut buffer = [0u8; 4096];
    let drain = async { while let Ok(Some(_)) = read_master(&master, &mut buffer).await {} };
    tokio::select! {
        () = drain => {}
        () = ended.cancelled() => {}
    }
}

impl Node {
    /// `NodeService.Pty`; see the module's comment.
    pub(crate) async fn pty(
        &self,
        mut inputs: Streaming<pb::PtyRequest>,
    ) -> Result<PtyStream, PlinthError> {
        let start = match inputs.message().await {
            Ok(Some(pb::PtyRequest {
                input: Some(pb::pty_request::Input::Start(start)),
            })) => start,
            Ok(_) => {
                return Err(PlinthError::invalid(
                    "a terminal's first message must be `start`, naming the session and the command",
                ));
            }
            Err(status) => return Err(PlinthError::from_status(&status)),
        };
        let spec = start
            .session
            .ok_or_else(|| PlinthError::invalid("a session is required"))?;
        let timeout = match start.timeout_ms {
            0 => self.limits.max_timeout,
            ms => Duration::from_millis(ms).min(self.limits.max_timeout),
        };
        let interactive = start.command.trim().is_empty();
        let mut env = start.env;
        env.entry("TERM".to_owned())
            .or_insert_with(|| DEFAULT_TERM.to_owned());
        let Prepared {
            session,
            mut command,
            namespace,
            oom_before,
        } = self.prepare(&spec, start.command, &start.cwd, env).await?;
        if interactive {
            command.argv = interactive_shell();
        }
        let size = winsize(start.size.as_ref());
        let (master, slave) = open_terminal(namespace.as_deref(), command.uid, size)
            .map_err(|error| {
                tracing::warn!(session = %session.record.session_id, %error, "cannot open a terminal");
                PlinthError::new(
                    ErrorCode::Unavailable,
                    format!("opening a terminal in the session: {error}"),
                )
            })?;
        command.terminal = Some(slave);
        let started = Instant::now();
        let spawned = crate::spawn::spawn(&command);
        // Only the command holds the slave now, so the master reads EIO once it and what it
        // started are gone.
        command.terminal = None;
        let mut child = match spawned {
            Ok(child) => child,
            Err(error) if error.cwd_failure().is_some() => {
                return Err(cwd_refused(&error, &start.cwd));
            }
            Err(error) => {
                tracing::warn!(session = %session.record.session_id, %error, "a terminal's command could not be started");
                return Err(PlinthError::new(
                    ErrorCode::Unavailable,
                    format!("the terminal's command could not be started: {error}"),
                ));
            }
        };
        // SAFETY: an owned descriptor, which stays open and the same while the AsyncFd owns
        // it.
        #[allow(unsafe_code)]
        let master = unsafe { AsyncFd::register(master) }
            .map_err(|error| PlinthError::internal(&std::io::Error::other(error.to_string())))?;
        let master = Arc::new(master);
        let command_cgroup = command.cgroup.take();
        drop(command);
        let ended = session.ended.clone();
        let (outputs, receiver) = mpsc::channel::<Result<pb::PtyOutput, Status>>(32);
        plinth_kit::tasks::spawn(async move {
            let fed = feed(inputs, master.clone());
            tokio::pin!(fed);
            let group = child.pid();
            // Interactive shells put each job in a process group of its own: the command's
            // cgroup holds them all.
            let kill_all = || {
                let _ = rustix::process::kill_process_group(group, rustix::process::Signal::KILL);
                if let Some(cgroup) = &command_cgroup {
                    let _ = cgroup.kill_all();
                }
            };
            let mut buffer = vec![0u8; 16 * 1024];
            let mut closed = false;
            let mut timed_out = false;
            let deadline = tokio::time::sleep(timeout);
            tokio::pin!(deadline);
            let status = loop {
                tokio::select! {
                    // Its end, as when a terminal's shell exits: what it left running in the
                    // background goes on until the session ends (the kernel hangs up its
                    // foreground group, as it does at any terminal; `nohup` and a shell's
                    // jobs survive that).
                    status = child.wait() => break status.ok(),
                    read = read_master(&master, &mut buffer), if !closed => match read {
                        Ok(Some(read)) => {
                            let data = bytes::Bytes::copy_from_slice(&buffer[..read]);
                            if outputs.send(Ok(output(pb::pty_output::Output::Data(data)))).await.is_err() {
                                // The caller left: a terminal nobody watches is hung up.
                                kill_all();
                                break child.wait().await.ok();
                            }
                        }
                        Ok(None) | Err(_) => closed = true,
                    },
                    () = &mut fed => {
                        kill_all();
                        break child.wait().await.ok();
                    }
                    () = &mut deadline => {
                        timed_out = true;
                        kill_all();
                        break child.wait().await.ok();
                    }
                    () = ended.cancelled() => {
                        kill_all();
                        break child.wait().await.ok();
                    }
                }
            };
            // What it wrote before it ended is in the terminal: read without waiting, up to
            // what a terminal buffers, so a chatty background job cannot hold the answer.
            let mut drained = 0;
            while !closed && drained < TERMINAL_DRAIN_BYTES {
                match rustix::io::read(master.get_ref(), &mut buffer) {
                    Ok(0) => closed = true,
                    Ok(read) => {
                        drained += read;
                        let data = bytes::Bytes::copy_from_slice(&buffer[..read]);
                        if outputs
                            .send(Ok(output(pb::pty_output::Output::Data(data))))
                            .await
                            .is_err()
                        {
                            break;
                        }
                    }
                    Err(rustix::io::Errno::INTR) => {}
                    // EIO: every slave is closed. EAGAIN: what it left running holds one.
                    Err(rustix::io::Errno::IO) => closed = true,
                    Err(_) => break,
                }
            }
            let result = exec_result(
                status,
                started,
                timed_out,
                command_cgroup.as_ref(),
                oom_before,
                namespace.as_deref(),
            );
            let _ = outputs
                .send(Ok(output(pb::pty_output::Output::Result(result))))
                .await;
            drop(outputs);
            // What it left running still writes to the terminal: read and dropped until the
            // last of it closes the terminal or the session ends, so it never blocks on a
            // full one.
            if !closed {
                plinth_kit::tasks::spawn(drain_left(master, ended));
            }
            if let Some(cgroup) = command_cgroup {
                let _ = tokio::task::spawn_blocking(move || cgroup.remove()).await;
            }
        });
        Ok(ReceiverStream::new(receiver))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_size_defaults_to_80_by_24_and_is_clamped() {
        let size = winsize(None);
        assert_eq!((size.ws_col, size.ws_row), (80, 24));
        let size = winsize(Some(&pb::PtySize { cols: 0, rows: 50 }));
        assert_eq!((size.ws_col, size.ws_row), (80, 50));
        let size = winsize(Some(&pb::PtySize {
            cols: 100_000,
            rows: 7,
        }));
        assert_eq!((size.ws_col, size.ws_row), (1000, 7));
    }
}
