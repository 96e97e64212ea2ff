//! Symbolic links in a source: which ones are kept, and how one is followed.
//!
//! A link is kept only when its target provably stays inside the environment's root however
//! the links around it are arranged, now or after later edits. The rule is lexical and
//! checked against the link's own path alone:
//!
//! - the target is relative, UTF-8, at most [`MAX_PATH_BYTES`], with no NUL, control
//!   character or backslash (such a name can never be an entry of the index anyway);
//! - after dropping empty and `.` components, every `..` comes first (`../../lib/x` is fine,
//!   `lib/../x` is not), and there are no more of them than the link's directory is deep.
//!
//! Why `..` only first: a link's directory is a real directory (no ancestor of an index
//! entry is ever a link), so climbing from it stays on real directories, inside the root.
//! Every later component only descends, and a link met while descending obeys the same rule
//! from its own real directory, so resolution can never climb out, whatever chain of links
//! it passes through. A `..` after a name would climb from wherever that name resolves to:
//! with `sub/up -> ..` kept, `sub/up/..` is the root's parent. Such targets are rare in real
//! projects and are dropped, never rewritten.
//!
//! Everything else (absolute targets, climbing past the root, odd bytes) is dropped and
//! counted as `symlink` in the import report, as UHP §3.1 and §9 require of links out of the
//! root.

use crate::paths::{MAX_PATH_BYTES, SourcePath};

/// Most links followed when reading through one (Linux's own limit).
pub const MAX_HOPS: usize = 40;

/// A target's components after dropping empty and `.` ones: how many leading `..`, and the
/// names after them; `None` when the target breaks the rule's shape (see the module).
fn shape(target: &str) -> Option<(usize, Vec<&str>)> {
    if target.is_empty()
        || target.len() > MAX_PATH_BYTES
        || target.starts_with('/')
        || target.contains('\\')
        || target.chars().any(char::is_control)
    {
        return None;
    }
    let mut ups = 0;
    let mut names = Vec::new();
    for component in target.split('/') {
        match component {
            "" | "." => {}
            ".." if names.is_empty() => ups += 1,
            ".." => return None,
            name => names.push(name),
        }
    }
    Some((ups, names))
}

/// Whether a link's raw target could stay inside a root for a link at `link`: the rule's
/// check, answered as text when it holds. Archive readers apply it as soon as they see a
/// link; imports apply it again to the final path (a stripped wrapping directory makes every
/// link one level shallower).
pub fn kept_target(link: &SourcePath, raw: &[u8]) -> Option<String> {
    let target = std::str::from_utf8(raw).ok()?;
    let (ups, _) = shape(target)?;
    // The link's directory is as deep as the link's path has ancestors.
    let depth = link.ancestors().count();
    (ups <= depth).then(|| target.to_owned())
}

/// The path `target` names, read from the directory of the link at `link`, as components
/// joined onto that directory: `None` when the target breaks the rule. Only meaningful
/// together with resolving each component in turn (see [`Step`]).
pub fn components_from(link: &SourcePath, target: &str) -> Option<Vec<String>> {
    let (ups, names) = shape(target)?;
    let mut at: Vec<String> = link
        .ancestors()
        .last()
        .map(|parent| parent.as_str().split('/').map(str::to_owned).collect())
        .unwrap_or_default();
    for _ in 0..ups {
        at.pop()?;
    }
    at.extend(names.into_iter().map(str::to_owned));
    Some(at)
}

/// Following a path through the links of an index, one component at a time, as the kernel
/// would on a checkout, but against the index alone: nothing on any disk is ever touched.
#[derive(Debug)]
pub struct Walk {
    /// Real components resolved so far, from the root.
    resolved: Vec<String>,
    /// Components still to resolve, next first.
    pending: std::collections::VecDeque<String>,
    hops: usize,
}

/// What the caller found at the path [`Walk::step`] asked about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// Nothing there.
    Nothing,
    /// A directory.
    Directory,
    /// A file.
    File,
    /// A link, with its target.
    Link(String),
}

/// Why a walk stopped without reaching an entry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WalkError {
    /// A component, or the end, names nothing.
    #[error("{0} does not exist")]
    Missing(String),
    /// A file where a directory is needed.
    #[error("{0} is a file, not a directory")]
    NotADirectory(String),
    /// More than [`MAX_HOPS`] links, or a loop.
    #[error("following {0} passes through more than {MAX_HOPS} links (a loop?)")]
    TooManyLinks(String),
    /// A stored target breaks the rule (an index written by hand?): never followed.
    #[error("{0} is a link that would leave the environment's root; it is not followed")]
    Escapes(String),
}

/// The next question of a walk, or its end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Look up this path and report what is there with [`Walk::answer`].
    Lookup(String),
    /// The walk ended on this path, which holds what was last answered.
    Done(String),
}

impl Walk {
    /// A walk of `path` from the root.
    pub fn new(path: &SourcePath) -> Self {
        Walk {
            resolved: Vec::new(),
            pending: path.as_str().split('/').map(str::to_owned).collect(),
            hops: 0,
        }
    }

    /// The next path to look up, or the end.
    pub fn step(&mut self) -> Step {
        match self.pending.pop_front() {
            Some(component) => {
                self.resolved.push(component);
                Step::Lookup(self.resolved.join("/"))
            }
            None => Step::Done(self.resolved.join("/")),
        }
    }

    /// What the last looked-up path holds.
    pub fn answer(&mut self, found: Found) -> Result<(), WalkError> {
        let here = self.resolved.join("/");
        match found {
            Found::Nothing => Err(WalkError::Missing(here)),
            Found::Directory => Ok(()),
            Found::File if self.pending.is_empty() => Ok(()),
            Found::File => Err(WalkError::NotADirectory(here)),
            Found::Link(target) => {
                self.hops += 1;
                if self.hops > MAX_HOPS {
                    return Err(WalkError::TooManyLinks(here));
                }
                let link =
                    SourcePath::parse(&here).map_err(|_| WalkError::Escapes(here.clone()))?;
                let start = components_from(&link, &target).ok_or(WalkError::Escapes(here))?;
                self.resolved.clear();
                for component in start.into_iter().rev() {
                    self.pending.push_front(component);
                }
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn path(text: &str) -> SourcePath {
        SourcePath::parse(text).expect("path")
    }

    #[test]
    fn targets_that_stay_inside_are_kept() {
        for (link, target) in [
            ("README.md", "docs/README.md"),
            ("a/b/lib", "../../lib"),
            ("a/up", ".."),
            ("a/b/same", "./x/./y/"),
            ("self", "."),
            ("a/b", "../c//d"),
        ] {
            assert_eq!(
                kept_target(&path(link), target.as_bytes()).as_deref(),
                Some(target),
                "{link} -> {target}"
            );
        }
    }

    #[test]
    fn targets_that_could_leave_are_dropped() {
        for (link, target) in [
            ("top", ".."),
            ("a/b", "../../x"),
            ("a/b", "/etc/passwd"),
            ("a/b", "sub/../../.."),
            ("a/b", "x/.."),
            ("a/b", ""),
            ("a/b", "x\\..\\.."),
            ("a/b", "x\0y"),
            ("a/b", "new\nline"),
        ] {
            assert_eq!(
                kept_target(&path(link), target.as_bytes()),
                None,
                "{link} -> {target:?}"
            );
        }
        assert_eq!(kept_target(&path("a"), &[0xff, b'x']), None, "not UTF-8");
        assert_eq!(
            kept_target(&path("a"), "x/".repeat(600).as_bytes()),
            None,
            "too long"
        );
    }

    /// Walks `path` through `entries` (path → what is there).
    fn walk(entries: &HashMap<&str, Found>, path_text: &str) -> Result<String, WalkError> {
        let mut walk = Walk::new(&path(path_text));
        loop {
            match walk.step() {
                Step::Lookup(at) => {
                    walk.answer(entries.get(at.as_str()).cloned().unwrap_or(Found::Nothing))?
                }
                Step::Done(at) => return Ok(at),
            }
        }
    }

    #[test]
    fn a_walk_follows_chains_of_links_and_stops_at_loops_and_escapes() {
        let link = |target: &str| Found::Link(target.to_owned());
        let entries: HashMap<&str, Found> = [
            ("docs", Found::Directory),
            ("docs/guide.md", Found::File),
            ("README.md", link("docs/guide.md")),
            ("sub", Found::Directory),
            ("sub/up", link("..")),
            ("sub/readme", link("../README.md")),
            ("loop", link("loop")),
            // Stored by hand, past the import's check: never followed.
            ("sub/evil", link("../../etc/passwd")),
        ]
        .into_iter()
        .collect();
        assert_eq!(walk(&entries, "README.md"), Ok("docs/guide.md".into()));
        assert_eq!(walk(&entries, "sub/readme"), Ok("docs/guide.md".into()));
        assert_eq!(
            walk(&entries, "sub/up/sub/up/docs/guide.md"),
            Ok("docs/guide.md".into())
        );
        assert_eq!(walk(&entries, "sub/up"), Ok(String::new()), "the root");
        assert!(matches!(
            walk(&entries, "loop"),
            Err(WalkError::TooManyLinks(_))
        ));
        assert!(matches!(
            walk(&entries, "sub/evil"),
            Err(WalkError::Escapes(_))
        ));
        assert!(matches!(
            walk(&entries, "docs/guide.md/x"),
            Err(WalkError::NotADirectory(_))
        ));
        assert!(matches!(
            walk(&entries, "docs/nothing"),
            Err(WalkError::Missing(_))
        ));
    }
}
