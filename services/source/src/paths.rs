//! Source paths: the one check every endpoint and every import applies before a path names
//! anything. A path is relative to the environment's root, UTF-8, made of non-empty
//! components that are not `.` or `..`, and holds no NUL, no backslash, no control character,
//! no absolute or drive-letter prefix. Anything else is refused, never rewritten.

use std::fmt;

/// Most bytes a whole path may have.
pub const MAX_PATH_BYTES: usize = 1024;
/// Most bytes one component may have (the common file-system limit).
pub const MAX_COMPONENT_BYTES: usize = 255;
/// Most components a path may have.
pub const MAX_DEPTH: usize = 64;

/// A checked path beneath an environment's root, components joined by `/`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SourcePath(String);

/// Why a path was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    /// Empty, or an empty component (`a//b`, a trailing `/`).
    #[error("path {0:?} is empty or has an empty component")]
    Empty(String),
    /// Starts with `/` or a drive letter, or is a UNC path.
    #[error("path {0:?} is absolute; paths are relative to the environment's root")]
    Absolute(String),
    /// Has a `.` or `..` component.
    #[error("path {0:?} has a '.' or '..' component")]
    Dot(String),
    /// Has a backslash.
    #[error("path {0:?} has a backslash; use '/' between components")]
    Backslash(String),
    /// Has NUL or another control character.
    #[error("path {0:?} has a NUL or control character")]
    Control(String),
    /// Too long, too deep, or a component too long.
    #[error(
        "path {path:?} is too long: at most {MAX_PATH_BYTES} bytes, {MAX_DEPTH} components of {MAX_COMPONENT_BYTES} bytes"
    )]
    TooLong {
        /// The path, cut for the message.
        path: String,
    },
}

fn shown(path: &str) -> String {
    if path.len() <= 200 {
        return path.to_owned();
    }
    let mut end = 200;
    while !path.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &path[..end])
}

impl SourcePath {
    /// Checks a path.
    pub fn parse(path: &str) -> Result<Self, PathError> {
        if path.is_empty() {
            return Err(PathError::Empty(String::new()));
        }
        if path.len() > MAX_PATH_BYTES {
            return Err(PathError::TooLong { path: shown(path) });
        }
        if path.chars().any(char::is_control) {
            return Err(PathError::Control(shown(path)));
        }
        if path.contains('\\') {
            return Err(PathError::Backslash(shown(path)));
        }
        if path.starts_with('/') || has_drive_prefix(path) {
            return Err(PathError::Absolute(shown(path)));
        }
        let mut depth = 0;
        for component in path.split('/') {
            depth += 1;
            match component {
                "" => return Err(PathError::Empty(shown(path))),
                "." | ".." => return Err(PathError::Dot(shown(path))),
                c if c.len() > MAX_COMPONENT_BYTES => {
                    return Err(PathError::TooLong { path: shown(path) });
                }
                _ => {}
            }
        }
        if depth > MAX_DEPTH {
            return Err(PathError::TooLong { path: shown(path) });
        }
        Ok(SourcePath(path.to_owned()))
    }

    /// The path as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Every ancestor directory, outermost first (`a/b/c` → `a`, `a/b`).
    pub fn ancestors(&self) -> impl Iterator<Item = SourcePath> + '_ {
        self.0
            .match_indices('/')
            .map(|(index, _)| SourcePath(self.0[..index].to_owned()))
    }

    /// The path without its first component, if it has more than one.
    pub fn strip_first_component(&self) -> Option<SourcePath> {
        self.0
            .split_once('/')
            .map(|(_, rest)| SourcePath(rest.to_owned()))
    }

    /// The first component.
    pub fn first_component(&self) -> &str {
        self.0.split('/').next().unwrap_or(&self.0)
    }

    /// The last component.
    pub fn file_name(&self) -> &str {
        self.0.rsplit('/').next().unwrap_or(&self.0)
    }
}

/// `C:`, `c:foo`: a Windows drive letter at the start.
fn has_drive_prefix(path: &str) -> bool {
    let bytes = path.as_bytes();
    bytes.len() >= 2 && bytes[0].is_ascii_alphabetic() && bytes[1] == b':'
}

impl fmt::Display for SourcePath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn good_paths_pass() {
        for path in [
            "a",
            "scripts/run.py",
            ".env",
            "a/.hidden/b",
            "ünïcode/文件.txt",
            "a..b",
            "...",
            "xy:z",
        ] {
            SourcePath::parse(path).unwrap_or_else(|error| panic!("{path}: {error}"));
        }
    }

    #[test]
    fn bad_paths_are_refused_with_the_path_named() {
        type Expect = fn(&PathError) -> bool;
        let cases: [(&str, Expect); 14] = [
            ("", |e| matches!(e, PathError::Empty(_))),
            ("a//b", |e| matches!(e, PathError::Empty(_))),
            ("a/", |e| matches!(e, PathError::Empty(_))),
            ("/etc/passwd", |e| matches!(e, PathError::Absolute(_))),
            ("C:/Windows", |e| matches!(e, PathError::Absolute(_))),
            ("c:evil", |e| matches!(e, PathError::Absolute(_))),
            ("..", |e| matches!(e, PathError::Dot(_))),
            ("a/../../b", |e| matches!(e, PathError::Dot(_))),
            ("./a", |e| matches!(e, PathError::Dot(_))),
            ("a\\..\\b", |e| matches!(e, PathError::Backslash(_))),
            ("\\\\host\\share", |e| matches!(e, PathError::Backslash(_))),
            ("a\0b", |e| matches!(e, PathError::Control(_))),
            ("line\nbreak", |e| matches!(e, PathError::Control(_))),
            ("a/b", |_| false),
        ];
        for (path, expected) in &cases[..13] {
            let error = SourcePath::parse(path).expect_err(path);
            assert!(expected(&error), "{path:?}: {error:?}");
        }
        assert!(matches!(
            SourcePath::parse(&"x".repeat(256)),
            Err(PathError::TooLong { .. })
        ));
        assert!(matches!(
            SourcePath::parse("a/".repeat(65).trim_end_matches('/')),
            Err(PathError::TooLong { .. })
        ));
        assert!(matches!(
            SourcePath::parse(&"abcd/".repeat(300)),
            Err(PathError::TooLong { .. })
        ));
    }

    #[test]
    fn ancestors_and_components() {
        let path = SourcePath::parse("a/b/c.txt").expect("valid");
        let ancestors: Vec<String> = path.ancestors().map(|a| a.as_str().to_owned()).collect();
        assert_eq!(ancestors, ["a", "a/b"]);
        assert_eq!(path.first_component(), "a");
        assert_eq!(path.file_name(), "c.txt");
        assert_eq!(
            path.strip_first_component().map(|p| p.0),
            Some("b/c.txt".to_owned())
        );
        assert_eq!(
            SourcePath::parse("top")
                .expect("valid")
                .strip_first_component(),
            None
        );
    }
}
