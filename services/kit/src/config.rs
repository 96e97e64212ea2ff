//! Configuration helpers shared by every binary: one story, defaults → file → environment →
//! flags. Each service defines its own `Config` struct (serde, with defaults); the binary reads
//! the file with [`read_toml`], then lays environment variables and flags over it.
//!
//! Secrets are [`Secret`]s: they load like strings but print as `<redacted>` in `Debug`, in
//! logs and in `--dump-config`.

use std::fmt;
use std::path::Path;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A value that must never be printed: tokens, passwords, keys.
#[derive(Clone, PartialEq, Eq, Hash, Default)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret value.
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }

    /// The secret itself, for the one place that must use it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

const REDACTED: &str = "<redacted>";

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

impl Serialize for Secret {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(REDACTED)
    }
}

impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer).map(Secret)
    }
}

/// A configuration file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not valid TOML for this binary.
    #[error("config file {path} is invalid: {message}")]
    Parse {
        /// The file.
        path: String,
        /// What the parser said, with the line and the key.
        message: String,
    },
    /// A value is out of range or contradicts another.
    #[error("{0}")]
    Invalid(String),
}

/// Reads a TOML configuration file. Unknown keys are refused, so a typo is an error and not a
/// silently ignored setting.
pub fn read_toml<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<T, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.display().to_string(),
        source,
    })?;
    toml_from_str(&text).map_err(|message| ConfigError::Parse {
        path: path.display().to_string(),
        message,
    })
}

fn toml_from_str<T: for<'de> Deserialize<'de>>(text: &str) -> Result<T, String> {
    toml::from_str(text).map_err(|error| error.to_string())
}

/// Renders an effective configuration as TOML for `--dump-config`, secrets redacted.
pub fn dump_toml<T: Serialize>(config: &T) -> Result<String, ConfigError> {
    toml::to_string_pretty(config).map_err(|error| ConfigError::Invalid(error.to_string()))
}

/// Parses `token=scope,token=scope` (the form environment variables and flags use) into pairs.
/// Whitespace around items is ignored; an item without `=` or with an empty side is refused.
pub fn parse_token_scopes(text: &str) -> Result<Vec<(Secret, String)>, ConfigError> {
    let mut pairs = Vec::new();
    for item in text
        .split(',')
        .map(str::trim)
        .filter(|item| !item.is_empty())
    {
        let Some((token, scope)) = item.split_once('=') else {
            return Err(ConfigError::Invalid(
                "tokens must be written token=scope, separated by commas".to_owned(),
            ));
        };
        let (token, scope) = (token.trim(), scope.trim());
        if token.is_empty() || scope.is_empty() {
            return Err(ConfigError::Invalid(
                "tokens must be written token=scope with neither side empty".to_owned(),
            ));
        }
        pairs.push((Secret::new(token), scope.to_owned()));
    }
    Ok(pairs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_never_print() {
        let secret = Secret::new("hunter2");
        assert_eq!(format!("{secret:?}"), "<redacted>");
        #[derive(Serialize)]
        struct Holder {
            token: Secret,
        }
        let dumped = dump_toml(&Holder {
            token: secret.clone(),
        })
        .expect("dump");
        assert!(!dumped.contains("hunter2"), "{dumped}");
        assert_eq!(secret.expose(), "hunter2");
    }

    #[test]
    fn token_scopes_parse_and_refuse_malformed_items() {
        let pairs = parse_token_scopes(" a=one, b = two ,").expect("parse");
        assert_eq!(pairs.len(), 2);
        assert_eq!(pairs[1].0.expose(), "b");
        assert_eq!(pairs[1].1, "two");
        assert!(parse_token_scopes("novalue").is_err());
        assert!(parse_token_scopes("=scope").is_err());
    }
}

/// A URL with its password (the part between `user:` and `@`) replaced, for printing.
pub fn redact_url(url: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return url.to_owned();
    };
    let rest = &url[scheme_end..];
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    let Some(at) = authority.rfind('@') else {
        return url.to_owned();
    };
    let userinfo = &authority[..at];
    let Some(colon) = userinfo.find(':') else {
        return url.to_owned();
    };
    format!(
        "{}{}:{REDACTED}{}",
        &url[..scheme_end],
        &userinfo[..colon],
        &rest[at..]
    )
}

/// `serialize_with` for URLs that may carry a password.
pub fn serialize_redacted_url<S: Serializer>(
    url: &Option<String>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    match url {
        Some(url) => serializer.serialize_some(&redact_url(url)),
        None => serializer.serialize_none(),
    }
}

#[cfg(test)]
mod url_tests {
    use super::redact_url;

    #[test]
    fn passwords_in_urls_are_redacted_and_nothing_else_changes() {
        assert_eq!(
            redact_url("postgres://app:s3cret@db:5432/plinth?sslmode=require"),
            "postgres://app:<redacted>@db:5432/plinth?sslmode=require"
        );
        assert_eq!(
            redact_url("postgres://app@db/plinth"),
            "postgres://app@db/plinth"
        );
        assert_eq!(
            redact_url("sqlite://./data/catalog.db"),
            "sqlite://./data/catalog.db"
        );
        assert_eq!(redact_url("not a url"), "not a url");
    }
}
