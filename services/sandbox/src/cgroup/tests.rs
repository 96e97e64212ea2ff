//! Session cgroups on the real kernel (as root), with small limits (128 MiB, 64 processes, a
//! tenth of a core) so they are cheap on a shared machine. The resource tests use whichever
//! interface detection picks on the machine they run on; the v2 tests make groups in the v2
//! hierarchy directly, so its joining and killing are tested on hybrid hosts too, where it has
//! no controllers. Every group a test makes is removed when it ends, passed or not.

use std::os::fd::OwnedFd;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

use rustix::event::{PollFd, PollFlags, Timespec};

use super::detect::{self, NODE_LEAF};
use super::*;

const MIB: u64 = 1024 * 1024;
const SESSION: &str = "sess_0123456789abcdef0123456789abcdef";

static NEXT_GROUP: AtomicU32 = AtomicU32::new(0);

/// A parent group name no other test (or test process) uses.
fn unique_group() -> String {
    format!(
        "plinth-test-{}-{}",
        std::process::id(),
        NEXT_GROUP.fetch_add(1, Ordering::Relaxed)
    )
}

/// Plinth's parent groups made for one test; dropping it kills and removes every session
/// group in them, then the parents.
struct Scratch {
    group: String,
    cgroups: Cgroups,
}

impl Scratch {
    fn detect() -> Scratch {
        let group = unique_group();
        let cgroups = Cgroups::detect(&group).expect("detecting cgroups (run as root)");
        Scratch { group, cgroups }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        for name in self.cgroups.list().unwrap_or_default() {
            if let Err(error) = self.cgroups.destroy(&name) {
                eprintln!("cleaning up {name}: {error}");
            }
        }
        for hierarchy in &self.cgroups.hierarchies {
            let Some(group_dir) = hierarchy.sessions.parent() else {
                continue;
            };
            for dir in [
                hierarchy.sessions.clone(),
                group_dir.join(NODE_LEAF),
                group_dir.to_owned(),
            ] {
                if let Err(error) = fs::remove_dir(&dir)
                    && error.kind() != ErrorKind::NotFound
                {
                    eprintln!("cleaning up {}: {error}", dir.display());
                }
            }
        }
    }
}

/// Starts `command` joined to `session`, the way the node's child does: `join` between fork
/// and exec.
fn start(session: &SessionCgroup, command: &mut Command) -> Child {
    start_joined(session.join_fds(), command)
}

fn start_joined(join_fds: &[OwnedFd], command: &mut Command) -> Child {
    let fds: Vec<OwnedFd> = join_fds
        .iter()
        .map(|fd| fd.try_clone().expect("duplicating a join descriptor"))
        .collect();
    // SAFETY: the hook runs in the forked child before exec and only calls `join`, which
    // makes write(2) calls on descriptors the closure owns: async-signal-safe, as a pre_exec
    // hook must be.
    #[allow(unsafe_code)]
    unsafe {
        command.pre_exec(move || join(&fds).map_err(io::Error::from));
    }
    command.spawn().expect("starting a command")
}

fn shell(script: &str) -> Command {
    let mut command = Command::new("/bin/sh");
    command
        .args(["-c", script])
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    command
}

/// Waits (up to a generous bound: the machine is shared) until `done`, or fails the test
/// saying `what` never happened.
fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let until = Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(Instant::now() < until, "{what} never happened");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The session id `/proc/<pid>/stat` gives a process (as seen from this PID namespace: 0
/// when the leader is outside it), or None once it has gone.
fn session_of(pid: Pid) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", pid.as_raw_nonzero())).ok()?;
    // The command name may hold spaces and parentheses; the fields follow its last ')'.
    let fields = &stat[stat.rfind(')')? + 1..];
    // state, ppid, pgrp, session
    fields.split_whitespace().nth(3)?.parse().ok()
}

fn wait(child: &mut Child) -> ExitStatus {
    child.wait().expect("waiting for a command")
}

/// Whether the process behind `pidfd` has ended (a zombie counts as ended).
fn ended(pidfd: &OwnedFd) -> bool {
    let mut fds = [PollFd::new(pidfd, PollFlags::IN)];
    let none = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    rustix::event::poll(&mut fds, Some(&none)).expect("polling a pidfd") == 1
}

fn pidfd(pid: Pid) -> OwnedFd {
    rustix::process::pidfd_open(pid, PidfdFlags::empty()).expect("opening a pidfd")
}

fn read_text(path: &Path) -> String {
    fs::read_to_string(path)
        .unwrap_or_else(|error| panic!("reading {}: {error}", path.display()))
        .trim()
        .to_owned()
}

fn small_limits() -> Limits {
    Limits {
        memory_bytes: Some(128 * MIB),
        pids: Some(64),
        cpu_millicores: Some(100),
    }
}

#[test]
fn detection_prepares_a_parent_group_in_every_hierarchy_it_describes() {
    let scratch = Scratch::detect();
    let description = scratch.cgroups.describe();
    for controller in ["memory", "pids", "cpu"] {
        assert!(
            description.contains(controller),
            "{controller} in {description:?}"
        );
    }
    for hierarchy in &scratch.cgroups.hierarchies {
        assert!(
            hierarchy.sessions.is_dir(),
            "{} made",
            hierarchy.sessions.display()
        );
        assert!(
            description.contains(&*hierarchy.sessions.to_string_lossy()),
            "{description:?} says where"
        );
    }
    // A host whose v2 hierarchy has no memory controller (this development machine) is
    // limited through v1.
    if fs::read_to_string("/sys/fs/cgroup/unified/cgroup.controllers")
        .is_ok_and(|offered| !offered.split_whitespace().any(|name| name == "memory"))
    {
        assert_eq!(scratch.cgroups.version(), Version::V1, "{description}");
    }
    let again = Cgroups::detect(&scratch.group).expect("detecting again");
    assert_eq!(
        again.describe(),
        description,
        "the same groups, found again"
    );
}

#[test]
fn limits_land_in_the_kernels_files() {
    let scratch = Scratch::detect();
    let session = scratch
        .cgroups
        .create(SESSION, &small_limits())
        .expect("creating");
    match session.version {
        Version::V1 => {
            let memory = session.dir("memory").expect("memory");
            assert_eq!(
                read_text(&memory.join("memory.limit_in_bytes")),
                "134217728"
            );
            let memsw = memory.join("memory.memsw.limit_in_bytes");
            if memsw.exists() {
                assert_eq!(read_text(&memsw), "134217728", "swap cannot extend it");
            }
            let pids = session.dir("pids").expect("pids");
            assert_eq!(read_text(&pids.join("pids.max")), "64");
            let cpu = session.dir("cpu").expect("cpu");
            assert_eq!(read_text(&cpu.join("cpu.cfs_quota_us")), "10000");
            assert_eq!(read_text(&cpu.join("cpu.cfs_period_us")), "100000");
        }
        Version::V2 => {
            let dir = &session.dirs[0].path;
            assert_eq!(read_text(&dir.join("memory.max")), "134217728");
            let swap = dir.join("memory.swap.max");
            if swap.exists() {
                assert_eq!(read_text(&swap), "0", "swap cannot extend it");
            }
            assert_eq!(read_text(&dir.join("pids.max")), "64");
            assert_eq!(read_text(&dir.join("cpu.max")), "10000 100000");
        }
    }
}

#[test]
fn a_command_over_its_memory_limit_is_killed_by_the_kernel_and_the_next_command_still_runs() {
    let scratch = Scratch::detect();
    let session = scratch
        .cgroups
        .create(SESSION, &small_limits())
        .expect("creating");
    let before = session.oom_kills().expect("counting OOM kills");

    // `tail` keeps a line until it ends: 512 MiB without a newline, touched as it is read.
    let mut zeros = Command::new("head")
        .args(["-c", "512M", "/dev/zero"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("starting head");
    let mut hog = Command::new("tail");
    hog.stdin(zeros.stdout.take().expect("head's output"))
        .stdout(Stdio::null());
    let mut hog = start(&session, &mut hog);
    let status = wait(&mut hog);
    let _ = zeros.kill();
    let _ = zeros.wait();

    assert_eq!(
        status.signal(),
        Some(libc::SIGKILL),
        "tail ended by: {status}"
    );
    let after = session.oom_kills().expect("counting OOM kills");
    assert!(after > before, "OOM kills went from {before} to {after}");

    let mut echo = shell("echo ok");
    echo.stdout(Stdio::piped());
    let output = start(&session, &mut echo)
        .wait_with_output()
        .expect("running echo");
    assert!(output.status.success(), "{}", output.status);
    assert_eq!(String::from_utf8_lossy(&output.stdout), "ok\n");
}

#[test]
fn a_fork_bomb_stops_at_the_pids_limit_and_kill_all_leaves_no_process() {
    let scratch = Scratch::detect();
    let session = scratch
        .cgroups
        .create(SESSION, &small_limits())
        .expect("creating");
    let mut bomb = start(
        &session,
        &mut shell("i=0; while [ $i -lt 300 ]; do sleep 30 & i=$((i+1)); done; wait"),
    );
    // The shell gives up when a fork fails (dash exits); however it behaves, the count that
    // matters is the group's.
    let until = Instant::now() + Duration::from_secs(20);
    while bomb.try_wait().expect("watching the shell").is_none() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(50));
    }
    let processes = session.processes().expect("listing");
    assert!(
        processes.len() <= 64,
        "{} processes in a group limited to 64",
        processes.len()
    );
    assert!(
        processes.len() > 10,
        "the shell started sleeps: {processes:?}"
    );
    let pidfds: Vec<OwnedFd> = processes
        .iter()
        .filter_map(|&pid| rustix::process::pidfd_open(pid, PidfdFlags::empty()).ok())
        .collect();

    session.kill_all().expect("killing");

    assert_eq!(session.processes().expect("listing"), Vec::new());
    let alive = pidfds.iter().filter(|pidfd| !ended(pidfd)).count();
    assert_eq!(alive, 0, "every sleep died");
    let _ = bomb.kill();
    let _ = bomb.wait();
}

#[test]
fn without_a_freezer_signal_rounds_still_catch_a_process_that_keeps_forking() {
    let scratch = Scratch::detect();
    let session = scratch
        .cgroups
        .create(SESSION, &small_limits())
        .expect("creating");
    let mut forker = start(&session, &mut shell("while :; do sleep 30 & done"));
    eventually("the forker reaching the pids limit", || {
        session.processes().expect("listing").len() > 32
    });

    super::kill_by_signals(&session, None, Instant::now() + KILL_PATIENCE).expect("killing");

    assert_eq!(session.processes().expect("listing"), Vec::new());
    // The forker is gone: killed, or (when a fork failed at the pids limit first) exited on
    // its own; either way nothing of it is left in the group, as asserted above.
    let _ = wait(&mut forker);
}

#[test]
fn a_daemon_that_double_forked_into_its_own_session_does_not_survive_kill_all() {
    let scratch = Scratch::detect();
    let session = scratch
        .cgroups
        .create(SESSION, &small_limits())
        .expect("creating");
    let scratch_dir = tempfile::tempdir().expect("a temporary directory");
    let pid_file = scratch_dir.path().join("daemon.pid");
    let mut launcher = shell(r#"(setsid sleep 300 </dev/null >/dev/null 2>&1 & echo $! > "$1")"#);
    launcher.arg("sh").arg(&pid_file);
    let mut launcher = start(&session, &mut launcher);
    assert!(wait(&mut launcher).success());
    let daemon: i32 = read_text(&pid_file).parse().expect("the daemon's pid");
    let daemon = Pid::from_raw(daemon).expect("a pid");
    let daemon_fd = pidfd(daemon);
    assert!(!ended(&daemon_fd), "the daemon runs");
    // Read from /proc rather than getsid(2): before `setsid` runs, the daemon's session is
    // the test runner's, whose leader may live in an ancestor PID namespace, where getsid
    // answers 0 (which rustix refuses as a pid).
    eventually("the daemon leading a session of its own", || {
        session_of(daemon) == Some(daemon.as_raw_nonzero().get())
    });
    assert!(
        session.processes().expect("listing").contains(&daemon),
        "but not its cgroup"
    );

    session.kill_all().expect("killing");

    eventually("the daemon's end being visible", || ended(&daemon_fd));
    assert_eq!(session.processes().expect("listing"), Vec::new());
}

#[test]
fn a_commands_group_kills_its_tree_and_leaves_the_sessions_memory_limit_on_it() {
    let scratch = Scratch::detect();
    let mut session = scratch
        .cgroups
        .create(SESSION, &small_limits())
        .expect("creating");
    // A resident of the session (as its keeper is), then the session's own descriptors go.
    let mut resident = start(&session, &mut shell("sleep 300"));
    session.release_join_fds();
    assert!(session.join_fds().is_empty());
    let command = session.child("cmd-1").expect("a command's group");
    let scratch_dir = tempfile::tempdir().expect("a temporary directory");
    let pid_file = scratch_dir.path().join("daemon.pid");
    let mut launcher = shell(r#"(setsid sleep 300 </dev/null >/dev/null 2>&1 & echo $! > "$1")"#);
    launcher.arg("sh").arg(&pid_file);
    let mut launcher = start(&command, &mut launcher);
    assert!(wait(&mut launcher).success());
    let daemon: i32 = read_text(&pid_file).parse().expect("the daemon's pid");
    let daemon = Pid::from_raw(daemon).expect("a pid");
    let daemon_fd = pidfd(daemon);
    // The command's tree is in the session's group too: its limits hold it.
    let of_session = session.processes().expect("listing");
    assert!(of_session.contains(&daemon), "{of_session:?}");
    if scratch.cgroups.version() == Version::V1 {
        let own = read_text(Path::new(&format!(
            "/proc/{}/cgroup",
            daemon.as_raw_nonzero()
        )));
        let group = |controller: &str| {
            own.lines()
                .find(|line| {
                    line.split(':')
                        .nth(1)
                        .is_some_and(|names| names.split(',').any(|name| name == controller))
                })
                .and_then(|line| line.rsplit(':').next())
                .map(str::to_owned)
        };
        let memory = group("memory").expect("a memory group");
        assert!(memory.ends_with(&format!("/{SESSION}")), "{memory}");
        let freezer = group("freezer").expect("a freezer group");
        assert!(freezer.ends_with(&format!("/{SESSION}/cmd-1")), "{freezer}");
    }
    assert_eq!(command.processes().expect("listing"), vec![daemon]);

    command.kill_all().expect("killing the command's tree");
    eventually("the daemon's end being visible", || ended(&daemon_fd));
    command.remove().expect("removing the command's group");
    let resident_fd = pidfd(Pid::from_child(&resident));
    assert!(!ended(&resident_fd), "the rest of the session runs on");
    // The next command gets a group of its own the same way.
    let next = session.child("cmd-2").expect("the next command's group");
    let mut echo = shell("echo ok");
    echo.stdout(Stdio::piped());
    let output = start(&next, &mut echo).wait_with_output().expect("echo");
    assert_eq!(output.stdout, b"ok\n");
    next.remove().expect("removing");
    session.kill_all().expect("killing");
    let _ = resident.wait();
}

#[test]
fn a_busy_loop_under_a_tenth_of_a_core_gets_clearly_less_than_half_its_wall_time() {
    let scratch = Scratch::detect();
    let session = scratch
        .cgroups
        .create(SESSION, &small_limits())
        .expect("creating");
    let started = Instant::now();
    let mut spin = start(&session, &mut shell("while :; do :; done"));
    std::thread::sleep(Duration::from_secs(1));
    session.kill_all().expect("stopping the loop");
    let wall = started.elapsed();
    let used = session.cpu_usage().expect("reading CPU time");
    let _ = wait(&mut spin);
    assert!(used > Duration::ZERO, "the loop ran");
    assert!(
        used < wall / 2,
        "{used:?} of CPU in {wall:?} under 100 millicores"
    );
}

#[test]
fn a_restarted_node_finds_opens_and_destroys_the_groups_left_behind() {
    let scratch = Scratch::detect();
    let cgroups = &scratch.cgroups;
    let session = cgroups.create(SESSION, &small_limits()).expect("creating");
    let mut orphan = start(&session, Command::new("sleep").arg("300"));
    // The node goes away; the group and its process stay.
    drop(session);

    assert_eq!(cgroups.list().expect("listing"), vec![SESSION.to_owned()]);
    let reopened = cgroups.open(SESSION).expect("opening");
    assert_eq!(
        reopened.processes().expect("listing"),
        vec![Pid::from_child(&orphan)]
    );
    // A crash between two hierarchies' mkdir leaves a group in some of them only.
    let half_made = "sess_ffffffffffffffffffffffffffffffff";
    fs::create_dir(cgroups.hierarchies[0].sessions.join(half_made)).expect("half a group");
    if cgroups.hierarchies.len() > 1 {
        assert!(matches!(
            cgroups.open(half_made),
            Err(CgroupError::NotFound { .. })
        ));
    }
    assert_eq!(
        cgroups.list().expect("listing"),
        vec![SESSION.to_owned(), half_made.to_owned()]
    );

    for name in cgroups.list().expect("listing") {
        cgroups.destroy(&name).expect("destroying");
    }

    assert_eq!(cgroups.list().expect("listing"), Vec::<String>::new());
    assert_eq!(wait(&mut orphan).signal(), Some(libc::SIGKILL));
    assert!(!reopened.dirs[0].path.exists(), "the group is gone");
}

#[test]
fn a_group_with_processes_is_not_removed_until_they_are_killed() {
    let scratch = Scratch::detect();
    let session = scratch
        .cgroups
        .create(SESSION, &small_limits())
        .expect("creating");
    let mut sleeper = start(&session, Command::new("sleep").arg("300"));
    let error = session.remove().expect_err("a group with a process");
    assert!(matches!(error, CgroupError::Busy { .. }), "{error}");
    assert!(error.to_string().contains("kill_all"), "{error}");

    let session = scratch.cgroups.open(SESSION).expect("opening again");
    session.kill_all().expect("killing");
    session.remove().expect("removing");
    assert_eq!(wait(&mut sleeper).signal(), Some(libc::SIGKILL));
    assert_eq!(
        scratch.cgroups.list().expect("listing"),
        Vec::<String>::new()
    );
}

#[test]
fn creating_a_session_twice_is_refused_and_the_first_group_stays() {
    let scratch = Scratch::detect();
    let first = scratch
        .cgroups
        .create(SESSION, &small_limits())
        .expect("creating");
    let error = scratch
        .cgroups
        .create(SESSION, &Limits::default())
        .expect_err("twice");
    assert!(matches!(error, CgroupError::Exists { .. }), "{error}");
    let output = start(&first, shell("true").stdout(Stdio::null()))
        .wait()
        .expect("running");
    assert!(output.success(), "the first group still takes commands");
}

#[test]
fn names_that_are_not_one_plain_path_segment_and_zero_limits_are_refused() {
    let scratch = Scratch::detect();
    let too_long = "a".repeat(129);
    for name in [
        "",
        ".",
        "..",
        "../escape",
        "a/b",
        "memory.max",
        "sess 1",
        too_long.as_str(),
    ] {
        let error = scratch
            .cgroups
            .create(name, &Limits::default())
            .expect_err(name);
        assert!(matches!(error, CgroupError::InvalidName { .. }), "{error}");
    }
    for limits in [
        Limits {
            pids: Some(0),
            ..Limits::default()
        },
        Limits {
            memory_bytes: Some(0),
            ..Limits::default()
        },
        Limits {
            cpu_millicores: Some(u64::MAX),
            ..Limits::default()
        },
    ] {
        let error = scratch
            .cgroups
            .create(SESSION, &limits)
            .expect_err("an impossible limit");
        assert!(matches!(error, CgroupError::InvalidLimit { .. }), "{error}");
    }
    assert_eq!(
        scratch.cgroups.list().expect("listing"),
        Vec::<String>::new(),
        "nothing was made"
    );
}

/// The node's own cgroup in the v2 hierarchy, when there is one this process can write.
fn own_v2_cgroup() -> Option<PathBuf> {
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").ok()?;
    let own = fs::read_to_string("/proc/self/cgroup").ok()?;
    // Any offer passes: this is only to find the directory.
    match detect::choose(&mountinfo, &own, "unused", |_| {
        Some("memory pids cpu".to_owned())
    }) {
        Ok(detect::Layout::V2 { base }) => Some(base),
        _ => None,
    }
}

/// Session groups in the v2 hierarchy with no controllers: what works on any host with a
/// cgroup2 mount, limits aside.
fn v2_scratch() -> Option<Scratch> {
    let Some(base) = own_v2_cgroup() else {
        eprintln!("no cgroup2 mount: nothing to test");
        return None;
    };
    let group = unique_group();
    let cgroups = v2::prepare(&base, &group, &[]).expect("preparing v2 groups");
    Some(Scratch { group, cgroups })
}

#[test]
fn v2_groups_join_and_cgroup_kill_work_on_a_hierarchy_without_controllers() {
    let Some(scratch) = v2_scratch() else { return };
    let session = scratch
        .cgroups
        .create(SESSION, &Limits::default())
        .expect("creating");
    let mut family = start(
        &session,
        &mut shell("sleep 300 & (setsid sleep 300 &); wait"),
    );
    eventually("three processes in the group", || {
        session.processes().expect("listing").len() == 3
    });
    let line = fs::read_to_string(format!("/proc/{}/cgroup", family.id())).expect("its cgroup");
    assert!(
        line.lines()
            .any(|line| line.starts_with("0::") && line.ends_with(SESSION)),
        "joined: {line}"
    );
    let pidfds: Vec<OwnedFd> = session
        .processes()
        .expect("listing")
        .into_iter()
        .map(pidfd)
        .collect();

    session.kill_all().expect("killing with cgroup.kill");

    assert_eq!(session.processes().expect("listing"), Vec::new());
    assert!(pidfds.iter().all(ended), "every process died");
    assert_eq!(wait(&mut family).signal(), Some(libc::SIGKILL));
}

#[test]
fn v2_without_cgroup_kill_freezes_and_signals_every_process() {
    let Some(scratch) = v2_scratch() else { return };
    let session = scratch
        .cgroups
        .create(SESSION, &Limits::default())
        .expect("creating");
    let mut family = start(
        &session,
        &mut shell("sleep 300 & (setsid sleep 300 &); wait"),
    );
    eventually("three processes in the group", || {
        session.processes().expect("listing").len() == 3
    });
    let pidfds: Vec<OwnedFd> = session
        .processes()
        .expect("listing")
        .into_iter()
        .map(pidfd)
        .collect();

    v2::kill_by_signals(&session, Instant::now() + KILL_PATIENCE).expect("killing");

    assert_eq!(session.processes().expect("listing"), Vec::new());
    assert!(pidfds.iter().all(ended), "every process died");
    assert_eq!(wait(&mut family).signal(), Some(libc::SIGKILL));
    let frozen = read_text(&session.dirs[0].path.join("cgroup.freeze"));
    assert_eq!(frozen, "0", "the group is left thawed");
}

/// A v2 cgroup standing for the node's own, holding a process, removed with everything
/// below it when the test ends; and the controller the test delegates, handed back.
struct NodeCgroup {
    dir: PathBuf,
    resident: Child,
    enabled_in_parent: Option<(PathBuf, String)>,
}

impl Drop for NodeCgroup {
    fn drop(&mut self) {
        let _ = self.resident.kill();
        let _ = self.resident.wait();
        let group = self.dir.join("plinth");
        for dir in [
            group.join("sessions").join(SESSION),
            group.join("sessions"),
            group.join(NODE_LEAF),
            group,
            self.dir.clone(),
        ] {
            if let Err(error) = fs::remove_dir(&dir)
                && error.kind() != ErrorKind::NotFound
            {
                eprintln!("cleaning up {}: {error}", dir.display());
            }
        }
        if let Some((control, controller)) = &self.enabled_in_parent
            && let Err(error) = write(control, &format!("-{controller}"))
        {
            eprintln!("handing {controller} back: {error}");
        }
    }
}

#[test]
fn a_node_whose_own_v2_cgroup_holds_processes_is_moved_to_a_leaf_so_sessions_get_controllers() {
    let Some(base) = own_v2_cgroup() else {
        eprintln!("no cgroup2 mount: nothing to test");
        return;
    };
    // Any controller the v2 hierarchy offers shows the delegation (here: hugetlb, the one a
    // hybrid host leaves to v2).
    let offered = fs::read_to_string(base.join("cgroup.controllers")).unwrap_or_default();
    let Some(controller) = offered.split_whitespace().next().map(str::to_owned) else {
        eprintln!("the v2 hierarchy offers no controller: nothing to delegate");
        return;
    };
    let control = base.join("cgroup.subtree_control");
    let enabled = read_text(&control);
    let enabled_in_parent = if enabled.split_whitespace().any(|name| name == controller) {
        None
    } else if let Err(error) = write(&control, &format!("+{controller}")) {
        eprintln!("cannot enable {controller} in {}: {error}", base.display());
        return;
    } else {
        Some((control, controller.clone()))
    };
    let dir = base.join(unique_group());
    fs::create_dir(&dir).expect("the node's cgroup");
    let join_node = [rustix::fs::open(
        dir.join("cgroup.procs"),
        OFlags::WRONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .expect("opening cgroup.procs")];
    let resident = start_joined(&join_node, Command::new("sleep").arg("300"));
    let node = NodeCgroup {
        dir,
        resident,
        enabled_in_parent,
    };
    let resident = Pid::from_child(&node.resident);

    let cgroups = v2::prepare(&node.dir, "plinth", &[controller.as_str()]).expect("preparing");

    let leaf = node.dir.join("plinth").join(NODE_LEAF);
    assert_eq!(
        read_pids(&leaf.join("cgroup.procs")).expect("the leaf"),
        vec![resident],
        "the node's process moved to the leaf"
    );
    assert_eq!(
        read_pids(&node.dir.join("cgroup.procs")).expect("the node's cgroup"),
        Vec::new()
    );
    let session = cgroups
        .create(SESSION, &Limits::default())
        .expect("creating");
    let files: Vec<String> = fs::read_dir(&session.dirs[0].path)
        .expect("the session group")
        .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
        .collect();
    assert!(
        files
            .iter()
            .any(|file| file.starts_with(&format!("{controller}."))),
        "{controller} reached the session group: {files:?}"
    );
    let again = v2::prepare(&node.dir, "plinth", &[controller.as_str()]).expect("again");
    assert_eq!(again.describe(), cgroups.describe());
    session.remove().expect("removing");
}
