//! What reaches the installers (see the module documentation's heading of that name).

use plinth_sandbox::egress::DEFAULT_PROXY_ADDR;

use super::{BUILD_CACHE, BuildNetwork, InstallOptions};
use crate::sandbox::{self, Sandbox};

/// `SOURCE_DATE_EPOCH` for the installers: 1980-01-01T00:00:00Z, the earliest time a zip (and so
/// a wheel built during the install) can hold.
const SOURCE_DATE_EPOCH: &str = "315532800";

/// The installers' environment (see the module documentation), later entries overriding.
pub(super) fn environment(
    sandbox: &Sandbox,
    options: &InstallOptions,
    python: bool,
) -> Vec<(String, String)> {
    let mount = sandbox.mount_path();
    let venv = format!("{mount}/.venv");
    let cache = format!("{mount}/{BUILD_CACHE}");
    let mut env: Vec<(String, String)> = Vec::new();
    let mut set = |name: &str, value: &str| {
        env.retain(|(existing, _)| existing != name);
        env.push((name.to_owned(), value.to_owned()));
    };
    set(
        "PATH",
        &format!("{venv}/bin:{mount}/node_modules/.bin:{}", options.path),
    );
    set("HOME", sandbox::HOME);
    set("TMPDIR", "/tmp");
    set("LANG", "C.UTF-8");
    set("PROJECT_ROOT", &mount);
    if python {
        set("VIRTUAL_ENV", &venv);
    }
    set("UV_PROJECT_ENVIRONMENT", &venv);
    set("UV_PYTHON_DOWNLOADS", "never");
    set("UV_PYTHON_PREFERENCE", "only-system");
    set("UV_COMPILE_BYTECODE", "1");
    set("SOURCE_DATE_EPOCH", SOURCE_DATE_EPOCH);
    // Imports during the install (a build backend in the project, `setup.sh`'s scripts) must
    // not leave timestamp `.pyc`s in the tree: they name the materialized files' times, so
    // they differ from build to build and no session could use them.
    set("PYTHONDONTWRITEBYTECODE", "1");
    set("PIP_DISABLE_PIP_VERSION_CHECK", "1");
    set("PIP_NO_INPUT", "1");
    set("PIP_PROGRESS_BAR", "off");
    set("npm_config_fund", "false");
    set("npm_config_audit", "false");
    set("npm_config_update_notifier", "false");
    set("npm_config_progress", "false");
    set("XDG_CACHE_HOME", &cache);
    set("UV_CACHE_DIR", &format!("{cache}/uv"));
    set("PIP_CACHE_DIR", &format!("{cache}/pip"));
    set("npm_config_cache", &format!("{cache}/npm"));
    for (name, value) in options.registries.env() {
        set(&name, &value);
    }
    // After the registries' proxies: in the build's namespace nothing but the egress proxy
    // leads anywhere, so no host is reached without it.
    if matches!(options.network, BuildNetwork::Egress(_)) {
        for (name, value) in plinth_sandbox::egress::proxy_env(DEFAULT_PROXY_ADDR) {
            set(&name, &value);
        }
    }
    for (name, value) in &options.extra_env {
        set(name, value);
    }
    env
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};
    use std::sync::Arc;
    use std::time::Duration;

    use plinth_sandbox::egress::EgressPolicy;

    use super::*;
    use crate::registries::Registries;
    use crate::sandbox::Network;

    fn sandbox() -> Sandbox {
        Sandbox {
            slug: "demo".to_owned(),
            root: PathBuf::from("/scratch"),
            home: PathBuf::from("/work/home"),
            tmp: PathBuf::from("/work/tmp"),
            shown: Vec::new(),
            uid: 65534,
            gid: 65534,
            hidden_paths: Vec::new(),
            network: Network::None,
            timeout: Duration::from_secs(1),
            cgroup: None,
        }
    }

    #[test]
    fn the_environment_is_explicit_and_extra_env_wins() {
        let options = InstallOptions {
            path: "/tools:/usr/bin".to_owned(),
            extra_env: vec![("npm_config_audit".to_owned(), "true".to_owned())],
            ..InstallOptions::default()
        }
        .offline(Path::new("/wheels"));
        let env = environment(&sandbox(), &options, true);
        let get = |name: &str| {
            env.iter()
                .find(|(existing, _)| existing == name)
                .map(|(_, value)| value.as_str())
        };
        assert_eq!(
            get("PATH"),
            Some("/env/demo/.venv/bin:/env/demo/node_modules/.bin:/tools:/usr/bin")
        );
        assert_eq!(get("HOME"), Some("/env/.home"));
        assert_eq!(get("VIRTUAL_ENV"), Some("/env/demo/.venv"));
        assert_eq!(
            get("UV_CACHE_DIR"),
            Some("/env/demo/.plinth-build-cache/uv")
        );
        assert_eq!(get("UV_COMPILE_BYTECODE"), Some("1"));
        assert_eq!(get("SOURCE_DATE_EPOCH"), Some("315532800"));
        assert_eq!(get("PYTHONDONTWRITEBYTECODE"), Some("1"));
        assert_eq!(get("UV_LINK_MODE"), None, "uv hard-links from the cache");
        assert_eq!(get("npm_config_audit"), Some("true"));
        assert_eq!(get("PIP_FIND_LINKS"), Some("/wheels"));
        assert_eq!(
            env.iter()
                .filter(|(name, _)| name == "npm_config_audit")
                .count(),
            1
        );
        assert!(matches!(options.network, BuildNetwork::None));
        assert_eq!(options.read_only_paths, vec![PathBuf::from("/wheels")]);
        assert!(
            environment(&sandbox(), &options, false)
                .iter()
                .all(|(name, _)| name != "VIRTUAL_ENV")
        );
        assert_eq!(get("HTTPS_PROXY"), None, "no proxy without the network");
    }

    #[test]
    fn with_egress_the_proxy_wins_over_the_registries_proxies_and_extra_env_over_both() {
        let options = InstallOptions {
            network: BuildNetwork::Egress(Arc::new(EgressPolicy::default())),
            registries: Registries {
                https_proxy: Some("http://upstream:3128".to_owned()),
                no_proxy: Some(".internal".to_owned()),
                python_index_url: Some("https://pypi.internal/simple".to_owned()),
                ..Registries::default()
            },
            extra_env: vec![("YARN_HTTP_PROXY".to_owned(), "http://mine".to_owned())],
            ..InstallOptions::default()
        };
        let env = environment(&sandbox(), &options, true);
        let get = |name: &str| {
            env.iter()
                .find(|(existing, _)| existing == name)
                .map(|(_, value)| value.as_str())
        };
        for name in [
            "HTTPS_PROXY",
            "https_proxy",
            "HTTP_PROXY",
            "npm_config_https_proxy",
        ] {
            assert_eq!(get(name), Some("http://127.0.0.1:3128"), "{name}");
        }
        assert_eq!(get("NO_PROXY"), Some("localhost,127.0.0.1,::1"));
        assert_eq!(get("UV_INDEX_URL"), Some("https://pypi.internal/simple"));
        assert_eq!(get("YARN_HTTP_PROXY"), Some("http://mine"));
    }
}
