//! Symbolic links in a source: which ones are kept. A kept link lands in builds, so sessions
//! (and installers) see what it points at; the files API lists it only when asked and never
//! follows it (UHP §3 serves regular files and directories alone).
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

/// Why the files API refuses a link, or a path through one: UHP §3 has it serve regular
/// files and directories alone.
pub const NOT_SERVED: &str =
    "links are kept in builds and sessions but not served by the files API";

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

#[cfg(test)]
mod tests {
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
}
