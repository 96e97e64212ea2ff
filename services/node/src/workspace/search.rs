//! Listing, content search and file-name globs over a workspace, walked by descriptor
//! (`beneath::walk`, no link followed). Contents are matched by ripgrep's own crates
//! (`grep-regex`, `grep-searcher`), globs by `globset`, and search and find honour
//! `.gitignore` files (`ignore`) and skip hidden names below where they start, as ripgrep
//! does.

use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

use globset::{GlobBuilder, GlobMatcher};
use grep_regex::RegexMatcherBuilder;
use grep_searcher::{BinaryDetection, SearcherBuilder, sinks};
use ignore::gitignore::{Gitignore, GitignoreBuilder};
use plinth_kit::{ErrorCode, PlinthError};
use rustix::fs::FileType;

use super::beneath::Step;
use super::{Target, Workspace, beneath};

/// Largest file searched.
const MAX_SEARCH_BYTES: u64 = super::MAX_FILE_BYTES;
/// Largest `.gitignore` read.
const MAX_IGNORE_BYTES: u64 = 1024 * 1024;

// What one listing, find or search may cost, whatever the caller asks: counts are clamped to
// these, and an answer that reaches one says it was cut (`truncated`).

/// Most entries a listing or a find answers.
pub const MAX_ENTRIES: usize = 10_000;
/// Most matches a search answers, in all and in one file.
pub const MAX_RESULTS: usize = 1_000;
/// Most bytes of one line (a match or its context) a search answers.
pub const MAX_LINE_BYTES: usize = 4_096;
/// Most lines of context each side of a match.
pub const MAX_CONTEXT_LINES: usize = 20;
/// Most bytes of paths and lines one answer carries.
pub const MAX_ANSWER_BYTES: usize = 4 * 1024 * 1024;
/// How long a walk (a listing, a find, a search) may run; past it, it answers what it found
/// so far, marked truncated.
pub const WALK_TIME_LIMIT: Duration = Duration::from_secs(10);

/// One entry answered.
#[derive(Debug, Clone)]
pub struct Entry {
    /// As answered (relative to the root, or absolute under the mount).
    pub path: String,
    /// What it is.
    pub kind: EntryKind,
    /// A file's size.
    pub size: Option<u64>,
    /// Modification time, ms.
    pub mtime_ms: i64,
}

/// What a listed entry is; nothing else (sockets, devices, fifos) is listed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    /// A regular file.
    File,
    /// A directory.
    Directory,
    /// A symbolic link, as itself.
    Symlink,
}

fn entry_kind(kind: FileType) -> Option<EntryKind> {
    match kind {
        FileType::RegularFile => Some(EntryKind::File),
        FileType::Directory => Some(EntryKind::Directory),
        FileType::Symlink => Some(EntryKind::Symlink),
        _ => None,
    }
}

fn hidden(rel: &str) -> bool {
    rel.rsplit('/')
        .next()
        .is_some_and(|name| name.starts_with('.'))
}

/// Lists a directory: its entries, or with `recursive` everything beneath it; at most
/// `max_entries` (and [`MAX_ENTRIES`]), [`MAX_ANSWER_BYTES`] of paths, and until `deadline`.
pub fn list(
    ws: &Workspace,
    target: &Target,
    recursive: bool,
    include_hidden: bool,
    max_entries: usize,
    deadline: Instant,
) -> Result<(Vec<Entry>, bool), PlinthError> {
    let max_entries = max_entries.min(MAX_ENTRIES);
    let mut answer_bytes = 0usize;
    let base = ws.open_base(target.base)?;
    let (_, stat) = beneath::lookup(&base, &target.rel(), &target.display)?;
    if beneath::kind(&stat) != FileType::Directory {
        return Err(PlinthError::new(
            ErrorCode::WorkspacePathInvalid,
            format!("{}: not a directory", target.display),
        ));
    }
    let mut entries = Vec::new();
    let mut truncated = false;
    beneath::walk(
        &base,
        &target.rel(),
        &target.display,
        |_, _| {},
        |walked, _| {
            if !include_hidden && hidden(&walked.rel) {
                return Step::Skip;
            }
            let Some(kind) = entry_kind(beneath::kind(&walked.stat)) else {
                return Step::Skip;
            };
            if entries.len() >= max_entries
                || answer_bytes >= MAX_ANSWER_BYTES
                || Instant::now() >= deadline
            {
                truncated = true;
                return Step::Stop;
            }
            let path = ws.display(target.base, &walked.rel);
            answer_bytes += path.len();
            entries.push(Entry {
                path,
                kind,
                size: (kind == EntryKind::File)
                    .then(|| u64::try_from(walked.stat.st_size).unwrap_or(0)),
                mtime_ms: beneath::mtime_ms(&walked.stat),
            });
            if recursive { Step::Descend } else { Step::Skip }
        },
    )?;
    entries.sort_by(|a, b| a.path.cmp(&b.path));
    Ok((entries, truncated))
}

/// A glob as agents write them: without `/` it matches a name at any depth, with `/` the
/// path relative to where the search starts (`**` crosses directories, `*` does not).
pub struct NameGlob {
    matcher: GlobMatcher,
    by_name: bool,
}

impl NameGlob {
    /// Compiles `glob` (`workspace_invalid_request` when it is not one).
    pub fn new(glob: &str) -> Result<Self, PlinthError> {
        let pattern = glob.trim_start_matches("./");
        let compiled = GlobBuilder::new(pattern)
            .literal_separator(true)
            .build()
            .map_err(|error| {
                PlinthError::new(
                    ErrorCode::WorkspaceInvalidRequest,
                    format!("glob {glob:?}: {error}"),
                )
            })?;
        Ok(NameGlob {
            matcher: compiled.compile_matcher(),
            by_name: !pattern.contains('/'),
        })
    }

    /// Whether the file at `rel` (relative to the search's start) matches.
    pub fn matches(&self, rel: &str) -> bool {
        if self.by_name {
            let name = rel.rsplit('/').next().unwrap_or(rel);
            self.matcher.is_match(name)
        } else {
            self.matcher.is_match(rel)
        }
    }
}

/// The `.gitignore` rules in force while walking: one matcher per directory that has one.
struct Ignores {
    stack: Vec<(String, Gitignore)>,
}

impl Ignores {
    fn new() -> Self {
        Ignores { stack: Vec::new() }
    }

    /// Reads `dir`'s `.gitignore`, if any, for the entries beneath `rel`.
    fn enter(&mut self, dir: &OwnedFd, rel: &str, owner: Option<u32>) {
        self.stack.retain(|(prefix, _)| {
            prefix.is_empty() || rel == prefix || rel.starts_with(&format!("{prefix}/"))
        });
        let Some(content) = beneath::read_entry(dir, ".gitignore", MAX_IGNORE_BYTES, owner) else {
            return;
        };
        let mut builder = GitignoreBuilder::new(format!("/{rel}"));
        for line in String::from_utf8_lossy(&content).lines() {
            let _ = builder.add_line(None, line);
        }
        if let Ok(ignore) = builder.build() {
            self.stack.push((rel.to_owned(), ignore));
        }
    }

    fn ignored(&self, rel: &str, is_dir: bool) -> bool {
        let path = format!("/{rel}");
        self.stack.iter().rev().any(|(prefix, ignore)| {
            (prefix.is_empty() || rel.starts_with(&format!("{prefix}/")))
                && ignore.matched(&path, is_dir).is_ignore()
        })
    }
}

/// Visits the regular files to search beneath `target` (or `target` itself when it is a
/// file) with their path relative to the start: hidden names and `.gitignore`d paths below
/// the start are skipped (`.git` is hidden). `visit` answers false to stop.
fn files(
    ws: &Workspace,
    target: &Target,
    mut visit: impl FnMut(&str, &beneath::Walked, &OwnedFd) -> bool,
) -> Result<(), PlinthError> {
    let base = ws.open_base(target.base)?;
    let start = target.rel();
    let (_, stat) = beneath::lookup(&base, &start, &target.display)?;
    if beneath::kind(&stat) == FileType::RegularFile {
        let parent = target.parts[..target.parts.len().saturating_sub(1)].join("/");
        let dir = beneath::open_beneath_dir(&base, &parent, &target.display)?;
        let walked = beneath::Walked { rel: start, stat };
        let name = walked
            .rel
            .rsplit('/')
            .next()
            .unwrap_or(&walked.rel)
            .to_owned();
        visit(&name, &walked, &dir);
        return Ok(());
    }
    if beneath::kind(&stat) != FileType::Directory {
        return Err(PlinthError::new(
            ErrorCode::WorkspacePathInvalid,
            format!("{}: not a file or directory", target.display),
        ));
    }
    let owner = ws.owner(target.base);
    let ignores = std::cell::RefCell::new(Ignores::new());
    beneath::walk(
        &base,
        &start,
        &target.display,
        |rel, dir| ignores.borrow_mut().enter(dir, rel, owner),
        |walked, dir| {
            let is_dir = beneath::kind(&walked.stat) == FileType::Directory;
            if hidden(&walked.rel) || ignores.borrow().ignored(&walked.rel, is_dir) {
                return Step::Skip;
            }
            if is_dir {
                return Step::Descend;
            }
            if beneath::kind(&walked.stat) != FileType::RegularFile {
                return Step::Skip;
            }
            let relative = walked
                .rel
                .strip_prefix(start.as_str())
                .map_or(walked.rel.as_str(), |rest| rest.trim_start_matches('/'));
            if visit(relative, walked, dir) {
                Step::Descend
            } else {
                Step::Stop
            }
        },
    )
}

/// One match.
#[derive(Debug, Clone)]
pub struct Found {
    /// The file as answered.
    pub path: String,
    /// Line number, from 1.
    pub line: u64,
    /// The line, cut.
    pub text: String,
    /// Lines before.
    pub before: Vec<String>,
    /// Lines after.
    pub after: Vec<String>,
}

/// What a search looks for.
#[derive(Debug, Clone)]
pub struct Query {
    /// The pattern.
    pub pattern: String,
    /// Match it as a plain string.
    pub literal: bool,
    /// Case-insensitive.
    pub ignore_case: bool,
    /// Only files matching this glob.
    pub glob: Option<String>,
    /// Context lines each side.
    pub context: usize,
    /// Most matches per file.
    pub per_file: usize,
    /// Most matches in all.
    pub max_results: usize,
    /// Most bytes of a line answered.
    pub max_line_bytes: usize,
    /// When to stop and answer what was found (truncated).
    pub deadline: Instant,
}

impl Query {
    /// The query with every count within its maximum.
    fn clamped(&self) -> (usize, usize, usize, usize) {
        (
            self.context.min(MAX_CONTEXT_LINES),
            self.per_file.min(MAX_RESULTS),
            self.max_results.min(MAX_RESULTS),
            self.max_line_bytes.min(MAX_LINE_BYTES),
        )
    }
}

fn cut(line: &[u8], max: usize) -> String {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let text = String::from_utf8_lossy(line);
    if text.len() <= max {
        return text.into_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}

/// Searches file contents: answers the matches, whether some were left out, and how many
/// files were searched.
pub fn search(
    ws: &Workspace,
    target: &Target,
    query: &Query,
) -> Result<(Vec<Found>, bool, u64), PlinthError> {
    let matcher = RegexMatcherBuilder::new()
        .case_insensitive(query.ignore_case)
        .fixed_strings(query.literal)
        .build(&query.pattern)
        .map_err(|error| {
            PlinthError::new(
                ErrorCode::WorkspaceInvalidRequest,
                format!("pattern {:?}: {error}", query.pattern),
            )
        })?;
    let glob = query.glob.as_deref().map(NameGlob::new).transpose()?;
    let mut searcher = SearcherBuilder::new()
        .line_number(true)
        .binary_detection(BinaryDetection::quit(b'\x00'))
        .build();
    let owner = ws.owner(target.base);
    let (context, per_file, max_results, max_line_bytes) = query.clamped();
    let mut found = Vec::new();
    let mut truncated = false;
    let mut searched = 0u64;
    let mut answer_bytes = 0usize;
    files(ws, target, |relative, walked, dir| {
        if Instant::now() >= query.deadline {
            truncated = true;
            return false;
        }
        if let Some(glob) = &glob
            && !glob.matches(relative)
        {
            return true;
        }
        let name = walked.rel.rsplit('/').next().unwrap_or(&walked.rel);
        let Some(content) = beneath::read_entry(dir, name, MAX_SEARCH_BYTES, owner) else {
            return true;
        };
        searched += 1;
        let mut lines_hit: Vec<u64> = Vec::new();
        let mut more_in_file = false;
        let _ = searcher.search_slice(
            &matcher,
            &content,
            sinks::Lossy(|number, _line| {
                if lines_hit.len() >= per_file {
                    more_in_file = true;
                    return Ok(false);
                }
                lines_hit.push(number);
                Ok(true)
            }),
        );
        if more_in_file {
            truncated = true;
        }
        if lines_hit.is_empty() {
            return true;
        }
        let lines: Vec<&[u8]> = content.split_inclusive(|b| *b == b'\n').collect();
        let path = ws.display(target.base, &walked.rel);
        for number in lines_hit {
            if found.len() >= max_results || answer_bytes >= MAX_ANSWER_BYTES {
                truncated = true;
                return false;
            }
            let index = usize::try_from(number).unwrap_or(1).saturating_sub(1);
            let Some(line) = lines.get(index) else {
                continue;
            };
            let from = index.saturating_sub(context);
            let to = (index + 1 + context).min(lines.len());
            let hit = Found {
                path: path.clone(),
                line: number,
                text: cut(line, max_line_bytes),
                before: lines[from..index]
                    .iter()
                    .map(|l| cut(l, max_line_bytes))
                    .collect(),
                after: lines[index + 1..to]
                    .iter()
                    .map(|l| cut(l, max_line_bytes))
                    .collect(),
            };
            answer_bytes += hit.path.len()
                + hit.text.len()
                + hit
                    .before
                    .iter()
                    .chain(&hit.after)
                    .map(String::len)
                    .sum::<usize>();
            found.push(hit);
        }
        true
    })?;
    Ok((found, truncated, searched))
}

/// Files whose path matches a glob, beneath `target`; bounded as [`list`] is.
pub fn find(
    ws: &Workspace,
    target: &Target,
    pattern: &str,
    max_entries: usize,
    deadline: Instant,
) -> Result<(Vec<Entry>, bool), PlinthError> {
    let glob = NameGlob::new(pattern)?;
    let max_entries = max_entries.min(MAX_ENTRIES);
    let mut entries = Vec::new();
    let mut truncated = false;
    let mut answer_bytes = 0usize;
    files(ws, target, |relative, walked, _| {
        if Instant::now() >= deadline {
            truncated = true;
            return false;
        }
        if !glob.matches(relative) {
            return true;
        }
        if entries.len() >= max_entries || answer_bytes >= MAX_ANSWER_BYTES {
            truncated = true;
            return false;
        }
        let path = ws.display(target.base, &walked.rel);
        answer_bytes += path.len();
        entries.push(Entry {
            path,
            kind: EntryKind::File,
            size: Some(u64::try_from(walked.stat.st_size).unwrap_or(0)),
            mtime_ms: beneath::mtime_ms(&walked.stat),
        });
        true
    })?;
    Ok((entries, truncated))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(pattern: &str, max_results: usize, deadline: Instant) -> Query {
        Query {
            pattern: pattern.to_owned(),
            literal: true,
            ignore_case: false,
            glob: None,
            context: usize::MAX,
            per_file: usize::MAX,
            max_results,
            max_line_bytes: usize::MAX,
            deadline,
        }
    }

    /// Whatever a caller asks, a listing holds at most [`MAX_ENTRIES`], a search at most
    /// [`MAX_RESULTS`] matches with lines of at most [`MAX_LINE_BYTES`] and
    /// [`MAX_CONTEXT_LINES`] of context; each answer that was cut says so.
    #[test]
    fn oversized_counts_are_clamped_and_the_answer_says_it_was_cut() {
        let dir = tempfile::tempdir().expect("dir");
        let ws = crate::workspace::on_disk(dir.path(), 1 << 20);
        let many = ws.root.join("many");
        std::fs::create_dir_all(&many).expect("dir");
        for n in 0..=MAX_ENTRIES {
            std::fs::write(many.join(format!("{n:05}.txt")), b"").expect("file");
        }
        let line = format!("needle {}\n", "x".repeat(2 * MAX_LINE_BYTES));
        std::fs::write(ws.root.join("hay.txt"), line.repeat(MAX_RESULTS + 50)).expect("hay");
        let target = ws.resolve(".").expect("root");
        let later = Instant::now() + Duration::from_secs(600);

        let (entries, truncated) =
            list(&ws, &target, true, false, usize::MAX, later).expect("list");
        assert_eq!(entries.len(), MAX_ENTRIES);
        assert!(truncated);
        let (entries, truncated) = find(&ws, &target, "*.txt", usize::MAX, later).expect("find");
        assert_eq!(entries.len(), MAX_ENTRIES);
        assert!(truncated);

        let without_context = Query {
            context: 0,
            ..query("needle", usize::MAX, later)
        };
        let (found, truncated, _) = search(&ws, &target, &without_context).expect("search");
        assert_eq!(found.len(), MAX_RESULTS);
        assert!(truncated);
        assert!(found.iter().all(|hit| hit.text.len() == MAX_LINE_BYTES));
        // With the most context, the answer's byte budget cuts it first.
        let (found, truncated, _) =
            search(&ws, &target, &query("needle", usize::MAX, later)).expect("search");
        assert!(truncated && found.len() < MAX_RESULTS, "{}", found.len());
        for hit in &found {
            assert!(hit.text.len() <= MAX_LINE_BYTES);
            assert!(hit.before.len() <= MAX_CONTEXT_LINES && hit.after.len() <= MAX_CONTEXT_LINES);
        }
        let bytes: usize = found
            .iter()
            .map(|hit| {
                hit.text.len()
                    + hit
                        .before
                        .iter()
                        .chain(&hit.after)
                        .map(String::len)
                        .sum::<usize>()
            })
            .sum();
        assert!(
            bytes <= MAX_ANSWER_BYTES + MAX_LINE_BYTES * (2 * MAX_CONTEXT_LINES + 1) + 4096,
            "{bytes}"
        );
    }

    /// A walk past its time limit answers what it found, marked truncated, instead of going
    /// on (here the limit has already passed when it starts).
    #[test]
    fn a_walk_past_its_time_limit_answers_truncated() {
        let dir = tempfile::tempdir().expect("dir");
        let ws = crate::workspace::on_disk(dir.path(), 1 << 20);
        std::fs::write(ws.root.join("a.txt"), b"needle\n").expect("file");
        let target = ws.resolve(".").expect("root");
        let past = Instant::now();
        let (found, truncated, searched) =
            search(&ws, &target, &query("needle", 10, past)).expect("search");
        assert!(truncated);
        assert_eq!((found.len(), searched), (0, 0));
        let (_, truncated) = find(&ws, &target, "*", 10, past).expect("find");
        assert!(truncated);
        let (_, truncated) = list(&ws, &target, true, false, 10, past).expect("list");
        assert!(truncated);
        let later = Instant::now() + Duration::from_secs(600);
        let (found, truncated, _) =
            search(&ws, &target, &query("needle", 10, later)).expect("search");
        assert_eq!(
            (found.len(), truncated),
            (1, false),
            "in time, the whole answer"
        );
    }

    #[test]
    fn globs_without_a_slash_match_names_at_any_depth() {
        let glob = NameGlob::new("*.py").expect("glob");
        assert!(glob.matches("a.py"));
        assert!(glob.matches("src/deep/a.py"));
        assert!(!glob.matches("a.pyc"));
        let glob = NameGlob::new("src/*.py").expect("glob");
        assert!(glob.matches("src/a.py"));
        assert!(!glob.matches("src/deep/a.py"));
        let glob = NameGlob::new("src/**/*.py").expect("glob");
        assert!(glob.matches("src/deep/a.py"));
        assert!(NameGlob::new("a[").is_err());
    }
}
