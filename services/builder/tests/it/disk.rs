//! A build's disk image outlives a killed builder only until the next start: the work
//! directory's leftovers are removed, mounts and images included (root and loop devices).

use std::os::unix::fs::MetadataExt as _;

use crate::fixtures::require_sandbox;

/// Moves this thread into a mount namespace of its own, so nothing the test mounts reaches
/// the host even if it fails midway.
fn private_mounts() {
    // SAFETY: only the mount namespace (and the thread's file-system context) is unshared; no
    // descriptor table is, so every descriptor stays valid on every thread.
    #[allow(unsafe_code)]
    unsafe { rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::NEWNS) }
        .expect("unsharing the mount namespace");
    rustix::mount::mount_change(
        "/",
        rustix::mount::MountPropagationFlags::PRIVATE | rustix::mount::MountPropagationFlags::REC,
    )
    .expect("making mounts private");
}

#[test]
fn a_killed_builders_disk_image_is_unmounted_and_removed_at_the_next_start() {
    if !require_sandbox() {
        return;
    }
    private_mounts();
    let work = tempfile::tempdir().expect("temp dir");
    let builds = work.path().join("builds");
    let limits = plinth_sandbox::disk::DiskLimits::check(&builds).expect("disk limits");
    // A build's directory as the builder makes it, mounted, written to, and never removed:
    // the builder was killed mid-build.
    let build = builds.join("env-1-1");
    std::fs::create_dir(&build).expect("mkdir");
    let dir = limits.create(&build, 64, 0, 0).expect("image");
    std::fs::create_dir(dir.path().join("project")).expect("mkdir");
    std::fs::write(dir.path().join("project/big"), vec![7u8; 1 << 20]).expect("write");
    let mounted = dir.path().to_owned();
    assert_ne!(
        std::fs::metadata(&mounted).expect("stat").dev(),
        std::fs::metadata(&builds).expect("stat").dev(),
        "the build's directory is on its image"
    );
    drop(dir);

    let removed = plinth_builder::worker::remove_leftovers(work.path()).expect("leftovers");
    assert_eq!(removed, 1);
    assert!(
        std::fs::read_dir(&builds).expect("list").next().is_none(),
        "nothing is left of the build"
    );
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    assert!(
        !mounts.contains(mounted.to_str().expect("utf-8")),
        "{mounts}"
    );
}
