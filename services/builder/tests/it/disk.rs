//! Builds' disks (root and loop devices): a scope's disk is mounted once for all of its
//! builds running at once and kept, caches and all, between them; it gives its caches up when
//! short of room, is made anew when it will not mount or its size changed, and a killed
//! builder's mounts are gone after the next start (the disk kept, and tidied). The per-build
//! images of an earlier release are removed at start.

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

/// The loop devices attached to `image` (by the path sysfs shows).
fn devices_of(image: &std::path::Path) -> usize {
    let image = image.to_str().expect("utf-8");
    std::fs::read_dir("/sys/block")
        .expect("sysfs")
        .flatten()
        .filter_map(|entry| std::fs::read_to_string(entry.path().join("loop/backing_file")).ok())
        .filter(|backing| backing.trim_end() == image)
        .count()
}

/// Whether anything is mounted at `path` in this thread's mount namespace.
fn mounted_at(path: &std::path::Path) -> bool {
    let path = path.to_str().expect("utf-8");
    std::fs::read_to_string("/proc/thread-self/mountinfo")
        .expect("mountinfo")
        .lines()
        .any(|line| line.split(' ').nth(4) == Some(path))
}

/// A work directory's scope disks, checked as the builder checks them at start.
fn scope_disks(work: &std::path::Path, size_mb: u64) -> plinth_builder::scope_disk::ScopeDisks {
    let dir = plinth_builder::scope_disk::ScopeDisks::dir_of(work);
    let limits = plinth_sandbox::disk::DiskLimits::check(&dir).expect("disk limits");
    plinth_builder::scope_disk::ScopeDisks::new(limits, work, size_mb)
}

#[test]
fn builds_of_one_scope_share_one_mount_and_its_caches_outlive_them() {
    if !require_sandbox() {
        return;
    }
    private_mounts();
    let work = tempfile::tempdir().expect("temp dir");
    let disks = scope_disks(work.path(), 64);
    let (one, two) = (
        disks.acquire("aaaa").expect("first build"),
        disks.acquire("aaaa").expect("second build"),
    );
    let image = work.path().join("scopes/aaaa/work.ext4");
    assert_eq!(one.root(), two.root());
    assert!(mounted_at(one.root()));
    assert_eq!(devices_of(&image), 1, "one loop device for both builds");
    std::fs::create_dir(one.cache()).expect("cache");
    std::fs::write(one.cache().join("wheel"), b"downloaded").expect("write");
    std::fs::create_dir(two.build_dir("env-1-1")).expect("scratch");

    // Another scope has a disk of its own.
    let other = disks.acquire("bbbb").expect("other scope");
    assert_ne!(other.root(), one.root());
    assert!(!other.cache().join("wheel").exists());
    other.release();

    // The first to end leaves the mount to the other; the last unmounts it.
    let root = one.root().to_owned();
    one.release();
    assert!(mounted_at(&root));
    two.release();
    assert!(!mounted_at(&root));
    assert_eq!(devices_of(&image), 0);

    // The next build of the scope finds the cache, and no other build's directory.
    let next = disks.acquire("aaaa").expect("next build");
    assert_eq!(
        std::fs::read(next.cache().join("wheel")).expect("kept"),
        b"downloaded"
    );
    next.release();
}

#[test]
fn a_full_scope_disk_gives_up_its_caches_and_a_broken_or_resized_one_is_made_anew() {
    if !require_sandbox() {
        return;
    }
    private_mounts();
    let work = tempfile::tempdir().expect("temp dir");
    let disks = scope_disks(work.path(), 64);
    let fill = |disk: &plinth_builder::scope_disk::ScopeDisk, mib: usize| {
        std::fs::create_dir_all(disk.cache()).expect("cache");
        std::fs::create_dir_all(disk.kept().join("layer/.venv")).expect("kept");
        std::fs::write(disk.cache().join("wheel"), vec![1u8; mib << 20]).expect("write");
    };

    // A build that ran out of the disk: its caches go when it ends.
    let disk = disks.acquire("aaaa").expect("build");
    fill(&disk, 1);
    disk.mark_full();
    disk.release();
    let disk = disks.acquire("aaaa").expect("build");
    assert!(!disk.cache().exists());
    assert!(!disk.kept().join("layer").exists());

    // Caches that leave less than a quarter free go too; smaller ones stay.
    fill(&disk, 8);
    disk.release();
    let disk = disks.acquire("aaaa").expect("build");
    assert!(disk.cache().join("wheel").exists());
    fill(&disk, 48);
    disk.release();
    let disk = disks.acquire("aaaa").expect("build");
    assert!(!disk.cache().exists());
    assert!(!disk.kept().join("layer").exists());
    fill(&disk, 1);
    disk.release();

    // A new limit makes the disk anew, of its size.
    let image = work.path().join("scopes/aaaa/work.ext4");
    let bigger = scope_disks(work.path(), 96);
    let disk = bigger.acquire("aaaa").expect("build");
    assert_eq!(std::fs::metadata(&image).expect("image").len(), 96 << 20);
    assert!(!disk.cache().exists());
    disk.release();

    // An image that does not mount is made anew too (it only ever held caches).
    std::fs::write(&image, vec![0u8; 96 << 20]).expect("garbage");
    let disk = bigger.acquire("aaaa").expect("made anew");
    std::fs::create_dir(disk.build_dir("env-1-1")).expect("usable");
    disk.release();
}

#[test]
fn a_killed_builders_scope_disk_is_tidied_and_unmounted_at_the_next_start_and_kept() {
    if !require_sandbox() {
        return;
    }
    private_mounts();
    let work = tempfile::tempdir().expect("temp dir");
    let scopes = work.path().join("scopes");
    let limits = plinth_sandbox::disk::DiskLimits::check(&scopes).expect("disk limits");
    // A scope's disk as a builder left it when it was killed mid-build: mounted, with the
    // build's directory and a tree half set aside on it, beside the scope's cache.
    let scope = scopes.join("aaaa");
    std::fs::create_dir(&scope).expect("mkdir");
    let dir = limits.create(&scope, 64, 0, 0).expect("image");
    let root = dir.path().to_owned();
    for made in [
        "builds/env-1-1/.venv",
        "kept/.partial-1/.venv",
        "kept/layer",
        "cache",
    ] {
        std::fs::create_dir_all(root.join(made)).expect("mkdir");
    }
    std::fs::write(root.join("builds/env-1-1/big"), vec![7u8; 1 << 20]).expect("write");
    std::fs::write(root.join("cache/wheel"), b"downloaded").expect("write");
    drop(dir);
    assert!(mounted_at(&root));

    let removed = plinth_builder::worker::remove_leftovers(work.path()).expect("leftovers");
    assert_eq!(removed, 2, "the build's directory and the partial tree");
    assert!(!mounted_at(&root), "no mount is left");
    assert_eq!(devices_of(&scope.join("work.ext4")), 0);

    // The restarted builder builds on it: the scope's caches are there, the build's not.
    let disks = plinth_builder::scope_disk::ScopeDisks::new(limits, work.path(), 64);
    let disk = disks.acquire("aaaa").expect("mounted again");
    assert_eq!(
        std::fs::read(disk.cache().join("wheel")).expect("cache"),
        b"downloaded"
    );
    assert!(disk.kept().join("layer").is_dir());
    assert_eq!(
        std::fs::read_dir(disk.root().join("builds"))
            .expect("builds")
            .count(),
        0
    );
    disk.release();
}
