//! Manifests: which install steps a project's source asks for, and the commands each step runs.
//!
//! This is the documented manifest list (ARCHITECTURE §3.4, the list the UHP spec asks a server
//! to publish), in the order the steps run, each optional:
//!
//! | manifest | step |
//! |---|---|
//! | `pyproject.toml` + `uv.lock` | `uv sync --locked` |
//! | `pyproject.toml` (no lock) | `uv sync` |
//! | `requirements.txt` | `uv venv .venv` (unless it exists) + `uv pip install -r requirements.txt` |
//! | `package.json` + `package-lock.json` or `npm-shrinkwrap.json` | `npm ci` |
//! | `package.json` (no lock) | `npm install` |
//! | `setup.sh` | `bash setup.sh`, last, with `.venv/bin` and `node_modules/.bin` first on PATH |
//!
//! Without `uv` the Python steps fall back to `python3 -m venv .venv` and `.venv/bin/pip`
//! (`pip install -r requirements.txt`, or `pip install .` for a `pyproject.toml`, which then
//! ignores `uv.lock`). Deciding *whether* uv is there is the installer's business (it knows the
//! build's PATH); this module only says what each choice runs. Commands run with the mount path
//! as their working directory, so relative paths here are relative to `/env/<slug>`.

use std::path::Path;

/// One install step, named for the manifest that asks for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Step {
    /// `pyproject.toml` with `uv.lock`: install exactly the lock.
    UvSyncLocked,
    /// `pyproject.toml` without a lock: resolve and install.
    UvSync,
    /// `requirements.txt`: a `.venv` and the requirements installed into it.
    Requirements,
    /// `package.json` with a lockfile: a clean install of the lock.
    NpmCi,
    /// `package.json` without a lockfile.
    NpmInstall,
    /// `setup.sh`: the project's own script, run last.
    SetupScript,
}

/// The steps a source directory needs, in the order they run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    pub steps: Vec<Step>,
}

impl Plan {
    /// Whether any step installs Python packages (so a `.venv` is expected).
    pub fn has_python(&self) -> bool {
        self.steps.iter().any(|step| step.is_python())
    }

    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }
}

/// What the installer knows when it turns a step into commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Toolchain<'a> {
    /// `uv` is on the build's PATH.
    pub uv: bool,
    /// `.venv` already exists (an earlier step made it): reuse it rather than recreate it.
    pub venv_exists: bool,
    /// The build runs over `.venv` and `node_modules` reused from an earlier build with the
    /// same reuse key, and these are the root package's lifecycle scripts ([`npm_lifecycle`]).
    /// Every step still runs, so the version holds what a fresh build's would (the installers'
    /// outputs outside the dependency trees: a `prepare` script's `lib/`, uv's `uv.lock`, an
    /// `*.egg-info`); uv and pip find their packages installed, and `npm ci`, which would
    /// delete `node_modules`, gives way to the lifecycle scripts it runs after installing.
    pub reused: Option<&'a [String]>,
}

/// The root package's lifecycle scripts `npm ci` and `npm install` run after installing, in
/// their order, that `package.json` defines (npm's documented order: preinstall, install,
/// postinstall, prepublish, preprepare, prepare, postprepare).
pub const NPM_LIFECYCLE: [&str; 7] = [
    "preinstall",
    "install",
    "postinstall",
    "prepublish",
    "preprepare",
    "prepare",
    "postprepare",
];

/// Which of [`NPM_LIFECYCLE`] the `package.json` in `dir` defines; none when it is absent or
/// unreadable (npm itself then fails on it, with its own message).
pub fn npm_lifecycle(dir: &Path) -> Vec<String> {
    // The project's file: read beneath `dir`, never through a link, and bounded.
    let Some(text) = crate::beneath::open_root(dir)
        .ok()
        .and_then(|root| crate::beneath::read_small(&root, "package.json", 16 * 1024 * 1024))
    else {
        return Vec::new();
    };
    let Ok(package) = serde_json::from_slice::<serde_json::Value>(&text) else {
        return Vec::new();
    };
    let Some(scripts) = package.get("scripts").and_then(|s| s.as_object()) else {
        return Vec::new();
    };
    NPM_LIFECYCLE
        .iter()
        .filter(|name| scripts.get(**name).is_some_and(|script| script.is_string()))
        .map(|name| (*name).to_owned())
        .collect()
}

impl Step {
    /// The manifest file that asks for this step.
    pub fn manifest(self) -> &'static str {
        match self {
            Step::UvSyncLocked | Step::UvSync => "pyproject.toml",
            Step::Requirements => "requirements.txt",
            Step::NpmCi | Step::NpmInstall => "package.json",
            Step::SetupScript => "setup.sh",
        }
    }

    /// Whether this step installs Python packages into `.venv`.
    pub fn is_python(self) -> bool {
        matches!(self, Step::UvSyncLocked | Step::UvSync | Step::Requirements)
    }

    /// The commands (argv) this step runs, in order, given the toolchain.
    pub fn commands(self, toolchain: Toolchain) -> Vec<Vec<String>> {
        let argv = |words: &[&str]| words.iter().map(|word| (*word).to_owned()).collect();
        let make_venv = if toolchain.venv_exists {
            None
        } else if toolchain.uv {
            Some(argv(&["uv", "venv", ".venv"]))
        } else {
            Some(argv(&["python3", "-m", "venv", ".venv"]))
        };
        match self {
            Step::UvSyncLocked if toolchain.uv => vec![argv(&["uv", "sync", "--locked"])],
            Step::UvSync if toolchain.uv => vec![argv(&["uv", "sync"])],
            Step::UvSyncLocked | Step::UvSync => make_venv
                .into_iter()
                .chain([argv(&[".venv/bin/pip", "install", "."])])
                .collect(),
            Step::Requirements => {
                let install = if toolchain.uv {
                    argv(&["uv", "pip", "install", "-r", "requirements.txt"])
                } else {
                    argv(&[".venv/bin/pip", "install", "-r", "requirements.txt"])
                };
                make_venv.into_iter().chain([install]).collect()
            }
            // `--ignore-scripts` runs the named script without its pre- and post- scripts,
            // which come in the list on their own.
            Step::NpmCi => match toolchain.reused {
                Some(scripts) => scripts
                    .iter()
                    .map(|name| argv(&["npm", "run", "--ignore-scripts", name]))
                    .collect(),
                None => vec![argv(&["npm", "ci"])],
            },
            Step::NpmInstall => vec![argv(&["npm", "install"])],
            Step::SetupScript => vec![argv(&["bash", "setup.sh"])],
        }
    }
}

/// The steps `dir` (a materialized source) needs. Only regular files count as manifests: the
/// source holds no links, and a directory named `setup.sh` asks for nothing.
pub fn plan(dir: &Path) -> Plan {
    let has = |name: &str| {
        std::fs::symlink_metadata(dir.join(name)).is_ok_and(|metadata| metadata.is_file())
    };
    let mut steps = Vec::new();
    if has("pyproject.toml") {
        steps.push(if has("uv.lock") {
            Step::UvSyncLocked
        } else {
            Step::UvSync
        });
    }
    if has("requirements.txt") {
        steps.push(Step::Requirements);
    }
    if has("package.json") {
        steps.push(if has("package-lock.json") || has("npm-shrinkwrap.json") {
            Step::NpmCi
        } else {
            Step::NpmInstall
        });
    }
    if has("setup.sh") {
        steps.push(Step::SetupScript);
    }
    Plan { steps }
}

/// How a command is shown in the log and in errors: its words joined by spaces.
pub fn display(argv: &[String]) -> String {
    argv.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan_of(files: &[&str]) -> Vec<Step> {
        let dir = tempfile::tempdir().expect("tempdir");
        for file in files {
            std::fs::write(dir.path().join(file), b"").expect("write");
        }
        plan(dir.path()).steps
    }

    #[test]
    fn manifests_map_to_steps_in_order() {
        assert_eq!(plan_of(&[]), vec![]);
        assert_eq!(
            plan_of(&[
                "setup.sh",
                "package.json",
                "requirements.txt",
                "pyproject.toml",
                "uv.lock"
            ]),
            vec![
                Step::UvSyncLocked,
                Step::Requirements,
                Step::NpmInstall,
                Step::SetupScript
            ]
        );
        assert_eq!(plan_of(&["pyproject.toml"]), vec![Step::UvSync]);
        assert_eq!(plan_of(&["uv.lock"]), vec![]);
        assert_eq!(
            plan_of(&["package.json", "package-lock.json"]),
            vec![Step::NpmCi]
        );
        assert_eq!(
            plan_of(&["package.json", "npm-shrinkwrap.json"]),
            vec![Step::NpmCi]
        );
    }

    #[test]
    fn a_directory_is_not_a_manifest() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(dir.path().join("setup.sh")).expect("mkdir");
        assert!(plan(dir.path()).is_empty());
    }

    #[test]
    fn commands_follow_the_toolchain() {
        let with_uv = Toolchain {
            uv: true,
            venv_exists: false,
            reused: None,
        };
        let without_uv = Toolchain {
            uv: false,
            venv_exists: false,
            reused: None,
        };
        let shown = |step: Step, toolchain| {
            step.commands(toolchain)
                .iter()
                .map(|argv| display(argv))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            shown(Step::Requirements, with_uv),
            ["uv venv .venv", "uv pip install -r requirements.txt"]
        );
        assert_eq!(
            shown(Step::Requirements, without_uv),
            [
                "python3 -m venv .venv",
                ".venv/bin/pip install -r requirements.txt"
            ]
        );
        assert_eq!(
            shown(
                Step::Requirements,
                Toolchain {
                    uv: true,
                    venv_exists: true,
                    reused: None,
                }
            ),
            ["uv pip install -r requirements.txt"]
        );
        assert_eq!(shown(Step::UvSyncLocked, with_uv), ["uv sync --locked"]);
        assert_eq!(
            shown(Step::UvSyncLocked, without_uv),
            ["python3 -m venv .venv", ".venv/bin/pip install ."]
        );
        assert_eq!(shown(Step::NpmCi, with_uv), ["npm ci"]);
        assert_eq!(shown(Step::SetupScript, without_uv), ["bash setup.sh"]);
        let scripts = ["postinstall".to_owned(), "prepare".to_owned()];
        let reused = Toolchain {
            uv: true,
            venv_exists: true,
            reused: Some(&scripts),
        };
        assert_eq!(
            shown(Step::NpmCi, reused),
            [
                "npm run --ignore-scripts postinstall",
                "npm run --ignore-scripts prepare"
            ]
        );
        assert_eq!(shown(Step::NpmInstall, reused), ["npm install"]);
        assert_eq!(shown(Step::UvSyncLocked, reused), ["uv sync --locked"]);
    }

    #[test]
    fn lifecycle_scripts_in_npms_order() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert!(npm_lifecycle(dir.path()).is_empty());
        std::fs::write(
            dir.path().join("package.json"),
            r#"{"scripts": {"prepare": "a", "test": "b", "postinstall": "c", "install": 3}}"#,
        )
        .expect("write");
        assert_eq!(npm_lifecycle(dir.path()), ["postinstall", "prepare"]);
    }
}
