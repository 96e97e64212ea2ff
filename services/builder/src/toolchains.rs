//! Toolchains as the project pins them: which Python and which Node a build's installers run
//! with, and what a build records about them.
//!
//! A project pins its Python with `.python-version` (its first line, as uv and pyenv read it)
//! or, without one, `requires-python` in `pyproject.toml`; its Node with `.nvmrc` or
//! `.node-version` (a version or prefix: `22`, `v22.3`) or, without either, `engines.node` in
//! `package.json` (an npm range). The interpreters a builder offers are the system's (`PATH`)
//! and those in `builder.toolchain_dirs`, each directory holding `python3.X` or `node`
//! executables directly (a `bin` directory of an installed toolchain).
//!
//! - Python: uv chooses the interpreter itself and honours both pins (`uv venv`, `uv sync`);
//!   before any installer runs, [`select`] asks uv whether the pin can be met among the
//!   offered interpreters (`uv python find`), so that a pin that cannot is one clear error
//!   naming what was asked and what there is. Without uv, `python3` must match the pin.
//! - Node: the newest offered `node` that satisfies the pin is put first on the installers'
//!   `PATH` (npm runs under the `node` it finds there).
//!
//! After the installers, [`report`] reads what was actually used: the venv's `pyvenv.cfg`
//! (its interpreter and version) and the chosen `node`. The version records them.

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;

/// One toolchain a build ran with, as its version records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Used {
    /// `python` or `node`.
    pub name: &'static str,
    /// As the program reports it, without a leading `v` (`3.11.7`, `20.20.2`).
    pub version: String,
    /// The program's path as builds (and sessions) see it.
    pub path: String,
}

/// A pin: what the project asks for and which file asks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pin {
    pub request: String,
    pub from: &'static str,
}

/// The project's Python pin, if any: `.python-version`'s first line, else `requires-python`.
pub fn python_pin(root: &Path) -> Option<Pin> {
    if let Some(line) = first_line(root, ".python-version") {
        return Some(Pin {
            request: line,
            from: ".python-version",
        });
    }
    let text = read_small(root, "pyproject.toml")?;
    let document: toml::Table = toml::from_str(&text).ok()?;
    let request = document
        .get("project")?
        .get("requires-python")?
        .as_str()?
        .trim()
        .to_owned();
    (!request.is_empty()).then_some(Pin {
        request,
        from: "requires-python in pyproject.toml",
    })
}

/// The project's Node pin, if any: `.nvmrc`, `.node-version`, else `engines.node`.
pub fn node_pin(root: &Path) -> Option<Pin> {
    for from in [".nvmrc", ".node-version"] {
        if let Some(line) = first_line(root, from) {
            return Some(Pin {
                request: line,
                from,
            });
        }
    }
    let text = read_small(root, "package.json")?;
    let document: serde_json::Value = serde_json::from_str(&text).ok()?;
    let request = document
        .get("engines")?
        .get("node")?
        .as_str()?
        .trim()
        .to_owned();
    (!request.is_empty()).then_some(Pin {
        request,
        from: ENGINES_NODE,
    })
}

/// Where a Node pin read from `package.json` comes from.
const ENGINES_NODE: &str = "engines.node in package.json";

/// Whether the project's `.npmrc` makes npm refuse an unmet `engines.node`
/// (`engine-strict=true`; npm's default is false).
fn engine_strict(root: &Path) -> bool {
    read_small(root, ".npmrc").is_some_and(|text| {
        text.lines().any(|line| {
            let line = line.trim();
            if line.starts_with(['#', ';']) {
                return false;
            }
            line.split_once('=').is_some_and(|(key, value)| {
                key.trim() == "engine-strict" && value.trim().trim_matches('"') == "true"
            })
        })
    })
}

/// The first line that says something, without comments (`#`), of a small text file.
fn first_line(root: &Path, rel: &str) -> Option<String> {
    read_small(root, rel)?
        .lines()
        .map(|line| line.split('#').next().unwrap_or("").trim())
        .find(|line| !line.is_empty())
        .map(str::to_owned)
}

/// A regular file's text beneath `root`, if it is small enough to be a pin or a manifest
/// (never through a link: a pin is read on the builder's side, see [`crate::beneath`]).
fn read_small(root: &Path, rel: &str) -> Option<String> {
    let root = crate::beneath::open_root(root).ok()?;
    String::from_utf8(crate::beneath::read_small(&root, rel, 1024 * 1024)?).ok()
}

/// What [`select`] decided.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selection {
    /// The installers' PATH: the given one, with the chosen Node's directory first.
    pub path: String,
    /// The chosen Node, when the project pins one.
    pub node: Option<Used>,
    /// What the choice adds to the reuse key.
    pub key: String,
    /// What the build log should warn of: a pin the installers only warn about.
    pub warnings: Vec<String>,
}

/// A pin of the project's this builder cannot meet ([`select`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnmetPin {
    /// A pin no version or range could be: too long, or holding control characters.
    #[error(
        "the project's {from} is not a version or range ({start:?}…): give a version such as \
         3.12 or a range such as >=20"
    )]
    NotAVersion {
        /// The file (and field) that pins it.
        from: &'static str,
        /// The pin's first characters.
        start: String,
    },
    /// No Python offered meets the pin.
    #[error(
        "{}: pin a version it has, or add an interpreter's directory to builder.toolchain_dirs",
        self.unmet()
    )]
    Python {
        /// The version or range asked for.
        request: String,
        /// The file (and field) that pins it.
        from: &'static str,
        /// What this builder offers, listed.
        offered: String,
    },
    /// No Node offered meets the pin.
    #[error(
        "{}: pin a version it has, or add a Node's bin directory to builder.toolchain_dirs",
        self.unmet()
    )]
    Node {
        /// The version or range asked for.
        request: String,
        /// The file (and field) that pins it.
        from: &'static str,
        /// What this builder offers, listed.
        offered: String,
    },
}

impl UnmetPin {
    /// What was asked and what there is, without the advice.
    fn unmet(&self) -> String {
        match self {
            UnmetPin::NotAVersion { .. } => self.to_string(),
            UnmetPin::Python {
                request,
                from,
                offered,
            } => format!(
                "the project asks for Python {request} ({from}), and this builder has {offered}"
            ),
            UnmetPin::Node {
                request,
                from,
                offered,
            } => format!(
                "the project asks for Node {request} ({from}), and this builder has {offered}"
            ),
        }
    }
}

/// Checks the project's pins against the offered toolchains and answers the installers' PATH.
/// `path` is the installers' PATH (tools directory, toolchain directories, system); the error
/// names what was asked, by which file, and what this builder has.
pub fn select(root: &Path, path: &str, python: bool, node: bool) -> Result<Selection, UnmetPin> {
    let mut selection = Selection {
        path: path.to_owned(),
        ..Selection::default()
    };
    for pin in [
        python.then(|| python_pin(root)).flatten(),
        node.then(|| node_pin(root)).flatten(),
    ]
    .iter()
    .flatten()
    {
        plausible(pin)?;
    }
    if python && let Some(pin) = python_pin(root) {
        let found = find_python(path, &pin.request);
        let Some(found) = found else {
            return Err(UnmetPin::Python {
                request: pin.request,
                from: pin.from,
                offered: listed(&pythons(path)),
            });
        };
        selection
            .key
            .push_str(&format!("python {} {}\n", found.version, found.path));
    }
    if node && let Some(pin) = node_pin(root) {
        let offered = nodes(path);
        let chosen = offered
            .iter()
            .filter(|candidate| node_satisfies(&pin, &candidate.version))
            .max_by(|a, b| compare_versions(&a.version, &b.version));
        let Some(chosen) = chosen else {
            let unmet = UnmetPin::Node {
                request: pin.request.clone(),
                from: pin.from,
                offered: listed(&offered),
            };
            // `engines.node` is advice to npm, which warns and installs unless the project's
            // `.npmrc` says `engine-strict=true`; `.nvmrc` and `.node-version` name the Node
            // to run, and nothing else will do.
            if pin.from == ENGINES_NODE && !engine_strict(root) {
                selection.warnings.push(format!(
                    "{}; npm installs anyway (as without engine-strict=true in .npmrc) with \
                     the Node on PATH",
                    unmet.unmet()
                ));
                return Ok(selection);
            }
            return Err(unmet);
        };
        if let Some(dir) = Path::new(&chosen.path).parent() {
            selection.path = format!("{}:{}", dir.display(), path);
        }
        selection
            .key
            .push_str(&format!("node {} {}\n", chosen.version, chosen.path));
        selection.node = Some(chosen.clone());
    }
    Ok(selection)
}

/// Longest pin taken as one: versions and ranges are short, and the pin is quoted in errors.
const MAX_PIN_CHARS: usize = 128;

/// Refuses a pin no version or range could be: too long, or holding control characters.
fn plausible(pin: &Pin) -> Result<(), UnmetPin> {
    if pin.request.chars().count() > MAX_PIN_CHARS || pin.request.chars().any(char::is_control) {
        return Err(UnmetPin::NotAVersion {
            from: pin.from,
            start: pin.request.chars().take(32).collect(),
        });
    }
    Ok(())
}

/// `3.11.7 (/usr/bin/python3.11), …`, or `none`.
fn listed(offered: &[Used]) -> String {
    if offered.is_empty() {
        return "none".to_owned();
    }
    offered
        .iter()
        .map(|used| format!("{} {} ({})", used.name, used.version, used.path))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A `.nvmrc`-style version (`22`, `v22.3`, `22.3.1`) matches by prefix; anything else is an
/// npm range (`>=18`, `^20 || ^22`). Aliases (`lts/*`, `node`) match any version.
fn node_satisfies(pin: &Pin, version: &str) -> bool {
    let request = pin.request.trim_start_matches('v');
    if matches!(request, "node" | "stable" | "latest") || request.starts_with("lts") {
        return true;
    }
    if !request.is_empty() && request.chars().all(|c| c.is_ascii_digit() || c == '.') {
        let wanted: Vec<&str> = request.split('.').collect();
        return version
            .split('.')
            .zip(&wanted)
            .filter(|(a, b)| a == *b)
            .count()
            == wanted.len()
            && version.split('.').count() >= wanted.len();
    }
    match (
        nodejs_semver::Range::parse(request),
        nodejs_semver::Version::parse(version),
    ) {
        (Ok(range), Ok(version)) => range.satisfies(&version),
        _ => false,
    }
}

/// Orders dotted versions numerically.
fn compare_versions(a: &str, b: &str) -> std::cmp::Ordering {
    let parts = |text: &str| -> Vec<u64> {
        text.split('.')
            .map(|part| part.parse().unwrap_or(0))
            .collect()
    };
    parts(a).cmp(&parts(b))
}

/// Runs a program with only `PATH` set; its trimmed standard output (or error output) on
/// success.
fn output(program: &Path, args: &[&str], path: &str) -> Option<String> {
    let output = Command::new(program)
        .args(args)
        .env_clear()
        .env("PATH", path)
        .current_dir("/")
        .output()
        .ok()
        .filter(|output| output.status.success())?;
    let text = if output.stdout.is_empty() {
        output.stderr
    } else {
        output.stdout
    };
    Some(String::from_utf8_lossy(&text).trim().to_owned())
}

/// The directories of a PATH, in order.
fn dirs(path: &str) -> impl Iterator<Item = PathBuf> + '_ {
    path.split(':')
        .filter(|dir| !dir.is_empty())
        .map(PathBuf::from)
}

fn executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path)
        .is_ok_and(|metadata| metadata.is_file() && metadata.permissions().mode() & 0o111 != 0)
}

/// Every `node` on `path`, each real program once.
pub fn nodes(path: &str) -> Vec<Used> {
    offered(path, "node", |name| name == "node", "v", usize::MAX)
}

/// The `node` a command on `path` runs: the first one.
fn first_node(path: &str) -> Option<Used> {
    offered(path, "node", |name| name == "node", "v", 1).pop()
}

/// Every Python interpreter on `path` (`python3`, `python3.X`), each real program once.
pub fn pythons(path: &str) -> Vec<Used> {
    let named = |name: &str| {
        name == "python3"
            || name
                .strip_prefix("python3.")
                .is_some_and(|minor| minor.chars().all(|c| c.is_ascii_digit()))
    };
    offered(path, "python", named, "Python ", usize::MAX)
}

/// The executables in `path`'s directories whose names `named` accepts, in PATH order (and
/// by name within a directory), each real program once, with the version each reports
/// (`--version`, without `prefix`); at most `limit` of them, each asked only when needed.
fn offered(
    path: &str,
    toolchain: &'static str,
    named: impl Fn(&str) -> bool,
    prefix: &str,
    limit: usize,
) -> Vec<Used> {
    let mut seen = Vec::new();
    let mut found = Vec::new();
    for dir in dirs(path) {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        let mut names: Vec<String> = entries
            .flatten()
            .map(|entry| entry.file_name().to_string_lossy().into_owned())
            .filter(|name| named(name))
            .collect();
        names.sort();
        for name in names {
            let candidate = dir.join(&name);
            if !executable(&candidate) {
                continue;
            }
            let real = std::fs::canonicalize(&candidate).unwrap_or_else(|_| candidate.clone());
            if seen.contains(&real) {
                continue;
            }
            seen.push(real);
            if let Some(version) = output(&candidate, &["--version"], path) {
                found.push(Used {
                    name: toolchain,
                    version: version.trim_start_matches(prefix).to_owned(),
                    path: candidate.to_string_lossy().into_owned(),
                });
                if found.len() >= limit {
                    return found;
                }
            }
        }
    }
    found
}

/// The interpreter uv would choose on `path` for `request` (uv's own matching: a version, a
/// prefix, a specifier such as `>=3.10`), or, without uv, `python3` when its version meets
/// the request as an installer judges it ([`python_satisfies`]).
fn find_python(path: &str, request: &str) -> Option<Used> {
    let uv = dirs(path)
        .map(|dir| dir.join("uv"))
        .find(|uv| executable(uv));
    let found = match uv {
        Some(uv) => {
            let found = output(
                &uv,
                &[
                    "python",
                    "find",
                    "--no-config",
                    "--no-project",
                    "--python-preference",
                    "only-system",
                    "--no-python-downloads",
                    "--",
                    request,
                ],
                path,
            )?;
            PathBuf::from(found.lines().last()?.trim())
        }
        None => {
            let python = dirs(path)
                .map(|dir| dir.join("python3"))
                .find(|python| executable(python))?;
            let version = output(&python, &["--version"], path)?;
            if !python_satisfies(request, version.trim_start_matches("Python ").trim()) {
                return None;
            }
            python
        }
    };
    let version = output(&found, &["--version"], path)?;
    Some(Used {
        name: "python",
        version: version.trim_start_matches("Python ").to_owned(),
        path: found.to_string_lossy().into_owned(),
    })
}

/// Whether a Python of `version` (`3.11.2`) meets `request`, as installers judge it without
/// uv: a PEP 440 specifier set (`requires-python`: `>=3.9`, `>=3.10,<4`, `~=3.11`,
/// `==3.11.*`) is evaluated as one; anything else is a `.python-version` line (`3.11`,
/// `python3.11`, `cpython@3.11.2`), which names a version or its leading segments.
fn python_satisfies(request: &str, version: &str) -> bool {
    use std::str::FromStr as _;
    let Ok(version) = pep440_rs::Version::from_str(version) else {
        return false;
    };
    let request = request.trim();
    if request.starts_with(['<', '>', '=', '!', '~']) {
        return pep440_rs::VersionSpecifiers::from_str(request)
            .is_ok_and(|specifiers| specifiers.contains(&version));
    }
    let wanted = request
        .rsplit_once('@')
        .map_or(request, |(_, version)| version)
        .trim_start_matches("cpython")
        .trim_start_matches("python");
    let Ok(wanted) = pep440_rs::Version::from_str(wanted) else {
        return false;
    };
    // Leading segments: 3.11 is met by 3.11.2, not by 3.1 nor 3.110.
    let (have, want) = (version.release(), wanted.release());
    have.len() >= want.len() && have[..want.len()] == *want
}

/// Makes `node_modules/.bin/node` under `root` a link to `target`, the Node a pin chose, so
/// that sessions (whose PATH has the environment's `node_modules/.bin` before the system's
/// directories) and `#!/usr/bin/env node` scripts run it. Replaces whatever is there: a pin
/// is the project's word on which Node runs it.
///
/// The build made `node_modules`: every step is taken beneath `root` following no link, so a
/// link planted at `node_modules` or `.bin` fails the step instead of leading the builder
/// (root) to write or delete anywhere else.
pub fn link_node(root: &Path, target: &str) -> std::io::Result<()> {
    use rustix::fs::{AtFlags, FileType, Mode};
    let mut dir = crate::beneath::open_root(root)?;
    for name in ["node_modules", ".bin"] {
        match rustix::fs::mkdirat(&dir, name, Mode::from_raw_mode(0o755)) {
            Ok(()) | Err(rustix::io::Errno::EXIST) => {}
            Err(errno) => return Err(errno.into()),
        }
        dir = crate::beneath::open_dir(&dir, name)?;
    }
    match crate::beneath::lstat(&dir, "node")? {
        Some(stat) if crate::beneath::kind(&stat) == FileType::Directory => {
            // Through the descriptor checked above: std removes a tree beneath it without
            // following links.
            std::fs::remove_dir_all(
                Path::new(&format!("/proc/self/fd/{}", dir.as_raw_fd())).join("node"),
            )?;
        }
        Some(_) => rustix::fs::unlinkat(&dir, "node", AtFlags::empty())?,
        None => {}
    }
    Ok(rustix::fs::symlinkat(target, &dir, "node")?)
}

/// What a finished build ran with: the venv's interpreter (from its `pyvenv.cfg`) and, when
/// the project used Node, `chosen` (the pin's choice, already asked its version) or else
/// the `node` first on the installers' PATH.
pub fn report(
    root: &Path,
    mount: &str,
    path: &str,
    node_used: bool,
    chosen: Option<Used>,
) -> Vec<Used> {
    let mut used = Vec::new();
    if let Some(config) = read_small(root, ".venv/pyvenv.cfg") {
        let value = |key: &str| {
            config.lines().find_map(|line| {
                let (name, value) = line.split_once('=')?;
                (name.trim() == key).then(|| value.trim().to_owned())
            })
        };
        if let Some(version) = value("version_info").or_else(|| value("version")) {
            // The venv's own python links to the interpreter it was made from, directly (uv)
            // or through a sibling (`python -> python3 -> /usr/bin/python3`, venv).
            let mut name = PathBuf::from("python");
            let mut path = None;
            for _ in 0..4 {
                let Ok(target) = crate::beneath::open_root(root).and_then(|fd| {
                    crate::beneath::read_link(&fd, Path::new(".venv/bin").join(&name))
                }) else {
                    break;
                };
                if target.is_absolute() {
                    path = Some(target.to_string_lossy().into_owned());
                    break;
                }
                if target.components().count() != 1 {
                    break;
                }
                name = target;
            }
            let path = path
                .or_else(|| value("home").map(|home| format!("{home}/python3")))
                .unwrap_or_else(|| format!("{mount}/.venv/bin/python"));
            // `version_info` may carry a release level (`3.11.7.final.0`).
            let version = version.split('.').take(3).collect::<Vec<_>>().join(".");
            used.push(Used {
                name: "python",
                version,
                path,
            });
        }
    }
    if node_used && let Some(node) = chosen.or_else(|| first_node(path)) {
        used.push(node);
    }
    used
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requires_python_is_judged_as_pep_440_and_a_python_version_line_by_its_segments() {
        for met in [
            ">=3.9",
            ">=3.10,<4",
            "~=3.11",
            "==3.11.*",
            "!=3.10.*",
            "3.11",
            "3",
            "3.11.2",
            "python3.11",
            "cpython@3.11",
        ] {
            assert!(python_satisfies(met, "3.11.2"), "{met}");
        }
        for unmet in [
            ">=3.12", "<3.11", "~=3.12", "==3.10.*", "3.1", "3.12", "3.11.3", "x",
        ] {
            assert!(!python_satisfies(unmet, "3.11.2"), "{unmet}");
        }
    }

    fn pin(request: &str) -> Pin {
        Pin {
            request: request.to_owned(),
            from: ".nvmrc",
        }
    }

    #[test]
    fn node_pins_match_like_nvm_and_npm() {
        assert!(node_satisfies(&pin("20"), "20.20.2"));
        assert!(node_satisfies(&pin("v20.20"), "20.20.2"));
        assert!(!node_satisfies(&pin("2"), "20.20.2"));
        assert!(!node_satisfies(&pin("22"), "20.20.2"));
        assert!(node_satisfies(&pin(">=18"), "20.20.2"));
        assert!(node_satisfies(&pin("^18 || ^20"), "20.1.0"));
        assert!(!node_satisfies(&pin(">= 22"), "20.20.2"));
        assert!(node_satisfies(&pin("lts/*"), "20.20.2"));
        assert!(!node_satisfies(&pin("not a range"), "20.20.2"));
    }

    #[test]
    fn pins_come_from_the_files_projects_use() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert_eq!(python_pin(dir.path()), None);
        std::fs::write(
            dir.path().join("pyproject.toml"),
            "[project]\nname = \"x\"\nrequires-python = \">=3.10\"\n",
        )
        .expect("write");
        assert_eq!(
            python_pin(dir.path()).map(|pin| pin.request),
            Some(">=3.10".to_owned())
        );
        std::fs::write(dir.path().join(".python-version"), "# pinned\n3.12\n").expect("write");
        assert_eq!(
            python_pin(dir.path()),
            Some(Pin {
                request: "3.12".to_owned(),
                from: ".python-version"
            })
        );
        std::fs::write(
            dir.path().join("package.json"),
            r#"{"engines": {"node": ">=22"}}"#,
        )
        .expect("write");
        assert_eq!(
            node_pin(dir.path()).map(|pin| pin.request),
            Some(">=22".to_owned())
        );
        std::fs::write(dir.path().join(".nvmrc"), "v20\n").expect("write");
        assert_eq!(node_pin(dir.path()).map(|pin| pin.from), Some(".nvmrc"));
    }

    #[test]
    fn requires_python_ranges_are_met_by_the_machines_python_with_and_without_uv() {
        // The machine's Python, as builds without uv find it.
        let python = Path::new("/usr/bin/python3");
        let version = output(python, &["--version"], "/usr/bin:/bin").expect("/usr/bin/python3");
        let version = version.trim_start_matches("Python ").trim().to_owned();
        let mut parts = version
            .split('.')
            .map(|part| part.parse::<u32>().expect("a number"));
        let (major, minor) = (parts.next().expect("major"), parts.next().expect("minor"));
        let only_python = tempfile::tempdir().expect("tempdir");
        std::os::unix::fs::symlink(python, only_python.path().join("python3")).expect("link");
        let without_uv = only_python.path().display().to_string();
        let with_uv = std::env::var("PATH").unwrap_or_default();
        let has_uv = dirs(&with_uv).any(|dir| executable(&dir.join("uv")));
        assert!(
            has_uv || std::env::var_os("CI").is_none(),
            "uv is on the CI machines"
        );
        let project = tempfile::tempdir().expect("tempdir");
        for request in [
            format!(">={major}.{}", minor.saturating_sub(2)),
            format!(">={major}.{minor},<{}", major + 1),
            format!("~={major}.{minor}"),
            format!("=={major}.{minor}.*"),
        ] {
            std::fs::write(
                project.path().join("pyproject.toml"),
                format!("[project]\nname = \"x\"\nrequires-python = \"{request}\"\n"),
            )
            .expect("write");
            let chosen = select(project.path(), &without_uv, true, false)
                .unwrap_or_else(|error| panic!("{request} without uv: {error}"));
            assert_eq!(chosen.path, without_uv);
            if has_uv {
                select(project.path(), &with_uv, true, false)
                    .unwrap_or_else(|error| panic!("{request} with uv: {error}"));
            }
        }
        // A range the machine's Python does not meet still says so.
        std::fs::write(
            project.path().join("pyproject.toml"),
            format!(
                "[project]\nname = \"x\"\nrequires-python = \">={major}.{}\"\n",
                minor + 1
            ),
        )
        .expect("write");
        let error = select(project.path(), &without_uv, true, false)
            .expect_err("too new")
            .to_string();
        assert!(error.contains("asks for Python >="), "{error}");
    }

    #[test]
    fn an_unmet_engines_node_is_a_warning_unless_npmrc_makes_it_strict() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(
            dir.path().join("package.json"),
            r#"{"name": "x", "engines": {"node": ">=99"}}"#,
        )
        .expect("write");
        let path = "/usr/local/bin:/usr/bin:/bin";
        let chosen = select(dir.path(), path, false, true).expect("npm only warns");
        assert_eq!((chosen.path.as_str(), chosen.node), (path, None));
        assert_eq!(chosen.warnings.len(), 1, "{:?}", chosen.warnings);
        assert!(
            chosen.warnings[0].contains("Node >=99 (engines.node in package.json)"),
            "{:?}",
            chosen.warnings
        );
        std::fs::write(
            dir.path().join(".npmrc"),
            "; strict\nengine-strict = true\n",
        )
        .expect("write");
        let error = select(dir.path(), path, false, true).expect_err("engine-strict");
        assert!(
            matches!(&error, UnmetPin::Node { request, from: ENGINES_NODE, .. } if request == ">=99"),
            "{error:?}"
        );
        assert!(error.to_string().contains("Node >=99"), "{error}");
        // A Node named by .nvmrc is the one to run: unmet, it fails.
        std::fs::remove_file(dir.path().join(".npmrc")).expect("rm");
        std::fs::write(dir.path().join(".nvmrc"), "99\n").expect("write");
        assert!(select(dir.path(), path, false, true).is_err());
    }

    #[test]
    fn an_unmet_pin_names_what_was_asked_and_what_there_is() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join(".python-version"), "3.99\n").expect("write");
        std::fs::write(dir.path().join(".nvmrc"), "99\n").expect("write");
        let path = "/usr/local/bin:/usr/bin:/bin";
        let error = select(dir.path(), path, true, false)
            .expect_err("python 3.99")
            .to_string();
        assert!(
            error.contains("Python 3.99 (.python-version)") && error.contains("python 3."),
            "{error}"
        );
        let error = select(dir.path(), path, false, true).expect_err("node 99");
        assert!(error.to_string().contains("Node 99 (.nvmrc)"), "{error}");
        assert!(
            error.to_string().ends_with(
                ": pin a version it has, or add a Node's bin directory to builder.toolchain_dirs"
            ),
            "{error}"
        );
        // A pin no version could be is named, not passed on.
        std::fs::write(dir.path().join(".nvmrc"), "9".repeat(4096)).expect("write");
        let error = select(dir.path(), path, false, true).expect_err("long pin");
        assert!(
            matches!(error, UnmetPin::NotAVersion { from: ".nvmrc", .. }),
            "{error:?}"
        );
        let error = error.to_string();
        assert!(
            error.contains(".nvmrc is not a version or range") && error.len() < 300,
            "{error}"
        );
        // Unpinned, or pinned to what there is: no error.
        std::fs::remove_file(dir.path().join(".nvmrc")).expect("rm");
        assert!(select(dir.path(), path, false, true).is_ok());
    }
}
