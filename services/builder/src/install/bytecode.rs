//! Bytecode (see the module documentation's heading of that name): which `.py` files still
//! lack a checked-hash `.pyc`, and the list the bytecode pass hands compileall.

use std::io::Read;
use std::os::fd::OwnedFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use rustix::fs::FileType;

use super::remove_any;
use crate::beneath;

/// The virtual environment, in the scratch directory.
const VENV: &str = ".venv";

/// The flags word of a checked-hash `.pyc` (PEP 552): hash-based (bit 0) and checked (bit 1).
const CHECKED_HASH_PYC: u32 = 0b11;

/// The list of files the bytecode pass compiles, in the build's `/tmp`.
pub(super) const BYTECODE_LIST: &str = ".plinth-uncompiled";

/// The `.py` files under `.venv` in the scratch directory `root` without a checked-hash `.pyc`
/// beside them in `__pycache__`, as the sandbox sees them (`/env/<slug>/…` is `root`; only paths
/// relative to it are returned, sorted). Names that are not UTF-8 or hold a newline cannot be
/// listed for compileall and are left out.
pub(super) fn uncompiled(root: &Path) -> Vec<String> {
    let Ok(root) = beneath::open_root(root) else {
        return Vec::new();
    };
    let mut sources: Vec<PathBuf> = Vec::new();
    // A `.venv` that is a link, or links within it, are not followed: the build made them.
    let _ = beneath::walk(&root, VENV, &mut |walked| {
        if beneath::kind(walked.stat) == FileType::RegularFile
            && walked.rel.extension().is_some_and(|ext| ext == "py")
        {
            sources.push(Path::new(VENV).join(walked.rel));
        }
        true
    });
    let mut uncompiled: Vec<String> = sources
        .into_iter()
        .filter(|source| !has_checked_hash_pyc(&root, source))
        .filter_map(|source| {
            let relative = source.to_str()?.to_owned();
            (!relative.contains('\n')).then_some(relative)
        })
        .collect();
    uncompiled.sort_unstable();
    uncompiled
}

/// Whether `__pycache__/<stem>.<tag>.pyc` beside `source` (relative to `root`) exists for some
/// interpreter tag and is a checked-hash pyc. Opened beneath `root` following no link, and only
/// if it is a regular file (it is the build's file).
fn has_checked_hash_pyc(root: &OwnedFd, source: &Path) -> bool {
    let (Some(dir), Some(stem)) = (
        source.parent(),
        source.file_stem().and_then(|stem| stem.to_str()),
    ) else {
        return false;
    };
    let Ok(cache) = beneath::open_dir(root, dir.join("__pycache__")) else {
        return false;
    };
    let Ok(entries) = beneath::entries(&cache) else {
        return false;
    };
    entries.iter().any(|(name, stat)| {
        let Some(tag) = name
            .to_str()
            .and_then(|name| name.strip_prefix(stem)?.strip_prefix('.'))
            .and_then(|rest| rest.strip_suffix(".pyc"))
        else {
            return false;
        };
        if tag.is_empty() || tag.contains('.') || beneath::kind(stat) != FileType::RegularFile {
            return false;
        }
        let mut header = [0u8; 8];
        beneath::open_regular(&cache, name)
            .and_then(|(mut pyc, _)| pyc.read_exact(&mut header))
            .is_ok_and(|()| {
                u32::from_le_bytes([header[4], header[5], header[6], header[7]]) == CHECKED_HASH_PYC
            })
    })
}

/// Writes the bytecode pass's list of files (paths relative to the mount path, which is the
/// command's working directory), replacing whatever the build left at that name, readable by
/// the build.
pub(super) fn write_list(list: &Path, files: &[String]) -> std::io::Result<()> {
    use std::io::Write as _;
    remove_any(list)?;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(list)?;
    for path in files {
        file.write_all(path.as_bytes())?;
        file.write_all(b"\n")?;
    }
    file.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_sources_without_checked_hash_bytecode_are_listed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        let site = root.join(".venv/lib/python3.11/site-packages");
        let pyc = |name: &str, flags: u32| {
            let cache = site.join("__pycache__");
            std::fs::create_dir_all(&cache).expect("mkdir");
            let mut bytes = vec![0xa7, 0x0d, 0x0d, 0x0a];
            bytes.extend_from_slice(&flags.to_le_bytes());
            bytes.extend_from_slice(&[0; 8]);
            std::fs::write(cache.join(name), bytes).expect("write");
        };
        for source in [
            "checked",
            "timestamp",
            "unchecked",
            "none",
            "other.name",
            "opt",
        ] {
            std::fs::create_dir_all(&site).expect("mkdir");
            std::fs::write(site.join(format!("{source}.py")), "").expect("write");
        }
        pyc("checked.cpython-311.pyc", 3);
        pyc("timestamp.cpython-311.pyc", 0);
        pyc("unchecked.cpython-311.pyc", 1);
        pyc("other.cpython-311.pyc", 3);
        pyc("opt.cpython-311.opt-1.pyc", 3);
        std::os::unix::fs::symlink(
            site.join("__pycache__/checked.cpython-311.pyc"),
            site.join("__pycache__/other.name.cpython-311.pyc"),
        )
        .expect("symlink");
        std::fs::write(root.join(".venv/README.txt"), "").expect("write");
        std::fs::write(root.join("app.py"), "").expect("write");

        let prefix = ".venv/lib/python3.11/site-packages/";
        assert_eq!(
            uncompiled(root),
            ["none", "opt", "other.name", "timestamp", "unchecked"]
                .map(|name| format!("{prefix}{name}.py"))
        );
    }
}
