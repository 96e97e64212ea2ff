//! The code base's shape, as a newcomer relies on it:
//!
//! - within each crate, no two top-level modules import each other, directly or around a
//!   longer loop, so each can be read and changed knowing only what it imports (a module's
//!   imports are the `crate::<module>` paths in its files, outside comments and its
//!   `#[cfg(test)] mod tests` block);
//! - a migration both databases take as it is lives once, in `migrations/common`: the `sqlite`
//!   and `postgres` folders hold only pairs that differ;
//! - no function visible outside its module fails with a bare `String`;
//! - the gateway is built in floors (`http`, `runtime`, `agents`, `rest`, the router, the
//!   crate root): a module imports only from floors below its own, and none but the crate
//!   root and the router names the whole state.

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

/// Top-level module → the top-level modules it names as `crate::<name>` (the crate root
/// left out): [`module_imports`], each module taken as the top-level one it is in.
fn imports(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let top = |module: &str| module.split("::").next().unwrap_or(module).to_owned();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (module, names) in module_imports(src) {
        let from = top(&module);
        for named in names.iter().map(|named| top(named)) {
            if from != "lib" && named != "lib" && named != from {
                graph.entry(from.clone()).or_default().insert(named);
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
/// whose error is a bare `String`, as `file:function`.
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
            for name in string_error_functions(text) {
                found.insert(format!("{relative}:{name}"));
            }
        }
    }
    found
}

/// The `pub` functions in `text` whose error is a bare `String`. A signature is read from
/// `fn` to its body's `{` (or `;`), at bracket depth 0.
fn string_error_functions(text: &str) -> Vec<String> {
    let mut found = Vec::new();
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
        // Spaces and a trailing comma (rustfmt's, on a long type) aside.
        let returns: String = returns
            .split_whitespace()
            .collect::<String>()
            .replace(",>", ">");
        if returns.starts_with("Result<") && returns.ends_with(",String>") {
            found.push(
                signature[3..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect(),
            );
        }
    }
    found
}

#[test]
fn a_bare_string_failure_is_found_however_it_is_written() {
    let text = "pub fn a() -> Result<(), String> {}\n\
        pub(crate) async fn b(\n    x: u8,\n) -> Result<\n    Vec<u8>,\n    String,\n> {}\n\
        pub fn c() -> Result<(), Error> {}\n\
        fn d() -> Result<(), String> {}\n";
    assert_eq!(string_error_functions(text), vec!["a", "b"]);
}

/// A failure that crosses a module boundary is a type its caller can match, not a sentence:
/// no `pub` function answers `Result<_, String>`.
#[test]
fn no_function_across_modules_fails_with_a_bare_string() {
    let found = string_errors();
    assert!(
        found.is_empty(),
        "these answer Result<_, String>; give them an error type their callers can match: {found:?}"
    );
}

/// The paths `code` names beneath `crate::`, groups spelled out: `crate::{a, b::c}` names
/// `a` and `b::c`, and `crate::{self}` the crate root.
fn crate_paths(code: &str) -> Vec<String> {
    let path_char = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    let mut paths = Vec::new();
    for (at, _) in code.match_indices("crate::") {
        let rest = &code[at + "crate::".len()..];
        let Some(group) = rest.strip_prefix('{') else {
            paths.push(rest.chars().take_while(|c| path_char(*c)).collect());
            continue;
        };
        let mut depth = 0usize;
        let mut item = String::new();
        for c in group.chars() {
            match c {
                '{' => depth += 1,
                '}' if depth == 0 => break,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    paths.push(std::mem::take(&mut item));
                    continue;
                }
                _ => {}
            }
            if depth == 0 && path_char(c) {
                item.push(c);
            } else if depth == 0 && !item.is_empty() {
                // Whatever follows the path (` as name`, a nested group) ends it.
                item.push(' ');
            }
        }
        paths.push(item);
    }
    paths
        .into_iter()
        .map(|path| {
            path.split(' ')
                .next()
                .unwrap_or("")
                .trim_end_matches("::")
                .to_owned()
        })
        .filter(|path| !path.is_empty())
        .map(|path| if path == "self" { String::new() } else { path })
        .collect()
}

/// Every module of a crate (`http::auth`, `rest`, …; `lib` for the crate root) → the modules
/// it names as `crate::<path>` (the longest prefix of the path that is a module), outside
/// comments and its `#[cfg(test)] mod tests` block.
fn module_imports(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let module_of = |path: &Path| -> String {
        let relative = path
            .strip_prefix(src)
            .expect("beneath src")
            .with_extension("");
        let mut parts: Vec<String> = relative
            .components()
            .filter_map(|part| part.as_os_str().to_str().map(str::to_owned))
            .collect();
        if parts.last().is_some_and(|last| last == "mod") {
            parts.pop();
        }
        if parts.is_empty() || parts == ["lib"] || parts == ["main"] {
            "lib".to_owned()
        } else {
            parts.join("::")
        }
    };
    let modules: BTreeSet<String> = files.iter().map(|path| module_of(path)).collect();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for path in &files {
        let module = module_of(path);
        let text = std::fs::read_to_string(path).expect("read");
        let text = text.split("#[cfg(test)]\nmod tests").next().unwrap_or("");
        let code: String = text
            .lines()
            .filter(|line| !line.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n");
        for named in crate_paths(&code) {
            let parts: Vec<&str> = named.split("::").filter(|p| !p.is_empty()).collect();
            let target = (1..=parts.len())
                .rev()
                .map(|n| parts[..n].join("::"))
                .find(|prefix| modules.contains(prefix))
                .unwrap_or_else(|| "lib".to_owned());
            if target != module {
                graph.entry(module.clone()).or_default().insert(target);
            }
        }
    }
    graph
}

/// The gateway's floors, lowest first: a module imports only from floors below its own (and
/// from its own directory). The options (what the gateway is told), the router and `lib`
/// (the state every handler's part is taken from) are on top; `public` (the public gRPC
/// face) stands alone.
const GATEWAY_FLOORS: &[&[&str]] = &[
    &["http", "public"],
    &["runtime"],
    &["agents"],
    &["rest"],
    &["options"],
    &["router"],
    &["lib"],
];

fn floor_of(module: &str) -> usize {
    let top = module.split("::").next().unwrap_or(module);
    GATEWAY_FLOORS
        .iter()
        .position(|floor| floor.contains(&top))
        .unwrap_or_else(|| {
            panic!("gateway module {module} is on no floor: add it to GATEWAY_FLOORS")
        })
}

/// The imports of `graph` that reach up a floor or across to another top-level module of
/// the same floor.
fn upward_imports(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    let mut upward = Vec::new();
    for (module, names) in graph {
        let top = module.split("::").next().unwrap_or(module);
        for named in names {
            let named_top = named.split("::").next().unwrap_or(named);
            if named_top != top && floor_of(named) >= floor_of(module) {
                upward.push(format!("{module} → {named}"));
            }
        }
    }
    upward
}

#[test]
fn the_gateway_is_built_in_floors() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../gateway/src");
    let graph = module_imports(&src);
    // Each top-level directory is on a floor, and nothing reaches up or across.
    let upward = upward_imports(&graph);
    assert!(
        upward.is_empty(),
        "gateway imports that reach up a floor (http, public < runtime < agents < rest < options < router < lib): {upward:?}"
    );
    // No module names the whole state (or anything else of the crate root): each handler
    // takes the part it needs.
    let whole_state: Vec<&String> = graph
        .iter()
        .filter(|(module, names)| module.as_str() != "lib" && names.contains("lib"))
        .map(|(module, _)| module)
        .collect();
    assert!(
        whole_state.is_empty(),
        "these reach into the crate root (the whole state) instead of taking their part: {whole_state:?}"
    );
    // And no loop among the gateway's modules, however long.
    let circles: Vec<Vec<String>> = graph
        .keys()
        .filter_map(|module| cycle_through(&graph, module))
        .collect();
    assert!(circles.is_empty(), "gateway import circles: {circles:?}");
}

#[test]
fn grouped_crate_paths_are_each_named() {
    assert_eq!(
        crate_paths(
            "use crate::{agents, public, rest::sessions::{A, B}};\nx = crate::http::auth::f();"
        ),
        vec!["agents", "public", "rest::sessions", "http::auth::f"]
    );
    assert_eq!(
        crate_paths("use crate::{\n    self,\n    a as b,\n};"),
        vec!["", "a"]
    );
}

#[test]
fn an_import_up_a_floor_is_found() {
    let graph: BTreeMap<String, BTreeSet<String>> = [
        ("http::edge", vec!["http::error"]),
        ("runtime::live", vec!["http::error", "agents::adapters"]),
        ("rest::sessions", vec!["runtime::live", "rest::idempotency"]),
        ("agents::novo", vec!["rest"]),
    ]
    .into_iter()
    .map(|(from, to)| (from.to_owned(), to.into_iter().map(str::to_owned).collect()))
    .collect();
    assert_eq!(
        upward_imports(&graph),
        vec![
            "agents::novo → rest".to_owned(),
            "runtime::live → agents::adapters".to_owned()
        ]
    );
}
