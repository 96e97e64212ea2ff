//! The documents hold together: every relative link in `README.md` and `docs/**/*.md`, and
//! every relative `runbook_url` of the alerting rules under `deploy/`, names a file of the
//! repository, and every `#anchor` a heading of that file (as GitHub makes anchors from
//! headings). No relative link leaves the repository. The README stays a first page: at
//! most [`README_MAX_LINES`] lines, whose first code block is the two commands that run
//! Plinth and its tests. Files only: no server.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Component, Path, PathBuf};

/// How long the README may grow.
const README_MAX_LINES: usize = 200;

/// The README's first code block, exactly: running Plinth, then its tests.
const FIRST_COMMANDS: [&str; 2] = [
    "cargo run -p plinth -- serve",
    "cargo nextest run --workspace",
];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .expect("the repository's root")
}

/// Every file under `dir` whose name ends in one of `extensions`, sorted.
fn files_under(dir: &Path, extensions: &[&str]) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let entries = fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        for entry in entries {
            let path = entry.expect("directory entry").path();
            if path.is_dir() {
                pending.push(path);
            } else if path
                .extension()
                .and_then(|ext| ext.to_str())
                .is_some_and(|ext| extensions.contains(&ext))
            {
                found.push(path);
            }
        }
    }
    found.sort();
    found
}

/// The Markdown files whose links are checked: the README and everything under `docs/`.
fn documents(root: &Path) -> Vec<PathBuf> {
    let mut documents = vec![root.join("README.md")];
    documents.extend(files_under(&root.join("docs"), &["md"]));
    documents
}

/// The lines of a Markdown text outside fenced code blocks, with their 1-based numbers.
fn prose_lines(text: &str) -> Vec<(usize, &str)> {
    let mut fence: Option<&str> = None;
    let mut lines = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        let marker = ["```", "~~~"]
            .into_iter()
            .find(|marker| trimmed.starts_with(marker));
        match (fence, marker) {
            (None, Some(marker)) => fence = Some(marker),
            (Some(open), Some(marker)) if open == marker && trimmed.trim_end() == marker => {
                fence = None;
            }
            (None, None) => lines.push((index + 1, line)),
            _ => {}
        }
    }
    lines
}

/// `line` without its inline code spans (`` `…` ``), which hold no links.
fn without_code_spans(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut rest = line;
    while let Some(start) = rest.find('`') {
        out.push_str(&rest[..start]);
        let ticks = rest[start..].chars().take_while(|c| *c == '`').count();
        let after = &rest[start + ticks..];
        match after.find(&"`".repeat(ticks)) {
            Some(end) => rest = &after[end + ticks..],
            None => {
                out.push_str(&rest[start..]);
                rest = "";
            }
        }
    }
    out.push_str(rest);
    out
}

/// The targets of the inline links (`[text](target)`, images too) in one line of prose.
fn link_targets(line: &str) -> Vec<String> {
    let line = without_code_spans(line);
    let mut targets = Vec::new();
    let mut rest = line.as_str();
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        let mut depth = 0usize;
        let end = after.char_indices().find(|&(_, c)| match c {
            '(' => {
                depth += 1;
                false
            }
            ')' if depth == 0 => true,
            ')' => {
                depth -= 1;
                false
            }
            _ => false,
        });
        let Some((end, _)) = end else { break };
        let target = after[..end].trim();
        // A title after the target (`[a](b "title")`) is not part of it.
        let target = target
            .split_once(" \"")
            .map_or(target, |(target, _)| target);
        let target = target.trim_start_matches('<').trim_end_matches('>');
        targets.push(target.to_owned());
        rest = &after[end..];
    }
    targets
}

/// The anchor GitHub gives a heading's text: lowercased, every character but letters,
/// digits, spaces, `-` and `_` dropped, spaces turned into `-`.
fn slug(heading: &str) -> String {
    // Links in a heading show their text.
    let mut text = String::new();
    let mut rest = heading;
    while let Some(open) = rest.find('[') {
        let Some(close) = rest[open..].find("](").map(|at| open + at) else {
            break;
        };
        let Some(end) = rest[close..].find(')').map(|at| close + at) else {
            break;
        };
        text.push_str(&rest[..open]);
        text.push_str(&rest[open + 1..close]);
        rest = &rest[end + 1..];
    }
    text.push_str(rest);
    text.trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            '-' | '_' => Some(c),
            c if c.is_alphanumeric() => Some(c),
            _ => None,
        })
        .collect()
}

/// Every anchor the headings of a Markdown text make, a repeated one with `-1`, `-2`, …
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut anchors = BTreeSet::new();
    for (_, line) in prose_lines(text) {
        let hashes = line.chars().take_while(|c| *c == '#').count();
        if hashes == 0 || hashes > 6 || !line[hashes..].starts_with(' ') {
            continue;
        }
        let base = slug(line[hashes..].trim().trim_end_matches('#'));
        let count = seen.entry(base.clone()).or_insert(0);
        let anchor = if *count == 0 {
            base.clone()
        } else {
            format!("{base}-{count}")
        };
        *count += 1;
        anchors.insert(anchor);
    }
    anchors
}

/// `path` with `.` and `..` taken out, or `None` when a `..` climbs above `root`.
fn normalized(root: &Path, path: &Path) -> Option<PathBuf> {
    let relative = path.strip_prefix(root).ok()?;
    let mut parts: Vec<&std::ffi::OsStr> = Vec::new();
    for component in relative.components() {
        match component {
            Component::Normal(part) => parts.push(part),
            Component::CurDir => {}
            Component::ParentDir => {
                parts.pop()?;
            }
            Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    Some(
        parts
            .iter()
            .fold(root.to_path_buf(), |path, part| path.join(part)),
    )
}

/// What is wrong with one relative link `target` written in `from` (a file under `root`),
/// if anything. Links with a scheme (`https:`, `mailto:`) are not checked.
fn broken(root: &Path, from: &Path, target: &str) -> Option<String> {
    if target.is_empty() {
        return Some("an empty link".to_owned());
    }
    if target.contains("://") || target.starts_with("mailto:") {
        return None;
    }
    let (path, anchor) = match target.split_once('#') {
        Some((path, anchor)) => (path, Some(anchor)),
        None => (target, None),
    };
    if path.starts_with('/') {
        return Some(format!(
            "{target}: an absolute path; links are relative to the file"
        ));
    }
    let file = if path.is_empty() {
        from.to_path_buf()
    } else {
        let joined = from.parent().expect("a file's directory").join(path);
        match normalized(root, &joined) {
            Some(file) => file,
            None => return Some(format!("{target}: leaves the repository")),
        }
    };
    if !file.exists() {
        return Some(format!("{target}: no such file in the repository"));
    }
    let anchor = anchor?;
    if file.extension().and_then(|ext| ext.to_str()) != Some("md") {
        return Some(format!(
            "{target}: an anchor into a file that is not Markdown"
        ));
    }
    let text = fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    if anchors(&text).contains(anchor) {
        None
    } else {
        Some(format!(
            "{target}: {} has no heading whose anchor is #{anchor}",
            file.strip_prefix(root).unwrap_or(&file).display()
        ))
    }
}

#[test]
fn docs_links_resolve_to_files_and_headings_in_the_repository() {
    let root = root();
    let mut problems = Vec::new();
    let mut checked = 0;
    for document in documents(&root) {
        let text =
            fs::read_to_string(&document).unwrap_or_else(|e| panic!("{}: {e}", document.display()));
        let name = document
            .strip_prefix(&root)
            .unwrap_or(&document)
            .display()
            .to_string();
        for (number, line) in prose_lines(&text) {
            for target in link_targets(line) {
                checked += 1;
                if let Some(problem) = broken(&root, &document, &target) {
                    problems.push(format!("{name}:{number}: {problem}"));
                }
            }
        }
    }
    assert!(
        checked >= 100,
        "only {checked} links found in the documents"
    );
    assert!(
        problems.is_empty(),
        "{} broken links:\n{}",
        problems.len(),
        problems.join("\n")
    );
}

#[test]
fn docs_runbook_urls_of_the_alerting_rules_resolve() {
    let root = root();
    let mut problems = Vec::new();
    let mut checked = 0;
    for file in files_under(&root.join("deploy"), &["yaml", "yml"]) {
        let text = fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let name = file
            .strip_prefix(&root)
            .unwrap_or(&file)
            .display()
            .to_string();
        for (index, line) in text.lines().enumerate() {
            let Some(url) = line.trim().strip_prefix("runbook_url:") else {
                continue;
            };
            let url = url.trim().trim_matches(|c| c == '"' || c == '\'');
            checked += 1;
            // A relative runbook URL names a file from the repository's root.
            if let Some(problem) = broken(&root, &root.join("README.md"), url) {
                problems.push(format!("{name}:{}: {problem}", index + 1));
            }
        }
    }
    assert!(checked > 0, "no runbook_url found under deploy/");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn docs_readme_is_a_first_page() {
    let readme = fs::read_to_string(root().join("README.md")).expect("README.md");
    let lines = readme.lines().count();
    assert!(
        lines <= README_MAX_LINES,
        "README.md has {lines} lines; it is a first page of at most {README_MAX_LINES}: move \
         the detail into docs/ and link to it"
    );
    let block: Vec<&str> = readme
        .lines()
        .skip_while(|line| !line.starts_with("```"))
        .skip(1)
        .take_while(|line| !line.starts_with("```"))
        .collect();
    let commands: Vec<&str> = block
        .iter()
        .map(|line| line.split("  #").next().unwrap_or(line).trim())
        .collect();
    assert_eq!(
        commands, FIRST_COMMANDS,
        "README.md's first code block is the two commands, running Plinth and running its tests"
    );
}

// The checker itself must catch what it is for.

#[test]
fn docs_checker_reads_links_and_anchors_as_github_does() {
    assert_eq!(
        slug("Walk-through (UHP Environments §2)"),
        "walk-through-uhp-environments-2"
    );
    assert_eq!(
        slug("Files and imports (§3, §3.1)"),
        "files-and-imports-3-31"
    );
    assert_eq!(slug("A scope's build disk"), "a-scopes-build-disk");
    assert_eq!(slug("The `plinth` command"), "the-plinth-command");
    assert_eq!(slug("See [the guide](guide.md)"), "see-the-guide");
    let text = "# A\n\n## Notes\n\n```sh\n# not a heading\n```\n\n## Notes\n";
    assert_eq!(
        anchors(text),
        ["a", "notes", "notes-1"]
            .map(str::to_owned)
            .into_iter()
            .collect()
    );
    assert_eq!(
        link_targets("see [a](b.md#c), `[x](not-a-link)` and ![i](img.png \"t\")"),
        ["b.md#c", "img.png"]
    );
    assert_eq!(link_targets("a [link (with parens)](f(x).md)"), ["f(x).md"]);

    let root = root();
    let readme = root.join("README.md");
    assert_eq!(broken(&root, &readme, "docs/guide/walkthrough.md"), None);
    assert_eq!(broken(&root, &readme, "https://example.com/x"), None);
    for target in [
        "docs/no-such-file.md",
        "docs/guide/walkthrough.md#no-such-heading",
        "../outside.md",
        "docs/../../outside.md",
        "/etc/passwd",
        "#no-such-heading-here",
    ] {
        assert!(
            broken(&root, &readme, target).is_some(),
            "{target} passed the check"
        );
    }
}
