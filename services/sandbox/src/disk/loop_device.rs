//! The loop device calls disk limits need, as direct `ioctl`s on `/dev/loop-control` and
//! `/dev/loopN` (the `linux/loop.h` numbers are not in the libc crate, so they are spelled out
//! here): attach an image, find the device an image is already attached to, detach.
//!
//! An image is attached with one `LOOP_CONFIGURE` that also sets `LO_FLAGS_AUTOCLEAR`, so there
//! is no moment at which a node killed between attaching and mounting leaves a device behind:
//! the device goes with the last descriptor or mount of it. The older `LOOP_SET_FD` +
//! `LOOP_SET_STATUS64` pair has such a moment.

use std::ffi::OsStr;
use std::fs::Metadata;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use rustix::fs::{CWD, FileType, Mode, OFlags};
use rustix::io::Errno;

use super::DiskError;

/// The control device that hands out free loop devices.
pub(super) const LOOP_CONTROL: &str = "/dev/loop-control";

const LOOP_CLR_FD: libc::Ioctl = 0x4C01;
const LOOP_GET_STATUS64: libc::Ioctl = 0x4C05;
const LOOP_CONFIGURE: libc::Ioctl = 0x4C0A;
const LOOP_CTL_GET_FREE: libc::Ioctl = 0x4C82;
const LO_FLAGS_AUTOCLEAR: u32 = 4;
const LO_FLAGS_DIRECT_IO: u32 = 16;
const LO_NAME_SIZE: usize = 64;
/// The block size the device shows: ext4's, so direct I/O to the image needs no
/// read-modify-write of partial blocks.
const BLOCK_SIZE: u32 = 4096;
/// Tries at `LOOP_CTL_GET_FREE` + `LOOP_CONFIGURE` when another process takes the free device
/// in between (`EBUSY`), as `losetup` does.
const ATTACH_TRIES: usize = 32;

/// `struct loop_info64`.
#[repr(C)]
#[allow(dead_code)] // The kernel's layout: every field is there to be written or read by it.
struct LoopInfo64 {
    lo_device: u64,
    lo_inode: u64,
    lo_rdevice: u64,
    lo_offset: u64,
    lo_sizelimit: u64,
    lo_number: u32,
    lo_encrypt_type: u32,
    lo_encrypt_key_size: u32,
    lo_flags: u32,
    lo_file_name: [u8; LO_NAME_SIZE],
    lo_crypt_name: [u8; LO_NAME_SIZE],
    lo_encrypt_key: [u8; 32],
    lo_init: [u64; 2],
}

/// `struct loop_config`.
#[repr(C)]
#[allow(dead_code)] // As above.
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

// The kernel's sizes, so a field mistake cannot reach an ioctl.
const _: () = assert!(size_of::<LoopInfo64>() == 232);
const _: () = assert!(size_of::<LoopConfig>() == 304);

impl LoopInfo64 {
    fn zeroed() -> Self {
        LoopInfo64 {
            lo_device: 0,
            lo_inode: 0,
            lo_rdevice: 0,
            lo_offset: 0,
            lo_sizelimit: 0,
            lo_number: 0,
            lo_encrypt_type: 0,
            lo_encrypt_key_size: 0,
            lo_flags: 0,
            lo_file_name: [0; LO_NAME_SIZE],
            lo_crypt_name: [0; LO_NAME_SIZE],
            lo_encrypt_key: [0; 32],
            lo_init: [0; 2],
        }
    }
}

/// A loop device this process attached an image to. Dropping it closes the descriptor: a
/// device nothing mounted is then detached by the kernel (autoclear).
#[derive(Debug)]
pub(super) struct Attached {
    pub(super) index: u32,
    _device: OwnedFd,
}

/// `/dev/loopN`.
pub(super) fn device_path(index: u32) -> PathBuf {
    PathBuf::from(format!("/dev/loop{index}"))
}

/// Attaches `image` to a free loop device, with autoclear and direct I/O (the kernel drops
/// direct I/O by itself where the image's file system cannot do it, e.g. tmpfs before 6.6).
pub(super) fn attach(image: &Path) -> Result<Attached, DiskError> {
    let attach_error = |source: io::Error| DiskError::Attach {
        image: image.to_owned(),
        source,
    };
    let backing = rustix::fs::open(
        image,
        OFlags::RDWR | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        Mode::empty(),
    )
    .map_err(|errno| attach_error(errno.into()))?;
    let control = open_control()?;
    let mut config = LoopConfig {
        fd: u32::try_from(backing.as_raw_fd())
            .map_err(|_| attach_error(io::Error::from(Errno::BADF)))?,
        block_size: BLOCK_SIZE,
        info: LoopInfo64::zeroed(),
        reserved: [0; 8],
    };
    config.info.lo_flags = LO_FLAGS_AUTOCLEAR | LO_FLAGS_DIRECT_IO;
    // Only what `losetup --list` shows; the kernel reports the real path in sysfs.
    let name = image.as_os_str().as_bytes();
    let shown = name.len().min(LO_NAME_SIZE - 1);
    config.info.lo_file_name[..shown].copy_from_slice(&name[..shown]);

    let mut last_busy = io::Error::from(Errno::BUSY);
    for _ in 0..ATTACH_TRIES {
        let index = get_free(&control).map_err(|source| DiskError::NoLoopDevices {
            path: PathBuf::from(LOOP_CONTROL),
            source,
        })?;
        let device = open_device(index).map_err(attach_error)?;
        match configure(&device, &config) {
            Ok(()) => {
                return Ok(Attached {
                    index,
                    _device: device,
                });
            }
            Err(error) if error.raw_os_error() == Some(libc::EBUSY) => last_busy = error,
            Err(error) => return Err(attach_error(error)),
        }
    }
    Err(attach_error(last_busy))
}

pub(super) fn open_control() -> Result<OwnedFd, DiskError> {
    rustix::fs::open(LOOP_CONTROL, OFlags::RDWR | OFlags::CLOEXEC, Mode::empty()).map_err(|errno| {
        DiskError::NoLoopDevices {
            path: PathBuf::from(LOOP_CONTROL),
            source: errno.into(),
        }
    })
}

/// Opens `/dev/loopN`, making the node first when `/dev` lacks it: a container's `/dev` (a
/// Kubernetes privileged pod's too) is a copy of the host's made at its start, so devices the
/// kernel adds later (`LOOP_CTL_GET_FREE` adds one when none is free) are missing from it.
pub(super) fn open_device(index: u32) -> io::Result<OwnedFd> {
    let path = device_path(index);
    let flags = OFlags::RDWR | OFlags::CLOEXEC;
    match rustix::fs::open(&path, flags, Mode::empty()) {
        Err(Errno::NOENT) => {
            let numbers = std::fs::read_to_string(format!("/sys/block/loop{index}/dev"))?;
            let (major, minor) = numbers
                .trim()
                .split_once(':')
                .and_then(|(major, minor)| Some((major.parse().ok()?, minor.parse().ok()?)))
                .ok_or_else(|| {
                    io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("/sys/block/loop{index}/dev reads {numbers:?}, not major:minor"),
                    )
                })?;
            tracing::debug!(device = %path.display(), "making the loop device's node");
            match rustix::fs::mknodat(
                CWD,
                &path,
                FileType::BlockDevice,
                Mode::RUSR | Mode::WUSR,
                rustix::fs::makedev(major, minor),
            ) {
                Ok(()) | Err(Errno::EXIST) => {}
                Err(errno) => return Err(errno.into()),
            }
            Ok(rustix::fs::open(&path, flags, Mode::empty())?)
        }
        other => Ok(other?),
    }
}

/// Whether the device `device` is attached to the file `image` is (compared by device and
/// inode, so paths seen from other mount namespaces do not matter).
pub(super) fn backs(device: &OwnedFd, image: &Metadata) -> io::Result<bool> {
    match get_status(device) {
        Ok(info) => Ok(info.lo_device == image.dev() && info.lo_inode == image.ino()),
        Err(error) if error.raw_os_error() == Some(libc::ENXIO) => Ok(false),
        Err(error) => Err(error),
    }
}

/// The loop device already attached to `image`, if one is: the node may restart while a mount
/// of the image it made before still lives (in a mount namespace it no longer sees), and a
/// second device on the same file would be a second ext4 driver writing the same blocks.
///
/// Candidates are found by the end of their backing path (the session's directory and the
/// image's name, which do not depend on the namespace the path is read from), then checked by
/// inode.
pub(super) fn find(image: &Path, metadata: &Metadata) -> io::Result<Option<Attached>> {
    let mut tail = Vec::new();
    if let Some(parent) = image.parent().and_then(Path::file_name) {
        tail.extend_from_slice(b"/");
        tail.extend_from_slice(parent.as_bytes());
    }
    tail.extend_from_slice(b"/");
    tail.extend_from_slice(image.file_name().unwrap_or_default().as_bytes());
    for (index, backing) in attached()? {
        if !backing.as_os_str().as_bytes().ends_with(&tail) {
            continue;
        }
        let device = match open_device(index) {
            Ok(device) => device,
            // Detached and removed since it was listed.
            Err(error) if error.kind() == io::ErrorKind::NotFound => continue,
            Err(error) => return Err(error),
        };
        // Held open from here, autoclear cannot take the device before it is mounted.
        if backs(&device, metadata)? {
            return Ok(Some(Attached {
                index,
                _device: device,
            }));
        }
    }
    Ok(None)
}

/// Every attached loop device and the path of its backing file, as sysfs shows it; files
/// deleted while attached are left out (nothing can reopen them).
pub(super) fn attached() -> io::Result<Vec<(u32, PathBuf)>> {
    let mut found = Vec::new();
    let entries = match std::fs::read_dir("/sys/block") {
        Ok(entries) => entries,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(found),
        Err(error) => return Err(error),
    };
    for entry in entries {
        let name = entry?.file_name();
        let Some(index) = name
            .to_str()
            .and_then(|name| name.strip_prefix("loop"))
            .and_then(|number| number.parse::<u32>().ok())
        else {
            continue;
        };
        let mut backing = match std::fs::read(format!("/sys/block/loop{index}/loop/backing_file")) {
            Ok(backing) => backing,
            // Not attached.
            Err(error) if error.kind() == io::ErrorKind::NotFound => continue,
            Err(error) => return Err(error),
        };
        if backing.last() == Some(&b'\n') {
            backing.pop();
        }
        if backing.ends_with(b" (deleted)") {
            continue;
        }
        found.push((index, PathBuf::from(OsStr::from_bytes(&backing))));
    }
    Ok(found)
}

/// Detaches device `index`; when something still holds it the kernel turns this into
/// autoclear, so it goes with its last holder.
pub(super) fn detach(index: u32) -> io::Result<()> {
    let device = match open_device(index) {
        Ok(device) => device,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(error) => return Err(error),
    };
    // SAFETY: `LOOP_CLR_FD` takes no argument and only reads the descriptor, which `device`
    // keeps open for the call.
    #[allow(unsafe_code)]
    let done = unsafe { libc::ioctl(device.as_raw_fd(), LOOP_CLR_FD) };
    match done {
        0.. => Ok(()),
        _ => match io::Error::last_os_error() {
            // Already detached.
            error if error.raw_os_error() == Some(libc::ENXIO) => Ok(()),
            error => Err(error),
        },
    }
}

/// The loop device index `dev` (a `st_dev`) names, if it is a loop device.
pub(super) fn index_of(dev: u64) -> Option<u32> {
    let link = std::fs::read_link(format!(
        "/sys/dev/block/{}:{}",
        rustix::fs::major(dev),
        rustix::fs::minor(dev)
    ))
    .ok()?;
    link.file_name()?
        .to_str()?
        .strip_prefix("loop")?
        .parse()
        .ok()
}

fn get_free(control: &OwnedFd) -> io::Result<u32> {
    // SAFETY: `LOOP_CTL_GET_FREE` takes no argument; it answers a device number (adding a
    // device when none is free) and `control` stays open for the call.
    #[allow(unsafe_code)]
    let index = unsafe { libc::ioctl(control.as_raw_fd(), LOOP_CTL_GET_FREE) };
    u32::try_from(index).map_err(|_| io::Error::last_os_error())
}

fn configure(device: &OwnedFd, config: &LoopConfig) -> io::Result<()> {
    // SAFETY: `LOOP_CONFIGURE` reads one `struct loop_config`, which `LoopConfig` lays out
    // exactly (sizes asserted above); the kernel only reads it during the call, and it and
    // `device` outlive the call.
    #[allow(unsafe_code)]
    let done = unsafe {
        libc::ioctl(
            device.as_raw_fd(),
            LOOP_CONFIGURE,
            std::ptr::from_ref(config),
        )
    };
    if done < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn get_status(device: &OwnedFd) -> io::Result<LoopInfo64> {
    let mut info = LoopInfo64::zeroed();
    // SAFETY: `LOOP_GET_STATUS64` writes one `struct loop_info64` into the buffer, which
    // `LoopInfo64` lays out exactly and which lives on this frame for the call.
    #[allow(unsafe_code)]
    let done = unsafe {
        libc::ioctl(
            device.as_raw_fd(),
            LOOP_GET_STATUS64,
            std::ptr::from_mut(&mut info),
        )
    };
    if done < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(info)
}
