//! Internal credentials for tests: one random token per role, the accept file that lists
//! their digests, and what each `plinth` process is given (its own token and the file).

use std::path::PathBuf;

use plinth_kit::auth::{Role, digest_hex, new_token};
use plinth_kit::config::Secret;
use plinth_kit::grpc::ClientInterceptor;

/// One credential per role, accepted by every service given [`Credentials::accept_file`].
pub(crate) struct Credentials {
    dir: tempfile::TempDir,
    gateway: Secret,
    builder: Secret,
    node: Secret,
    source: Secret,
    observer: Secret,
}

impl Credentials {
    /// New random credentials (a node's and a builder's for any name), and their accept file.
    pub(crate) fn new() -> Self {
        Self::with_extra(&[])
    }

    /// The same, with more `[[accept]]` entries: (role, name, token).
    pub(crate) fn with_extra(extra: &[(Role, Option<&str>, &str)]) -> Self {
        let token = || new_token().expect("random");
        let credentials = Credentials {
            dir: tempfile::tempdir().expect("temp dir"),
            gateway: token(),
            builder: token(),
            node: token(),
            source: token(),
            observer: token(),
        };
        let mut file = String::new();
        let mut entry = |role: Role, name: Option<&str>, token: &str| {
            file.push_str(&format!(
                "[[accept]]\nrole = \"{role}\"\ntoken_sha256 = \"{}\"\n",
                digest_hex(token)
            ));
            if let Some(name) = name {
                file.push_str(&format!("name = \"{name}\"\n"));
            }
        };
        for (role, token) in [
            (Role::Gateway, &credentials.gateway),
            (Role::Builder, &credentials.builder),
            (Role::Node, &credentials.node),
            (Role::Source, &credentials.source),
            (Role::Observer, &credentials.observer),
        ] {
            entry(role, None, token.expose());
        }
        for (role, name, token) in extra {
            entry(*role, *name, token);
        }
        std::fs::write(credentials.accept_file(), file).expect("accept file");
        credentials
    }

    /// The file listing every credential's digest.
    pub(crate) fn accept_file(&self) -> PathBuf {
        self.dir.path().join("accept.toml")
    }

    /// The token of `role`.
    pub(crate) fn token(&self, role: Role) -> &str {
        match role {
            Role::Gateway => self.gateway.expose(),
            Role::Builder => self.builder.expose(),
            Role::Node => self.node.expose(),
            Role::Source => self.source.expose(),
            Role::Observer => self.observer.expose(),
        }
    }

    /// The environment `plinth <command>` needs: the accept file, and the credential of the
    /// role the command runs as, if it calls other services.
    pub(crate) fn env_for(&self, command: &str) -> Vec<(&'static str, String)> {
        let mut env = vec![(
            "PLINTH_INTERNAL_ACCEPT_FILE",
            self.accept_file().display().to_string(),
        )];
        let role = match command {
            "gateway" => Some(Role::Gateway),
            "builder" => Some(Role::Builder),
            "node" => Some(Role::Node),
            // The source service asks the catalog what it keeps, to collect garbage.
            "source" => Some(Role::Source),
            _ => None,
        };
        if let Some(role) = role {
            env.push(("PLINTH_INTERNAL_CREDENTIAL", self.token(role).to_owned()));
        }
        env
    }

    /// A config file for `plinth serve` (given with `--config`) that also accepts these
    /// credentials, so a test can call the in-process services as any role.
    pub(crate) fn serve_config(&self) -> PathBuf {
        let path = self.dir.path().join("serve.toml");
        std::fs::write(
            &path,
            format!(
                "[internal]\naccept_file = \"{}\"\n",
                self.accept_file().display()
            ),
        )
        .expect("config");
        path
    }

    /// An interceptor that calls as `role`.
    pub(crate) fn interceptor(&self, role: Role) -> ClientInterceptor {
        ClientInterceptor::new(&Secret::new(self.token(role))).expect("printable")
    }
}

/// Credentials shared by the tests that need no others of their own.
pub(crate) fn shared() -> &'static Credentials {
    static SHARED: std::sync::LazyLock<Credentials> = std::sync::LazyLock::new(Credentials::new);
    &SHARED
}

/// Sets a test process's environment for `command` from `credentials`.
pub(crate) fn apply(command: &mut std::process::Command, credentials: &Credentials, role: &str) {
    command
        .env_remove("PLINTH_INTERNAL_CREDENTIAL")
        .env_remove("PLINTH_INTERNAL_TOKEN");
    for (name, value) in credentials.env_for(role) {
        command.env(name, value);
    }
}
