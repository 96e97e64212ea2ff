//! Limited working directories on the real kernel (root needed: loop devices and mounts).
//!
//! Each test runs in a private mount namespace of its own thread, so even a test that panics
//! past its guards leaves no mount on the host (and with it, by autoclear, no loop device);
//! the guards still remove everything, as a passing run must show.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use rustix::fs::{FileType, Mode};
use rustix::mount::{MountFlags, MountPropagationFlags, UnmountFlags};

use super::*;

/// The session's uid and gid: nobody on the host.
const SESSION_UID: u32 = 200_123;
const SIZE_MB: u64 = 64;

/// Moves this thread into a mount namespace of its own, whose mounts reach nowhere else.
fn private_mounts() {
    // SAFETY: only the mount namespace (and with it the thread's file-system context) is
    // unshared; no descriptor table is, so every descriptor stays valid on every thread.
    #[allow(unsafe_code)]
    unsafe { rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::NEWNS) }
        .expect("unsharing the mount namespace (the tests need root)");
    rustix::mount::mount_change(
        "/",
        MountPropagationFlags::PRIVATE | MountPropagationFlags::REC,
    )
    .expect("making mounts private");
}

/// A sessions directory as the node has one; removes every limited directory in it when
/// dropped, whatever the test did.
struct Node {
    limits: DiskLimits,
    sessions: PathBuf,
    _root: tempfile::TempDir,
}

impl Node {
    fn start() -> Node {
        private_mounts();
        let root = tempfile::tempdir().expect("temp dir");
        // The session's uid must get through to its working directory, as on a node.
        std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o711))
            .expect("chmod");
        let sessions = root.path().join("sessions");
        let limits = DiskLimits::check(&sessions).expect("disk limits check");
        std::fs::set_permissions(&sessions, std::fs::Permissions::from_mode(0o711)).expect("chmod");
        Node {
            limits,
            sessions,
            _root: root,
        }
    }

    /// A session directory as the node makes one: 0711, with an empty `work/` (0700).
    fn session_dir(&self, name: &str) -> PathBuf {
        let dir = self.sessions.join(name);
        make_dir(&dir, 0o711).expect("session dir");
        make_dir(&dir.join(WORK), 0o700).expect("work dir");
        dir
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let sessions = std::fs::read_dir(&self.sessions).into_iter().flatten();
        for entry in sessions.flatten() {
            let _ = remove_at(&entry.path());
        }
    }
}

/// `dd` of `mb` MiB of zeros into `dir/name`, as the session's uid.
fn dd_as_session(dir: &Path, name: &str, mb: u32) -> Output {
    Command::new("dd")
        .arg("if=/dev/zero")
        .arg(format!("of={}", dir.join(name).display()))
        .arg("bs=1M")
        .arg(format!("count={mb}"))
        .uid(SESSION_UID)
        .gid(SESSION_UID)
        .output()
        .expect("running dd")
}

/// Asserts `dd` of 200 MiB was stopped by the limit, with the file at most the limit.
fn assert_limit_holds(work: &Path) {
    let output = dd_as_session(work, "big", 200);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success(),
        "dd of 200 MiB succeeded: {stderr}"
    );
    assert!(
        stderr.contains("No space left on device") || stderr.contains("Disk quota exceeded"),
        "dd failed for another reason: {stderr}"
    );
    let written = std::fs::metadata(work.join("big"))
        .expect("dd's file")
        .len();
    assert!(written <= SIZE_MB * MIB, "dd wrote {written} bytes");
    // Most of the limit is usable: ext4's journal and tables take a few MiB.
    assert!(
        written >= (SIZE_MB - 8) * MIB,
        "dd wrote only {written} bytes"
    );
}

/// The mount points at `path` in this thread's mount namespace.
fn mounts_at(path: &Path) -> usize {
    let mounts = std::fs::read_to_string("/proc/thread-self/mountinfo").expect("mountinfo");
    let path = path.to_str().expect("utf-8 temp path");
    mounts
        .lines()
        .filter(|line| line.split(' ').nth(4) == Some(path))
        .count()
}

/// The loop devices attached to `image`, per sysfs.
fn devices_backed_by(image: &Path) -> Vec<u32> {
    loop_device::attached()
        .expect("listing loop devices")
        .into_iter()
        .filter(|(_, backing)| backing == image)
        .map(|(index, _)| index)
        .collect()
}

/// The loop devices still attached to `image` after up to two seconds for the kernel to finish
/// detaching those on their way out.
fn devices_left_on(image: &Path) -> Vec<u32> {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let found = devices_backed_by(image);
        if found.is_empty() || Instant::now() > deadline {
            return found;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_limited_directory_stops_a_session_writing_past_its_size_and_writes_again_after_a_delete() {
    let node = Node::start();
    let dir = node.session_dir("sess_a");
    node.limits
        .prepare(&dir, SIZE_MB)
        .expect("preparing a spare");
    let work = node
        .limits
        .create(&dir, SIZE_MB, SESSION_UID, SESSION_UID)
        .expect("creating from the spare");
    assert!(!dir.join(SPARE).exists(), "the spare was not used");

    assert_limit_holds(work.path());

    std::fs::remove_file(work.path().join("big")).expect("deleting the big file");
    let output = dd_as_session(work.path(), "small", 1);
    assert!(
        output.status.success(),
        "a small write after the delete failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn a_limited_directory_belongs_to_the_session_and_starts_empty() {
    let node = Node::start();
    let dir = node.session_dir("sess_b");
    // No spare: formatted while creating.
    let work = node
        .limits
        .create(&dir, SIZE_MB, SESSION_UID, SESSION_UID + 1)
        .expect("creating");

    let meta = std::fs::metadata(work.path()).expect("stat");
    assert_eq!((meta.uid(), meta.gid()), (SESSION_UID, SESSION_UID + 1));
    assert_eq!(meta.mode() & 0o7777, 0o700);
    let entries: Vec<_> = std::fs::read_dir(work.path())
        .expect("listing")
        .map(|entry| entry.expect("entry").file_name())
        .collect();
    assert!(
        entries.is_empty(),
        "a fresh working directory holds {entries:?}"
    );
    assert_eq!(mounts_at(work.path()), 1);
    assert!(matches!(
        node.limits.create(&dir, SIZE_MB, SESSION_UID, SESSION_UID),
        Err(DiskError::AlreadyCreated { .. })
    ));
}

#[test]
fn a_limited_directory_survives_a_node_restart_that_took_its_mount() {
    let node = Node::start();
    let dir = node.session_dir("sess_c");
    let work = node
        .limits
        .create(&dir, SIZE_MB, SESSION_UID, SESSION_UID)
        .expect("creating");
    std::fs::write(work.path().join("notes"), b"kept").expect("writing");
    let image = std::fs::canonicalize(dir.join(IMAGE)).expect("image path");

    // The node stops: its handles go, and with its mount namespace its mounts (a reboot takes
    // the device too; autoclear does it here).
    drop(work);
    rustix::mount::unmount(dir.join(WORK), UnmountFlags::empty()).expect("unmounting");
    assert_eq!(devices_left_on(&image), Vec::<u32>::new());

    let work = node.limits.open(&dir).expect("reopening");
    assert_eq!(
        std::fs::read(work.path().join("notes")).expect("reading"),
        b"kept"
    );
    assert_limit_holds(work.path());
}

#[test]
fn reopening_while_the_mount_is_still_there_keeps_it() {
    let node = Node::start();
    let dir = node.session_dir("sess_d");
    let work = node
        .limits
        .create(&dir, SIZE_MB, SESSION_UID, SESSION_UID)
        .expect("creating");
    let image = std::fs::canonicalize(dir.join(IMAGE)).expect("image path");
    let before = std::fs::metadata(work.path()).expect("stat").dev();
    drop(work);

    let work = node.limits.open(&dir).expect("reopening");

    assert_eq!(std::fs::metadata(work.path()).expect("stat").dev(), before);
    assert_eq!(devices_backed_by(&image).len(), 1);
    assert_eq!(mounts_at(work.path()), 1);
}

#[test]
fn reopening_an_image_still_attached_elsewhere_mounts_the_same_device_not_a_second() {
    let node = Node::start();
    let dir = node.session_dir("sess_e");
    let work = node
        .limits
        .create(&dir, SIZE_MB, SESSION_UID, SESSION_UID)
        .expect("creating");
    let image = std::fs::canonicalize(dir.join(IMAGE)).expect("image path");
    let [index] = devices_backed_by(&image)[..] else {
        panic!("not one device backs the image");
    };
    // A mount namespace the restarted node cannot see still holds the device: here, an open
    // descriptor, which keeps autoclear away when the visible mount goes.
    let holder = loop_device::open_device(index).expect("holding the device");
    drop(work);
    rustix::mount::unmount(dir.join(WORK), UnmountFlags::empty()).expect("unmounting");

    let work = node.limits.open(&dir).expect("reopening");

    let dev = std::fs::metadata(work.path()).expect("stat").dev();
    assert_eq!(loop_device::index_of(dev), Some(index));
    assert_eq!(devices_backed_by(&image), vec![index]);
    drop(holder);
}

#[test]
fn removing_a_limited_directory_leaves_no_mount_no_device_and_no_image() {
    let node = Node::start();
    let dir = node.session_dir("sess_f");
    let work = node
        .limits
        .create(&dir, SIZE_MB, SESSION_UID, SESSION_UID)
        .expect("creating");
    std::fs::write(work.path().join("file"), b"x").expect("writing");
    let image = std::fs::canonicalize(dir.join(IMAGE)).expect("image path");
    let point = work.path().to_owned();

    work.remove().expect("removing");

    assert_eq!(mounts_at(&point), 0);
    assert_eq!(devices_left_on(&image), Vec::<u32>::new());
    assert!(!image.exists());
    assert!(!point.exists());
}

#[test]
fn leftovers_of_a_killed_node_are_removed_and_live_sessions_are_not_touched() {
    let node = Node::start();
    let live = node.session_dir("sess_live");
    let gone = node.session_dir("sess_gone");
    let half = node.session_dir("sess_half");
    for dir in [&live, &gone] {
        let work = node
            .limits
            .create(dir, SIZE_MB, SESSION_UID, SESSION_UID)
            .expect("creating");
        std::fs::write(work.path().join("file"), b"x").expect("writing");
        // Killed: no handle is given back, nothing is removed.
        drop(work);
    }
    // Killed while formatting.
    std::fs::write(half.join(DRAFT), b"").expect("writing a draft");
    let gone_image = std::fs::canonicalize(gone.join(IMAGE)).expect("image path");
    let live_image = std::fs::canonicalize(live.join(IMAGE)).expect("image path");

    let left = node
        .limits
        .remove_leftovers(&node.sessions, |name| name == "sess_live")
        .expect("removing leftovers");

    assert_eq!(
        left,
        Leftovers {
            unmounted: 1,
            images: 2,
            detached: 0
        }
    );
    assert_eq!(mounts_at(&gone.join(WORK)), 0);
    assert_eq!(devices_left_on(&gone_image), Vec::<u32>::new());
    assert!(!gone_image.exists() && !half.join(DRAFT).exists());
    assert_eq!(mounts_at(&live.join(WORK)), 1);
    assert_eq!(devices_backed_by(&live_image).len(), 1);
    assert_eq!(
        std::fs::read(live.join(WORK).join("file")).expect("reading"),
        b"x"
    );
}

#[test]
fn leftovers_include_devices_attached_without_a_mount() {
    let node = Node::start();
    let gone = node.session_dir("sess_gone");
    node.limits.prepare(&gone, MIN_SIZE_MB).expect("preparing");
    let image = gone.join(IMAGE);
    std::fs::rename(gone.join(SPARE), &image).expect("renaming");
    let image = std::fs::canonicalize(&image).expect("image path");
    // Held by something else (another namespace's mount, a hand-made `losetup`): no unmount
    // here can release it.
    let attached = loop_device::attach(&image).expect("attaching");

    let left = node
        .limits
        .remove_leftovers(&node.sessions, |_| false)
        .expect("removing leftovers");
    drop(attached);

    assert_eq!(left.detached, 1);
    assert_eq!(devices_left_on(&image), Vec::<u32>::new());
}

#[test]
fn a_device_attached_by_a_process_killed_before_mounting_detaches_itself() {
    let node = Node::start();
    let dir = node.session_dir("sess_g");
    node.limits.prepare(&dir, MIN_SIZE_MB).expect("preparing");
    let image = std::fs::canonicalize(dir.join(SPARE)).expect("image path");
    let attached = loop_device::attach(&image).expect("attaching");
    assert_eq!(devices_backed_by(&image), vec![attached.index]);

    // What dying does to a descriptor.
    drop(attached);

    assert_eq!(devices_left_on(&image), Vec::<u32>::new());
}

#[test]
fn a_loop_device_missing_from_a_containers_dev_is_made() {
    let node = Node::start();
    // A container's /dev: a tmpfs with copies of the host's nodes made at its start.
    rustix::mount::mount("tmpfs", "/dev", "tmpfs", MountFlags::empty(), c"mode=755")
        .expect("mounting a /dev");
    for (name, mode, major, minor) in [("loop-control", 0o600, 10, 237), ("null", 0o666, 1, 3)] {
        rustix::fs::mknodat(
            rustix::fs::CWD,
            format!("/dev/{name}"),
            FileType::CharacterDevice,
            Mode::from_raw_mode(mode),
            rustix::fs::makedev(major, minor),
        )
        .expect("making a device node");
    }
    let dir = node.session_dir("sess_h");

    let work = node
        .limits
        .create(&dir, MIN_SIZE_MB, SESSION_UID, SESSION_UID)
        .expect("creating");

    std::fs::write(work.path().join("file"), b"x").expect("writing");
    let dev = std::fs::metadata(work.path()).expect("stat").dev();
    let index = loop_device::index_of(dev).expect("a loop device");
    assert!(loop_device::device_path(index).exists());
}

#[test]
fn without_loop_devices_the_check_says_what_to_do() {
    private_mounts();
    rustix::mount::mount("tmpfs", "/dev", "tmpfs", MountFlags::empty(), c"mode=755")
        .expect("mounting an empty /dev");
    let root = tempfile::tempdir().expect("temp dir");

    let error = DiskLimits::check(root.path()).expect_err("the check passed");

    assert!(matches!(error, DiskError::NoLoopDevices { .. }), "{error}");
    let message = error.to_string();
    for what_to_do in [
        "/dev/loop-control",
        "privileged pod",
        "configure no disk_mb",
    ] {
        assert!(message.contains(what_to_do), "{message}");
    }
}

#[test]
fn limits_below_the_minimum_are_refused_with_the_range() {
    let node = Node::start();
    let dir = node.session_dir("sess_i");

    let error = node
        .limits
        .create(&dir, 1, SESSION_UID, SESSION_UID)
        .expect_err("a 1 MiB limit was made");

    assert!(matches!(error, DiskError::InvalidSize { size_mb: 1 }));
    assert!(error.to_string().contains("use 16 to"), "{error}");
    assert!(!dir.join(IMAGE).exists() && !dir.join(WORK).exists());
}
