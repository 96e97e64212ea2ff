//! Whether this node can run what a version was built with.
//!
//! A venv names its interpreter by path (`.venv/bin/python -> /usr/bin/python3.11`) and a
//! pinned Node is linked the same way (`node_modules/.bin/node`). Both point outside the
//! version, at the builder's own files: a node whose image differs from the builder's would
//! give sessions a venv whose `python` is missing, or a different Python whose compiled
//! packages fail at import. So before a session attaches, the version's interpreter is looked
//! for here, and asked its version, and a difference is refused with what was expected and
//! what this node has.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, SystemTime};

use crate::cache::Materialized;

/// How long an interpreter may take to say its version.
const ASK_TIMEOUT: Duration = Duration::from_secs(5);

/// A version needs what this node does not have.
#[derive(Debug, thiserror::Error)]
#[error(
    "{what}; this node cannot run its sessions: run nodes from the same image as builders (a venv names its interpreter by path)"
)]
pub struct Mismatch {
    what: String,
}

/// Checks the interpreters `version` (at `/env/<slug>`) was built with against this node's.
pub fn check(version: &Materialized, slug: &str) -> Result<(), Mismatch> {
    if let Some((expected, interpreter)) = python(version) {
        let Some(found) = asked(&interpreter) else {
            return Err(Mismatch {
                what: format!(
                    "/env/{slug} was built with Python {expected} at {}, which this node does not have",
                    interpreter.display()
                ),
            });
        };
        if found != expected {
            return Err(Mismatch {
                what: format!(
                    "/env/{slug} was built with Python {expected} at {}, and this node's is Python {found}",
                    interpreter.display()
                ),
            });
        }
    }
    if let Some(node) = read_link(version, Path::new("node_modules/.bin/node"))
        && node.is_absolute()
        && !node.exists()
    {
        return Err(Mismatch {
            what: format!(
                "/env/{slug} was built with the Node at {}, which this node does not have",
                node.display()
            ),
        });
    }
    Ok(())
}

/// The Python version the venv records and the interpreter its `python` leads to, when the
/// version has a venv whose interpreter is outside it.
fn python(version: &Materialized) -> Option<(String, PathBuf)> {
    let config = read_small(version, Path::new(".venv/pyvenv.cfg"))?;
    let value = |key: &str| {
        config.lines().find_map(|line| {
            let (name, value) = line.split_once('=')?;
            (name.trim() == key).then(|| value.trim().to_owned())
        })
    };
    let recorded = value("version_info").or_else(|| value("version"))?;
    // `version_info` may carry a release level (`3.11.7.final.0`).
    let expected = recorded.split('.').take(3).collect::<Vec<_>>().join(".");
    // `python -> /usr/bin/python3.11` (uv), or through siblings (`python -> python3 ->
    // /usr/bin/python3`, venv).
    let mut name = PathBuf::from("python");
    for _ in 0..4 {
        let target = read_link(version, &Path::new(".venv/bin").join(&name))?;
        if target.is_absolute() {
            return Some((expected, target));
        }
        if target.components().count() != 1 {
            return None;
        }
        name = target;
    }
    None
}

/// Where `relative` is in the version: its own directory first, then the layers under it,
/// as the session's overlay shows them.
fn find(version: &Materialized, relative: &Path) -> Option<PathBuf> {
    std::iter::once(&version.path)
        .chain(&version.lower)
        .map(|dir| dir.join(relative))
        .find(|path| std::fs::symlink_metadata(path).is_ok())
}

fn read_link(version: &Materialized, relative: &Path) -> Option<PathBuf> {
    if let Some(lazy) = &version.lazy {
        return lazy.read_link(relative.to_str()?);
    }
    std::fs::read_link(find(version, relative)?).ok()
}

fn read_small(version: &Materialized, relative: &Path) -> Option<String> {
    use std::io::Read as _;
    if let Some(lazy) = &version.lazy {
        return String::from_utf8(lazy.read(relative.to_str()?, 64 * 1024)?).ok();
    }
    let file = std::fs::File::open(find(version, relative)?).ok()?;
    let mut text = String::new();
    file.take(64 * 1024).read_to_string(&mut text).ok()?;
    Some(text)
}

/// What `interpreter` says its version is (`3.11.7`), remembered while the file is
/// unchanged; `None` when it is missing or does not answer.
fn asked(interpreter: &Path) -> Option<String> {
    static ASKED: OnceLock<Mutex<HashMap<PathBuf, (SystemTime, String)>>> = OnceLock::new();
    let modified = std::fs::metadata(interpreter).ok()?.modified().ok()?;
    let asked = ASKED.get_or_init(Default::default);
    if let Some((when, version)) = asked
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .get(interpreter)
        && *when == modified
    {
        return Some(version.clone());
    }
    let mut child = std::process::Command::new(interpreter)
        .args([
            "-I",
            "-c",
            "import sys; print('%d.%d.%d' % sys.version_info[:3])",
        ])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .ok()?;
    let deadline = std::time::Instant::now() + ASK_TIMEOUT;
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10));
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
        }
    }
    let output = child.wait_with_output().ok()?;
    let version = String::from_utf8(output.stdout).ok()?.trim().to_owned();
    if !output.status.success() || version.is_empty() {
        return None;
    }
    let mut asked = asked
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if asked.len() < 64 {
        asked.insert(interpreter.to_owned(), (modified, version.clone()));
    }
    Some(version)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn version(dir: &Path) -> Materialized {
        Materialized {
            path: dir.join("top"),
            lower: vec![dir.join("base")],
            fetched: 0,
            took: Duration::ZERO,
            lazy: None,
        }
    }

    fn venv(layer: &Path, recorded: &str, interpreter: &Path) {
        std::fs::create_dir_all(layer.join(".venv/bin")).expect("venv");
        std::fs::write(
            layer.join(".venv/pyvenv.cfg"),
            format!("home = /usr/bin\nversion_info = {recorded}\n"),
        )
        .expect("cfg");
        std::os::unix::fs::symlink(interpreter, layer.join(".venv/bin/python")).expect("link");
    }

    fn this_python() -> (PathBuf, String) {
        let python = PathBuf::from("/usr/bin/python3");
        let version = asked(&python).expect("the test host has /usr/bin/python3");
        (python, version)
    }

    #[test]
    fn a_venv_from_a_layer_below_is_checked_against_this_nodes_interpreter() {
        let dir = tempfile::tempdir().expect("dir");
        std::fs::create_dir_all(dir.path().join("top")).expect("top");
        let (python, found) = this_python();
        // The venv is in the base layer; the top layer changed other files only.
        venv(
            &dir.path().join("base"),
            &format!("{found}.final.0"),
            &python,
        );
        check(&version(dir.path()), "app").expect("the same interpreter");

        let other = tempfile::tempdir().expect("dir");
        std::fs::create_dir_all(other.path().join("top")).expect("top");
        venv(&other.path().join("base"), "3.4.1", &python);
        let error = check(&version(other.path()), "app")
            .expect_err("another version")
            .to_string();
        assert!(
            error.contains("built with Python 3.4.1 at /usr/bin/python3")
                && error.contains(&format!("this node's is Python {found}"))
                && error.contains("same image"),
            "{error}"
        );
    }

    #[test]
    fn a_missing_interpreter_or_node_is_named() {
        let dir = tempfile::tempdir().expect("dir");
        std::fs::create_dir_all(dir.path().join("base")).expect("base");
        venv(
            &dir.path().join("top"),
            "3.12.1",
            Path::new("/opt/python/3.12.1/bin/python3.12"),
        );
        let error = check(&version(dir.path()), "app")
            .expect_err("missing")
            .to_string();
        assert!(
            error.contains("/env/app was built with Python 3.12.1 at /opt/python/3.12.1/bin/python3.12, which this node does not have"),
            "{error}"
        );

        let dir = tempfile::tempdir().expect("dir");
        std::fs::create_dir_all(dir.path().join("top/node_modules/.bin")).expect("bin");
        std::os::unix::fs::symlink(
            "/opt/node-v99.0.0/bin/node",
            dir.path().join("top/node_modules/.bin/node"),
        )
        .expect("link");
        let error = check(&version(dir.path()), "web")
            .expect_err("missing")
            .to_string();
        assert!(
            error.contains("the Node at /opt/node-v99.0.0/bin/node"),
            "{error}"
        );
        // No venv, no pinned Node: nothing to check.
        let empty = tempfile::tempdir().expect("dir");
        check(&version(empty.path()), "plain").expect("nothing to check");
    }
}
