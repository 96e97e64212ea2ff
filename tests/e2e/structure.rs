//! The code base's shape, as a newcomer relies on it:
//!
//! - within each crate, no two top-level modules import each other, directly or around a
//!   longer loop, so each can be read and changed knowing only what it imports (a module's
//!   imports are the `crate::<module>` paths in its files, outside comments and its
//!   `#[cfg(test)] mod tests` block);
//! - a migration both databases take as it is lives once, in `migrations/common`: the `sqlite`
//!   and `postgres` folders hold only pairs that differ;
//! - no new function visible outside its module fails with a bare `String`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Every crate's `src` directory.
fn crate_sources() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut sources = vec![
        root.join("cli/src"),
        root.join("gateway/src"),
        root.join("proto/src"),
        root.join("bench/src"),
    ];
    for entry in std::fs::read_dir(root.join("services")).expect("services") {
        let src = entry.expect("entry").path().join("src");
        if src.is_dir() {
            sources.push(src);
        }
    }
    sources
}

fn rust_files(dir: &Path, into: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read dir") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            rust_files(&path, into);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            into.push(path);
        }
    }
}

/// Top-level module → the top-level modules it names as `crate::<name>`.
fn imports(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let top_level = |path: &Path| -> Option<String> {
        let relative = path.strip_prefix(src).ok()?;
        let first = relative.components().next()?.as_os_str().to_str()?;
        let name = first.strip_suffix(".rs").unwrap_or(first).to_owned();
        (name != "lib" && name != "main").then_some(name)
    };
    let modules: BTreeSet<String> = files.iter().filter_map(|path| top_level(path)).collect();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for path in &files {
        let Some(module) = top_level(path) else {
            continue;
        };
        let text = std::fs::read_to_string(path).expect("read");
        let text = text.split("#[cfg(test)]\nmod tests").next().unwrap_or("");
        for line in text
            .lines()
            .filter(|line| !line.trim_start().starts_with("//"))
        {
            for (at, _) in line.match_indices("crate::") {
                let name: String = line[at + "crate::".len()..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if name != module && modules.contains(&name) {
                    graph.entry(module.clone()).or_default().insert(name);
                }
            }
        }
    }
    graph
}

/// A loop of imports through `start`, if there is one.
fn cycle_through(graph: &BTreeMap<String, BTreeSet<String>>, start: &str) -> Option<Vec<String>> {
    let mut stack = vec![(start.to_owned(), vec![start.to_owned()])];
    let mut seen = BTreeSet::new();
    while let Some((module, path)) = stack.pop() {
        for next in graph.get(&module).into_iter().flatten() {
            if next == start {
                let mut found = path.clone();
                found.push(start.to_owned());
                return Some(found);
            }
            if seen.insert(next.clone()) {
                let mut longer = path.clone();
                longer.push(next.clone());
                stack.push((next.clone(), longer));
            }
        }
    }
    None
}

#[test]
fn no_crate_has_an_import_circle() {
    let mut circles = Vec::new();
    for src in crate_sources() {
        let graph = imports(&src);
        for module in graph.keys() {
            if let Some(circle) = cycle_through(&graph, module) {
                circles.push(format!("{}: {}", src.display(), circle.join(" → ")));
            }
        }
    }
    assert!(
        circles.is_empty(),
        "import circles:\n{}",
        circles.join("\n")
    );
}

#[test]
fn a_circle_is_found_however_long() {
    let graph: BTreeMap<String, BTreeSet<String>> = [
        ("a", vec!["b"]),
        ("b", vec!["c"]),
        ("c", vec!["a", "d"]),
        ("d", vec![]),
    ]
    .into_iter()
    .map(|(from, to)| (from.to_owned(), to.into_iter().map(str::to_owned).collect()))
    .collect();
    assert_eq!(
        cycle_through(&graph, "a"),
        Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
    );
    assert_eq!(cycle_through(&graph, "d"), None);
}

#[test]
fn each_backend_specific_migration_has_a_differing_twin() {
    let services = Path::new(env!("CARGO_MANIFEST_DIR")).join("../services");
    let mut checked = 0;
    for service in std::fs::read_dir(services).expect("services") {
        let root = service.expect("entry").path().join("migrations");
        if !root.is_dir() {
            continue;
        }
        for (folder, twin) in [("sqlite", "postgres"), ("postgres", "sqlite")] {
            for entry in std::fs::read_dir(root.join(folder)).expect("migrations folder") {
                let path = entry.expect("entry").path();
                let name = path.file_name().expect("name").to_owned();
                let ours = std::fs::read(&path).expect("read");
                let theirs = std::fs::read(root.join(twin).join(&name))
                    .unwrap_or_else(|_| panic!("{} has no twin in {twin}/", path.display()));
                assert_ne!(
                    ours,
                    theirs,
                    "{} is the same for both databases: keep it once, in migrations/common",
                    path.display()
                );
                checked += 1;
            }
        }
    }
    assert!(
        checked > 0,
        "no backend-specific migration was found to check"
    );
}

/// The public and crate-visible functions (`pub fn`, `pub(crate) fn`, …) outside test code
/// whose error is a bare `String`, as `file:function`. A signature is read from `fn` to its
/// body's `{` (or `;`), at bracket depth 0.
fn string_errors() -> BTreeSet<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut found = BTreeSet::new();
    for src in crate_sources() {
        let mut files = Vec::new();
        rust_files(&src, &mut files);
        for path in files {
            let text = std::fs::read_to_string(&path).expect("read");
            let text = text.split("#[cfg(test)]\nmod tests").next().unwrap_or("");
            let relative = path
                .strip_prefix(&root)
                .unwrap_or(&path)
                .display()
                .to_string();
            for (at, _) in text.match_indices("pub") {
                let rest = &text[at..];
                let Some(fn_at) = rest.find("fn ") else {
                    continue;
                };
                // `pub fn`, `pub(crate) async fn`, `pub const fn`: only words between.
                let between = &rest[3..fn_at];
                if between.contains(['{', '}', ';', '=', '\n']) && !between.trim().is_empty() {
                    continue;
                }
                let signature = &rest[fn_at..];
                let mut depth = 0i32;
                let mut end = signature.len();
                for (index, c) in signature.char_indices() {
                    match c {
                        '(' | '[' => depth += 1,
                        ')' | ']' => depth -= 1,
                        '{' | ';' if depth == 0 => {
                            end = index;
                            break;
                        }
                        _ => {}
                    }
                }
                let signature = &signature[..end];
                let Some(returns) = signature.split("->").nth(1) else {
                    continue;
                };
                let returns: String = returns.split_whitespace().collect();
                if returns.starts_with("Result<") && returns.ends_with(",String>") {
                    let name: String = signature[3..]
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    found.insert(format!("{relative}:{name}"));
                }
            }
        }
    }
    found
}

/// A failure that crosses a module boundary is a type its caller can match, not a sentence:
/// no new `pub` function answers `Result<_, String>`. The ones that still do are listed here,
/// to become typed; one made typed leaves the list (the test says so), and the list only
/// shrinks.
#[test]
fn no_new_function_across_modules_fails_with_a_bare_string() {
    const STILL_STRINGS: &[&str] = &[
        "gateway/src/brain/callbacks.rs:check_origin",
        "gateway/src/browsers.rs:new",
        "gateway/src/lib.rs:check_browser_settings",
        "gateway/src/limits.rs:new",
        "gateway/src/public/json.rs:message_from_rest",
        "gateway/src/public/json.rs:rest_fields",
        "gateway/src/public/rules.rs:path",
    ];
    let found = string_errors();
    let listed: BTreeSet<String> = STILL_STRINGS.iter().map(|s| (*s).to_owned()).collect();
    let new: Vec<&String> = found.difference(&listed).collect();
    assert!(
        new.is_empty(),
        "these answer Result<_, String>; give them an error type their callers can match: {new:?}"
    );
    let fixed: Vec<&String> = listed.difference(&found).collect();
    assert!(
        fixed.is_empty(),
        "these no longer answer a bare String: take them off STILL_STRINGS: {fixed:?}"
    );
}
