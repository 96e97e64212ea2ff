//! Edits and unified diffs, worked out in memory: an edit or a patch either yields every new
//! file content, or an error, before anything is written.

use plinth_kit::{ErrorCode, PlinthError};

/// What an edit does (see `EditOperation` in workspace.proto).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EditKind {
    /// The whole file.
    Create,
    /// `find` → `contents`.
    Replace,
    /// `contents` after `find`.
    InsertAfter,
    /// `contents` before `find`.
    InsertBefore,
    /// `contents` at the end.
    Append,
}

fn error(code: ErrorCode, message: String) -> PlinthError {
    PlinthError::new(code, message)
}

/// The file's new text after an edit. `current` is `None` when the file does not exist.
pub fn edit(
    path: &str,
    current: Option<&str>,
    kind: EditKind,
    contents: Option<&str>,
    find: Option<&str>,
    replace_all: bool,
) -> Result<String, PlinthError> {
    if replace_all && (kind != EditKind::Replace || find.is_none()) {
        return Err(error(
            ErrorCode::WorkspaceInvalidRequest,
            "replace_all is only valid with operation \"replace\" and a find string".to_owned(),
        ));
    }
    if kind == EditKind::Create {
        return Ok(contents.unwrap_or_default().to_owned());
    }
    let Some(contents) = contents else {
        return Err(error(
            ErrorCode::WorkspaceContentsRequired,
            "contents is required for this operation (pass \"\" to delete the matched text on purpose)".to_owned(),
        ));
    };
    if kind == EditKind::Append {
        return Ok(format!("{}{contents}", current.unwrap_or_default()));
    }
    let Some(current) = current else {
        return Err(error(
            ErrorCode::WorkspaceNotFound,
            format!("{path}: no such file; use operation \"create\" to make it"),
        ));
    };
    let Some(find) = find else {
        return Err(error(
            ErrorCode::WorkspaceInvalidRequest,
            "find is required for replace, insert_after and insert_before".to_owned(),
        ));
    };
    if find.is_empty() {
        return Err(error(
            ErrorCode::WorkspaceInvalidRequest,
            "find must not be empty".to_owned(),
        ));
    }
    let count = current.matches(find).count();
    if count == 0 {
        return Err(error(
            ErrorCode::WorkspaceFindNotFound,
            format!(
                "{path}: the find text does not occur in the file (it is matched exactly, whitespace included)"
            ),
        ));
    }
    if count > 1 && !(kind == EditKind::Replace && replace_all) {
        return Err(error(
            ErrorCode::WorkspaceFindNotUnique,
            format!(
                "{path}: the find text occurs {count} times; make it unique with more surrounding text, or set replace_all"
            ),
        ));
    }
    Ok(match kind {
        EditKind::Replace => current.replace(find, contents),
        EditKind::InsertAfter => current.replacen(find, &format!("{find}{contents}"), 1),
        EditKind::InsertBefore => current.replacen(find, &format!("{contents}{find}"), 1),
        EditKind::Create | EditKind::Append => unreachable!("handled above"),
    })
}

/// One hunk: the lines it expects and the lines it leaves.
#[derive(Debug, Default)]
struct Hunk {
    old_start: Option<usize>,
    old: Vec<String>,
    new: Vec<String>,
}

fn is_header(line: &str) -> bool {
    line.starts_with("--- ")
        || line.starts_with("+++ ")
        || line.starts_with("diff ")
        || line.starts_with("index ")
        || line.starts_with("new file mode")
        || line.starts_with("deleted file mode")
        || line == "***"
}

/// `@@ -a,b +c,d @@` → `a`; `@@` alone → none.
fn old_start(header: &str) -> Option<usize> {
    let rest = header.strip_prefix("@@")?.trim_start();
    let old = rest.strip_prefix('-')?;
    let number: String = old.chars().take_while(char::is_ascii_digit).collect();
    number.parse().ok()
}

/// Why a diff does not apply.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DiffError {
    /// A line that is no part of a unified diff.
    #[error("line {0:?} is not part of a unified diff (lines start with ' ', '-', '+' or '@@')")]
    NotADiffLine(String),
    /// A create_file diff that removes or keeps lines.
    #[error("a create_file diff may only add lines")]
    CreateRemoves,
    /// An update_file diff without a hunk.
    #[error("the diff has no hunks")]
    NoHunks,
    /// A hunk (numbered from 1) whose context and removed lines are not in the file.
    #[error(
        "hunk {0} does not apply: its context and removed lines are not in the file as written"
    )]
    HunkDoesNotApply(usize),
}

fn hunks(diff: &str) -> Result<(Vec<Hunk>, bool), DiffError> {
    let mut hunks: Vec<Hunk> = Vec::new();
    let mut no_newline_at_end = false;
    for line in diff.lines() {
        if line.starts_with("@@") {
            hunks.push(Hunk {
                old_start: old_start(line),
                ..Hunk::default()
            });
            continue;
        }
        if is_header(line) && hunks.is_empty() {
            continue;
        }
        if line.starts_with('\\') {
            no_newline_at_end = true;
            continue;
        }
        if hunks.is_empty() {
            hunks.push(Hunk::default());
        }
        let hunk = hunks.last_mut().expect("a hunk");
        if let Some(text) = line.strip_prefix('+') {
            hunk.new.push(text.to_owned());
        } else if let Some(text) = line.strip_prefix('-') {
            hunk.old.push(text.to_owned());
        } else if let Some(text) = line.strip_prefix(' ') {
            hunk.old.push(text.to_owned());
            hunk.new.push(text.to_owned());
        } else if line.is_empty() {
            // An empty context line whose leading space was trimmed.
            hunk.old.push(String::new());
            hunk.new.push(String::new());
        } else {
            return Err(DiffError::NotADiffLine(line.to_owned()));
        }
    }
    Ok((hunks, no_newline_at_end))
}

/// The content a create_file diff adds.
pub fn created(diff: &str) -> Result<String, DiffError> {
    let (hunks, no_newline) = hunks(diff)?;
    let mut lines = Vec::new();
    for hunk in hunks {
        if !hunk.old.is_empty() {
            return Err(DiffError::CreateRemoves);
        }
        lines.extend(hunk.new);
    }
    let mut text = lines.join("\n");
    if !lines.is_empty() && !no_newline {
        text.push('\n');
    }
    Ok(text)
}

/// `current` with an update_file diff applied: each hunk is placed where its expected lines
/// are, trying the line its header names first, then the nearest other place.
pub fn apply(current: &str, diff: &str) -> Result<String, DiffError> {
    let (hunks, no_newline) = hunks(diff)?;
    if hunks.is_empty() {
        return Err(DiffError::NoHunks);
    }
    let ends_with_newline = current.ends_with('\n');
    let mut lines: Vec<String> = current.lines().map(str::to_owned).collect();
    let mut offset: isize = 0;
    let mut from = 0usize;
    for (number, hunk) in hunks.iter().enumerate() {
        let position = if hunk.old.is_empty() {
            hunk.old_start
                .map(|start| {
                    usize::try_from(start as isize + offset)
                        .unwrap_or(0)
                        .min(lines.len())
                })
                .unwrap_or(lines.len())
        } else {
            let fits = |at: usize| {
                at + hunk.old.len() <= lines.len()
                    && lines[at..at + hunk.old.len()]
                        .iter()
                        .zip(&hunk.old)
                        .all(|(have, want)| have.trim_end() == want.trim_end())
            };
            let hint = hunk
                .old_start
                .map(|start| usize::try_from(start as isize - 1 + offset).unwrap_or(0));
            let mut candidates: Vec<usize> = (from..=lines.len()).filter(|at| fits(*at)).collect();
            if let Some(hint) = hint {
                candidates.sort_by_key(|at| at.abs_diff(hint));
            }
            *candidates
                .first()
                .ok_or(DiffError::HunkDoesNotApply(number + 1))?
        };
        lines.splice(
            position..position + hunk.old.len(),
            hunk.new.iter().cloned(),
        );
        offset += hunk.new.len() as isize - hunk.old.len() as isize;
        from = position + hunk.new.len();
    }
    let mut text = lines.join("\n");
    let newline = !no_newline && (ends_with_newline || current.is_empty());
    if !lines.is_empty() && newline {
        text.push('\n');
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edits_follow_the_rules() {
        let text = "a = 1\nb = 2\na = 1\n";
        let one = edit(
            "f",
            Some(text),
            EditKind::Replace,
            Some("c = 3"),
            Some("b = 2"),
            false,
        );
        assert_eq!(one.expect("unique"), "a = 1\nc = 3\na = 1\n");
        let twice = edit(
            "f",
            Some(text),
            EditKind::Replace,
            Some("x"),
            Some("a = 1"),
            false,
        );
        assert_eq!(
            twice.expect_err("not unique").code,
            ErrorCode::WorkspaceFindNotUnique
        );
        let all = edit(
            "f",
            Some(text),
            EditKind::Replace,
            Some("x"),
            Some("a = 1"),
            true,
        );
        assert_eq!(all.expect("all"), "x\nb = 2\nx\n");
        let missing = edit(
            "f",
            Some(text),
            EditKind::Replace,
            None,
            Some("b = 2"),
            false,
        );
        assert_eq!(
            missing.expect_err("contents").code,
            ErrorCode::WorkspaceContentsRequired
        );
        let deleted = edit(
            "f",
            Some(text),
            EditKind::Replace,
            Some(""),
            Some("b = 2\n"),
            false,
        );
        assert_eq!(deleted.expect("explicit empty"), "a = 1\na = 1\n");
        let after = edit(
            "f",
            Some("x\ny\n"),
            EditKind::InsertAfter,
            Some("z\n"),
            Some("x\n"),
            false,
        );
        assert_eq!(after.expect("after"), "x\nz\ny\n");
        let before = edit(
            "f",
            Some("x\ny\n"),
            EditKind::InsertBefore,
            Some("z\n"),
            Some("y"),
            false,
        );
        assert_eq!(before.expect("before"), "x\nz\ny\n");
        let append = edit("f", None, EditKind::Append, Some("new\n"), None, false);
        assert_eq!(append.expect("append makes"), "new\n");
        let bad = edit("f", Some(text), EditKind::Append, Some("x"), None, true);
        assert_eq!(
            bad.expect_err("replace_all").code,
            ErrorCode::WorkspaceInvalidRequest
        );
        let nowhere = edit(
            "f",
            Some(text),
            EditKind::Replace,
            Some("x"),
            Some("zzz"),
            false,
        );
        assert_eq!(
            nowhere.expect_err("absent").code,
            ErrorCode::WorkspaceFindNotFound
        );
    }

    #[test]
    fn diffs_apply_by_their_context() {
        let text = "one\ntwo\nthree\nfour\n";
        let diff = "--- a/f\n+++ b/f\n@@ -2,2 +2,2 @@\n two\n-three\n+THREE\n";
        assert_eq!(
            apply(text, diff).expect("applies"),
            "one\ntwo\nTHREE\nfour\n"
        );
        let shifted = "@@ -10,2 +10,3 @@\n three\n+three and a half\n four\n";
        assert_eq!(
            apply(text, shifted).expect("found by context"),
            "one\ntwo\nthree\nthree and a half\nfour\n"
        );
        assert_eq!(
            apply(text, "@@ -1 +1 @@\n-nope\n+yes\n"),
            Err(DiffError::HunkDoesNotApply(1))
        );
        assert_eq!(apply(text, ""), Err(DiffError::NoHunks));
        assert_eq!(
            created("--- /dev/null\n+++ b/new.py\n@@ -0,0 +1,2 @@\n+a\n+b\n").expect("created"),
            "a\nb\n"
        );
        assert_eq!(
            created("@@ -1 +1 @@\n-a\n+b\n"),
            Err(DiffError::CreateRemoves)
        );
        assert!(matches!(
            created("@@ -0,0 +1 @@\n*a\n"),
            Err(DiffError::NotADiffLine(line)) if line == "*a"
        ));
    }
}
