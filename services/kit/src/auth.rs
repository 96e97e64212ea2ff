//! Who may call what between Plinth's services. Every internal call carries a credential (a
//! bearer token); the service called looks it up in the credentials it accepts, each of which
//! names a [`Role`] (and, for nodes and builders, may name the one node or builder it is), and
//! lets the call through only when the RPC's rule names that role. Handlers that act for one
//! node or builder read the caller's [`Principal`] from the request to check it is that one.
//!
//! A service keeps digests of the tokens it accepts, not the tokens: the list of accepted
//! credentials can live in a ConfigMap, and only the process that calls needs its own token.

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use sha2::Digest as _;

use crate::config::Secret;

/// What a caller is to Plinth's services.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// The REST gateway: acts for any scope, on every tenant-facing RPC.
    Gateway,
    /// A builder: claims builds and reports on the ones it leases.
    Builder,
    /// A node agent: registers itself and learns its own sessions.
    Node,
    /// A metrics scraper or operator: `/metrics`, `/readyz` details and gRPC reflection.
    Observer,
    /// The source service: asks the catalog which blobs it keeps, to collect the rest.
    Source,
}

impl Role {
    /// The role's name, as configuration spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Gateway => "gateway",
            Role::Builder => "builder",
            Role::Node => "node",
            Role::Observer => "observer",
            Role::Source => "source",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Who made a call: the role its credential names and, when the credential is one node's or
/// one builder's, that name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// The role.
    pub role: Role,
    /// The one node or builder the credential is for; `None` for any.
    pub name: Option<String>,
}

impl Principal {
    /// The caller of `request`, as the server's credential check found it. `None` only for
    /// calls that reached a handler without the check (there are none in a running service).
    pub fn of<T>(request: &tonic::Request<T>) -> Option<&Principal> {
        request.extensions().get::<Principal>()
    }

    /// Whether this caller may act as the node or builder called `name`: a credential for
    /// one name acts only as that one.
    pub fn may_act_as(&self, name: &str) -> bool {
        self.name.as_deref().is_none_or(|own| own == name)
    }
}

/// One credential a service accepts, as configuration gives it: the token itself, or (better:
/// the accepting side then holds nothing a caller could use) its SHA-256 digest.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AcceptEntry {
    /// The role the credential grants.
    pub role: Role,
    /// The one node or builder it is for (only for those roles); any when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<Secret>,
    /// The token's SHA-256 digest, 64 hex digits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_sha256: Option<String>,
}

/// An accepted credential that cannot be used, and why.
#[derive(Debug, thiserror::Error)]
pub enum CredentialError {
    /// The entry gives neither or both of `token` and `token_sha256`.
    #[error("accepted credential #{0} ({1}) must give exactly one of `token` and `token_sha256`")]
    TokenOrDigest(usize, Role),
    /// `token_sha256` is not 64 hex digits.
    #[error("accepted credential #{0} ({1}): `token_sha256` must be 64 hex digits")]
    BadDigest(usize, Role),
    /// A name on a role that is not one node's or builder's.
    #[error(
        "accepted credential #{0}: only `node` and `builder` credentials name one node or builder, not `{1}`"
    )]
    NameOnRole(usize, Role),
    /// An empty or unprintable name.
    #[error("accepted credential #{0} ({1}): `name` must be printable and not empty")]
    BadName(usize, Role),
    /// The same token accepted twice, which would make the caller's role ambiguous.
    #[error(
        "accepted credentials #{0} and #{1} are the same token: give each role and name its own"
    )]
    Duplicate(usize, usize),
    /// A token too short to resist guessing.
    #[error(
        "accepted credential #{0} ({1}): the token is shorter than {MIN_TOKEN_LEN} characters; make one with `plinth credential new`"
    )]
    TooShort(usize, Role),
}

/// The fewest characters a configured token may have.
pub const MIN_TOKEN_LEN: usize = 16;

/// The credentials one process's gRPC services (and its admin endpoints) accept.
#[derive(Default)]
pub struct Accepted {
    entries: Vec<(Principal, [u8; 32])>,
}

impl fmt::Debug for Accepted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.entries.iter().map(|(principal, _)| principal))
            .finish()
    }
}

impl Accepted {
    /// The credentials `entries` describe, checked.
    pub fn new(entries: &[AcceptEntry]) -> Result<Self, CredentialError> {
        let mut accepted = Accepted::default();
        for (index, entry) in entries.iter().enumerate() {
            let number = index + 1;
            let digest = match (&entry.token, &entry.token_sha256) {
                (Some(token), None) => {
                    if token.expose().len() < MIN_TOKEN_LEN {
                        return Err(CredentialError::TooShort(number, entry.role));
                    }
                    digest(token.expose())
                }
                (None, Some(hex)) => {
                    parse_digest(hex).ok_or(CredentialError::BadDigest(number, entry.role))?
                }
                _ => return Err(CredentialError::TokenOrDigest(number, entry.role)),
            };
            if let Some(name) = &entry.name {
                if !matches!(entry.role, Role::Node | Role::Builder) {
                    return Err(CredentialError::NameOnRole(number, entry.role));
                }
                if name.is_empty() || !name.chars().all(|c| c.is_ascii_graphic()) {
                    return Err(CredentialError::BadName(number, entry.role));
                }
            }
            if let Some(earlier) = accepted.entries.iter().position(|(_, d)| *d == digest) {
                return Err(CredentialError::Duplicate(earlier + 1, number));
            }
            accepted.entries.push((
                Principal {
                    role: entry.role,
                    name: entry.name.clone(),
                },
                digest,
            ));
        }
        Ok(accepted)
    }

    /// Also accepts `token` as `principal` (for credentials a process makes itself).
    pub fn push(&mut self, principal: Principal, token: &Secret) {
        self.entries.push((principal, digest(token.expose())));
    }

    /// Whether no credential is accepted.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether some credential grants `role`.
    pub fn has_role(&self, role: Role) -> bool {
        self.entries
            .iter()
            .any(|(principal, _)| principal.role == role)
    }

    /// Who `token` is, if it is accepted. Every digest is compared in full, so the time taken
    /// says nothing about which entry, if any, matched.
    pub fn authenticate(&self, token: &[u8]) -> Option<Principal> {
        let given: [u8; 32] = sha2::Sha256::digest(token).into();
        let mut found = None;
        for (principal, digest) in &self.entries {
            if constant_time_eq(&given, digest) {
                found = Some(principal);
            }
        }
        found.cloned()
    }

    /// Who the `Authorization: Bearer` header in `headers` is, if accepted.
    pub fn authenticate_headers(&self, headers: &http::HeaderMap) -> Option<Principal> {
        let value = headers.get(http::header::AUTHORIZATION)?;
        let token = value.as_bytes().strip_prefix(b"Bearer ")?;
        self.authenticate(token.trim_ascii())
    }
}

/// The SHA-256 digest of a token, as accepted credentials hold it.
pub fn digest(token: &str) -> [u8; 32] {
    sha2::Sha256::digest(token.as_bytes()).into()
}

/// `digest(token)` as 64 lowercase hex digits, as `token_sha256` takes it.
pub fn digest_hex(token: &str) -> String {
    crate::hex(&digest(token))
}

fn parse_digest(hex: &str) -> Option<[u8; 32]> {
    let hex = hex.trim();
    if hex.len() != 64 || !hex.is_ascii() {
        return None;
    }
    let mut out = [0u8; 32];
    for (slot, pair) in out.iter_mut().zip(hex.as_bytes().chunks(2)) {
        let pair = std::str::from_utf8(pair).ok()?;
        *slot = u8::from_str_radix(pair, 16).ok()?;
    }
    Some(out)
}

/// A new random token: 32 bytes from the kernel, hex, with a prefix that makes a leaked one
/// easy to recognise in a scan.
pub fn new_token() -> Result<Secret, std::io::Error> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(std::io::Error::other)?;
    Ok(Secret::new(format!("plinth_{}", crate::hex(&bytes))))
}

/// Which roles may call each RPC of one service: entries are a full method path
/// (`/plinth.catalog.v1.SessionService/RegisterNode`) or a service prefix ending in `/`
/// (`/plinth.source.v1.SourceService/`). The first entry that matches decides; a path no entry
/// matches is refused to everyone.
#[derive(Debug, Clone, Copy)]
pub struct Access(pub &'static [(&'static str, &'static [Role])]);

impl Access {
    /// Whether `role` may call `path`.
    pub fn allows(&self, path: &str, role: Role) -> bool {
        self.0
            .iter()
            .find(|(pattern, _)| {
                if pattern.ends_with('/') {
                    path.starts_with(pattern)
                } else {
                    path == *pattern
                }
            })
            .is_some_and(|(_, roles)| roles.contains(&role))
    }
}

/// What a gRPC server checks each call against.
#[derive(Debug, Clone)]
pub struct ServerAuth {
    /// The credentials it accepts.
    pub accepted: Arc<Accepted>,
    /// Its RPCs' rules.
    pub access: Access,
}

/// Compares without an early exit, so the time taken says nothing about the secret.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(role: Role, name: Option<&str>, token: &str) -> AcceptEntry {
        AcceptEntry {
            role,
            name: name.map(str::to_owned),
            token: Some(Secret::new(token)),
            token_sha256: None,
        }
    }

    #[test]
    fn a_token_or_its_digest_authenticates_as_the_role_and_name_it_was_given() {
        let node_token = "node-a-token-0123456789";
        let accepted = Accepted::new(&[
            entry(Role::Gateway, None, "gateway-token-0123456789"),
            AcceptEntry {
                role: Role::Node,
                name: Some("node-a".into()),
                token: None,
                token_sha256: Some(digest_hex(node_token).to_uppercase()),
            },
        ])
        .expect("valid");
        assert_eq!(
            accepted.authenticate(b"gateway-token-0123456789"),
            Some(Principal {
                role: Role::Gateway,
                name: None
            })
        );
        let node = accepted.authenticate(node_token.as_bytes()).expect("known");
        assert_eq!(node.role, Role::Node);
        assert!(node.may_act_as("node-a"));
        assert!(!node.may_act_as("node-b"));
        assert_eq!(accepted.authenticate(b"gateway-token-012345678"), None);
        assert_eq!(accepted.authenticate(b""), None);
    }

    #[test]
    fn entries_that_cannot_be_used_are_refused_with_what_is_wrong() {
        let long = "a-token-long-enough-0123";
        let cases: Vec<(AcceptEntry, &str)> = vec![
            (
                AcceptEntry {
                    role: Role::Gateway,
                    name: None,
                    token: None,
                    token_sha256: None,
                },
                "exactly one of",
            ),
            (
                AcceptEntry {
                    role: Role::Gateway,
                    name: None,
                    token: Some(Secret::new(long)),
                    token_sha256: Some(digest_hex(long)),
                },
                "exactly one of",
            ),
            (
                AcceptEntry {
                    role: Role::Node,
                    name: None,
                    token: None,
                    token_sha256: Some("abc".into()),
                },
                "64 hex digits",
            ),
            (
                entry(Role::Gateway, Some("g1"), long),
                "only `node` and `builder`",
            ),
            (entry(Role::Node, Some(""), long), "printable and not empty"),
            (
                entry(Role::Node, Some("a b"), long),
                "printable and not empty",
            ),
            (entry(Role::Builder, None, "short"), "shorter than"),
        ];
        for (entry, expected) in cases {
            let error = Accepted::new(std::slice::from_ref(&entry))
                .expect_err("refused")
                .to_string();
            assert!(error.contains(expected), "{entry:?}: {error}");
        }
        let error = Accepted::new(&[
            entry(Role::Node, Some("n1"), long),
            entry(Role::Gateway, None, long),
        ])
        .expect_err("a token twice")
        .to_string();
        assert!(error.contains("#1 and #2 are the same token"), "{error}");
        assert!(!error.contains(long), "the error never shows the token");
    }

    #[test]
    fn the_first_matching_rule_decides_and_unlisted_paths_are_refused() {
        let access = Access(&[("/p.S/Special", &[Role::Node]), ("/p.S/", &[Role::Gateway])]);
        assert!(access.allows("/p.S/Special", Role::Node));
        assert!(!access.allows("/p.S/Special", Role::Gateway));
        assert!(access.allows("/p.S/Other", Role::Gateway));
        assert!(!access.allows("/p.S/Other", Role::Node));
        assert!(!access.allows("/p.T/Other", Role::Gateway));
        assert!(!access.allows("/p.SS/Other", Role::Gateway));
    }

    #[test]
    fn new_tokens_differ_and_are_long() {
        let (a, b) = (new_token().expect("random"), new_token().expect("random"));
        assert_ne!(a.expose(), b.expose());
        assert!(a.expose().len() > 64);
    }
}
