//! The seccomp filter of every session's and every build's processes: the system calls that
//! agents' commands and install scripts never need, refused.
//!
//! [`REFUSED`] lists each refused call with its reason, and the filter is compiled from that
//! table, so the two cannot disagree; everything not listed is allowed. A refused call fails with
//! `EPERM` (`clone3` with `ENOSYS`) and never kills; a call through another ABI than the one
//! built for (i386 on x86_64, x32, aarch32) kills the process. [`Filter::new`] does the
//! allocating work once; [`Filter::install`] allocates nothing and takes no lock, so it is safe
//! between `fork` (or `vfork`) and `execve`. Install it last: it refuses `setns`, `mount` and
//! `unshare`. Namespaces, identities, cgroups and mounts are other modules'.
//!
//! Why a deny-list, why the program is emitted here rather than by seccompiler, and its cost:
//! `docs/design/SANDBOX.md#the-seccomp-filter`.

use std::sync::OnceLock;

use libc::{c_long, sock_filter};

/// Every system call the filter refuses, and why, for docs/guide/sandbox.md to quote. All answer `EPERM`
/// except `clone3`, which answers `ENOSYS`; `clone`, `personality`, `socket` and `socketpair`
/// are refused only for the arguments named.
pub const REFUSED: &[(&str, &str)] = &[
    (
        "add_key",
        "kernel keyring: kernel state shared across the host, a history of escalations",
    ),
    (
        "request_key",
        "kernel keyring: kernel state shared across the host, a history of escalations",
    ),
    (
        "keyctl",
        "kernel keyring: kernel state shared across the host, a history of escalations",
    ),
    (
        "bpf",
        "loads programs into the kernel: a large attack surface no build needs",
    ),
    (
        "perf_event_open",
        "observes the host's CPUs and other processes; a history of escalations",
    ),
    (
        "userfaultfd",
        "lets a process stall the kernel mid-copy, the usual tool for kernel races",
    ),
    // Mounts and namespaces: the sandbox's file system view and its isolation are made by the
    // node before the command starts; inside, nothing may change or leave them.
    (
        "mount",
        "changes the sandbox's file system view, which the node alone sets up",
    ),
    (
        "umount2",
        "changes the sandbox's file system view, which the node alone sets up",
    ),
    (
        "pivot_root",
        "changes the sandbox's root, which the node alone sets up",
    ),
    (
        "move_mount",
        "new mount API: changes the sandbox's file system view",
    ),
    (
        "open_tree",
        "new mount API: clones mounts of the sandbox's file system view",
    ),
    (
        "open_tree_attr",
        "new mount API (Linux 6.15): clones mounts with new attributes",
    ),
    ("fsopen", "new mount API: creates file system instances"),
    (
        "fsconfig",
        "new mount API: configures file system instances",
    ),
    (
        "fsmount",
        "new mount API: turns a file system instance into a mount",
    ),
    ("fspick", "new mount API: reconfigures an existing mount"),
    (
        "mount_setattr",
        "new mount API: changes a mount's flags (read-only, nosuid, idmapping)",
    ),
    (
        "unshare",
        "makes new namespaces, whose user namespace opens kernel code to unprivileged users",
    ),
    (
        "setns",
        "enters another namespace, out of the sandbox's own",
    ),
    (
        "clone",
        "only with a CLONE_NEW* flag (a new namespace, as unshare); threads and fork stay allowed",
    ),
    (
        "clone3",
        "answers ENOSYS, not EPERM: its flags are in memory the filter cannot read, and on ENOSYS \
         libc falls back to clone, whose flags the filter checks",
    ),
    ("init_module", "loads a kernel module"),
    ("finit_module", "loads a kernel module"),
    ("delete_module", "unloads a kernel module"),
    ("kexec_load", "replaces the running kernel"),
    ("kexec_file_load", "replaces the running kernel"),
    ("reboot", "reboots or halts the host"),
    ("swapon", "changes the host's swap"),
    ("swapoff", "changes the host's swap"),
    ("acct", "switches the host's process accounting"),
    ("settimeofday", "sets the host's clock"),
    ("clock_settime", "sets the host's clock"),
    ("clock_adjtime", "adjusts the host's clock"),
    ("adjtimex", "adjusts the host's clock"),
    (
        "syslog",
        "reads or clears the kernel log, which holds other tenants' traces and addresses",
    ),
    ("quotactl", "changes disk quotas, which limit the sandbox"),
    (
        "quotactl_fd",
        "changes disk quotas, which limit the sandbox",
    ),
    (
        "open_by_handle_at",
        "opens a file by handle, past every mount and directory permission: a known container \
         escape (\"shocker\")",
    ),
    (
        "name_to_handle_at",
        "makes the handles open_by_handle_at uses",
    ),
    ("iopl", "raw I/O port access (x86_64 only)"),
    ("ioperm", "raw I/O port access (x86_64 only)"),
    (
        "io_uring_setup",
        "io_uring: a large kernel surface with a history of escalations; callers fall back to \
         ordinary calls",
    ),
    ("io_uring_enter", "io_uring: see io_uring_setup"),
    ("io_uring_register", "io_uring: see io_uring_setup"),
    (
        "lookup_dcookie",
        "profiling interface that reveals kernel file identities (removed in 6.8)",
    ),
    (
        "nfsservctl",
        "the kernel NFS server's control (removed in 3.1)",
    ),
    (
        "socket",
        "only for an address family other than AF_UNIX, AF_INET, AF_INET6 and AF_NETLINK \
         (which `ip`, `ss` and glibc's resolver use): AF_VSOCK reaches the hypervisor and the \
         host's other guests past the network namespace, AF_PACKET, AF_KEY, AF_ALG, \
         Bluetooth, CAN, TIPC, RDS, XDP and the rest are kernel code no session needs, with a \
         history of escalations, and a family added to a future kernel is refused too",
    ),
    ("socketpair", "only for the families socket refuses"),
    (
        "personality",
        "only to set a persona other than PER_LINUX (asking, with 0xffffffff, stays allowed): \
         the others weaken the memory layout exploits rely on (ADDR_NO_RANDOMIZE, \
         READ_IMPLIES_EXEC, MMAP_PAGE_ZERO) or serve other ABIs, which the filter kills anyway",
    ),
];

/// The `clone` flags that make a new namespace. `CLONE_NEWTIME` is not one of them for
/// `clone`: its bit is part of the exit signal there (it exists for `clone3` and `unshare`).
const CLONE_NEW_NAMESPACE: libc::c_int = libc::CLONE_NEWNS
    | libc::CLONE_NEWCGROUP
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET;

/// Linux's default persona (`PER_LINUX` in `<sys/personality.h>`; libc does not name it).
const PER_LINUX: u32 = 0;
/// `personality(0xffffffff)` returns the persona without changing it.
const PERSONALITY_QUERY: u32 = 0xffff_ffff;
/// What `personality` may be asked.
const PERSONALITIES: &[u32] = &[PER_LINUX, PERSONALITY_QUERY];

/// The address families `socket` and `socketpair` may make: local, IP and netlink (`ip`,
/// `ss`, glibc's `getaddrinfo` asking the kernel for the host's addresses).
const SOCKET_FAMILIES: &[u32] = &[
    libc::AF_UNIX as u32,
    libc::AF_INET as u32,
    libc::AF_INET6 as u32,
    libc::AF_NETLINK as u32,
];

/// `open_tree_attr` (Linux 6.15) has the same number on every architecture; libc does not
/// name it yet.
const SYS_OPEN_TREE_ATTR: c_long = 467;

/// `AUDIT_ARCH_*` of `<linux/audit.h>`, which libc does not name: the ELF machine, 64-bit,
/// little-endian.
#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 62 | 0x8000_0000 | 0x4000_0000;
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 183 | 0x8000_0000 | 0x4000_0000;
#[cfg(not(all(
    any(target_arch = "x86_64", target_arch = "aarch64"),
    target_endian = "little"
)))]
compile_error!("plinth-sandbox's seccomp filter is written for little-endian x86_64 and aarch64");

/// x32 calls are x86_64's `arch` with this bit in the call number.
#[cfg(target_arch = "x86_64")]
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

/// Offsets in `struct seccomp_data`: the call number, the ABI, and the low half of the first
/// argument (little-endian).
const DATA_NR: u32 = 0;
const DATA_ARCH: u32 = 4;
const DATA_ARG0_LOW: u32 = 16;

const ALLOW: u32 = libc::SECCOMP_RET_ALLOW;
const KILL: u32 = libc::SECCOMP_RET_KILL_PROCESS;
const EPERM: u32 = libc::SECCOMP_RET_ERRNO | libc::EPERM.unsigned_abs();
const ENOSYS: u32 = libc::SECCOMP_RET_ERRNO | libc::ENOSYS.unsigned_abs();

/// Why the filter could not be built: a mistake in this module, never in the environment.
#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    /// [`REFUSED`] names a call this module has no number for.
    #[error("no system call number is known for {0:?}")]
    UnknownSystemCall(&'static str),
    /// Two names of [`REFUSED`] have one number.
    #[error("{0:?} and {1:?} are the same system call")]
    Duplicate(&'static str, &'static str),
    /// The program is longer than the kernel accepts.
    #[error("the seccomp program has {0} instructions, more than the kernel accepts")]
    TooLong(usize),
}

/// The compiled filter: built once, shared by every child that installs it.
#[derive(Debug)]
pub struct Filter {
    program: Box<[sock_filter]>,
}

impl Filter {
    /// Compiles [`REFUSED`] for this architecture.
    pub fn new() -> Result<Filter, SeccompError> {
        let mut refused = Vec::with_capacity(REFUSED.len());
        for &(name, _) in REFUSED {
            if let Some(number) = number(name)? {
                refused.push(Refused {
                    name,
                    number,
                    answer: answer(name),
                });
            }
        }
        refused.sort_by_key(|call| call.number);
        if let Some(pair) = refused
            .windows(2)
            .find(|pair| pair[0].number == pair[1].number)
        {
            return Err(SeccompError::Duplicate(pair[0].name, pair[1].name));
        }

        let mut program = vec![
            load(DATA_ARCH),
            jump(libc::BPF_JEQ, AUDIT_ARCH, 1, 0),
            ret(KILL),
            load(DATA_NR),
        ];
        search(&intervals(&refused), &mut program);
        // The kernel's limit, BPF_MAXINSNS, is also below what `sock_fprog.len` can count.
        if program.len() > 4096 {
            return Err(SeccompError::TooLong(program.len()));
        }
        Ok(Filter {
            program: program.into_boxed_slice(),
        })
    }

    /// The filter of this process, compiled on first use.
    pub fn shared() -> Result<&'static Filter, SeccompError> {
        static SHARED: OnceLock<Filter> = OnceLock::new();
        if let Some(filter) = SHARED.get() {
            return Ok(filter);
        }
        // Two threads may both compile; one result is kept, and both are the same.
        let filter = Filter::new()?;
        Ok(SHARED.get_or_init(|| filter))
    }

    /// Sets `no_new_privs` on the calling thread and installs the filter on it, for good: it is
    /// inherited by every child and kept across `execve`.
    ///
    /// Async-signal-safe: call it in a child between `fork` (or `clone(CLONE_VM |
    /// CLONE_VFORK)`) and `execve`, as the last step before `execve`. It makes two system
    /// calls, allocates nothing and takes no lock; a failure is the kernel's errno.
    pub fn install(&self) -> Result<(), rustix::io::Errno> {
        // Without CAP_SYS_ADMIN a filter may be installed only with no_new_privs set; it is
        // also what stops a setuid program from gaining privileges the filter never saw.
        rustix::thread::set_no_new_privs(true)?;
        let program = libc::sock_fprog {
            // At most 4096, checked in `new`.
            len: self.program.len() as libc::c_ushort,
            filter: self.program.as_ptr().cast_mut(),
        };
        // SAFETY: `program` points at instructions owned by `self`, which outlives this call;
        // the kernel copies them before returning and never writes through the pointer.
        // `syscall` is the system call alone (on failure it sets this thread's errno).
        #[allow(unsafe_code)]
        let answer = unsafe {
            libc::syscall(
                libc::SYS_seccomp,
                libc::SECCOMP_SET_MODE_FILTER,
                0 as libc::c_uint,
                &raw const program,
            )
        };
        if answer != 0 {
            let errno = std::io::Error::last_os_error().raw_os_error();
            return Err(rustix::io::Errno::from_raw_os_error(
                errno.unwrap_or(libc::EINVAL),
            ));
        }
        Ok(())
    }
}

/// A refused call of this architecture.
#[derive(Clone, Copy, Debug)]
struct Refused {
    name: &'static str,
    number: u32,
    answer: Answer,
}

/// What a refused call gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Answer {
    /// Always this seccomp return value.
    Always(u32),
    /// `EPERM` when the first argument has any of these bits, else allowed.
    EpermIfAnyBit(u32),
    /// Allowed when the first argument is one of these (at most 16), else `EPERM`.
    EpermUnlessOneOf(&'static [u32]),
}

fn answer(name: &str) -> Answer {
    match name {
        "clone3" => Answer::Always(ENOSYS),
        // The kernel reads only the low 32 bits of `clone`'s flags, which the filter compares.
        "clone" => Answer::EpermIfAnyBit(CLONE_NEW_NAMESPACE.unsigned_abs()),
        // `personality` takes an `unsigned int`.
        "personality" => Answer::EpermUnlessOneOf(PERSONALITIES),
        // The family is an `int`.
        "socket" | "socketpair" => Answer::EpermUnlessOneOf(SOCKET_FAMILIES),
        _ => Answer::Always(EPERM),
    }
}

/// The call numbers cut into intervals of one answer each: the first number of each, and the
/// answer, in order. `refused` is sorted by number.
fn intervals(refused: &[Refused]) -> Vec<(u32, Answer)> {
    let mut intervals = vec![(0, Answer::Always(ALLOW))];
    let mut cut = |first: u32, answer: Answer| {
        if intervals.last().is_some_and(|&(start, _)| start == first) {
            intervals.pop();
        }
        if intervals.last().map(|&(_, answer)| answer) != Some(answer) {
            intervals.push((first, answer));
        }
    };
    for call in refused {
        cut(call.number, call.answer);
        cut(call.number.saturating_add(1), Answer::Always(ALLOW));
    }
    // x32 calls (see the module documentation), but not -1.
    #[cfg(target_arch = "x86_64")]
    {
        cut(X32_SYSCALL_BIT, Answer::Always(KILL));
        cut(u32::MAX, Answer::Always(ALLOW));
    }
    intervals
}

/// Appends a binary search over `intervals`, with the call number in the accumulator: every
/// path ends in a return of its interval's answer.
fn search(intervals: &[(u32, Answer)], program: &mut Vec<sock_filter>) {
    match intervals {
        [] => program.push(ret(ALLOW)),
        [(_, Answer::Always(answer))] => program.push(ret(*answer)),
        [(_, Answer::EpermIfAnyBit(bits))] => program.extend([
            load(DATA_ARG0_LOW),
            jump(libc::BPF_JSET, *bits, 0, 1),
            ret(EPERM),
            ret(ALLOW),
        ]),
        [(_, Answer::EpermUnlessOneOf(allowed))] => {
            program.push(load(DATA_ARG0_LOW));
            for (index, value) in allowed.iter().enumerate() {
                // On a match, over the remaining comparisons and the refusal.
                let over = u8::try_from(allowed.len() - index).unwrap_or(u8::MAX);
                program.push(jump(libc::BPF_JEQ, *value, over, 0));
            }
            program.extend([ret(EPERM), ret(ALLOW)]);
        }
        _ => {
            let (below, above) = intervals.split_at(intervals.len() / 2);
            let mut lower = Vec::new();
            search(below, &mut lower);
            let (pivot, _) = above[0];
            // A conditional jump reaches 255 instructions ahead; past that, through `ja`.
            match u8::try_from(lower.len()) {
                Ok(over_lower) => program.push(jump(libc::BPF_JGE, pivot, over_lower, 0)),
                Err(_) => program.extend([
                    jump(libc::BPF_JGE, pivot, 0, 1),
                    statement(libc::BPF_JMP | libc::BPF_JA, lower.len() as u32),
                ]),
            }
            program.extend(lower);
            search(above, program);
        }
    }
}

/// Classic BPF opcodes are 16 bits wide; libc spells them as `u32`.
fn statement(code: u32, k: u32) -> sock_filter {
    sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    }
}

fn load(offset: u32) -> sock_filter {
    statement(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, offset)
}

fn ret(answer: u32) -> sock_filter {
    statement(libc::BPF_RET | libc::BPF_K, answer)
}

/// Compares the accumulator with `k`: on true skips `jt` instructions, on false `jf`.
fn jump(comparison: u32, k: u32, jt: u8, jf: u8) -> sock_filter {
    sock_filter {
        code: (libc::BPF_JMP | comparison | libc::BPF_K) as u16,
        jt,
        jf,
        k,
    }
}

/// The call's number on this architecture; `Ok(None)` for a call this architecture does not
/// have (a refusal with nothing to refuse).
fn number(name: &'static str) -> Result<Option<u32>, SeccompError> {
    let number = match name {
        "add_key" => libc::SYS_add_key,
        "request_key" => libc::SYS_request_key,
        "keyctl" => libc::SYS_keyctl,
        "bpf" => libc::SYS_bpf,
        "perf_event_open" => libc::SYS_perf_event_open,
        "userfaultfd" => libc::SYS_userfaultfd,
        "mount" => libc::SYS_mount,
        "umount2" => libc::SYS_umount2,
        "pivot_root" => libc::SYS_pivot_root,
        "move_mount" => libc::SYS_move_mount,
        "open_tree" => libc::SYS_open_tree,
        "open_tree_attr" => SYS_OPEN_TREE_ATTR,
        "fsopen" => libc::SYS_fsopen,
        "fsconfig" => libc::SYS_fsconfig,
        "fsmount" => libc::SYS_fsmount,
        "fspick" => libc::SYS_fspick,
        "mount_setattr" => libc::SYS_mount_setattr,
        "unshare" => libc::SYS_unshare,
        "setns" => libc::SYS_setns,
        "clone" => libc::SYS_clone,
        "clone3" => libc::SYS_clone3,
        "init_module" => libc::SYS_init_module,
        "finit_module" => libc::SYS_finit_module,
        "delete_module" => libc::SYS_delete_module,
        "kexec_load" => libc::SYS_kexec_load,
        "kexec_file_load" => libc::SYS_kexec_file_load,
        "reboot" => libc::SYS_reboot,
        "swapon" => libc::SYS_swapon,
        "swapoff" => libc::SYS_swapoff,
        "acct" => libc::SYS_acct,
        "settimeofday" => libc::SYS_settimeofday,
        "clock_settime" => libc::SYS_clock_settime,
        "clock_adjtime" => libc::SYS_clock_adjtime,
        "adjtimex" => libc::SYS_adjtimex,
        "syslog" => libc::SYS_syslog,
        "quotactl" => libc::SYS_quotactl,
        "quotactl_fd" => libc::SYS_quotactl_fd,
        "open_by_handle_at" => libc::SYS_open_by_handle_at,
        "name_to_handle_at" => libc::SYS_name_to_handle_at,
        #[cfg(target_arch = "x86_64")]
        "iopl" => libc::SYS_iopl,
        #[cfg(target_arch = "x86_64")]
        "ioperm" => libc::SYS_ioperm,
        #[cfg(not(target_arch = "x86_64"))]
        "iopl" | "ioperm" => return Ok(None),
        "io_uring_setup" => libc::SYS_io_uring_setup,
        "io_uring_enter" => libc::SYS_io_uring_enter,
        "io_uring_register" => libc::SYS_io_uring_register,
        "lookup_dcookie" => libc::SYS_lookup_dcookie,
        "nfsservctl" => libc::SYS_nfsservctl,
        "personality" => libc::SYS_personality,
        "socket" => libc::SYS_socket,
        "socketpair" => libc::SYS_socketpair,
        _ => return Err(SeccompError::UnknownSystemCall(name)),
    };
    u32::try_from(number)
        .map(Some)
        .map_err(|_| SeccompError::UnknownSystemCall(name))
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeSet, HashMap};
    use std::io;
    use std::os::unix::process::{CommandExt, ExitStatusExt};
    use std::process::{Command, Output};

    use super::*;

    /// Makes each `name:number:first-argument` system call of its arguments with every other
    /// argument -1, and prints the name and the errno (0 when the call succeeded). The
    /// arguments make each call fail harmlessly when nothing refuses it, even as root:
    /// bad pointers, flags, descriptors or magic numbers.
    const PROBE: &str = r#"
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
for probe in sys.argv[1:]:
    name, number, first = probe.split(":")
    ctypes.set_errno(0)
    args = [ctypes.c_long(int(first))] + [ctypes.c_long(-1)] * 5
    answer = libc.syscall(ctypes.c_long(int(number)), *args)
    print(name, ctypes.get_errno() if answer == -1 else 0, flush=True)
print("still running", flush=True)
"#;

    fn python(script: &str, args: &[String]) -> Command {
        let mut command = Command::new("python3");
        command.arg("-c").arg(script).args(args);
        command
    }

    /// Starts `command` with the filter installed between `fork` and `execve`, as a session's
    /// command is started, and waits for it.
    fn filtered(mut command: Command) -> Output {
        let filter = Filter::shared().expect("the filter compiles");
        // SAFETY: `install` makes only system calls, on memory prepared before the fork.
        #[allow(unsafe_code)]
        unsafe {
            command.pre_exec(move || filter.install().map_err(io::Error::from));
        }
        command.output().expect("the test program starts")
    }

    fn unfiltered(mut command: Command) -> Output {
        command.output().expect("the test program starts")
    }

    fn stdout(output: &Output) -> String {
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// Every refused call this architecture has, as `PROBE` arguments.
    fn probes() -> Vec<String> {
        REFUSED
            .iter()
            .filter_map(|&(name, _)| {
                let number = number(name).expect("every listed call is known")?;
                // -1 asks personality for the persona, which stays allowed; READ_IMPLIES_EXEC
                // is one it refuses.
                let first = if name == "personality" {
                    0x0040_0000
                } else {
                    -1
                };
                Some(format!("{name}:{number}:{first}"))
            })
            .collect()
    }

    /// `PROBE`'s answers: the errno of each call, and whether it printed after the last one.
    fn answers(output: &Output) -> (HashMap<String, i32>, bool) {
        let text = stdout(output);
        let errnos = text
            .lines()
            .filter_map(|line| line.split_once(' '))
            .filter_map(|(name, errno)| Some((name.to_owned(), errno.parse().ok()?)))
            .collect();
        (errnos, text.lines().any(|line| line == "still running"))
    }

    /// Runs `program` on one call as the kernel does, for the instructions this module emits;
    /// returns the answer and how many instructions ran.
    fn interpret(program: &[sock_filter], arch: u32, nr: u32, arg0: u64) -> (u32, usize) {
        let mut accumulator = 0_u32;
        let mut next = 0_usize;
        for steps in 1.. {
            let instruction = program[next];
            next += 1;
            let code = u32::from(instruction.code);
            let skip = |taken: bool| {
                usize::from(if taken {
                    instruction.jt
                } else {
                    instruction.jf
                })
            };
            if code == libc::BPF_LD | libc::BPF_W | libc::BPF_ABS {
                accumulator = match instruction.k {
                    DATA_NR => nr,
                    DATA_ARCH => arch,
                    DATA_ARG0_LOW => arg0 as u32,
                    offset => panic!("loads seccomp_data at {offset}"),
                };
            } else if code == libc::BPF_RET | libc::BPF_K {
                return (instruction.k, steps);
            } else if code == libc::BPF_JMP | libc::BPF_JA {
                next += instruction.k as usize;
            } else if code == libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K {
                next += skip(accumulator == instruction.k);
            } else if code == libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K {
                next += skip(accumulator >= instruction.k);
            } else if code == libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K {
                next += skip(accumulator & instruction.k != 0);
            } else {
                panic!("unexpected instruction {code:#x}");
            }
        }
        unreachable!()
    }

    /// What the table says a call gets, worked out without the program.
    fn expected(nr: u32, arg0: u64) -> u32 {
        #[cfg(target_arch = "x86_64")]
        if nr & X32_SYSCALL_BIT != 0 && nr != u32::MAX {
            return KILL;
        }
        let listed = REFUSED
            .iter()
            .map(|&(name, _)| name)
            .find(|&name| number(name).expect("every listed call is known") == Some(nr));
        let flags = arg0 as u32;
        match listed {
            None => ALLOW,
            Some("clone3") => ENOSYS,
            Some("clone") if flags & CLONE_NEW_NAMESPACE.unsigned_abs() == 0 => ALLOW,
            Some("personality") if flags == PER_LINUX || flags == PERSONALITY_QUERY => ALLOW,
            Some("socket" | "socketpair")
                if [
                    libc::AF_UNIX,
                    libc::AF_INET,
                    libc::AF_INET6,
                    libc::AF_NETLINK,
                ]
                .contains(&(flags as i32)) =>
            {
                ALLOW
            }
            Some(_) => EPERM,
        }
    }

    #[test]
    fn the_program_answers_every_call_number_and_argument_as_the_table_says() {
        let filter = Filter::new().expect("every listed call compiles");
        let thread = libc::CLONE_VM
            | libc::CLONE_FS
            | libc::CLONE_FILES
            | libc::CLONE_SIGHAND
            | libc::CLONE_THREAD
            | libc::CLONE_SYSVSEM
            | libc::CLONE_SETTLS
            | libc::CLONE_PARENT_SETTID
            | libc::CLONE_CHILD_CLEARTID;
        let mut arguments = vec![0, u64::MAX, 0x0004_0000, u64::from(PERSONALITY_QUERY)];
        // Address families: AF_INET6, AF_PACKET, AF_VSOCK, AF_ALG.
        arguments.extend([10, 17, 40, 38]);
        arguments.extend(
            [
                thread,
                libc::SIGCHLD,
                libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            ]
            .into_iter()
            .map(|flags| u64::from(flags.unsigned_abs())),
        );
        for bit in 0..32 {
            // Namespace flags alone, and with the high half set (which `clone` ignores).
            arguments.extend([1_u64 << bit, (1_u64 << bit) | 0xffff_ffff_0000_0000]);
        }
        let numbers = (0..1024).chain([0x4000_0000, 0x4000_0110, 0x7fff_ffff, u32::MAX]);
        for nr in numbers {
            for &arg0 in &arguments {
                let (answer, _) = interpret(&filter.program, AUDIT_ARCH, nr, arg0);
                assert_eq!(answer, expected(nr, arg0), "call {nr} with {arg0:#x}");
            }
        }
    }

    #[test]
    fn a_call_of_another_abi_kills_the_process_whatever_its_number() {
        let filter = Filter::new().expect("every listed call compiles");
        const AUDIT_ARCH_I386: u32 = 3 | 0x4000_0000;
        const AUDIT_ARCH_ARM: u32 = 40 | 0x4000_0000;
        for arch in [AUDIT_ARCH_I386, AUDIT_ARCH_ARM, 0] {
            for nr in (0..1024).chain([u32::MAX]) {
                assert_eq!(interpret(&filter.program, arch, nr, 0).0, KILL);
            }
        }
    }

    #[test]
    fn any_call_is_decided_within_sixteen_instructions_so_installing_stays_cheap() {
        // The kernel runs the program once per call number when it is installed (see the
        // module documentation): its cost is the length of these walks.
        let filter = Filter::new().expect("every listed call compiles");
        let longest = (0..1024)
            .flat_map(|nr| {
                [0, u64::MAX].map(|arg0| interpret(&filter.program, AUDIT_ARCH, nr, arg0).1)
            })
            .max();
        assert!(longest <= Some(16), "{longest:?}");
    }

    #[test]
    fn no_system_call_is_listed_twice() {
        let names: BTreeSet<&str> = REFUSED.iter().map(|&(name, _)| name).collect();
        assert_eq!(names.len(), REFUSED.len());
    }

    #[test]
    fn every_refused_call_fails_with_eperm_and_the_process_lives_on() {
        let probes = probes();
        let output = filtered(python(PROBE, &probes));
        let (errnos, still_running) = answers(&output);
        assert!(output.status.success(), "{output:?}");
        assert!(still_running, "{output:?}");
        assert_eq!(errnos.len(), probes.len(), "{output:?}");
        for (name, errno) in &errnos {
            let expected = if name == "clone3" {
                libc::ENOSYS
            } else {
                libc::EPERM
            };
            assert_eq!(*errno, expected, "{name} answered errno {errno}");
        }
    }

    #[test]
    fn without_the_filter_the_same_calls_answer_something_else_so_the_eperm_is_the_filters() {
        let probes = probes();
        let output = unfiltered(python(PROBE, &probes));
        let (errnos, still_running) = answers(&output);
        assert!(still_running, "{output:?}");
        assert_eq!(errnos.len(), probes.len(), "{output:?}");
        for (name, errno) in &errnos {
            assert_ne!(
                *errno,
                libc::EPERM,
                "{name} is refused even without the filter"
            );
            if name == "clone3" {
                assert_ne!(*errno, libc::ENOSYS, "this kernel has no clone3");
            }
        }
    }

    #[test]
    fn the_process_runs_under_a_seccomp_filter_with_no_new_privs() {
        let mut cat = Command::new("cat");
        cat.arg("/proc/self/status");
        let output = filtered(cat);
        let status = stdout(&output);
        assert!(output.status.success(), "{output:?}");
        assert!(status.lines().any(|line| line == "Seccomp:\t2"), "{status}");
        assert!(
            status.lines().any(|line| line == "NoNewPrivs:\t1"),
            "{status}"
        );
    }

    #[test]
    fn ordinary_shell_work_still_works() {
        let directory = tempfile::tempdir().expect("a temporary directory");
        let mut shell = Command::new("sh");
        shell
            .args(["-c", "echo ok > file && cat file && ls | wc -l"])
            .current_dir(directory.path());
        let output = filtered(shell);
        assert!(output.status.success(), "{output:?}");
        assert_eq!(stdout(&output), "ok\n1\n");
    }

    #[test]
    fn python_still_starts_threads_subprocesses_and_forks() {
        // glibc's pthread_create and posix_spawn try clone3 first and fall back to clone on
        // ENOSYS; fork is clone without namespace flags.
        let script = r#"
import os, subprocess, threading
seen = []
thread = threading.Thread(target=lambda: seen.append("thread"))
thread.start()
thread.join()
child = subprocess.run(["sh", "-c", "echo subprocess"], capture_output=True, text=True, check=True)
pid = os.fork()
if pid == 0:
    os._exit(7)
_, status = os.waitpid(pid, 0)
print(seen[0], child.stdout.strip(), "fork", os.waitstatus_to_exitcode(status))
"#;
        let output = filtered(python(script, &[]));
        assert!(output.status.success(), "{output:?}");
        assert_eq!(stdout(&output), "thread subprocess fork 7\n");
    }

    /// Calls `clone` itself with each `name:flags` argument (and SIGCHLD) and prints the name
    /// and what happened; a child made exits at once.
    const CLONE: &str = r#"
import ctypes, os, signal, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
number = int(sys.argv[1])
for probe in sys.argv[2:]:
    name, flags = probe.split(":")
    ctypes.set_errno(0)
    args = [ctypes.c_long(int(flags) | signal.SIGCHLD)] + [ctypes.c_long(0)] * 4
    pid = libc.syscall(ctypes.c_long(number), *args)
    if pid == 0:
        os._exit(0)
    if pid > 0:
        os.waitpid(pid, 0)
        print(name, "made", flush=True)
    else:
        print(name, "errno", ctypes.get_errno(), flush=True)
print("still running", flush=True)
"#;

    #[test]
    fn a_clone_asking_for_a_new_user_or_mount_namespace_is_refused_while_a_plain_fork_works() {
        let args = [
            libc::SYS_clone.to_string(),
            format!("user:{}", libc::CLONE_NEWUSER),
            format!("mount:{}", libc::CLONE_NEWNS),
            format!("network:{}", libc::CLONE_NEWNET),
            format!("pid:{}", libc::CLONE_NEWPID),
            "fork:0".to_owned(),
        ];
        let output = filtered(python(CLONE, &args));
        assert!(output.status.success(), "{output:?}");
        let eperm = libc::EPERM;
        assert_eq!(
            stdout(&output),
            format!(
                "user errno {eperm}\nmount errno {eperm}\nnetwork errno {eperm}\n\
                 pid errno {eperm}\nfork made\nstill running\n"
            )
        );
    }

    #[test]
    fn unshare_cannot_make_namespaces_though_root_can_without_the_filter() {
        let unshare = |flag: &str| {
            let mut command = Command::new("unshare");
            command.args([flag, "true"]);
            command
        };
        assert!(unfiltered(unshare("--mount")).status.success());
        for flag in ["--mount", "--user", "--net", "--pid"] {
            let output = filtered(unshare(flag));
            assert!(!output.status.success(), "unshare {flag}: {output:?}");
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert!(
                stderr.contains("Operation not permitted"),
                "unshare {flag}: {stderr}"
            );
        }
    }

    #[test]
    fn personality_may_be_asked_and_kept_but_not_changed() {
        let args = [
            format!("query:{}:{PERSONALITY_QUERY}", libc::SYS_personality),
            format!("linux:{}:{PER_LINUX}", libc::SYS_personality),
            format!("no_randomize:{}:{}", libc::SYS_personality, 0x0004_0000),
            format!("page_zero:{}:{}", libc::SYS_personality, 0x0010_0000),
        ];
        let output = filtered(python(PROBE, &args));
        assert!(output.status.success(), "{output:?}");
        let eperm = libc::EPERM;
        assert_eq!(
            stdout(&output),
            format!("query 0\nlinux 0\nno_randomize {eperm}\npage_zero {eperm}\nstill running\n")
        );
    }

    /// Makes one i386 system call through `int 0x80` from a 64-bit process: the number and
    /// the first argument are the script's arguments.
    #[cfg(target_arch = "x86_64")]
    const INT_0X80: &str = r#"
import ctypes, mmap, sys
number, first = int(sys.argv[1]), int(sys.argv[2])
code = (b"\x53"                                      # push rbx
        + b"\xb8" + number.to_bytes(4, "little")     # mov eax, number
        + b"\xbb" + first.to_bytes(4, "little")      # mov ebx, first
        + b"\xcd\x80"                                # int 0x80
        + b"\x5b\xc3")                               # pop rbx; ret
page = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
page.write(code)
call = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(page)))
print("before", flush=True)
print("answer", call(), flush=True)
"#;

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn an_i386_system_call_kills_the_process_instead_of_slipping_past_the_filter() {
        const I386_GETPID: u32 = 20;
        const I386_UNSHARE: u32 = 310;
        let i386 =
            |number: u32, first: i32| python(INT_0X80, &[number.to_string(), first.to_string()]);
        // Without the filter this kernel answers i386 calls: the ABI is there to be abused.
        let control = unfiltered(i386(I386_GETPID, 0));
        assert!(control.status.success(), "{control:?}");
        assert!(stdout(&control).contains("answer "), "{control:?}");

        let output = filtered(i386(I386_UNSHARE, libc::CLONE_NEWUSER));
        assert_eq!(output.status.signal(), Some(libc::SIGSYS), "{output:?}");
        assert_eq!(stdout(&output), "before\n");
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn an_x32_system_call_kills_the_process_instead_of_slipping_past_the_filter() {
        let x32_unshare = i64::from(X32_SYSCALL_BIT) | libc::SYS_unshare;
        let args = [
            "no_call:-1:0".to_owned(),
            format!("x32_unshare:{x32_unshare}:{}", libc::CLONE_NEWUSER),
        ];
        let output = filtered(python(PROBE, &args));
        assert_eq!(output.status.signal(), Some(libc::SIGSYS), "{output:?}");
        assert_eq!(stdout(&output), format!("no_call {}\n", libc::ENOSYS));
    }
}
