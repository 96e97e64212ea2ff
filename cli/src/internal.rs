//! `[internal]`: how the services authenticate each other. Each process that calls another
//! has its own credential (`credential`, `credential_file`, `PLINTH_INTERNAL_CREDENTIAL`);
//! each process that serves gRPC accepts a list of credentials, each naming a role
//! (`[[internal.accept]]` or `accept_file`, `PLINTH_INTERNAL_ACCEPT_FILE`), usually as
//! digests, so the list is no secret. `plinth serve` makes its services' credentials itself at
//! every start. Optional TLS (and mutual TLS) for every internal listener and channel.
//!
//! Credentials are read from configuration and the environment only: a command line is
//! readable by every process of the host.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context as _;
use plinth_kit::auth::{AcceptEntry, Accepted, Principal, Role};
use plinth_kit::config::{ConfigError, Secret};
use plinth_kit::grpc::Internal;
use plinth_kit::tls::TlsSettings;
use serde::{Deserialize, Serialize};

use crate::args::CredentialCommand;

/// The error for the one shared token earlier versions took.
pub const TOKEN_REPLACED: &str = "`internal_token` / PLINTH_INTERNAL_TOKEN is replaced by per-role credentials: \
     give each calling process its own (PLINTH_INTERNAL_CREDENTIAL; `plinth credential new --role …` makes one) \
     and each serving process the list it accepts ([[internal.accept]] or PLINTH_INTERNAL_ACCEPT_FILE); \
     see docs/operating/trust.md, \"Between services\"";

/// `[internal]`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct InternalSection {
    /// This process's own credential, sent on every call it makes to another service.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub credential: Option<Secret>,
    /// A file holding it (a mounted Secret), read at start.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub credential_file: Option<PathBuf>,
    /// Credentials this process's gRPC services accept.
    pub accept: Vec<AcceptEntry>,
    /// A TOML file of more (`[[accept]]` entries, as `plinth credential new` prints them).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub accept_file: Option<PathBuf>,
    /// TLS between services.
    pub tls: InternalTls,
    /// How long a call between services may take (most calls: a few database statements),
    /// in milliseconds; the caller stops waiting a second after it, catalogs and sources stop
    /// working on it then. Default 5000.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub call_timeout_ms: Option<u64>,
    /// The same for calls whose work grows with the data they cover (a snapshot, a collection
    /// round, attaching a session). Default 120000.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub long_call_timeout_ms: Option<u64>,
}

/// `[internal.tls]`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct InternalTls {
    /// This process's certificate chain (PEM): served on its gRPC listener, presented to
    /// servers that require client certificates.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cert: Option<PathBuf>,
    /// Its private key (PEM).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<PathBuf>,
    /// The CA bundle (PEM) that signs the other services' certificates: `https://` service
    /// URLs are verified by it, and so are callers' certificates.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ca: Option<PathBuf>,
    /// Refuse callers without a certificate signed by `ca` (mutual TLS).
    pub require_client_cert: bool,
}

/// An accept file: `[[accept]]` entries.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AcceptFile {
    #[serde(default)]
    accept: Vec<AcceptEntry>,
}

fn env_path(name: &str) -> Option<PathBuf> {
    std::env::var_os(name)
        .filter(|value| !value.is_empty())
        .map(PathBuf::from)
}

impl InternalSection {
    /// Applies the environment variables over the file.
    pub fn apply_env(&mut self) -> Result<(), ConfigError> {
        if let Ok(credential) = std::env::var("PLINTH_INTERNAL_CREDENTIAL")
            && !credential.is_empty()
        {
            self.credential = Some(Secret::new(credential));
        }
        if let Some(path) = env_path("PLINTH_INTERNAL_CREDENTIAL_FILE") {
            self.credential_file = Some(path);
        }
        if let Some(path) = env_path("PLINTH_INTERNAL_ACCEPT_FILE") {
            self.accept_file = Some(path);
        }
        if let Some(path) = env_path("PLINTH_INTERNAL_TLS_CERT") {
            self.tls.cert = Some(path);
        }
        if let Some(path) = env_path("PLINTH_INTERNAL_TLS_KEY") {
            self.tls.key = Some(path);
        }
        if let Some(path) = env_path("PLINTH_INTERNAL_TLS_CA") {
            self.tls.ca = Some(path);
        }
        for (name, field) in [
            ("PLINTH_INTERNAL_CALL_TIMEOUT_MS", &mut self.call_timeout_ms),
            (
                "PLINTH_INTERNAL_LONG_CALL_TIMEOUT_MS",
                &mut self.long_call_timeout_ms,
            ),
        ] {
            if let Ok(value) = std::env::var(name)
                && !value.trim().is_empty()
            {
                *field = Some(value.trim().parse().map_err(|_| {
                    ConfigError::Invalid(format!(
                        "{name} is {value:?}: give a whole number of milliseconds"
                    ))
                })?);
            }
        }
        if let Ok(value) = std::env::var("PLINTH_INTERNAL_TLS_REQUIRE_CLIENT_CERT") {
            self.tls.require_client_cert = value.parse().map_err(|_| {
                ConfigError::Invalid(format!(
                    "PLINTH_INTERNAL_TLS_REQUIRE_CLIENT_CERT is {value:?}: give true or false"
                ))
            })?;
        }
        Ok(())
    }

    /// The credential this process sends, if configured.
    fn own_credential(&self) -> anyhow::Result<Option<Secret>> {
        let credential = match (&self.credential, &self.credential_file) {
            (Some(_), Some(_)) => anyhow::bail!(
                "give `internal.credential` (PLINTH_INTERNAL_CREDENTIAL) or `internal.credential_file`, not both"
            ),
            (Some(credential), None) => credential.clone(),
            (None, Some(path)) => Secret::new(
                std::fs::read_to_string(path)
                    .with_context(|| {
                        format!("reading internal.credential_file {}", path.display())
                    })?
                    .trim(),
            ),
            (None, None) => return Ok(None),
        };
        if credential.expose().is_empty()
            || !credential.expose().bytes().all(|b| b.is_ascii_graphic())
        {
            anyhow::bail!("the internal credential must be printable ASCII without spaces");
        }
        Ok(Some(credential))
    }

    /// Every accepted credential: `accept` and the accept file's.
    fn accepted(&self) -> anyhow::Result<Accepted> {
        let mut entries = self.accept.clone();
        if let Some(path) = &self.accept_file {
            let file: AcceptFile = plinth_kit::config::read_toml(path)?;
            entries.extend(file.accept);
        }
        Ok(Accepted::new(&entries)?)
    }

    fn tls(&self) -> anyhow::Result<Option<TlsSettings>> {
        let tls = &self.tls;
        Ok(TlsSettings::load(
            tls.cert.as_deref(),
            tls.key.as_deref(),
            tls.ca.as_deref(),
            tls.require_client_cert,
        )?)
    }

    /// Whether this process serves its gRPC listeners over TLS.
    pub fn serves_tls(&self) -> bool {
        self.tls.cert.is_some()
    }

    /// What a process started alone uses: `process` names it in errors; one that calls
    /// others needs its credential, one that serves needs credentials to accept.
    pub fn for_process(
        &self,
        process: &'static str,
        calls_out: bool,
        serves: bool,
    ) -> anyhow::Result<Internal> {
        let credential = self.own_credential()?;
        if calls_out && credential.is_none() {
            anyhow::bail!(plinth_kit::grpc::MissingCredential(process));
        }
        let accepted = self.accepted()?;
        if serves && accepted.is_empty() {
            anyhow::bail!(
                "the {process} accepts no internal credential, so every call to it would be refused: \
                 list the callers' credentials in [[internal.accept]] or PLINTH_INTERNAL_ACCEPT_FILE \
                 (`plinth credential new --role gateway` prints an entry)"
            );
        }
        Ok(Internal {
            credential,
            accepted: Arc::new(accepted),
            tls: self.tls()?,
            calls: self.call_rules()?,
        })
    }

    /// What `plinth serve`'s services use: credentials made now, at random, for its gateway,
    /// builders and node (named `node_name`), accepted beside any configured ones (an
    /// observer's, say). Nothing is written anywhere: the next start makes new ones.
    pub fn for_serve(&self, node_name: &str) -> anyhow::Result<ServeInternal> {
        let mut accepted = self.accepted()?;
        let tls = self.tls()?;
        let mut make = |role: Role, name: Option<&str>| -> anyhow::Result<Secret> {
            let token = plinth_kit::auth::new_token().context("making an internal credential")?;
            accepted.push(
                Principal {
                    role,
                    name: name.map(str::to_owned),
                },
                &token,
            );
            Ok(token)
        };
        let gateway = make(Role::Gateway, None)?;
        let builder = make(Role::Builder, None)?;
        let node = make(Role::Node, Some(node_name))?;
        let source = make(Role::Source, None)?;
        let accepted = Arc::new(accepted);
        let calls = self.call_rules()?;
        let with = |credential: Option<Secret>| Internal {
            credential,
            accepted: accepted.clone(),
            tls: tls.clone(),
            calls: calls.clone(),
        };
        Ok(ServeInternal {
            services: with(None),
            gateway: with(Some(gateway)),
            builder: with(Some(builder)),
            node: with(Some(node)),
            source: with(Some(source)),
        })
    }
}

impl InternalSection {
    /// Which of the services' calls a client may send again to another replica (those whose
    /// request is one message, after a failed connection, and those the protos declare
    /// idempotent), and how long calls may take.
    fn call_rules(&self) -> anyhow::Result<plinth_kit::grpc::CallRules> {
        let defaults = plinth_kit::grpc::Deadlines::default();
        let pick = |name: &str, value: Option<u64>, default: std::time::Duration| match value {
            None => Ok(default),
            Some(0) => anyhow::bail!(
                "internal.{name} is 0: give the milliseconds a call may take (at least 100)"
            ),
            Some(ms) => Ok(std::time::Duration::from_millis(ms.max(100))),
        };
        let deadlines = plinth_kit::grpc::Deadlines {
            quick: pick("call_timeout_ms", self.call_timeout_ms, defaults.quick)?,
            long: pick(
                "long_call_timeout_ms",
                self.long_call_timeout_ms,
                defaults.long,
            )?,
        };
        Ok(
            plinth_kit::grpc::CallRules::from_descriptor_sets(&[plinth_proto::FILE_DESCRIPTOR_SET])
                .with_deadlines(deadlines),
        )
    }
}

/// The credentials of `plinth serve`'s parts.
#[derive(Debug, Clone)]
pub struct ServeInternal {
    /// The catalog's and the source service's servers.
    pub services: Internal,
    /// The gateway's.
    pub gateway: Internal,
    /// Every builder's.
    pub builder: Internal,
    /// The node's.
    pub node: Internal,
    /// The source service's, for what it asks the catalog (garbage collection).
    pub source: Internal,
}

/// `plinth credential …`.
pub fn credential_command(command: &CredentialCommand) -> anyhow::Result<()> {
    match command {
        CredentialCommand::New(args) => {
            print!("{}", new_credential(&args.role, args.name.as_deref())?);
            Ok(())
        }
    }
}

fn new_credential(role: &str, name: Option<&str>) -> anyhow::Result<String> {
    let role = match role {
        "gateway" => Role::Gateway,
        "builder" => Role::Builder,
        "node" => Role::Node,
        "observer" => Role::Observer,
        "source" => Role::Source,
        other => {
            anyhow::bail!(
                "--role {other:?} is not a role: give gateway, builder, node, source or observer"
            )
        }
    };
    let token = plinth_kit::auth::new_token()?;
    let entry = AcceptEntry {
        role,
        name: name.map(str::to_owned),
        token: None,
        token_sha256: Some(plinth_kit::auth::digest_hex(token.expose())),
    };
    // The entry must be one the services take.
    Accepted::new(std::slice::from_ref(&entry))?;
    let mut out = String::new();
    out.push_str(&format!(
        "# The {role}'s credential: give it to that process only, as PLINTH_INTERNAL_CREDENTIAL\n\
         # or in the file `internal.credential_file` names. Keep it secret.\n{}\n\n",
        token.expose()
    ));
    out.push_str(
        "# What the services it calls accept: add to their accept file (PLINTH_INTERNAL_ACCEPT_FILE),\n\
         # or as [[internal.accept]] in their config file. A digest, not a secret.\n",
    );
    out.push_str("[[accept]]\n");
    out.push_str(&format!("role = \"{role}\"\n"));
    if let Some(name) = name {
        out.push_str(&format!("name = {}\n", toml_string(name)));
    }
    out.push_str(&format!(
        "token_sha256 = \"{}\"\n",
        entry.token_sha256.unwrap_or_default()
    ));
    Ok(out)
}

/// A TOML basic string; names are printable ASCII (checked above), so only `"` and `\\` need
/// escaping.
fn toml_string(text: &str) -> String {
    format!("\"{}\"", text.replace('\\', "\\\\").replace('"', "\\\""))
}

/// Reads a credential printed by `plinth credential new` back (for tests and scripts): the
/// first line that is not a comment or empty.
pub fn token_from_printout(printout: &str) -> Option<&str> {
    printout
        .lines()
        .map(str::trim)
        .find(|line| !line.is_empty() && !line.starts_with('#'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_printed_credential_is_accepted_by_the_entry_printed_beside_it() {
        let printed = new_credential("node", Some("node-a")).expect("made");
        let token = token_from_printout(&printed).expect("a token line");
        let accept_part = &printed[printed.find("[[accept]]").expect("an entry")..];
        let file: AcceptFile = toml::from_str(accept_part).expect("valid TOML");
        let accepted = Accepted::new(&file.accept).expect("usable");
        let principal = accepted.authenticate(token.as_bytes()).expect("accepted");
        assert_eq!(principal.role, Role::Node);
        assert_eq!(principal.name.as_deref(), Some("node-a"));
        assert!(!accept_part.contains(token), "the entry holds no token");
    }

    #[test]
    fn an_unknown_role_is_refused_with_the_ones_there_are() {
        let error = new_credential("admin", None)
            .expect_err("refused")
            .to_string();
        assert!(
            error.contains("gateway, builder, node, source or observer"),
            "{error}"
        );
        let error = new_credential("gateway", Some("g1"))
            .expect_err("a gateway credential names no one")
            .to_string();
        assert!(error.contains("only `node` and `builder`"), "{error}");
    }

    #[test]
    fn serve_makes_one_credential_per_part_and_accepts_each_as_its_role() {
        let section = InternalSection::default();
        let serve = section.for_serve("node-1").expect("made");
        let accepted = &serve.gateway.accepted;
        let role_of = |internal: &Internal| {
            let token = internal.credential.as_ref().expect("a credential");
            accepted
                .authenticate(token.expose().as_bytes())
                .expect("accepted")
        };
        assert_eq!(role_of(&serve.gateway).role, Role::Gateway);
        assert_eq!(role_of(&serve.builder).role, Role::Builder);
        let node = role_of(&serve.node);
        assert_eq!(
            (node.role, node.name.as_deref()),
            (Role::Node, Some("node-1"))
        );
        assert!(serve.services.credential.is_none());
        let again = section.for_serve("node-1").expect("made");
        assert_ne!(
            again.gateway.credential.as_ref().map(Secret::expose),
            serve.gateway.credential.as_ref().map(Secret::expose),
            "every start makes new ones"
        );
    }
}
