//! What a build's reuse key is made of, beyond the mount path and the toolchain: every file an
//! installer reads and the registry settings it installs from. Two builds whose keys are equal
//! install equal dependency trees, so the later may start from the earlier's `.venv` and
//! `node_modules` (the installers still run over them: see [`crate::manifests::Toolchain`]).
//!
//! The files, each by its content's digest, absent ones left out:
//!
//! - Python: `pyproject.toml`, `uv.lock`, `uv.toml`, `.python-version`, `setup.py`,
//!   `setup.cfg`, `requirements.txt`, and every file `requirements.txt` includes
//!   (`-r`/`--requirement`, `-c`/`--constraint`, transitively), the `pyproject.toml`,
//!   `setup.py` and `setup.cfg` of every local directory it installs (`-e ./lib`, `./lib`),
//!   and the files of every local `--find-links`/`-f` directory it names;
//! - Node: `package.json`, `package-lock.json`, `npm-shrinkwrap.json`, `.npmrc`, `.nvmrc`,
//!   `.node-version`;
//! - `setup.sh`;
//! - the requirements files the environment's `install.python` names, followed as
//!   `requirements.txt` is, and the setting itself ([`python`]).
//!
//! Included paths are resolved beneath the project only: a reference that leaves it (`..`,
//! absolute) adds nothing, since the build could not read it either.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

use plinth_blobs::Digest;

use crate::manifests::PythonInstall;
use crate::registries::Registries;

/// Files at the project's root that installers read.
pub const ROOT_INPUTS: [&str; 16] = [
    "pyproject.toml",
    "uv.lock",
    "uv.toml",
    ".python-version",
    "setup.py",
    "setup.cfg",
    "requirements.txt",
    "package.json",
    "package-lock.json",
    "npm-shrinkwrap.json",
    ".npmrc",
    ".nvmrc",
    ".node-version",
    "setup.sh",
    "pip.conf",
    "MANIFEST.in",
];

/// Most requirement files followed from `requirements.txt`, and most files hashed from local
/// find-links directories: a key is a summary, not an inventory.
const MAX_INCLUDES: usize = 256;
const MAX_FIND_LINKS_FILES: usize = 4096;

/// The key's files: path beneath the project to its content's digest, in path order.
/// `python` is the environment's `install.python`: the requirements files it names are
/// followed as `requirements.txt` is.
pub fn inputs(
    root: &Path,
    python: Option<&PythonInstall>,
) -> std::io::Result<Vec<(String, Digest)>> {
    let mut found = BTreeMap::new();
    for name in ROOT_INPUTS {
        add(root, Path::new(name), &mut found)?;
    }
    let mut pending = vec![PathBuf::from("requirements.txt")];
    for file in python
        .map(|python| python.requirements.as_slice())
        .unwrap_or_default()
    {
        let Some(path) = beneath(Path::new(""), file) else {
            continue;
        };
        if !found.contains_key(&display(&path)) {
            add(root, &path, &mut found)?;
        }
        pending.push(path);
    }
    let mut seen = 0;
    while let Some(file) = pending.pop() {
        seen += 1;
        if seen > MAX_INCLUDES {
            break;
        }
        let Some(text) = read_regular(root, &file)? else {
            continue;
        };
        let base = file.parent().unwrap_or(Path::new("")).to_owned();
        for reference in references(&text) {
            let Some(path) = beneath(&base, &reference.path) else {
                continue;
            };
            match reference.kind {
                Kind::Requirements => {
                    if !found.contains_key(&display(&path)) {
                        add(root, &path, &mut found)?;
                        pending.push(path);
                    }
                }
                Kind::LocalProject => {
                    for name in ["pyproject.toml", "setup.py", "setup.cfg"] {
                        add(root, &path.join(name), &mut found)?;
                    }
                }
                Kind::FindLinks => find_links(root, &path, &mut found)?,
            }
        }
    }
    Ok(found.into_iter().collect())
}

/// What `install.python` adds to the key: which manifest, groups and extras (the files it
/// names are among [`inputs`]); empty without it, so keys of environments that say nothing
/// are as they were.
pub fn python(python: Option<&PythonInstall>) -> String {
    python
        .map(|python| {
            format!(
                "python {}\n",
                serde_json::to_string(python).unwrap_or_default()
            )
        })
        .unwrap_or_default()
}

/// The registry settings that change what gets installed (indexes, registry; not proxies or
/// certificates, which change only how it is fetched).
pub fn registries(registries: &Registries) -> String {
    format!(
        "python_index_url={:?} python_extra_index_urls={:?} npm_registry={:?}",
        registries.python_index_url, registries.python_extra_index_urls, registries.npm_registry
    )
}

#[derive(Debug, PartialEq, Eq)]
enum Kind {
    /// `-r`, `-c`: another requirements file.
    Requirements,
    /// `-e ./dir`, `./dir`: a local project installed from its manifests.
    LocalProject,
    /// `-f dir`, `--find-links dir`: a directory of distributions.
    FindLinks,
}

#[derive(Debug, PartialEq, Eq)]
struct Reference {
    kind: Kind,
    path: String,
}

/// The local files and directories a requirements file refers to.
fn references(text: &str) -> Vec<Reference> {
    let mut found = Vec::new();
    for line in text.lines() {
        let line = line.split(" #").next().unwrap_or("").trim();
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let (option, value) = match line.split_once(['=', ' ', '\t']) {
            Some((option, value)) if option.starts_with('-') => (option, value.trim()),
            _ if line.starts_with('-') => (line, ""),
            _ => ("", line),
        };
        let kind = match option {
            "-r" | "--requirement" | "-c" | "--constraint" => Kind::Requirements,
            "-f" | "--find-links" => Kind::FindLinks,
            "-e" | "--editable" | "" => Kind::LocalProject,
            _ => continue,
        };
        let value = value.trim_start_matches("file://");
        let local = kind != Kind::LocalProject
            || value == "."
            || value.starts_with("./")
            || value.starts_with("../");
        if value.is_empty() || value.contains("://") || !local {
            continue;
        }
        // A local project may carry extras or markers: `./lib[extra]; python_version > "3"`.
        let value = value
            .split([';', '['])
            .next()
            .unwrap_or("")
            .trim()
            .to_owned();
        found.push(Reference { kind, path: value });
    }
    found
}

/// `reference` relative to `base`, both beneath the project; none when it would leave it.
fn beneath(base: &Path, reference: &str) -> Option<PathBuf> {
    let mut path = base.to_owned();
    for component in Path::new(reference).components() {
        match component {
            Component::Normal(part) => path.push(part),
            Component::CurDir => {}
            Component::ParentDir => {
                if !path.pop() {
                    return None;
                }
            }
            Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    Some(path)
}

fn display(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

/// The largest input file read (a manifest, a lock file, a local wheel); a larger one is
/// refused rather than read into memory.
const MAX_INPUT_BYTES: u64 = 256 * 1024 * 1024;

/// A regular file's bytes beneath `root`; none when absent, not a regular file, or when a link
/// is on the way (no link is followed: [`crate::beneath`]).
fn read_regular_bytes(root: &Path, path: &Path) -> std::io::Result<Option<Vec<u8>>> {
    let root = crate::beneath::open_root(root)?;
    let (file, stat) = match crate::beneath::lstat(&root, path)? {
        Some(stat) if crate::beneath::kind(&stat) == rustix::fs::FileType::RegularFile => {
            crate::beneath::open_regular(&root, path)?
        }
        _ => return Ok(None),
    };
    if u64::try_from(stat.st_size).unwrap_or(u64::MAX) > MAX_INPUT_BYTES {
        return Err(std::io::Error::other(format!(
            "{}: larger than {MAX_INPUT_BYTES} bytes",
            display(path)
        )));
    }
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut std::io::Read::take(file, MAX_INPUT_BYTES), &mut bytes)?;
    Ok(Some(bytes))
}

fn read_regular(root: &Path, path: &Path) -> std::io::Result<Option<String>> {
    Ok(read_regular_bytes(root, path)?.map(|bytes| String::from_utf8_lossy(&bytes).into_owned()))
}

fn add(root: &Path, path: &Path, found: &mut BTreeMap<String, Digest>) -> std::io::Result<()> {
    if let Some(bytes) = read_regular_bytes(root, path)? {
        found.insert(display(path), Digest::of(&bytes));
    }
    Ok(())
}

/// Every regular file directly in a local find-links directory (a directory beneath `root`,
/// reached through no link).
fn find_links(
    root: &Path,
    dir: &Path,
    found: &mut BTreeMap<String, Digest>,
) -> std::io::Result<()> {
    let fd = crate::beneath::open_root(root)?;
    let listing = match crate::beneath::open_dir(&fd, dir) {
        Ok(listing) => listing,
        Err(error) if crate::beneath::absent(&error) => return Ok(()),
        Err(error) => return Err(error),
    };
    let names: Vec<_> = crate::beneath::entries(&listing)?
        .into_iter()
        .map(|(name, _)| name)
        .collect();
    for name in names.into_iter().take(MAX_FIND_LINKS_FILES) {
        add(root, &dir.join(name), found)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requirement_files_name_what_they_include() {
        let text = "-r base.txt\n--requirement=dev/more.txt\n-c constraints.txt\n\
                    -e .\n./lib[extra]; python_version > '3'\n--find-links wheels\n\
                    -f https://example.invalid/simple\nflask==3.0 # a comment\n\
                    -e git+https://example.invalid/x.git\n--no-index\n";
        let found = references(text);
        let paths: Vec<&str> = found.iter().map(|r| r.path.as_str()).collect();
        assert_eq!(found[2].kind, Kind::Requirements);
        assert_eq!(found[4].kind, Kind::LocalProject);
        assert_eq!(found[5].kind, Kind::FindLinks);
        assert_eq!(
            paths,
            [
                "base.txt",
                "dev/more.txt",
                "constraints.txt",
                ".",
                "./lib",
                "wheels"
            ]
        );
    }

    #[test]
    fn each_root_input_changed_alone_changes_the_inputs() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        for name in ROOT_INPUTS {
            std::fs::write(root.join(name), "first\n").expect("write");
        }
        std::fs::write(root.join("README.md"), "not an input\n").expect("write");
        let before = inputs(root, None).expect("inputs");
        assert_eq!(before.len(), ROOT_INPUTS.len());
        std::fs::write(root.join("README.md"), "changed\n").expect("write");
        assert_eq!(inputs(root, None).expect("inputs"), before);
        for name in ROOT_INPUTS {
            std::fs::write(root.join(name), "second\n").expect("write");
            assert_ne!(inputs(root, None).expect("inputs"), before, "{name}");
            std::fs::write(root.join(name), "first\n").expect("write");
        }
    }

    #[test]
    fn every_input_changes_the_key_and_nothing_leaves_the_project() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("project");
        std::fs::create_dir_all(root.join("dev")).expect("mkdir");
        std::fs::create_dir_all(root.join("wheels")).expect("mkdir");
        std::fs::write(dir.path().join("outside.txt"), "secret").expect("write");
        std::fs::write(
            root.join("requirements.txt"),
            "-r dev/more.txt\n-r ../outside.txt\n-r /etc/passwd\n--find-links wheels\n",
        )
        .expect("write");
        std::fs::write(root.join("dev/more.txt"), "-c ../constraints.txt\n").expect("write");
        std::fs::write(root.join("constraints.txt"), "x<2\n").expect("write");
        std::fs::write(root.join("wheels/x-1.0-py3-none-any.whl"), "wheel").expect("write");
        std::fs::write(root.join(".python-version"), "3.11\n").expect("write");
        let names = |root: &Path| -> Vec<String> {
            inputs(root, None)
                .expect("inputs")
                .into_iter()
                .map(|(path, _)| path)
                .collect()
        };
        assert_eq!(
            names(&root),
            [
                ".python-version",
                "constraints.txt",
                "dev/more.txt",
                "requirements.txt",
                "wheels/x-1.0-py3-none-any.whl"
            ]
        );
        let before = inputs(&root, None).expect("inputs");
        std::fs::write(root.join("constraints.txt"), "x<3\n").expect("write");
        assert_ne!(inputs(&root, None).expect("inputs"), before);
    }

    #[test]
    fn the_settings_requirements_files_and_what_they_include_are_inputs() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        std::fs::create_dir_all(root.join("requirements")).expect("mkdir");
        std::fs::write(root.join("requirements/dev.txt"), "-r base.txt\npytest\n").expect("write");
        std::fs::write(root.join("requirements/base.txt"), "flask\n").expect("write");
        let setting = PythonInstall {
            requirements: vec!["requirements/dev.txt".into(), "../outside.txt".into()],
            project: None,
        };
        let names: Vec<String> = inputs(root, Some(&setting))
            .expect("inputs")
            .into_iter()
            .map(|(path, _)| path)
            .collect();
        assert_eq!(names, ["requirements/base.txt", "requirements/dev.txt"]);
        assert!(inputs(root, None).expect("inputs").is_empty());
        assert_eq!(python(None), "");
        assert_ne!(
            python(Some(&setting)),
            python(Some(&PythonInstall::default()))
        );
    }
}
