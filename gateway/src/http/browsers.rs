//! What a web page may not make the gateway do. A browser sends requests for any page it
//! shows, to any address, with the person's network position: a default `plinth serve` on a
//! laptop (loopback, no tokens) is in reach of every page its owner opens. Three rules, in
//! front of every route (REST, the public gRPC, the terminal), with tokens on or off:
//!
//! - **Host**: a request is answered only under one of the server's own names: any IP
//!   address literal, `localhost` (and names under `.localhost`), the host of
//!   `gateway.public_url`, and the names in `gateway.allowed_hosts`. A page on another name
//!   that its owner pointed at the server's address (DNS rebinding) sends its own name and
//!   is refused `421 host_not_allowed`. An address literal cannot be rebound: a page that
//!   shows one in its address bar was served from that address.
//! - **Origin**: a state-changing request (any method but `GET`, `HEAD`, `OPTIONS`) or a
//!   WebSocket upgrade (the terminal) that carries an `Origin` other than the server's own
//!   (the scheme's host and port the request was sent to, under a name the Host rule
//!   accepts: the console's pages, which the gateway serves) or one in
//!   `gateway.allowed_origins` (none by default) is refused `403 origin_not_allowed`.
//!   Browsers send `Origin` on every such request; clients that are not browsers (curl, the
//!   CLI, SDKs) send none and are not affected. The server's own origin serves nothing a
//!   tenant wrote as a page: every answer outside the console carries
//!   `Content-Security-Policy: sandbox` (see [`guard`]), so a file rendered from the API
//!   runs, if at all, in an origin of its own.
//! - **Content type**: JSON endpoints read only bodies declared `application/json` (see
//!   `json.rs`), which a page cannot send cross-origin without a CORS preflight, and the
//!   gateway answers no preflight with a grant.
//!
//! Credentials are bearer tokens only, never cookies, so nothing a browser attaches by itself
//! authenticates a request.

use std::net::IpAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use plinth_kit::{ErrorCode, PlinthError};

use crate::http::error::ApiError;

/// The config key that adds a name the server answers to.
pub const HOSTS_KEY: &str = "gateway.allowed_hosts";
/// The config key that allows a web page's origin.
pub const ORIGINS_KEY: &str = "gateway.allowed_origins";

/// One name the server answers to.
#[derive(Debug, Clone, PartialEq, Eq)]
enum HostRule {
    /// Every name (`*`): the operator checks names in front of the gateway.
    Any,
    /// This name, with any port or with this one.
    Name { name: String, port: Option<u16> },
    /// Every name under this suffix (`*.example.com`: `.example.com`).
    Under(String),
}

/// The names and origins a gateway accepts from browsers.
#[derive(Debug, Clone, Default)]
pub struct BrowserPolicy {
    hosts: Vec<HostRule>,
    origins: Vec<String>,
}

impl BrowserPolicy {
    /// The policy for `allowed_hosts` and `allowed_origins` as configured, with the host of
    /// `public_url` (when given) allowed too; or what is wrong with an entry.
    pub fn new(
        allowed_hosts: &[String],
        allowed_origins: &[String],
        public_url: Option<&str>,
    ) -> Result<Self, BrowserSettingError> {
        let mut hosts = allowed_hosts
            .iter()
            .map(|entry| host_rule(entry))
            .collect::<Result<Vec<_>, _>>()?;
        if let Some(url) = public_url
            && let Ok(url) = url::Url::parse(url)
            && let Some(host) = url.host_str()
        {
            hosts.push(HostRule::Name {
                name: normalized(host),
                port: None,
            });
        }
        let origins = allowed_origins
            .iter()
            .map(|entry| origin(entry))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(BrowserPolicy { hosts, origins })
    }

    /// Whether `host` (a `Host` header or a URI's authority: `name`, `name:port`,
    /// `[v6]:port`) is one of the server's names.
    fn host_allowed(&self, host: &str) -> bool {
        let Some((name, port)) = split_host(host) else {
            return false;
        };
        let bare = name.trim_start_matches('[').trim_end_matches(']');
        if bare.parse::<IpAddr>().is_ok() || name == "localhost" || name.ends_with(".localhost") {
            return true;
        }
        self.hosts.iter().any(|rule| match rule {
            HostRule::Any => true,
            HostRule::Name {
                name: allowed,
                port: allowed_port,
            } => *allowed == name && allowed_port.is_none_or(|allowed| Some(allowed) == port),
            HostRule::Under(suffix) => name.ends_with(suffix.as_str()),
        })
    }

    /// Whether a request carrying `Origin: origin` may change state or open a terminal.
    fn origin_allowed(&self, origin: &str) -> bool {
        self.origins.contains(&normalized_origin(origin))
    }

    /// The refusal for a request, if any.
    fn refusal(&self, request: &Request) -> Option<(PlinthError, &'static str)> {
        let headers = request.headers();
        // The names the request was sent to: the URI's authority, then every Host header.
        let hosts: Vec<String> = request
            .uri()
            .authority()
            .map(|authority| authority.as_str().to_owned())
            .into_iter()
            .chain(
                headers
                    .get_all(header::HOST)
                    .iter()
                    .map(|value| String::from_utf8_lossy(value.as_bytes()).into_owned()),
            )
            .collect();
        for host in &hosts {
            if !self.host_allowed(host) {
                return Some((
                    PlinthError::new(
                        ErrorCode::HostNotAllowed,
                        format!(
                            "this server does not answer to the name {host:?}: a request under a \
                             name that is not the server's own is refused, so that no web page \
                             can reach the server through a name it points here (DNS \
                             rebinding). If clients reach the server by this name, add it to \
                             {HOSTS_KEY} (PLINTH_ALLOWED_HOSTS)"
                        ),
                    ),
                    "host_not_allowed",
                ));
            }
        }
        let guarded = !matches!(
            *request.method(),
            Method::GET | Method::HEAD | Method::OPTIONS
        ) || is_upgrade(headers);
        if guarded && let Some(origin) = headers.get(header::ORIGIN) {
            let origin = String::from_utf8_lossy(origin.as_bytes());
            // Every name passed the rule above; the first is the one the request was sent to.
            let same = hosts.first().is_some_and(|host| same_origin(&origin, host));
            if !same && !self.origin_allowed(&origin) {
                return Some((
                    PlinthError::new(
                        ErrorCode::OriginNotAllowed,
                        format!(
                            "a request from the web page at {origin:?} is refused: requests that \
                             change anything, and terminals, are not taken from web pages \
                             unless their origin is in {ORIGINS_KEY} (PLINTH_ALLOWED_ORIGINS)"
                        ),
                    ),
                    "origin_not_allowed",
                ));
            }
        }
        None
    }
}

/// Whether `origin` (an `Origin` header) is the server's own: `http` or `https` (a proxy in
/// front may end TLS) on the name and port the request was sent to (`host`, already found to
/// be one of the server's names). A default port and none are the same.
fn same_origin(origin: &str, host: &str) -> bool {
    let Ok(url) = url::Url::parse(origin.trim()) else {
        return false;
    };
    if !matches!(url.scheme(), "http" | "https")
        || url.path() != "/"
        || url.query().is_some()
        || !url.username().is_empty()
    {
        return false;
    }
    let Some(name) = url.host_str() else {
        return false;
    };
    let Some((own_name, own_port)) = split_host(host) else {
        return false;
    };
    let default = match url.scheme() {
        "https" => 443,
        _ => 80,
    };
    normalized(name) == own_name
        && url.port_or_known_default().unwrap_or(default) == own_port.unwrap_or(default)
}

/// Whether a request asks to switch protocols (a WebSocket: the terminal).
fn is_upgrade(headers: &HeaderMap) -> bool {
    headers.contains_key(header::UPGRADE) || headers.contains_key(header::SEC_WEBSOCKET_KEY)
}

/// An `Origin` header as compared: trimmed, lower case, without a final `/`.
pub(crate) fn normalized_origin(origin: &str) -> String {
    origin.trim().trim_end_matches('/').to_ascii_lowercase()
}

/// A name as compared: lower case, without a final dot.
fn normalized(name: &str) -> String {
    name.trim_end_matches('.').to_ascii_lowercase()
}

/// `host` split into its normalized name (IPv6 literals keep their brackets) and port.
fn split_host(host: &str) -> Option<(String, Option<u16>)> {
    let authority: axum::http::uri::Authority = host.trim().parse().ok()?;
    if authority.as_str().contains('@') {
        return None;
    }
    let name = normalized(authority.host());
    if name.is_empty() {
        return None;
    }
    Some((name, authority.port_u16()))
}

/// What is wrong with an entry of `gateway.allowed_hosts` or `gateway.allowed_origins`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BrowserSettingError {
    /// A `*.` entry whose rest is no name (or carries a port).
    #[error("{HOSTS_KEY}: {entry:?} is not a name pattern (`*.example.com`)")]
    HostPattern {
        /// The entry as configured.
        entry: String,
    },
    /// An entry that is no host name.
    #[error(
        "{HOSTS_KEY}: {entry:?} is not a host name (`plinth.example.com`, \
         `plinth.example.com:8443`, `*.example.com` or `*`)"
    )]
    Host {
        /// The entry as configured.
        entry: String,
    },
    /// An origin that is no URL at all.
    #[error("{ORIGINS_KEY}: {entry:?} is not an origin (`https://console.example.com`): {why}")]
    OriginUrl {
        /// The entry as configured.
        entry: String,
        /// Why it is no URL.
        why: url::ParseError,
    },
    /// A URL that is more or less than an origin.
    #[error(
        "{ORIGINS_KEY}: {entry:?} is not an origin: a scheme (http or https), a host and an \
         optional port, nothing else (`https://console.example.com`)"
    )]
    Origin {
        /// The entry as configured.
        entry: String,
    },
}

fn host_rule(entry: &str) -> Result<HostRule, BrowserSettingError> {
    let entry = entry.trim();
    if entry == "*" {
        return Ok(HostRule::Any);
    }
    if let Some(suffix) = entry.strip_prefix("*.") {
        let (name, port) = split_host(suffix)
            .filter(|(_, port)| port.is_none())
            .ok_or_else(|| BrowserSettingError::HostPattern {
                entry: entry.to_owned(),
            })?;
        debug_assert!(port.is_none());
        return Ok(HostRule::Under(format!(".{name}")));
    }
    let (name, port) = split_host(entry).ok_or_else(|| BrowserSettingError::Host {
        entry: entry.to_owned(),
    })?;
    Ok(HostRule::Name { name, port })
}

fn origin(entry: &str) -> Result<String, BrowserSettingError> {
    let trimmed = entry.trim().trim_end_matches('/');
    let url = url::Url::parse(trimmed).map_err(|why| BrowserSettingError::OriginUrl {
        entry: entry.to_owned(),
        why,
    })?;
    if !matches!(url.scheme(), "http" | "https")
        || url.host_str().is_none()
        || url.path() != "/"
        || url.query().is_some()
        || url.fragment().is_some()
        || !url.username().is_empty()
    {
        return Err(BrowserSettingError::Origin {
            entry: entry.to_owned(),
        });
    }
    Ok(url.origin().ascii_serialization())
}

/// Refuses what a web page must not make the gateway do (see the module's comment).
pub(crate) async fn guard(
    State(policy): State<Arc<BrowserPolicy>>,
    request: Request,
    next: Next,
) -> Response {
    let Some((error, reason)) = policy.refusal(&request) else {
        let mut response = next.run(request).await;
        // Whatever the API answers runs, if a browser renders it, in an origin of its own
        // (the console's pages set their own policy).
        let headers = response.headers_mut();
        if !headers.contains_key(header::CONTENT_SECURITY_POLICY) {
            headers.insert(
                header::CONTENT_SECURITY_POLICY,
                axum::http::HeaderValue::from_static(
                    "sandbox; default-src 'none'; frame-ancestors 'none'",
                ),
            );
        }
        return response;
    };
    metrics::counter!("plinth_gateway_refused_total", "reason" => reason).increment(1);
    tracing::info!(reason, message = %error.message, "refused a request a web page may have sent");
    let grpc = request
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|value| value.as_bytes().starts_with(b"application/grpc"));
    if grpc {
        return error.to_status().into_http::<axum::body::Body>();
    }
    ApiError(error).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(hosts: &[&str], origins: &[&str]) -> BrowserPolicy {
        let owned = |list: &[&str]| list.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        BrowserPolicy::new(&owned(hosts), &owned(origins), None).expect("valid")
    }

    fn request(method: Method, headers: &[(&str, &str)]) -> Request {
        let mut builder = axum::http::Request::builder()
            .method(method)
            .uri("/v1/environments");
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        builder.body(axum::body::Body::empty()).expect("request")
    }

    fn refused(policy: &BrowserPolicy, method: Method, headers: &[(&str, &str)]) -> Option<u16> {
        policy
            .refusal(&request(method, headers))
            .map(|(error, _)| error.code.http_status())
    }

    #[test]
    fn the_server_answers_to_addresses_loopback_names_and_configured_names_only() {
        let default = policy(&[], &[]);
        for host in [
            "127.0.0.1:8080",
            "127.0.0.1",
            "[::1]:8080",
            "10.1.2.3:8080",
            "localhost:8080",
            "LOCALHOST",
            "localhost.:1",
            "app.localhost:3000",
        ] {
            assert_eq!(
                refused(&default, Method::GET, &[("host", host)]),
                None,
                "{host}"
            );
        }
        for host in [
            "evil.example:8080",
            "evil.example",
            "localhost.evil.example",
            "127.0.0.1.evil.example",
            "user@127.0.0.1",
            "",
        ] {
            assert_eq!(
                refused(&default, Method::GET, &[("host", host)]),
                Some(421),
                "{host}"
            );
        }
        let configured = policy(
            &["plinth.example.com", "api.example.com:8443", "*.svc"],
            &[],
        );
        for host in [
            "plinth.example.com",
            "Plinth.Example.Com:443",
            "api.example.com:8443",
            "gateway.plinth.svc:8080",
        ] {
            assert_eq!(
                refused(&configured, Method::GET, &[("host", host)]),
                None,
                "{host}"
            );
        }
        for host in [
            "api.example.com:8080",
            "api.example.com",
            "svc",
            "example.com",
        ] {
            assert_eq!(
                refused(&configured, Method::GET, &[("host", host)]),
                Some(421),
                "{host}"
            );
        }
        assert_eq!(
            refused(&policy(&["*"], &[]), Method::GET, &[("host", "any.where")]),
            None
        );
        let public =
            BrowserPolicy::new(&[], &[], Some("https://plinth.example.com/base")).expect("valid");
        assert_eq!(
            refused(&public, Method::GET, &[("host", "plinth.example.com")]),
            None
        );
    }

    #[test]
    fn web_pages_may_not_change_anything_or_open_a_terminal_unless_their_origin_is_allowed() {
        let default = policy(&[], &[]);
        let page = ("origin", "http://127.0.0.2:9000");
        assert_eq!(refused(&default, Method::POST, &[page]), Some(403));
        assert_eq!(refused(&default, Method::DELETE, &[page]), Some(403));
        assert_eq!(
            refused(&default, Method::POST, &[("origin", "null")]),
            Some(403)
        );
        assert_eq!(refused(&default, Method::GET, &[page]), None, "a read");
        assert_eq!(
            refused(&default, Method::GET, &[page, ("upgrade", "websocket")]),
            Some(403),
            "a terminal"
        );
        assert_eq!(refused(&default, Method::POST, &[]), None, "not a browser");
        // The server's own pages (the console) are the server's origin.
        for (origin, host) in [
            ("http://127.0.0.1:8080", "127.0.0.1:8080"),
            ("http://localhost:8080", "localhost:8080"),
            ("https://plinth.localhost", "plinth.localhost"),
            ("http://[::1]:9", "[::1]:9"),
        ] {
            for method in [Method::POST, Method::PUT, Method::DELETE] {
                assert_eq!(
                    refused(&default, method, &[("origin", origin), ("host", host)]),
                    None,
                    "{origin} to {host}"
                );
            }
            assert_eq!(
                refused(
                    &default,
                    Method::GET,
                    &[("origin", origin), ("host", host), ("upgrade", "websocket")]
                ),
                None,
                "{origin}'s terminal"
            );
        }
        // Another port, another name for the same address, another scheme's page: others.
        for (origin, host) in [
            ("http://127.0.0.1:9000", "127.0.0.1:8080"),
            ("http://localhost:8080", "127.0.0.1:8080"),
            ("http://127.0.0.1", "127.0.0.1:8080"),
            ("ws://127.0.0.1:8080", "127.0.0.1:8080"),
            ("null", "127.0.0.1:8080"),
            ("http://127.0.0.1:8080.evil.example", "127.0.0.1:8080"),
        ] {
            assert_eq!(
                refused(
                    &default,
                    Method::POST,
                    &[("origin", origin), ("host", host)]
                ),
                Some(403),
                "{origin} to {host}"
            );
        }
        // A rebound name is refused for its name before its origin is looked at.
        assert_eq!(
            refused(
                &default,
                Method::POST,
                &[
                    ("origin", "http://evil.example:8080"),
                    ("host", "evil.example:8080")
                ]
            ),
            Some(421)
        );
        let allowed = policy(&[], &["https://console.example.com/"]);
        assert_eq!(
            refused(
                &allowed,
                Method::POST,
                &[("origin", "https://console.example.com")]
            ),
            None
        );
        assert_eq!(
            refused(
                &allowed,
                Method::POST,
                &[("origin", "https://console.example.com:8443")]
            ),
            Some(403)
        );
    }

    #[test]
    fn bad_entries_are_refused_with_the_key() {
        for (hosts, pattern) in [("a b", false), ("*.x:80", true), ("user@host", false)] {
            let error = BrowserPolicy::new(&[hosts.to_owned()], &[], None).expect_err("refused");
            assert!(error.to_string().contains(HOSTS_KEY), "{error}");
            assert_eq!(
                matches!(error, BrowserSettingError::HostPattern { .. }),
                pattern,
                "{error}"
            );
        }
        for origin in ["console.example.com", "https://x.example/path", "ftp://x"] {
            let error = BrowserPolicy::new(&[], &[origin.to_owned()], None).expect_err("refused");
            assert!(error.to_string().contains(ORIGINS_KEY), "{error}");
        }
    }
}
