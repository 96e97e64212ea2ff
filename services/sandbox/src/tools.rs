//! The host's tools a sandbox is given beyond its system directories: `uv`, the same binary
//! for builds (which install with it) and sessions (whose agents run `uv run`).
//!
//! A `uv` installed by pip or pyenv lives under root's home, which no sandbox shows and no
//! session uid could reach anyway. So the real binary (not a pyenv shim or a wrapper script)
//! is found once at start and copied into a root-owned directory of the caller's, which the
//! builder puts on its installers' PATH and the node shows read-only inside each session.

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// The real `uv` binary: from its Python package (pip installs it there), else from PATH,
/// resolved through links, as long as it is an executable, not a wrapper script.
pub fn find_uv() -> Option<PathBuf> {
    let from_python = std::process::Command::new("python3")
        .args(["-c", "import uv; print(uv.find_uv_bin())"])
        .output()
        .ok()
        .filter(|output| output.status.success())
        .map(|output| PathBuf::from(String::from_utf8_lossy(&output.stdout).trim()));
    let from_path = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join("uv"))
            .find(|candidate| candidate.is_file())
    });
    [from_python, from_path]
        .into_iter()
        .flatten()
        .filter_map(|candidate| std::fs::canonicalize(candidate).ok())
        .find(|candidate| is_elf(candidate))
}

fn is_elf(path: &Path) -> bool {
    let mut magic = [0u8; 4];
    std::fs::File::open(path)
        .and_then(|mut file| file.read_exact(&mut magic))
        .is_ok()
        && magic == *b"\x7fELF"
}

/// Copies the host's `uv` ([`find_uv`]) into `dir` (which must exist) as `dir/uv`, mode 0755,
/// replaced atomically and only when it changed; answers where it was copied from. Without a
/// `uv` on the host, a copy left from an earlier start is removed (so nothing runs a `uv` the
/// host no longer has) and the answer is `None`.
pub fn place_uv(dir: &Path) -> std::io::Result<Option<PathBuf>> {
    let target = dir.join("uv");
    let Some(uv) = find_uv() else {
        match std::fs::remove_file(&target) {
            Ok(()) => {}
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => return Err(error),
        }
        return Ok(None);
    };
    let same = match (std::fs::metadata(&uv), std::fs::metadata(&target)) {
        (Ok(a), Ok(b)) => a.len() == b.len() && a.modified().ok() <= b.modified().ok(),
        _ => false,
    };
    if !same {
        let staging = dir.join(format!(".uv-{}", std::process::id()));
        std::fs::copy(&uv, &staging)?;
        std::fs::set_permissions(&staging, std::fs::Permissions::from_mode(0o755))?;
        std::fs::rename(&staging, &target)?;
    }
    Ok(Some(uv))
}
