//! Manifests: which install steps a project's source asks for, and the commands each step runs.
//!
//! This is the documented manifest list (ARCHITECTURE §3.4, the list the UHP spec asks a server
//! to publish), in the order the steps run, each optional: `pyproject.toml` (with `uv.lock`, or
//! declaring a package), `requirements.txt`, `package.json` (with a lock: `npm ci`), then
//! `setup.sh`, last. An environment's `install.python` setting ([`PythonInstall`]) names the
//! Python manifest instead; without it, the choice and its reason go to the build log (see
//! [`Plan::python`]). Without `uv`, the Python steps fall back to `python3 -m venv` and pip;
//! *whether* uv is there is the installer's business, this module only says what each choice
//! runs. Commands run with the mount path as their working directory.
//!
//! The table of commands, which Python manifest is chosen and why, and the pip fallback:
//! `docs/design/builds.md#manifests`.

use std::path::Path;

use plinth_kit::python_install::{InstallSettingError, normalized};
pub use plinth_kit::python_install::{PythonInstall, PythonProject};

/// One install step, named for the manifest that asks for it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Step {
    /// `pyproject.toml`: the project (see [`Project`]).
    Project(Project),
    /// Requirements files, installed together into `.venv`.
    Requirements(Vec<String>),
    /// `package.json` with a lockfile: a clean install of the lock.
    NpmCi,
    /// `package.json` without a lockfile.
    NpmInstall,
    /// `setup.sh`: the project's own script, run last.
    SetupScript,
}

/// The project in `pyproject.toml`, as a step installs it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Project {
    /// `uv.lock` is there: uv installs exactly the lock.
    pub locked: bool,
    /// It declares a package (`[build-system]`, or `tool.uv.package = true`), built and
    /// installed; otherwise only what it depends on is.
    pub package: bool,
    /// The dependency groups named by `install.python`; `None`: uv's defaults.
    pub groups: Option<Vec<String>>,
    /// The extras named by `install.python`.
    pub extras: Vec<String>,
    /// What pip installs besides the package itself, when there is no uv: a virtual
    /// project's dependencies and extras' dependencies, and the groups' requirements.
    pub pip_requirements: Vec<String>,
}

/// The steps a source directory needs, in the order they run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    pub steps: Vec<Step>,
    /// Which Python manifest was chosen and why, for the build log (`installing from
    /// requirements.txt: pyproject.toml declares no build system (a settings-only
    /// pyproject)`); none when the source has no Python manifest.
    pub python: Option<String>,
}

impl Plan {
    /// Whether any step installs Python packages (so a `.venv` is expected).
    pub fn has_python(&self) -> bool {
        self.steps.iter().any(Step::is_python)
    }

    /// Whether a step installs from `uv.lock`.
    pub fn locked(&self) -> bool {
        self.steps
            .iter()
            .any(|step| matches!(step, Step::Project(project) if project.locked))
    }

    /// Whether a step installs with npm.
    pub fn has_node(&self) -> bool {
        self.steps
            .iter()
            .any(|step| matches!(step, Step::NpmCi | Step::NpmInstall))
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
    /// Whether this step installs Python packages into `.venv`.
    pub fn is_python(&self) -> bool {
        matches!(self, Step::Project(_) | Step::Requirements(_))
    }

    /// The commands (argv) this step runs, in order, given the toolchain.
    pub fn commands(&self, toolchain: Toolchain) -> Vec<Vec<String>> {
        let argv = |words: &[&str]| -> Vec<String> {
            words.iter().map(|word| (*word).to_owned()).collect()
        };
        let make_venv = if toolchain.venv_exists {
            None
        } else if toolchain.uv {
            Some(argv(&["uv", "venv", ".venv"]))
        } else {
            Some(argv(&["python3", "-m", "venv", ".venv"]))
        };
        match self {
            Step::Project(project) if toolchain.uv => {
                let mut sync = argv(&["uv", "sync"]);
                if project.locked {
                    sync.push("--locked".to_owned());
                }
                if let Some(groups) = &project.groups {
                    sync.push("--no-default-groups".to_owned());
                    for group in groups {
                        sync.extend(["--group".to_owned(), group.clone()]);
                    }
                }
                for extra in &project.extras {
                    sync.extend(["--extra".to_owned(), extra.clone()]);
                }
                vec![sync]
            }
            Step::Project(project) => {
                let mut install = argv(&[".venv/bin/pip", "install"]);
                if project.package {
                    install.push(if project.extras.is_empty() {
                        ".".to_owned()
                    } else {
                        format!(".[{}]", project.extras.join(","))
                    });
                }
                install.extend(project.pip_requirements.iter().cloned());
                let install = (install.len() > 2).then_some(install);
                make_venv.into_iter().chain(install).collect()
            }
            Step::Requirements(files) => {
                let mut install = if toolchain.uv {
                    argv(&["uv", "pip", "install"])
                } else {
                    argv(&[".venv/bin/pip", "install"])
                };
                for file in files {
                    install.extend(["-r".to_owned(), file.clone()]);
                }
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

/// Why what a source's manifests, or the environment's `install.python`, ask for cannot be
/// installed ([`plan`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// `install.python` names the project, and the source has no `pyproject.toml`.
    #[error(
        "install.python names the project, and the source has no pyproject.toml at its root: \
         add one, or name requirements files instead"
    )]
    NoPyproject,
    /// `install.python` names a requirements file the source does not have (as a regular file).
    #[error(
        "install.python names the requirements file {0}, and the source has no such file: add \
         it, or change install.python on the environment"
    )]
    NoRequirementsFile(String),
    /// What `pyproject.toml` holds cannot be installed as asked: an extra or a dependency
    /// group named (by `install.python` or `tool.uv.default-groups`) that it does not define,
    /// a list that is not one of requirements, groups that include each other in a cycle. The
    /// sentence says which.
    #[error("{0}")]
    Pyproject(String),
}

/// The default requirements file.
pub const REQUIREMENTS: &str = "requirements.txt";

/// Largest `pyproject.toml` read.
const MAX_PYPROJECT_BYTES: u64 = 16 * 1024 * 1024;

/// The steps `dir` (a materialized source) needs, with `python` (the environment's
/// `install.python`) naming the Python manifest when given. Only regular files count as
/// manifests: the source holds no links, and a directory named `setup.sh` asks for nothing.
/// The error says what the setting names that the source lacks, or which dependency group
/// cannot be installed.
pub fn plan(dir: &Path, python: Option<&PythonInstall>) -> Result<Plan, PlanError> {
    let root = crate::beneath::open_root(dir).ok();
    let has = |name: &str| {
        root.as_ref().is_some_and(|root| {
            crate::beneath::lstat(root, name).is_ok_and(|stat| {
                stat.is_some_and(|stat| {
                    crate::beneath::kind(&stat) == rustix::fs::FileType::RegularFile
                })
            })
        })
    };
    let pyproject = has("pyproject.toml").then(|| {
        root.as_ref()
            .and_then(|root| {
                crate::beneath::read_small(root, "pyproject.toml", MAX_PYPROJECT_BYTES)
            })
            .and_then(|bytes| String::from_utf8(bytes).ok())
            .and_then(|text| toml::from_str::<toml::Table>(&text).ok())
    });
    let locked = pyproject.is_some() && has("uv.lock");
    let mut steps = Vec::new();
    let why;
    if let Some(python) = python {
        if let Some(named) = &python.project {
            let Some(document) = &pyproject else {
                return Err(PlanError::NoPyproject);
            };
            steps.push(Step::Project(
                project(
                    document.as_ref(),
                    locked,
                    named.groups.clone(),
                    named.extras.clone(),
                )
                .map_err(PlanError::Pyproject)?,
            ));
        }
        for file in &python.requirements {
            if !has(file) {
                return Err(PlanError::NoRequirementsFile(file.clone()));
            }
        }
        if !python.requirements.is_empty() {
            steps.push(Step::Requirements(python.requirements.clone()));
        }
        why = Some(format!("install.python names {}", python.describe()));
    } else {
        let requirements = has(REQUIREMENTS);
        let kind = pyproject
            .as_ref()
            .map(|document| Kind::of(document.as_ref()));
        let then = if requirements {
            format!(", then {REQUIREMENTS}")
        } else {
            String::new()
        };
        why = match kind {
            None if requirements => Some(format!(
                "installing from {REQUIREMENTS}: there is no pyproject.toml"
            )),
            None => None,
            Some(_) if locked => Some(format!(
                "installing the project in pyproject.toml as uv.lock pins it{then}"
            )),
            Some(Kind::Package(because)) => Some(format!(
                "installing the project in pyproject.toml: {because}{then}"
            )),
            Some(Kind::Virtual) if requirements => Some(format!(
                "installing from {REQUIREMENTS}: pyproject.toml declares no build system, so \
                 its [project] table names no package to install"
            )),
            Some(Kind::Settings { .. }) if requirements => Some(format!(
                "installing from {REQUIREMENTS}: pyproject.toml declares no build system (a \
                 settings-only pyproject)"
            )),
            Some(Kind::Virtual) => Some(
                "installing the dependencies in pyproject.toml: it declares no build system, \
                 so the project itself is not installed (as uv does)"
                    .to_owned(),
            ),
            Some(Kind::Settings { groups: true }) => Some(
                "installing the dependency groups in pyproject.toml: it has no [project] table"
                    .to_owned(),
            ),
            Some(Kind::Settings { groups: false }) => Some(
                "nothing to install from pyproject.toml: it has no [project] table and no \
                 [dependency-groups] (a settings-only pyproject)"
                    .to_owned(),
            ),
        };
        let project_step = match kind {
            None => false,
            Some(_) if locked => true,
            Some(Kind::Package(_)) => true,
            Some(Kind::Virtual | Kind::Settings { groups: true }) => !requirements,
            Some(Kind::Settings { groups: false }) => false,
        };
        if project_step {
            let document = pyproject.as_ref().and_then(Option::as_ref);
            steps.push(Step::Project(
                project(document, locked, None, Vec::new()).map_err(PlanError::Pyproject)?,
            ));
        }
        if requirements {
            steps.push(Step::Requirements(vec![REQUIREMENTS.to_owned()]));
        }
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
    Ok(Plan { steps, python: why })
}

/// What a `pyproject.toml` declares, as uv judges it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A package to build and install; why it is one.
    Package(&'static str),
    /// A `[project]` table and no build system: its dependencies, never the project itself.
    Virtual,
    /// No `[project]` table: tools' settings, and dependency groups if `groups`.
    Settings { groups: bool },
}

impl Kind {
    /// `None`: the file does not parse, so it is taken for a package and the installer says
    /// what is wrong with it.
    fn of(document: Option<&toml::Table>) -> Kind {
        let Some(document) = document else {
            return Kind::Package("it does not parse as TOML, so the installer reads it");
        };
        let package = document
            .get("tool")
            .and_then(|tool| tool.get("uv"))
            .and_then(|uv| uv.get("package"))
            .and_then(toml::Value::as_bool);
        match package {
            Some(true) => return Kind::Package("tool.uv.package is true"),
            Some(false) if document.contains_key("project") => return Kind::Virtual,
            _ => {}
        }
        if document.contains_key("build-system") {
            Kind::Package("it declares a build system")
        } else if document.contains_key("project") {
            Kind::Virtual
        } else {
            Kind::Settings {
                groups: document.contains_key("dependency-groups"),
            }
        }
    }
}

/// The project step for `document` (`None`: it did not parse), with the groups and extras
/// named (`groups` `None`: uv's defaults), and what pip installs for it.
fn project(
    document: Option<&toml::Table>,
    locked: bool,
    groups: Option<Vec<String>>,
    extras: Vec<String>,
) -> Result<Project, String> {
    let kind = Kind::of(document);
    let package = matches!(kind, Kind::Package(_));
    let mut pip_requirements = Vec::new();
    if let Some(document) = document {
        let project = document.get("project");
        let optional = project
            .and_then(|project| project.get("optional-dependencies"))
            .and_then(toml::Value::as_table);
        if !package {
            pip_requirements.extend(strings(
                project.and_then(|project| project.get("dependencies")),
                "project.dependencies",
            )?);
            for extra in &extras {
                let found = optional.and_then(|optional| {
                    optional
                        .iter()
                        .find(|(name, _)| normalized(name) == normalized(extra))
                });
                let Some((name, list)) = found else {
                    return Err(format!(
                        "install.python names the extra {extra:?}, and pyproject.toml's \
                         [project.optional-dependencies] has no such extra{}",
                        defined(optional)
                    ));
                };
                pip_requirements.extend(strings(
                    Some(list),
                    &format!("project.optional-dependencies.{name}"),
                )?);
            }
        } else if !extras.is_empty() {
            for extra in &extras {
                let known = optional.is_some_and(|optional| {
                    optional
                        .keys()
                        .any(|name| normalized(name) == normalized(extra))
                });
                // A package's extras may be dynamic (the backend computes them): only a
                // static table that lacks the name is an error.
                let dynamic = project
                    .and_then(|project| project.get("dynamic"))
                    .and_then(toml::Value::as_array)
                    .is_some_and(|dynamic| {
                        dynamic
                            .iter()
                            .any(|field| field.as_str() == Some("optional-dependencies"))
                    });
                if !known && !dynamic {
                    return Err(format!(
                        "install.python names the extra {extra:?}, and pyproject.toml's \
                         [project.optional-dependencies] has no such extra{}",
                        defined(optional)
                    ));
                }
            }
        }
        let table = document
            .get("dependency-groups")
            .and_then(toml::Value::as_table);
        let chosen = match &groups {
            Some(named) => {
                for group in named {
                    if find_group(table, group).is_none() {
                        return Err(format!(
                            "install.python names the dependency group {group:?}, and \
                             pyproject.toml's [dependency-groups] has no such group{}",
                            defined(table)
                        ));
                    }
                }
                named.clone()
            }
            None => default_groups(document, table)?,
        };
        for group in &chosen {
            pip_requirements.extend(group_requirements(table, group, &mut Vec::new())?);
        }
    }
    // A requirement named twice (by two groups, or a group and the dependencies) once.
    let mut seen = std::collections::HashSet::new();
    pip_requirements.retain(|requirement| seen.insert(requirement.clone()));
    Ok(Project {
        locked,
        package,
        groups,
        extras,
        pip_requirements,
    })
}

/// The groups uv installs when none are named: `tool.uv.default-groups` (a list, or `"all"`),
/// else `dev` when there is one.
fn default_groups(
    document: &toml::Table,
    table: Option<&toml::Table>,
) -> Result<Vec<String>, String> {
    let setting = document
        .get("tool")
        .and_then(|tool| tool.get("uv"))
        .and_then(|uv| uv.get("default-groups"));
    match setting {
        None => Ok(find_group(table, "dev")
            .map(|(name, _)| vec![name.to_owned()])
            .unwrap_or_default()),
        Some(toml::Value::String(all)) if all == "all" => Ok(table
            .map(|table| table.keys().cloned().collect())
            .unwrap_or_default()),
        Some(value) => {
            let named = strings(Some(value), "tool.uv.default-groups")?;
            for group in &named {
                if find_group(table, group).is_none() {
                    return Err(format!(
                        "tool.uv.default-groups in pyproject.toml names the dependency group \
                         {group:?}, and [dependency-groups] has no such group{}",
                        defined(table)
                    ));
                }
            }
            Ok(named)
        }
    }
}

/// The group `name` in `[dependency-groups]`, compared as PEP 735 says (normalized names).
fn find_group<'a>(
    table: Option<&'a toml::Table>,
    name: &str,
) -> Option<(&'a str, &'a toml::Value)> {
    table?
        .iter()
        .find(|(group, _)| normalized(group) == normalized(name))
        .map(|(group, value)| (group.as_str(), value))
}

/// Most groups followed through `include-group` from one named group.
const MAX_GROUP_DEPTH: usize = 64;

/// The requirements of dependency group `name`, with its `{include-group = "…"}` entries
/// replaced by theirs (PEP 735); a cycle or an unknown include is an error, as it is to uv
/// and pip.
fn group_requirements(
    table: Option<&toml::Table>,
    name: &str,
    path: &mut Vec<String>,
) -> Result<Vec<String>, String> {
    let Some((found, value)) = find_group(table, name) else {
        return Err(format!(
            "pyproject.toml's dependency group {:?} includes {name:?}, which [dependency-groups] \
             does not define{}",
            path.last().map(String::as_str).unwrap_or_default(),
            defined(table)
        ));
    };
    if path
        .iter()
        .any(|seen| normalized(seen) == normalized(found))
        || path.len() > MAX_GROUP_DEPTH
    {
        return Err(format!(
            "pyproject.toml's dependency groups include each other in a cycle: {} -> {found}",
            path.join(" -> ")
        ));
    }
    let Some(entries) = value.as_array() else {
        return Err(format!(
            "pyproject.toml's dependency group {found:?} is not a list"
        ));
    };
    path.push(found.to_owned());
    let mut requirements = Vec::new();
    for entry in entries {
        match entry {
            toml::Value::String(requirement) => {
                requirements.push(requirement_arg(requirement, found)?);
            }
            toml::Value::Table(include) => match include.get("include-group") {
                Some(toml::Value::String(other)) if include.len() == 1 => {
                    requirements.extend(group_requirements(table, other, path)?);
                }
                _ => {
                    return Err(format!(
                        "pyproject.toml's dependency group {found:?} holds a table that is not \
                         {{include-group = \"…\"}}"
                    ));
                }
            },
            _ => {
                return Err(format!(
                    "pyproject.toml's dependency group {found:?} holds an entry that is neither \
                     a requirement nor {{include-group = \"…\"}}"
                ));
            }
        }
    }
    path.pop();
    Ok(requirements)
}

/// The strings of a list in `pyproject.toml` (absent: none), each a requirement pip takes as
/// an argument.
fn strings(value: Option<&toml::Value>, field: &str) -> Result<Vec<String>, String> {
    let Some(value) = value else {
        return Ok(Vec::new());
    };
    let Some(list) = value.as_array() else {
        return Err(format!("pyproject.toml's {field} is not a list"));
    };
    list.iter()
        .map(|item| match item.as_str() {
            Some(text) => requirement_arg(text, field),
            None => Err(format!(
                "pyproject.toml's {field} holds an entry that is not a string"
            )),
        })
        .collect()
}

/// A requirement as pip's argument: trimmed, and never read as an option.
fn requirement_arg(requirement: &str, from: &str) -> Result<String, String> {
    let requirement = requirement.trim();
    if requirement.is_empty() || requirement.starts_with('-') {
        return Err(format!(
            "pyproject.toml's {from} holds {requirement:?}, which is not a requirement"
        ));
    }
    Ok(requirement.to_owned())
}

/// `: it has a, b` naming a table's keys, or nothing when it has none.
fn defined(table: Option<&toml::Table>) -> String {
    let names: Vec<&str> = table
        .map(|table| table.keys().map(String::as_str).collect())
        .unwrap_or_default();
    if names.is_empty() {
        " (it defines none)".to_owned()
    } else {
        format!(" (it defines {})", names.join(", "))
    }
}

/// The `install.python` a build claim carries, checked as the catalog checked it: `None` when
/// the environment names no Python manifest.
pub fn python_setting(
    install: Option<&plinth_proto::catalog::v1::InstallSettings>,
) -> Result<Option<PythonInstall>, InstallSettingError> {
    let Some(python) = install.and_then(|install| install.python.as_ref()) else {
        return Ok(None);
    };
    let setting = PythonInstall {
        requirements: python.requirements.clone(),
        project: python.project.as_ref().map(|project| PythonProject {
            groups: project.groups.as_ref().map(|groups| groups.names.clone()),
            extras: project.extras.clone(),
        }),
    };
    setting.check()?;
    Ok(Some(setting))
}

/// How a command is shown in the log and in errors: its words joined by spaces.
pub fn display(argv: &[String]) -> String {
    argv.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("tempdir");
        for (file, text) in files {
            let path = dir.path().join(file);
            std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
            std::fs::write(path, text).expect("write");
        }
        dir
    }

    fn plan_of(files: &[(&str, &str)]) -> Plan {
        plan(source(files).path(), None).expect("plan")
    }

    const PACKAGE: &str = "[build-system]\nrequires = [\"hatchling\"]\n\
                           build-backend = \"hatchling.build\"\n\
                           [project]\nname = \"app\"\nversion = \"1\"\n\
                           dependencies = [\"flask\"]\n\
                           [project.optional-dependencies]\ntest = [\"pytest\"]\n\
                           [dependency-groups]\ndev = [\"ruff\", {include-group = \"lint\"}]\n\
                           lint = [\"mypy\"]\ndocs = [\"sphinx\"]\n";
    const VIRTUAL: &str = "[project]\nname = \"app\"\nversion = \"1\"\n\
                           dependencies = [\"flask\"]\n[dependency-groups]\ndev = [\"pytest\"]\n";
    const SETTINGS: &str = "[tool.ruff]\nline-length = 100\n[tool.pytest.ini_options]\n";

    fn project_step(plan: &Plan) -> &Project {
        plan.steps
            .iter()
            .find_map(|step| match step {
                Step::Project(project) => Some(project),
                _ => None,
            })
            .expect("a project step")
    }

    #[test]
    fn manifests_map_to_steps_in_order() {
        assert_eq!(plan_of(&[]), Plan::default());
        let all = plan_of(&[
            ("setup.sh", ""),
            ("package.json", ""),
            ("requirements.txt", ""),
            ("pyproject.toml", VIRTUAL),
            ("uv.lock", ""),
        ]);
        assert!(matches!(
            all.steps.as_slice(),
            [
                Step::Project(Project { locked: true, .. }),
                Step::Requirements(_),
                Step::NpmInstall,
                Step::SetupScript
            ]
        ));
        assert_eq!(
            all.python.as_deref(),
            Some(
                "installing the project in pyproject.toml as uv.lock pins it, then requirements.txt"
            )
        );
        assert_eq!(plan_of(&[("uv.lock", "")]).steps, vec![]);
        assert_eq!(
            plan_of(&[("package.json", ""), ("package-lock.json", "")]).steps,
            vec![Step::NpmCi]
        );
        assert_eq!(
            plan_of(&[("package.json", ""), ("npm-shrinkwrap.json", "")]).steps,
            vec![Step::NpmCi]
        );
    }

    #[test]
    fn a_requirements_app_with_a_pyproject_that_declares_no_package_installs_its_requirements() {
        for (pyproject, why) in [
            (
                SETTINGS,
                "installing from requirements.txt: pyproject.toml declares no build system (a \
                 settings-only pyproject)",
            ),
            (
                VIRTUAL,
                "installing from requirements.txt: pyproject.toml declares no build system, so \
                 its [project] table names no package to install",
            ),
            (
                "[project]\nname = \"x\"\n[tool.uv]\npackage = false\n[build-system]\n",
                "installing from requirements.txt: pyproject.toml declares no build system, so \
                 its [project] table names no package to install",
            ),
        ] {
            let plan = plan_of(&[
                ("pyproject.toml", pyproject),
                ("requirements.txt", "flask\n"),
            ]);
            assert_eq!(
                plan.steps,
                vec![Step::Requirements(vec!["requirements.txt".into()])],
                "{pyproject}"
            );
            assert_eq!(plan.python.as_deref(), Some(why));
        }
        // A package installs as one, and then its requirements.txt, as before.
        let plan = plan_of(&[("pyproject.toml", PACKAGE), ("requirements.txt", "")]);
        assert!(project_step(&plan).package);
        assert_eq!(plan.steps.len(), 2);
        assert_eq!(
            plan.python.as_deref(),
            Some(
                "installing the project in pyproject.toml: it declares a build system, then requirements.txt"
            )
        );
        let plan = plan_of(&[(
            "pyproject.toml",
            "[project]\nname = \"x\"\n[tool.uv]\npackage = true\n",
        )]);
        assert!(project_step(&plan).package);
        // Without requirements.txt a virtual project's dependencies are installed, as uv does;
        // settings alone ask for nothing.
        let plan = plan_of(&[("pyproject.toml", VIRTUAL)]);
        assert!(!project_step(&plan).package);
        assert_eq!(project_step(&plan).pip_requirements, ["flask", "pytest"]);
        let plan = plan_of(&[("pyproject.toml", SETTINGS)]);
        assert!(!plan.has_python(), "{plan:?}");
        assert!(
            plan.python
                .is_some_and(|why| why.starts_with("nothing to install"))
        );
        // One that does not parse is the installer's to judge.
        let plan = plan_of(&[("pyproject.toml", "[project"), ("requirements.txt", "")]);
        assert!(project_step(&plan).package);
    }

    #[test]
    fn the_setting_names_requirements_files_groups_and_extras() {
        let dir = source(&[
            ("pyproject.toml", PACKAGE),
            ("requirements.txt", ""),
            ("requirements/dev.txt", ""),
        ]);
        let setting = |requirements: &[&str], project: Option<PythonProject>| PythonInstall {
            requirements: requirements.iter().map(|file| (*file).to_owned()).collect(),
            project,
        };
        let named = plan(
            dir.path(),
            Some(&setting(
                &["requirements.txt", "requirements/dev.txt"],
                None,
            )),
        )
        .expect("plan");
        assert_eq!(
            named.steps,
            vec![Step::Requirements(vec![
                "requirements.txt".into(),
                "requirements/dev.txt".into()
            ])]
        );
        assert_eq!(
            named.python.as_deref(),
            Some("install.python names requirements.txt, requirements/dev.txt")
        );
        let groups = plan(
            dir.path(),
            Some(&setting(
                &[],
                Some(PythonProject {
                    groups: Some(vec!["Docs".into(), "dev".into()]),
                    extras: vec!["test".into()],
                }),
            )),
        )
        .expect("plan");
        let project = project_step(&groups);
        assert_eq!(project.pip_requirements, ["sphinx", "ruff", "mypy"]);
        let uv = Toolchain {
            uv: true,
            venv_exists: false,
            reused: None,
        };
        let pip = Toolchain { uv: false, ..uv };
        let shown = |toolchain| {
            groups.steps[0]
                .commands(toolchain)
                .iter()
                .map(|argv| display(argv))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            shown(uv),
            ["uv sync --no-default-groups --group Docs --group dev --extra test"]
        );
        assert_eq!(
            shown(pip),
            [
                "python3 -m venv .venv",
                ".venv/bin/pip install .[test] sphinx ruff mypy"
            ]
        );
        for (bad, says) in [
            (
                setting(&["requirements-dev.txt"], None),
                "requirements file requirements-dev.txt",
            ),
            (
                setting(
                    &[],
                    Some(PythonProject {
                        groups: Some(vec!["nope".into()]),
                        extras: Vec::new(),
                    }),
                ),
                "the dependency group \"nope\", and pyproject.toml's [dependency-groups] has no \
                 such group (it defines dev, docs, lint)",
            ),
            (
                setting(
                    &[],
                    Some(PythonProject {
                        groups: None,
                        extras: vec!["web".into()],
                    }),
                ),
                "the extra \"web\"",
            ),
        ] {
            let error = plan(dir.path(), Some(&bad)).expect_err(says).to_string();
            assert!(error.contains(says), "{error}");
        }
        let empty = source(&[("requirements.txt", "")]);
        let error = plan(
            empty.path(),
            Some(&setting(&[], Some(PythonProject::default()))),
        )
        .expect_err("no pyproject");
        assert_eq!(error, PlanError::NoPyproject);
        assert!(error.to_string().contains("no pyproject.toml"), "{error}");
        // A path through a link is no file of the project's.
        std::os::unix::fs::symlink(dir.path(), empty.path().join("linked")).expect("link");
        let error = plan(
            empty.path(),
            Some(&setting(&["linked/requirements.txt"], None)),
        )
        .expect_err("through a link");
        assert_eq!(
            error,
            PlanError::NoRequirementsFile("linked/requirements.txt".to_owned())
        );
        assert!(error.to_string().contains("no such file"), "{error}");
    }

    #[test]
    fn pip_installs_the_groups_uv_installs_by_default() {
        let pip = Toolchain {
            uv: false,
            venv_exists: true,
            reused: None,
        };
        let shown = |pyproject: &str| -> Vec<String> {
            let plan = plan_of(&[("pyproject.toml", pyproject)]);
            plan.steps[0]
                .commands(pip)
                .iter()
                .map(|argv| display(argv))
                .collect()
        };
        assert_eq!(shown(PACKAGE), [".venv/bin/pip install . ruff mypy"]);
        assert_eq!(shown(VIRTUAL), [".venv/bin/pip install flask pytest"]);
        let defaults = format!("{PACKAGE}[tool.uv]\ndefault-groups = [\"docs\"]\n");
        assert_eq!(shown(&defaults), [".venv/bin/pip install . sphinx"]);
        let all = format!("{PACKAGE}[tool.uv]\ndefault-groups = \"all\"\n");
        assert_eq!(shown(&all), [".venv/bin/pip install . ruff mypy sphinx"]);
        // Nothing to install: the venv alone.
        assert!(shown("[project]\nname = \"x\"\n").is_empty());
        for (pyproject, says) in [
            (
                "[dependency-groups]\ndev = [{include-group = \"dev\"}]\n",
                "in a cycle: dev -> dev",
            ),
            (
                "[dependency-groups]\ndev = [{include-group = \"other\"}]\n",
                "includes \"other\"",
            ),
            (
                "[dependency-groups]\ndev = [\"--index-url=x\"]\n",
                "not a requirement",
            ),
            ("[dependency-groups]\ndev = [3]\n", "neither"),
            (
                "[tool.uv]\ndefault-groups = [\"x\"]\n[project]\nname = \"a\"\n",
                "default-groups",
            ),
        ] {
            let error =
                plan(source(&[("pyproject.toml", pyproject)]).path(), None).expect_err(says);
            assert!(matches!(error, PlanError::Pyproject(_)), "{error:?}");
            assert!(error.to_string().contains(says), "{error}");
        }
    }

    #[test]
    fn a_directory_is_not_a_manifest() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(dir.path().join("setup.sh")).expect("mkdir");
        assert!(plan(dir.path(), None).expect("plan").is_empty());
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
        let shown = |step: &Step, toolchain| {
            step.commands(toolchain)
                .iter()
                .map(|argv| display(argv))
                .collect::<Vec<_>>()
        };
        let requirements = Step::Requirements(vec![REQUIREMENTS.to_owned()]);
        let locked = Step::Project(Project {
            locked: true,
            package: true,
            ..Project::default()
        });
        assert_eq!(
            shown(&requirements, with_uv),
            ["uv venv .venv", "uv pip install -r requirements.txt"]
        );
        assert_eq!(
            shown(&requirements, without_uv),
            [
                "python3 -m venv .venv",
                ".venv/bin/pip install -r requirements.txt"
            ]
        );
        assert_eq!(
            shown(
                &requirements,
                Toolchain {
                    uv: true,
                    venv_exists: true,
                    reused: None,
                }
            ),
            ["uv pip install -r requirements.txt"]
        );
        assert_eq!(shown(&locked, with_uv), ["uv sync --locked"]);
        assert_eq!(
            shown(&locked, without_uv),
            ["python3 -m venv .venv", ".venv/bin/pip install ."]
        );
        assert_eq!(shown(&Step::NpmCi, with_uv), ["npm ci"]);
        assert_eq!(shown(&Step::SetupScript, without_uv), ["bash setup.sh"]);
        let scripts = ["postinstall".to_owned(), "prepare".to_owned()];
        let reused = Toolchain {
            uv: true,
            venv_exists: true,
            reused: Some(&scripts),
        };
        assert_eq!(
            shown(&Step::NpmCi, reused),
            [
                "npm run --ignore-scripts postinstall",
                "npm run --ignore-scripts prepare"
            ]
        );
        assert_eq!(shown(&Step::NpmInstall, reused), ["npm install"]);
        assert_eq!(shown(&locked, reused), ["uv sync --locked"]);
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
