//! The slug: an environment's name as one path segment, the last of `/env/<slug>`, where its
//! sessions and builds see it. The catalog makes slugs (`plinth_catalog::model::Slug`); every
//! service that takes one checks it by [`is_valid`] and makes its mount path by [`mount`], so
//! the rule and the path are written once.

/// Where environments are mounted in sessions and builds.
pub const MOUNT_ROOT: &str = "/env";

/// A slug's most characters.
pub const MAX_CHARS: usize = 63;

/// Whether `slug` is a slug: 1 to [`MAX_CHARS`] lowercase ASCII letters and digits in runs
/// joined by single `-`. So it is one path segment that is neither `.`, `..` nor hidden, and
/// cannot be read as a command-line option.
pub fn is_valid(slug: &str) -> bool {
    !slug.is_empty()
        && slug.len() <= MAX_CHARS
        && slug.split('-').all(|run| {
            !run.is_empty()
                && run
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        })
}

/// Where sessions and builds see the environment of `slug`: `/env/<slug>`.
pub fn mount(slug: &str) -> String {
    format!("{MOUNT_ROOT}/{slug}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slugs_are_lowercase_runs_joined_by_single_dashes() {
        for good in ["content-studio", "a", "v1-2", &"a".repeat(MAX_CHARS)] {
            assert!(is_valid(good), "{good}");
        }
        for bad in [
            "",
            ".home",
            "-x",
            "x-",
            "a--b",
            "a/b",
            "..",
            "a b",
            "é",
            "a'b",
            "A",
            "a_b",
            "a.b",
            &"a".repeat(MAX_CHARS + 1),
        ] {
            assert!(!is_valid(bad), "{bad}");
        }
        assert_eq!(mount("demo"), "/env/demo");
    }
}
