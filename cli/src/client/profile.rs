//! Where the client finds its server and token: `PLINTH_URL` and `PLINTH_TOKEN`, else the
//! file `plinth login` writes (`$XDG_CONFIG_HOME/plinth/client.toml`, or
//! `~/.config/plinth/client.toml`). The file holds a secret, so it is created 0600 in a
//! directory made 0700, written under a temporary name and renamed into place: no reader ever
//! sees it with wider permissions, or half written.

use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use serde::{Deserialize, Serialize};

use super::Usage;

/// The variable that names the server, over the file.
pub const URL_VARIABLE: &str = "PLINTH_URL";
/// The variable that holds the token, over the file.
pub const TOKEN_VARIABLE: &str = "PLINTH_TOKEN";
/// Where `plinth serve` listens unless told otherwise.
pub const DEFAULT_URL: &str = "http://127.0.0.1:8080";

/// What `client.toml` holds.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    /// The server's REST URL.
    pub url: Option<String>,
    /// The bearer token; none for a server without tokens.
    pub token: Option<String>,
}

/// The client's settings file: `$XDG_CONFIG_HOME/plinth/client.toml`, else
/// `$HOME/.config/plinth/client.toml`.
pub fn path() -> anyhow::Result<PathBuf> {
    let base = match std::env::var_os("XDG_CONFIG_HOME").filter(|dir| !dir.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => match std::env::var_os("HOME").filter(|dir| !dir.is_empty()) {
            Some(home) => PathBuf::from(home).join(".config"),
            None => {
                return Err(Usage(format!(
                    "neither XDG_CONFIG_HOME nor HOME is set, so there is nowhere to keep the \
                     client's settings; set {URL_VARIABLE} and {TOKEN_VARIABLE} instead"
                ))
                .into());
            }
        },
    };
    Ok(base.join("plinth").join("client.toml"))
}

/// The saved profile; an empty one when there is no file yet.
pub fn load() -> anyhow::Result<Profile> {
    let path = path()?;
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            return Ok(Profile::default());
        }
        Err(error) => {
            return Err(error).with_context(|| format!("cannot read {}", path.display()));
        }
    };
    toml::from_str(&text).with_context(|| {
        format!(
            "{} is not a client settings file; run `plinth login` again to rewrite it",
            path.display()
        )
    })
}

/// The profile in effect: the file's, with `PLINTH_URL` and `PLINTH_TOKEN` over it.
pub fn effective() -> anyhow::Result<Profile> {
    let from_env = |name| {
        std::env::var(name)
            .ok()
            .filter(|value: &String| !value.is_empty())
    };
    let (url, token) = (from_env(URL_VARIABLE), from_env(TOKEN_VARIABLE));
    // Both set: the file is not needed, and a broken one must not stop the command.
    let saved = if url.is_some() && token.is_some() {
        Profile::default()
    } else {
        load()?
    };
    Ok(Profile {
        url: url.or(saved.url),
        token: token.or(saved.token),
    })
}

/// Writes the profile to `path()`, readable by its owner only, from the first byte on.
pub fn save(profile: &Profile) -> anyhow::Result<PathBuf> {
    let path = path()?;
    let dir = path
        .parent()
        .context("the settings file has no directory")?;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("cannot make {}", dir.display()))?;
    let text = toml::to_string(profile).context("cannot write the settings as TOML")?;
    let temporary = dir.join(format!(".client.toml.{}", std::process::id()));
    write_private(&temporary, text.as_bytes())
        .with_context(|| format!("cannot write {}", temporary.display()))?;
    if let Err(error) = std::fs::rename(&temporary, &path) {
        let _ = std::fs::remove_file(&temporary);
        return Err(error).with_context(|| format!("cannot replace {}", path.display()));
    }
    Ok(path)
}

/// Creates `path` with mode 0600 (never wider, whatever the umask) and writes `bytes`.
fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    // A stale temporary from a killed run may have any mode: start afresh.
    let _ = std::fs::remove_file(path);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    // The mode given to open is masked by the umask, which can only narrow it; set it exactly.
    file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    file.write_all(bytes)?;
    file.sync_all()
}
