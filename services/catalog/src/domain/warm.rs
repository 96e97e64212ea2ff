//! What the catalog tells nodes so a session's first command does not wait for its version:
//! the versions to hold warm (every environment's active version, most recently activated
//! first, answered with a heartbeat's active list), and each version's read order (the files
//! its first sessions read, in the order they first read them), which a node fetches first.

use crate::domain::model::EnvironmentId;

/// How many versions a heartbeat names to hold warm, unless configured
/// (`catalog.prewarm_versions`).
pub const DEFAULT_PREWARM_VERSIONS: u32 = 256;

/// The most paths one read order holds.
pub const MAX_READ_ORDER_PATHS: usize = 4096;

/// The longest path of a read order, in bytes.
pub const MAX_READ_ORDER_PATH_BYTES: usize = 1024;

/// What a read order must be, as refusals say it.
pub const READ_ORDER_BOUNDS: &str = "paths: at most 4096, each 1 to 1024 bytes, relative to the \
     version's root (no leading `/`, no empty, `.` or `..` component, no NUL)";

/// A version for nodes to hold warm: an environment's active version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WarmVersion {
    /// The environment.
    pub environment_id: EnvironmentId,
    /// Its slug: sessions mount the version at `/env/<slug>`.
    pub slug: String,
    /// The active version.
    pub version: u32,
    /// The version's layer tree, as its sessions pin it.
    pub layer_tree: String,
}

/// The files a version's first sessions read, in the order they first read them: paths
/// relative to the version's root, within [`READ_ORDER_BOUNDS`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadOrder {
    paths: Vec<String>,
}

/// A read order past its bounds.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{READ_ORDER_BOUNDS}")]
pub struct ReadOrderOutOfBounds;

impl ReadOrder {
    /// The read order of `paths`, refused past [`READ_ORDER_BOUNDS`].
    pub fn new(paths: Vec<String>) -> Result<Self, ReadOrderOutOfBounds> {
        if paths.len() > MAX_READ_ORDER_PATHS || !paths.iter().all(|path| valid_path(path)) {
            return Err(ReadOrderOutOfBounds);
        }
        Ok(ReadOrder { paths })
    }

    /// Its paths, in order.
    pub fn paths(&self) -> &[String] {
        &self.paths
    }

    /// Whether it has no path.
    pub fn is_empty(&self) -> bool {
        self.paths.is_empty()
    }

    /// Its paths, in order.
    pub fn into_paths(self) -> Vec<String> {
        self.paths
    }

    /// As stored: one text, the paths joined by newlines, a backslash and a newline within a
    /// path escaped as `\\` and `\n`.
    pub fn to_stored(&self) -> String {
        let mut stored = String::with_capacity(self.paths.iter().map(|path| path.len() + 1).sum());
        for (index, path) in self.paths.iter().enumerate() {
            if index > 0 {
                stored.push('\n');
            }
            for character in path.chars() {
                match character {
                    '\\' => stored.push_str("\\\\"),
                    '\n' => stored.push_str("\\n"),
                    other => stored.push(other),
                }
            }
        }
        stored
    }

    /// Reads [`ReadOrder::to_stored`]'s text back; `None` when it is not such a text (an
    /// unknown escape, or a path past the bounds).
    pub fn from_stored(stored: &str) -> Option<Self> {
        if stored.is_empty() {
            return Some(ReadOrder { paths: Vec::new() });
        }
        let mut paths = Vec::new();
        for line in stored.split('\n') {
            let mut path = String::with_capacity(line.len());
            let mut characters = line.chars();
            while let Some(character) = characters.next() {
                if character == '\\' {
                    match characters.next()? {
                        '\\' => path.push('\\'),
                        'n' => path.push('\n'),
                        _ => return None,
                    }
                } else {
                    path.push(character);
                }
            }
            paths.push(path);
        }
        ReadOrder::new(paths).ok()
    }
}

/// A path relative to a version's root: 1 to 1024 bytes, no leading `/`, no empty, `.` or
/// `..` component, no NUL.
fn valid_path(path: &str) -> bool {
    !path.is_empty()
        && path.len() <= MAX_READ_ORDER_PATH_BYTES
        && !path.contains('\0')
        && path
            .split('/')
            .all(|component| !matches!(component, "" | "." | ".."))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn order(paths: &[&str]) -> Result<ReadOrder, ReadOrderOutOfBounds> {
        ReadOrder::new(paths.iter().map(|path| (*path).to_owned()).collect())
    }

    #[test]
    fn relative_paths_within_the_bounds_are_a_read_order() {
        let longest = "a".repeat(MAX_READ_ORDER_PATH_BYTES);
        for paths in [
            &[][..],
            &["bin/python3"][..],
            &[
                "lib/python3.12/site-packages/x.py",
                ".hidden/..dots",
                "a b",
                &longest,
            ][..],
        ] {
            assert!(order(paths).is_ok(), "{paths:?}");
        }
        let most = vec!["f".to_owned(); MAX_READ_ORDER_PATHS];
        assert!(ReadOrder::new(most.clone()).is_ok());
        let mut too_many = most;
        too_many.push("f".to_owned());
        assert_eq!(ReadOrder::new(too_many), Err(ReadOrderOutOfBounds));
    }

    #[test]
    fn paths_that_are_not_relative_or_too_long_are_refused() {
        let too_long = "a".repeat(MAX_READ_ORDER_PATH_BYTES + 1);
        for path in [
            "",
            "/etc/passwd",
            "../up",
            "a/../b",
            "./a",
            "a/.",
            "a//b",
            "a/",
            "nul\0byte",
            &too_long,
        ] {
            assert_eq!(
                order(&["fine", path]),
                Err(ReadOrderOutOfBounds),
                "{path:?}"
            );
        }
        assert!(ReadOrderOutOfBounds.to_string().contains("at most 4096"));
    }

    #[test]
    fn the_stored_text_gives_back_every_path_in_order() {
        for paths in [
            &[][..],
            &["one"][..],
            &["a/b", "new\nline", "back\\slash", "both\\n\n", "ünïcödé"][..],
        ] {
            let order = order(paths).expect("valid");
            let stored = order.to_stored();
            assert_eq!(ReadOrder::from_stored(&stored), Some(order), "{stored:?}");
        }
        assert_eq!(order(&["a", "b"]).expect("valid").to_stored(), "a\nb");
        for corrupt in ["a\\x", "trailing\\", "a\n\nb", "/root"] {
            assert_eq!(ReadOrder::from_stored(corrupt), None, "{corrupt:?}");
        }
    }
}
