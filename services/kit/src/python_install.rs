//! An environment's `install.python` setting: which Python manifest a build installs, named by
//! its owner instead of chosen from the manifests found (`plinth_builder::manifests`). The
//! catalog accepts it and the builder runs it; both check it by [`PythonInstall::check`], so
//! the rule is written once, as the slug's is ([`crate::slug`]).
//!
//! ```json
//! {"requirements": ["requirements.txt", "requirements-dev.txt"]}
//! {"project": {"groups": ["dev", "docs"], "extras": ["test"]}}
//! {"project": {}, "requirements": ["requirements-dev.txt"]}
//! ```
//!
//! - `requirements`: requirements files, relative to the project's root, installed together
//!   into `.venv` (`uv pip install -r a -r b`, or pip's).
//! - `project`: the project in `pyproject.toml` (`uv sync`, with `uv.lock` `uv sync --locked`;
//!   without uv, pip): `groups` are the dependency groups (PEP 735) to install, all of them
//!   and only them (left out: uv's defaults, the `dev` group); `extras` the optional
//!   dependencies.
//! - Both: the project first, then the requirements files.

use serde::{Deserialize, Serialize};

/// Most requirements files, groups or extras a setting names.
pub const MAX_NAMES: usize = 32;
/// Most characters of a requirements file's path.
pub const MAX_PATH_CHARS: usize = 255;
/// Most characters of a group's or an extra's name.
pub const MAX_NAME_CHARS: usize = 64;

/// What a build installs for Python, as its environment's owner names it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PythonInstall {
    /// Requirements files, relative to the project's root, in the order given.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub requirements: Vec<String>,
    /// The project in `pyproject.toml`; `None`: it is not installed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<PythonProject>,
}

/// The project in `pyproject.toml`, with which of its groups and extras.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PythonProject {
    /// Dependency groups (PEP 735), exactly these; `None`: uv's default groups (`dev`, or
    /// what `tool.uv.default-groups` says).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub groups: Option<Vec<String>>,
    /// Optional dependencies (`[project.optional-dependencies]`) to install with it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extras: Vec<String>,
}

/// What to write, quoted in errors.
const EXAMPLES: &str = r#"{"requirements": ["requirements.txt"]}, {"project": {"groups": ["dev"], "extras": ["test"]}}, or both"#;

/// Why an `install.python` setting is refused: each names the field at fault, what is wrong
/// and what to write.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InstallSettingError {
    /// Neither requirements files nor the project.
    #[error(
        "install.python: names nothing to install; write {examples} (or null, to let the \
         manifests found decide)",
        examples = EXAMPLES
    )]
    NothingToInstall,
    /// More than [`MAX_NAMES`] files, groups or extras.
    #[error("{field}: {count} {what}; at most {MAX_NAMES}")]
    TooMany {
        /// `install.python.requirements`, `….project.groups` or `….project.extras`.
        field: String,
        /// How many were given.
        count: usize,
        /// `files` or `names`.
        what: &'static str,
    },
    /// A requirements file's path that is not one beneath the project's root.
    #[error(
        "{field}: {path:?} {why}; write a path relative to the project's root, such as \
         \"requirements-dev.txt\" or \"requirements/dev.txt\""
    )]
    BadPath {
        /// `install.python.requirements[i]`.
        field: String,
        /// The path given.
        path: String,
        /// What is wrong with it (`leaves the project`, …).
        why: &'static str,
    },
    /// A path or name given twice.
    #[error("{field}: {value:?} is named twice")]
    NamedTwice {
        /// The field, with its index.
        field: String,
        /// The repeated value.
        value: String,
    },
    /// A group or extra that is no name `pyproject.toml` can give.
    #[error(
        "{field}: {name:?} is not a name pyproject.toml can give (1 to {MAX_NAME_CHARS} \
         letters, digits, \".\", \"-\" and \"_\", starting and ending with a letter or \
         digit), such as {example:?}"
    )]
    BadName {
        /// The field, with its index.
        field: String,
        /// The name given.
        name: String,
        /// A name that would do.
        example: &'static str,
    },
}

impl PythonInstall {
    /// Checks every rule; the error names the field at fault, what is wrong and what to
    /// write (`install.python.requirements[1]: "../x.txt" leaves the project; …`).
    pub fn check(&self) -> Result<(), InstallSettingError> {
        const FIELD: &str = "install.python";
        if self.requirements.is_empty() && self.project.is_none() {
            return Err(InstallSettingError::NothingToInstall);
        }
        if self.requirements.len() > MAX_NAMES {
            return Err(InstallSettingError::TooMany {
                field: format!("{FIELD}.requirements"),
                count: self.requirements.len(),
                what: "files",
            });
        }
        for (index, path) in self.requirements.iter().enumerate() {
            let field = format!("{FIELD}.requirements[{index}]");
            if let Err(why) = check_path(path) {
                return Err(InstallSettingError::BadPath {
                    field,
                    path: path.clone(),
                    why,
                });
            }
            if self.requirements[..index].contains(path) {
                return Err(InstallSettingError::NamedTwice {
                    field,
                    value: path.clone(),
                });
            }
        }
        if let Some(project) = &self.project {
            let groups = project.groups.as_deref().unwrap_or_default();
            for (what, names, example) in [
                ("groups", groups, "dev"),
                ("extras", project.extras.as_slice(), "test"),
            ] {
                let field = format!("{FIELD}.project.{what}");
                if names.len() > MAX_NAMES {
                    return Err(InstallSettingError::TooMany {
                        field,
                        count: names.len(),
                        what: "names",
                    });
                }
                for (index, name) in names.iter().enumerate() {
                    if !is_name(name) {
                        return Err(InstallSettingError::BadName {
                            field: format!("{field}[{index}]"),
                            name: name.clone(),
                            example,
                        });
                    }
                    // Names that differ only as PEP 503 normalizes them (`Dev`, `dev`) name
                    // one group to the installer, which takes it once.
                    if names[..index].contains(name) {
                        return Err(InstallSettingError::NamedTwice {
                            field: format!("{field}[{index}]"),
                            value: name.clone(),
                        });
                    }
                }
            }
        }
        Ok(())
    }

    /// How the build log names it: `requirements.txt, requirements-dev.txt`, `the project in
    /// pyproject.toml (groups dev, docs; extras test) and requirements-dev.txt`.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(project) = &self.project {
            let mut with = Vec::new();
            match project.groups.as_deref() {
                None => {}
                Some([]) => with.push("no groups".to_owned()),
                Some(groups) => with.push(format!("groups {}", groups.join(", "))),
            }
            if !project.extras.is_empty() {
                with.push(format!("extras {}", project.extras.join(", ")));
            }
            parts.push(if with.is_empty() {
                "the project in pyproject.toml".to_owned()
            } else {
                format!("the project in pyproject.toml ({})", with.join("; "))
            });
        }
        if !self.requirements.is_empty() {
            parts.push(self.requirements.join(", "));
        }
        parts.join(" and ")
    }
}

/// Why `path` is no requirements file's path beneath a project's root, if it is not.
fn check_path(path: &str) -> Result<(), &'static str> {
    if path.is_empty() {
        return Err("is empty");
    }
    if path.chars().count() > MAX_PATH_CHARS {
        return Err("is longer than 255 characters");
    }
    if path.chars().any(char::is_control) {
        return Err("holds a control character");
    }
    if path.starts_with('/') {
        return Err("is absolute");
    }
    // An installer would read it as an option.
    if path.starts_with('-') {
        return Err("starts with \"-\"");
    }
    for segment in path.split('/') {
        match segment {
            "" => return Err("has an empty segment"),
            "." => return Err("has a \".\" segment"),
            ".." => return Err("leaves the project"),
            _ => {}
        }
    }
    Ok(())
}

/// Whether `name` is a valid distribution, extra or group name (PEP 508, PEP 685, PEP 735).
fn is_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    let inner = |b: &u8| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_');
    !bytes.is_empty()
        && name.chars().count() <= MAX_NAME_CHARS
        && bytes.iter().all(inner)
        && bytes.first().is_some_and(u8::is_ascii_alphanumeric)
        && bytes.last().is_some_and(u8::is_ascii_alphanumeric)
}

/// A Python name (a package's, a group's, an extra's) as compared (PEP 503): lowercase, runs
/// of `-`, `_` and `.` as one `-`.
pub fn normalized(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut separator = false;
    for c in name.chars() {
        if matches!(c, '-' | '_' | '.') {
            separator = true;
            continue;
        }
        if separator && !out.is_empty() {
            out.push('-');
        }
        separator = false;
        out.extend(c.to_lowercase());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn requirements(paths: &[&str]) -> PythonInstall {
        PythonInstall {
            requirements: paths.iter().map(|path| (*path).to_owned()).collect(),
            project: None,
        }
    }

    fn project(groups: Option<&[&str]>, extras: &[&str]) -> PythonInstall {
        let owned = |names: &[&str]| names.iter().map(|name| (*name).to_owned()).collect();
        PythonInstall {
            requirements: Vec::new(),
            project: Some(PythonProject {
                groups: groups.map(owned),
                extras: owned(extras),
            }),
        }
    }

    #[test]
    fn good_settings_pass_and_say_what_they_install() {
        let both = PythonInstall {
            requirements: vec!["requirements-dev.txt".into()],
            ..project(Some(&["dev", "docs"]), &["test"])
        };
        for good in [
            requirements(&["requirements.txt", "requirements/dev.txt", ".reqs/a b.txt"]),
            project(None, &[]),
            project(Some(&[]), &[]),
            both.clone(),
        ] {
            assert_eq!(good.check(), Ok(()), "{good:?}");
        }
        assert_eq!(
            both.describe(),
            "the project in pyproject.toml (groups dev, docs; extras test) and requirements-dev.txt"
        );
        assert_eq!(requirements(&["a.txt", "b.txt"]).describe(), "a.txt, b.txt");
        assert_eq!(
            project(None, &[]).describe(),
            "the project in pyproject.toml"
        );
    }

    #[test]
    fn bad_settings_say_which_field_what_is_wrong_and_what_to_write() {
        for (bad, says) in [
            (PythonInstall::default(), "install.python: names nothing"),
            (
                requirements(&["../x.txt"]),
                "requirements[0]: \"../x.txt\" leaves the project",
            ),
            (requirements(&["/etc/passwd"]), "is absolute"),
            (requirements(&["a.txt", "--index-url=x"]), "requirements[1]"),
            (requirements(&[""]), "is empty"),
            (requirements(&["a//b"]), "empty segment"),
            (requirements(&["./a"]), "\".\" segment"),
            (requirements(&["a\nb"]), "control character"),
            (requirements(&["a.txt", "a.txt"]), "named twice"),
            (project(Some(&["my group"]), &[]), "groups[0]: \"my group\""),
            (project(None, &["-x"]), "extras[0]"),
            (
                project(None, &["test", "test"]),
                "extras[1]: \"test\" is named twice",
            ),
        ] {
            let error = bad.check().expect_err(says).to_string();
            assert!(error.contains(says), "{error}");
        }
        // Spellings PEP 503 makes one name are the installer's to merge, as written.
        project(Some(&["dev_tools", "dev.tools"]), &["Test", "test"])
            .check()
            .expect("spellings of one name");
        let long = "é".repeat(MAX_PATH_CHARS);
        requirements(&[long.as_str()])
            .check()
            .expect("255 characters, whatever their bytes");
        let error = requirements(&[format!("{long}x").as_str()])
            .check()
            .expect_err("256 characters")
            .to_string();
        assert!(error.contains("longer than 255 characters"), "{error}");
        let error = requirements(&["../x.txt"]).check().expect_err("bad");
        assert_eq!(
            error,
            InstallSettingError::BadPath {
                field: "install.python.requirements[0]".to_owned(),
                path: "../x.txt".to_owned(),
                why: "leaves the project",
            }
        );
        let error = error.to_string();
        assert!(error.contains("\"requirements-dev.txt\""), "{error}");
        let error = PythonInstall::default().check().expect_err("bad");
        assert_eq!(error, InstallSettingError::NothingToInstall);
        let error = error.to_string();
        assert!(
            error.contains(r#"{"requirements": ["requirements.txt"]}"#),
            "{error}"
        );
    }

    #[test]
    fn names_compare_as_pep_503_normalizes_them() {
        assert_eq!(normalized("Dev_Tools"), "dev-tools");
        assert_eq!(normalized("a.-_b"), "a-b");
        assert_eq!(normalized("test"), "test");
    }

    #[test]
    fn it_is_stored_as_the_json_owners_write() {
        let setting = project(Some(&["dev"]), &[]);
        let json = serde_json::to_string(&setting).expect("json");
        assert_eq!(json, r#"{"project":{"groups":["dev"]}}"#);
        assert_eq!(
            serde_json::from_str::<PythonInstall>(&json).expect("parse"),
            setting
        );
    }
}
