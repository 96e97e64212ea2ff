//! Builds that succeed or fail as a user would see them: what lands in the scratch directory,
//! what the layer says, what the log and errors say.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use plinth_builder::{EntryKind, InstallError, InstallOptions, Layer, LayerEntry, scan};

use crate::fixtures::{
    Fixtures, Scratch, build, host_env_mounts, require_npm, require_python, require_sandbox,
    require_uv,
};

fn entry<'a>(layer: &'a Layer, path: &str) -> &'a LayerEntry {
    layer
        .entries
        .iter()
        .find(|entry| entry.path == path)
        .unwrap_or_else(|| panic!("the layer has no {path}"))
}

fn packages(layer: &Layer) -> Vec<String> {
    layer
        .packages
        .iter()
        .map(|p| format!("{} {} {}", p.manager, p.name, p.version))
        .collect()
}

/// The `site-packages` directory of the scratch's venv.
fn site_packages(scratch: &Path) -> std::path::PathBuf {
    let lib = scratch.join(".venv/lib");
    let python = std::fs::read_dir(&lib)
        .expect("read .venv/lib")
        .map(|entry| entry.expect("entry").path())
        .find(|path| {
            path.file_name()
                .is_some_and(|name| name.to_string_lossy().starts_with("python"))
        })
        .expect("a python* directory");
    python.join("site-packages")
}

/// Checks a .pyc is hash-based and checked: its flags word (bytes 4..8) is 0b11.
fn assert_checked_hash_pyc(path: &Path) {
    let bytes = std::fs::read(path).expect("read pyc");
    assert_eq!(
        u32::from_le_bytes(bytes[4..8].try_into().expect("4 bytes")),
        3,
        "{} is not a checked-hash pyc",
        path.display()
    );
}

/// The one .pyc of `module` (a `.py` file's stem) in `dir/__pycache__`.
fn pyc_of(dir: &Path, module: &str) -> std::path::PathBuf {
    std::fs::read_dir(dir.join("__pycache__"))
        .unwrap_or_else(|error| panic!("{}/__pycache__: {error}", dir.display()))
        .map(|entry| entry.expect("entry").path())
        .find(|path| {
            let name = path.file_name().expect("name").to_string_lossy();
            name.starts_with(&format!("{module}.")) && name.ends_with(".pyc")
        })
        .unwrap_or_else(|| panic!("no .pyc for {module} in {}", dir.display()))
}

/// No file the build left in `.venv` or `node_modules` mentions where it was built on the host.
fn assert_no_scratch_path(scratch: &Path, layer: &Layer) {
    let host = std::fs::canonicalize(scratch).expect("canonicalize");
    let host = host.to_string_lossy();
    for entry in &layer.entries {
        if entry.kind == EntryKind::Symlink {
            let target = entry.target.as_deref().unwrap_or_default();
            assert!(
                !target.contains(host.as_ref()),
                "{} -> {target}",
                entry.path
            );
        }
        if entry.kind == EntryKind::File {
            let bytes = std::fs::read(scratch.join(&entry.path)).expect("read");
            assert!(
                !bytes
                    .windows(host.len())
                    .any(|window| window == host.as_bytes()),
                "{} mentions the scratch path {host}",
                entry.path
            );
        }
    }
}

#[tokio::test]
async fn a_project_with_requirements_package_json_and_setup_sh_builds_at_the_mount_path() {
    if !require_sandbox() || !require_npm() {
        return;
    }
    let Some(uv) = require_uv() else { return };
    let fixtures = Fixtures::new(Some(&uv));
    let scratch = Scratch::new(&[
        ("requirements.txt", "tinypkg\n"),
        ("package.json", &fixtures.package_json()),
        (
            "setup.sh",
            "set -e\n\
             tinytool > from-python.txt\n\
             tinynpm > from-node.txt\n\
             command -v tinytool > which-python.txt\n\
             command -v tinynpm > which-node.txt\n\
             site=$(echo .venv/lib/python3*/site-packages)\n\
             echo 'ADDED = 1' > \"$site/added_by_setup.py\"\n\
             echo setup done\n",
        ),
        ("app/main.py", "print('hi')\n"),
    ]);
    let slug = "studio";

    let (result, log) = build(&scratch, slug, &fixtures.options()).await;
    let report = result.unwrap_or_else(|error| panic!("{error}\nlog:\n{log}"));

    assert!(report.used_uv);
    assert_eq!(
        report.steps[..4],
        [
            "uv venv .venv",
            "uv pip install -r requirements.txt",
            "npm install",
            "bash setup.sh",
        ]
    );
    // uv compiled what it installed; the bytecode pass compiles only what had no bytecode.
    assert!(
        report.steps[4].contains("compileall") && report.steps[4].contains("-i /tmp/"),
        "{:?}",
        report.steps
    );
    for line in [
        "==> uv pip install -r requirements.txt\n",
        "==> npm install\n",
        "==> bash setup.sh\n",
        "setup done\n",
    ] {
        assert!(log.contains(line), "the log lacks {line:?}:\n{log}");
    }

    // setup.sh ran the installed tools, found first on PATH, at the mount path.
    assert_eq!(scratch.read("from-python.txt"), "tinytool ran\n");
    assert_eq!(scratch.read("from-node.txt"), "tinynpm ran\n");
    assert_eq!(
        scratch.read("which-python.txt"),
        format!("/env/{slug}/.venv/bin/tinytool\n")
    );
    assert_eq!(
        scratch.read("which-node.txt"),
        format!("/env/{slug}/node_modules/.bin/tinynpm\n")
    );

    // The venv is made for /env/<slug>, not for the scratch directory.
    let tinytool = scratch.read(".venv/bin/tinytool");
    assert!(
        tinytool.starts_with(&format!("#!/env/{slug}/.venv/bin/python")),
        "{tinytool}"
    );
    assert!(
        scratch
            .read(".venv/bin/activate")
            .contains(&format!("/env/{slug}/.venv")),
        "activate names the mount path"
    );
    // uv's pyvenv.cfg records the base interpreter (`home`), not the venv's own path.
    let cfg = scratch.read(".venv/pyvenv.cfg");
    assert!(cfg.lines().any(|line| line.starts_with("home = ")), "{cfg}");
    assert!(scratch.path.join("node_modules/.bin/tinynpm").exists());

    // Bytecode, hash-based so it stays valid however the files are materialized: uv's for
    // what it installed, the bytecode pass's for what setup.sh added.
    let site = site_packages(&scratch.path);
    let pyc = pyc_of(&site.join("tinypkg"), "__init__");
    assert_checked_hash_pyc(&pyc);
    assert_checked_hash_pyc(&pyc_of(&site, "added_by_setup"));
    // The download cache was in the scratch directory only while the build ran.
    assert!(!scratch.path.join(".plinth-build-cache").exists());
    assert!(!report.cache_discarded);

    // Everything the build made is the build uid's.
    for path in [
        ".venv/bin/tinytool",
        "node_modules/tinynpm/cli.js",
        "from-python.txt",
    ] {
        let metadata = std::fs::symlink_metadata(scratch.path.join(path)).expect("metadata");
        assert_eq!((metadata.uid(), metadata.gid()), (65534, 65534), "{path}");
    }

    // The layer describes it all.
    let layer = scan(&scratch.path).expect("scan");
    assert_eq!(packages(&layer), ["npm tinynpm 1.2.3", "pip tinypkg 1.0"]);
    let tool = entry(&layer, ".venv/bin/tinytool");
    assert_eq!(tool.kind, EntryKind::File);
    assert!(tool.executable);
    assert_eq!(
        tool.digest,
        Some(plinth_blobs::Digest::of(tinytool.as_bytes()))
    );
    let bin = entry(&layer, "node_modules/.bin/tinynpm");
    assert_eq!(bin.kind, EntryKind::Symlink);
    assert_eq!(bin.target.as_deref(), Some("../tinynpm/cli.js"));
    assert_eq!(entry(&layer, ".venv/bin/python").kind, EntryKind::Symlink);
    let pyc_path = pyc
        .strip_prefix(&scratch.path)
        .expect("under scratch")
        .to_string_lossy()
        .into_owned();
    assert!(entry(&layer, &pyc_path).digest.is_some());
    assert_eq!(entry(&layer, "app/main.py").size, 12);
    assert!(layer.bytes > 0);
    assert_eq!(layer.skipped, 0);
    assert_no_scratch_path(&scratch.path, &layer);

    // Nothing of the build's namespace leaked into the host's, and its HOME is gone.
    assert_eq!(host_env_mounts(), Vec::<String>::new());
    let leftovers: Vec<_> = std::fs::read_dir(scratch.parent.path())
        .expect("read parent")
        .map(|entry| entry.expect("entry").file_name())
        .collect();
    assert_eq!(leftovers, ["scratch"]);
}

#[tokio::test]
async fn pyproject_projects_run_uv_sync_and_uv_sync_locked() {
    if !require_sandbox() {
        return;
    }
    let Some(uv) = require_uv() else { return };
    let fixtures = Fixtures::new(Some(&uv));
    let cache = tempfile::tempdir().expect("tempdir");
    let options = InstallOptions {
        cache_dir: Some(cache.path().join("cache")),
        ..fixtures.options()
    };
    let pyproject = "[project]\nname = \"demo\"\nversion = \"0.1.0\"\n\
                     requires-python = \">=3.8\"\ndependencies = [\"tinypkg\"]\n\n\
                     [tool.uv]\npackage = false\n";

    // Without a lock: `uv sync` resolves and writes one.
    let unlocked = Scratch::new(&[("pyproject.toml", pyproject)]);
    let (result, log) = build(&unlocked, "unlocked", &options).await;
    let report = result.unwrap_or_else(|error| panic!("{error}\nlog:\n{log}"));
    assert_eq!(report.steps, ["uv sync"], "uv compiled; no bytecode pass");
    let installed = site_packages(&unlocked.path).join("tinypkg/__init__.py");
    assert_checked_hash_pyc(&pyc_of(installed.parent().expect("dir"), "__init__"));
    let lock = unlocked.read("uv.lock");
    assert!(lock.contains("name = \"tinypkg\""), "{lock}");
    assert!(
        cache.path().join("cache/uv").is_dir(),
        "uv used the persistent cache, and it was put back"
    );
    // Installed files are hard links into the cache, which is no part of the layer.
    let metadata = std::fs::metadata(&installed).expect("metadata");
    assert!(
        metadata.nlink() > 1,
        "{} is not linked",
        installed.display()
    );
    assert!(!unlocked.path.join(".plinth-build-cache").exists());
    assert!(
        scan(&unlocked.path)
            .expect("scan")
            .entries
            .iter()
            .all(|entry| !entry.path.starts_with(".plinth-build-cache"))
    );

    // With that lock: `uv sync --locked` installs exactly it.
    let locked = Scratch::new(&[("pyproject.toml", pyproject), ("uv.lock", &lock)]);
    let (result, log) = build(&locked, "locked", &options).await;
    let report = result.unwrap_or_else(|error| panic!("{error}\nlog:\n{log}"));
    assert_eq!(report.steps[0], "uv sync --locked");
    assert!(log.contains("==> uv sync --locked\n"), "{log}");
    let layer = scan(&locked.path).expect("scan");
    assert_eq!(packages(&layer), ["pip tinypkg 1.0"]);
}

#[tokio::test]
async fn a_step_that_changes_hard_linked_files_in_place_costs_the_cache() {
    if !require_sandbox() {
        return;
    }
    let Some(uv) = require_uv() else { return };
    let fixtures = Fixtures::new(Some(&uv));
    let cache = tempfile::tempdir().expect("tempdir");
    let options = InstallOptions {
        cache_dir: Some(cache.path().join("cache")),
        ..fixtures.options()
    };

    // Replacing an installed file (a new file under the old name) leaves the cache alone.
    let replacing = Scratch::new(&[
        ("requirements.txt", "tinypkg\n"),
        (
            "setup.sh",
            "f=$(echo .venv/lib/python3*/site-packages/tinypkg/__init__.py)\n\
             cp \"$f\" new.py && echo '# patched' >> new.py && mv new.py \"$f\"\n",
        ),
    ]);
    let (result, log) = build(&replacing, "replacing", &options).await;
    let report = result.unwrap_or_else(|error| panic!("{error}\nlog:\n{log}"));
    assert!(!report.cache_discarded, "{log}");
    assert!(cache.path().join("cache/uv").is_dir());

    // Appending to it writes the cache's copy too: that cache is not kept.
    let appending = Scratch::new(&[
        ("requirements.txt", "tinypkg\n"),
        (
            "setup.sh",
            "echo '# patched' >> .venv/lib/python3*/site-packages/tinypkg/__init__.py\n",
        ),
    ]);
    let (result, log) = build(&appending, "appending", &options).await;
    let report = result.unwrap_or_else(|error| panic!("{error}\nlog:\n{log}"));
    assert!(report.cache_discarded, "{log}");
    assert!(log.contains("the cache is discarded"), "{log}");
    assert!(!cache.path().join("cache").exists());
    assert!(!appending.path.join(".plinth-build-cache").exists());
    // The build itself has what its setup.sh made.
    let installed = site_packages(&appending.path).join("tinypkg/__init__.py");
    assert!(
        std::fs::read_to_string(installed)
            .expect("read")
            .ends_with("# patched\n")
    );

    // The next build starts from an empty cache and installs the wheel as it is.
    let next = Scratch::new(&[("requirements.txt", "tinypkg\n")]);
    let (result, log) = build(&next, "next", &options).await;
    result.unwrap_or_else(|error| panic!("{error}\nlog:\n{log}"));
    let installed = site_packages(&next.path).join("tinypkg/__init__.py");
    assert!(
        !std::fs::read_to_string(installed)
            .expect("read")
            .contains("patched")
    );
    assert!(cache.path().join("cache/uv").is_dir());
}

#[tokio::test]
async fn without_uv_requirements_fall_back_to_venv_and_pip() {
    if !require_sandbox() || !require_python() {
        return;
    }
    let fixtures = Fixtures::new(None);
    // A PATH with python3 and no uv. /usr/bin is that on a Debian machine; where uv was
    // installed into /usr/bin, a directory holding only python3 stands in for it.
    let mut path = "/usr/bin:/bin".to_owned();
    if plinth_builder::install::find_executable(&path, "uv").is_some() {
        let only_python = fixtures.dir.path().join("only-python");
        std::fs::create_dir(&only_python).expect("mkdir");
        crate::fixtures::chmod(&only_python, 0o755);
        std::os::unix::fs::symlink("/usr/bin/python3", only_python.join("python3"))
            .expect("symlink");
        path = only_python.display().to_string();
    }
    let options = InstallOptions {
        path,
        ..fixtures.options()
    };
    let scratch = Scratch::new(&[("requirements.txt", "tinypkg\n")]);
    let slug = "fallback";

    let (result, log) = build(&scratch, slug, &options).await;
    let report = result.unwrap_or_else(|error| panic!("{error}\nlog:\n{log}"));

    assert!(!report.used_uv);
    assert!(
        log.contains("uv not found on PATH: falling back to python3 -m venv and pip"),
        "{log}"
    );
    assert_eq!(
        report.steps[..2],
        [
            "python3 -m venv .venv",
            ".venv/bin/pip install -r requirements.txt",
        ]
    );
    assert!(
        log.contains("==> .venv/bin/pip install -r requirements.txt\n"),
        "{log}"
    );
    assert!(
        scratch
            .read(".venv/bin/tinytool")
            .starts_with(&format!("#!/env/{slug}/.venv/bin/python"))
    );
    // python3 -m venv records the command that made it, with the mount path.
    let cfg = scratch.read(".venv/pyvenv.cfg");
    assert!(cfg.contains(&format!("/env/{slug}/.venv")), "{cfg}");
    let layer = scan(&scratch.path).expect("scan");
    assert!(
        packages(&layer).contains(&"pip tinypkg 1.0".to_owned()),
        "{:?}",
        layer.packages
    );
    // pip may compile with timestamps; the bytecode pass rewrote everything, hash-based.
    assert!(report.steps[2].contains("compileall"), "{:?}", report.steps);
    assert_checked_hash_pyc(&pyc_of(
        &site_packages(&scratch.path).join("tinypkg"),
        "__init__",
    ));
    assert_no_scratch_path(&scratch.path, &layer);
}

#[tokio::test]
async fn a_failing_setup_script_fails_the_build_with_its_status_and_output() {
    if !require_sandbox() {
        return;
    }
    let fixtures = Fixtures::new(None);
    let scratch = Scratch::new(&[("setup.sh", "echo working\necho boom >&2\nexit 3\n")]);

    let (result, log) = build(&scratch, "failing", &fixtures.options()).await;

    match result {
        Err(InstallError::StepFailed {
            step, status, tail, ..
        }) => {
            assert_eq!(step, "bash setup.sh");
            assert_eq!(status, 3);
            assert!(tail.contains("boom"), "{tail}");
        }
        other => panic!("expected StepFailed, got {other:?}"),
    }
    assert!(log.contains("==> bash setup.sh\nworking\nboom\n"), "{log}");
    assert_eq!(host_env_mounts(), Vec::<String>::new());
}

#[tokio::test]
async fn a_step_past_its_time_limit_is_killed_with_everything_it_started() {
    if !require_sandbox() {
        return;
    }
    let fixtures = Fixtures::new(None);
    // A process in a session of its own, as a daemon would be, and one in the foreground.
    let scratch = Scratch::new(&[(
        "setup.sh",
        "setsid sleep 37 > /dev/null 2>&1 &\necho started\nsleep 37\n",
    )]);
    let options = InstallOptions {
        step_timeout: std::time::Duration::from_secs(1),
        ..fixtures.options()
    };

    let started = std::time::Instant::now();
    let (result, log) = build(&scratch, "slow", &options).await;
    let elapsed = started.elapsed();

    let error = result.expect_err("the step must time out");
    assert!(
        matches!(&error, InstallError::TimedOut { step, .. } if step == "bash setup.sh"),
        "{error:?}"
    );
    assert!(error.to_string().contains("time limit"), "{error}");
    assert!(log.contains("started"), "{log}");
    // A guard against a hang, not a speed claim: the limit is 1 s, a hang is 37 s.
    assert!(elapsed.as_secs() < 20, "took {elapsed:?}");
    // Checked at once: a timeout returns only when nothing of the step runs any more.
    let survivors = processes_running(b"sleep\x0037\x00");
    assert!(survivors.is_empty(), "left running: {survivors:?}");
    assert_eq!(host_env_mounts(), Vec::<String>::new());
}

#[tokio::test]
async fn a_dropped_build_leaves_nothing_running() {
    if !require_sandbox() {
        return;
    }
    let fixtures = Fixtures::new(None);
    let scratch = Scratch::new(&[("setup.sh", "setsid sleep 38 &\nsleep 38\n")]);
    // The caller gives up (a lost lease, a shutdown) while the step runs.
    let gave_up = tokio::time::timeout(
        std::time::Duration::from_secs(2),
        build(&scratch, "dropped", &fixtures.options()),
    )
    .await;
    assert!(
        gave_up.is_err(),
        "the build was expected to still be running"
    );
    // The kernel tears the namespace down right after; give it a moment.
    let mut survivors = Vec::new();
    for _ in 0..50 {
        survivors = processes_running(b"sleep\x0038\x00");
        if survivors.is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(survivors.is_empty(), "left running: {survivors:?}");
}

/// Pids of processes whose command line is exactly `cmdline`.
fn processes_running(cmdline: &[u8]) -> Vec<String> {
    std::fs::read_dir("/proc")
        .expect("/proc")
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let found = std::fs::read(entry.path().join("cmdline")).ok()?;
            (found == cmdline).then(|| entry.file_name().to_string_lossy().into_owned())
        })
        .collect()
}

#[tokio::test]
async fn the_log_keeps_head_and_tail_and_says_what_it_cut() {
    if !require_sandbox() {
        return;
    }
    let fixtures = Fixtures::new(None);
    let scratch = Scratch::new(&[("setup.sh", "seq 1 200000\n")]);
    let options = InstallOptions {
        log_head_bytes: 4096,
        log_tail_bytes: 4096,
        ..fixtures.options()
    };

    let (result, log) = build(&scratch, "chatty", &options).await;
    let report = result.unwrap_or_else(|error| panic!("{error}"));

    let printed: usize = (1..=200_000).map(|n: u32| n.to_string().len() + 1).sum();
    let total = "==> bash setup.sh\n".len() + printed;
    let cut = (total - 8192) as u64;
    assert_eq!(report.log_bytes_cut, cut);
    assert!(
        log.starts_with("==> bash setup.sh\n1\n2\n3\n"),
        "{}",
        &log[..64]
    );
    assert!(log.ends_with("\n199999\n200000\n"));
    assert!(
        log.contains(&format!("log cut: {cut} bytes omitted")),
        "cut line missing"
    );
    assert!(log.len() < 8192 + 200, "{} bytes kept", log.len());
}

#[tokio::test]
async fn dependency_directories_from_the_source_are_dropped_before_installing() {
    if !require_sandbox() {
        return;
    }
    let fixtures = Fixtures::new(None);
    let outside = tempfile::tempdir().expect("tempdir");
    crate::fixtures::write(outside.path(), "keep.txt", "not the build's to delete");
    let scratch = Scratch::new(&[
        (".venv/bin/python", "a laptop's venv"),
        (".venv/lib/junk.py", ""),
        (".plinth-build-cache/uv/junk", "not the scope's cache"),
        ("sub/node_modules/kept/package.json", "{}"),
        (
            "setup.sh",
            "ls -A > listing.txt\nls -A .plinth-build-cache > cache.txt\n",
        ),
    ]);
    // A link to elsewhere is removed as a link; what it points at is left alone.
    std::os::unix::fs::symlink(outside.path(), scratch.path.join("node_modules")).expect("symlink");

    let (result, log) = build(&scratch, "stale", &fixtures.options()).await;
    result.unwrap_or_else(|error| panic!("{error}\nlog:\n{log}"));

    // The reserved name holds the build's own (empty) download cache, not the source's.
    let listing = scratch.read("listing.txt");
    assert_eq!(
        listing, ".plinth-build-cache\nlisting.txt\nsetup.sh\nsub\n",
        "setup.sh saw {listing:?}"
    );
    assert_eq!(scratch.read("cache.txt"), "");
    assert!(!scratch.path.join(".plinth-build-cache").exists());
    assert!(!scratch.path.join(".venv").exists());
    assert!(std::fs::symlink_metadata(scratch.path.join("node_modules")).is_err());
    assert!(outside.path().join("keep.txt").exists());
    assert!(
        scratch
            .path
            .join("sub/node_modules/kept/package.json")
            .exists()
    );
}

#[tokio::test]
async fn a_missing_installer_is_named() {
    if !require_sandbox() {
        return;
    }
    let fixtures = Fixtures::new(None);
    let scratch = Scratch::new(&[("package.json", "{}")]);
    let options = InstallOptions {
        path: fixtures.dir.path().join("tools").display().to_string(),
        ..fixtures.options()
    };
    let (result, _) = build(&scratch, "no-npm", &options).await;
    match result {
        Err(InstallError::ToolMissing { tool, .. }) => assert_eq!(tool, "npm"),
        other => panic!("expected ToolMissing, got {other:?}"),
    }
}
