//! Where a pushed directory's files came from by git: what `plinth push` sends beside them, so
//! a build can give setuptools-scm and hatch-vcs the version they would compute in the
//! checkout (the archive holds the files, never `.git`).
//!
//! Best effort, with the `git` the user has: a directory that is not in a work tree, a
//! repository without commits, or no `git` at all sends nothing, and the push goes on.

use std::path::Path;
use std::process::{Command, Stdio};

/// A checkout's state, as a git import records a repository's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkout {
    /// `HEAD`'s full commit id.
    pub commit: String,
    /// `git describe --tags --always --abbrev=7 --match '*[0-9]*'` of it (the tags
    /// setuptools-scm reads), as a git import describes a commit.
    pub describe: String,
    /// Whether tracked files have changes not committed (`git describe --dirty`).
    pub dirty: bool,
    /// The branch checked out; empty when `HEAD` is detached.
    pub branch: String,
    /// Commits reachable from `HEAD` (`git rev-list --count`); 0 when not counted.
    pub commits: u64,
}

/// The checkout `dir` is in, if it is in one (see the module).
pub fn of(dir: &Path) -> Option<Checkout> {
    if git(dir, &["rev-parse", "--is-inside-work-tree"])? != "true" {
        return None;
    }
    let commit = git(dir, &["rev-parse", "--verify", "--quiet", "HEAD^{commit}"])?;
    let described = git(
        dir,
        &[
            "describe",
            "--dirty",
            "--tags",
            "--always",
            "--abbrev=7",
            "--match",
            "*[0-9]*",
        ],
    )?;
    let (describe, dirty) = match described.strip_suffix("-dirty") {
        Some(clean) => (clean.to_owned(), true),
        None => (described, false),
    };
    if describe.is_empty() {
        return None;
    }
    let branch = git(dir, &["symbolic-ref", "--quiet", "--short", "HEAD"]).unwrap_or_default();
    let commits = git(dir, &["rev-list", "--count", "HEAD"])
        .and_then(|count| count.parse().ok())
        .unwrap_or(0);
    Some(Checkout {
        commit,
        describe,
        dirty,
        branch,
        commits,
    })
}

/// `git <args>` in `dir`: its trimmed output when it succeeds.
fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let output = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        // Reading the state takes no lock another git in the checkout could be waiting on.
        .env("GIT_OPTIONAL_LOCKS", "0")
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    if !output.status.success() {
        return None;
    }
    Some(String::from_utf8(output.stdout).ok()?.trim().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(dir: &Path, args: &[&str]) -> String {
        let output = Command::new("git")
            .current_dir(dir)
            .args([
                "-c",
                "user.name=Test",
                "-c",
                "user.email=test@example.com",
                "-c",
                "init.defaultBranch=main",
            ])
            .args(args)
            .output()
            .expect("git runs");
        assert!(output.status.success(), "git {args:?}");
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    }

    #[test]
    fn a_checkout_says_its_commit_description_branch_count_and_changes() {
        let repo = tempfile::tempdir().expect("repo");
        let dir = repo.path();
        assert_eq!(of(dir), None, "not a checkout");
        run(dir, &["init", "--quiet"]);
        std::fs::write(dir.join("a.txt"), "a\n").expect("write");
        assert_eq!(of(dir), None, "no commit yet");
        run(dir, &["add", "."]);
        run(dir, &["commit", "--quiet", "-m", "one"]);
        run(dir, &["tag", "latest"]);
        let head = run(dir, &["rev-parse", "HEAD"]);
        let checkout = of(dir).expect("a checkout");
        assert_eq!(checkout.commit, head);
        assert_eq!(
            checkout.describe,
            &head[..7],
            "a tag without a digit is passed over"
        );
        assert_eq!((checkout.dirty, checkout.commits), (false, 1));
        assert_eq!(checkout.branch, "main");

        run(dir, &["tag", "v1.2.3"]);
        std::fs::write(dir.join("b.txt"), "b\n").expect("write");
        run(dir, &["add", "."]);
        run(dir, &["commit", "--quiet", "-m", "two"]);
        let short = run(dir, &["rev-parse", "--short=7", "HEAD"]);
        std::fs::create_dir(dir.join("sub")).expect("mkdir");
        let checkout = of(&dir.join("sub")).expect("beneath the root too");
        assert_eq!(checkout.describe, format!("v1.2.3-1-g{short}"));
        assert_eq!((checkout.dirty, checkout.commits), (false, 2));

        // An untracked file is no change; an edit to a tracked one is.
        std::fs::write(dir.join("new.txt"), "new\n").expect("write");
        assert!(!of(dir).expect("checkout").dirty);
        std::fs::write(dir.join("a.txt"), "changed\n").expect("write");
        let checkout = of(dir).expect("checkout");
        assert!(checkout.dirty);
        assert_eq!(checkout.describe, format!("v1.2.3-1-g{short}"));

        run(dir, &["checkout", "--quiet", "--detach", "v1.2.3"]);
        let checkout = of(dir).expect("checkout");
        assert_eq!(
            (checkout.describe.as_str(), checkout.branch.as_str()),
            ("v1.2.3", "")
        );
    }
}
