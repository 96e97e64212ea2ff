//! The installers' toolchain as the build user sees it. Installers run as an unprivileged uid
//! in a namespace where the builder's `/tmp` and home are out of reach, so a `uv` installed
//! under root's home (pip, pyenv) cannot run there. At start-up the builder copies the real
//! `uv` binary ([`plinth_sandbox::tools`], as the node does for sessions) into a root-owned,
//! world-readable tools directory and puts that directory first on the installers' PATH;
//! python3, node and npm come from the system directories.
//! Without a `uv` the builds fall back to `python3 -m venv` and pip, and say so in the log.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// The system directories the installers' PATH ends with.
pub const SYSTEM_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// Prepares `dir` and returns the PATH installers get.
pub fn prepare(dir: &Path) -> std::io::Result<String> {
    std::fs::create_dir_all(dir)?;
    // Every ancestor must be searchable by the build user for it to reach the tools.
    let mut ancestor = Some(dir);
    while let Some(path) = ancestor {
        let metadata = std::fs::metadata(path)?;
        if metadata.permissions().mode() & 0o001 == 0 {
            return Err(std::io::Error::other(format!(
                "{} is not searchable by other users, so the build user cannot reach tools under it; \
                 choose a tools directory outside it (builder.tools_dir)",
                path.display()
            )));
        }
        ancestor = path.parent();
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))?;
    match plinth_sandbox::tools::place_uv(dir)? {
        Some(uv) => {
            tracing::info!(from = %uv.display(), to = %dir.join("uv").display(), "uv available to builds");
        }
        None => {
            tracing::warn!("no uv found: Python builds will use python3 -m venv and pip (slower)");
        }
    }
    Ok(format!("{}:{SYSTEM_PATH}", dir.display()))
}

/// The installers' PATH `path` (tools directory, then the system's) with the configured
/// toolchain directories after it: a project's pin can be met by them (see
/// [`crate::toolchains`]), while an unpinned project gets the system's `python3` and `node`.
/// Directories outside the system ones are shown to builds read-only, like the tools
/// directory.
pub fn with_toolchain_dirs(path: &str, dirs: &[PathBuf]) -> String {
    dirs.iter().fold(path.to_owned(), |path, dir| {
        format!("{path}:{}", dir.to_string_lossy())
    })
}

/// The name of the certificate bundle's copy in the tools directory.
pub const CA_BUNDLE: &str = "ca-bundle.pem";

/// Copies the certificate bundle `source` into the tools directory `dir` (made by [`prepare`]),
/// readable by every user, and answers the copy's path: the file a setting or `SSL_CERT_FILE`
/// names may sit under root's home or `/tmp`, which the build user cannot read or the sandbox
/// hides. The copy is replaced atomically, so a build never reads half a bundle.
pub fn place_ca_bundle(dir: &Path, source: &Path) -> std::io::Result<PathBuf> {
    let bundle = std::fs::read(source).map_err(|error| {
        std::io::Error::new(
            error.kind(),
            format!(
                "reading the certificate bundle {} (builder.ca_bundle, or SSL_CERT_FILE in the \
                 builder's environment): {error}",
                source.display()
            ),
        )
    })?;
    if !bundle.windows(11).any(|window| window == b"-----BEGIN ") {
        return Err(std::io::Error::other(format!(
            "the certificate bundle {} holds no PEM certificate (builder.ca_bundle, or \
             SSL_CERT_FILE in the builder's environment)",
            source.display()
        )));
    }
    let target = dir.join(CA_BUNDLE);
    let staging = dir.join(format!(".{CA_BUNDLE}-{}", std::process::id()));
    std::fs::write(&staging, &bundle)?;
    std::fs::set_permissions(&staging, std::fs::Permissions::from_mode(0o644))?;
    std::fs::rename(&staging, &target)?;
    Ok(target)
}

/// What the installers on `path` are: uv's, Python's, node's and npm's versions. Builds with
/// another toolchain never reuse dependencies installed by this one.
pub fn identity(path: &str) -> String {
    let version = |program: &str, argument: &str| -> String {
        std::process::Command::new(program)
            .arg(argument)
            .env_clear()
            .env("PATH", path)
            .output()
            .ok()
            .filter(|output| output.status.success())
            .map(|output| {
                let text = if output.stdout.is_empty() {
                    output.stderr
                } else {
                    output.stdout
                };
                String::from_utf8_lossy(&text).trim().to_owned()
            })
            .unwrap_or_else(|| "absent".to_owned())
    };
    // Every interpreter a pin could choose, too: a toolchain directory that gains or loses
    // one changes what a pinned build would install.
    let offered = crate::toolchains::pythons(path)
        .into_iter()
        .chain(crate::toolchains::nodes(path))
        .map(|used| format!("{}={} {}", used.name, used.version, used.path))
        .collect::<Vec<_>>()
        .join("; ");
    format!(
        "uv={}; python3={}; node={}; npm={}; offered: {offered}",
        version("uv", "--version"),
        version("python3", "--version"),
        version("node", "--version"),
        version("npm", "--version"),
    )
}
