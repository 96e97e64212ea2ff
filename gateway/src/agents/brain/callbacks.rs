//! Brain's invocation services, as far as an environment that answers every Tool in its
//! receipt needs them: once a Tool's receipt is stored, Plinth calls the execution's granted
//! `finish` (`POST {callback.url} {"method": "finish", "input": null}` with the callback's
//! bearer token), so Brain completes the Tool. `null` says there is no new result: the receipt
//! already carried it. The callback belongs to that one delivery: it is used once, never
//! stored, never called again for a duplicate delivery or after a restart.
//!
//! Where Plinth sends it: only to the adapter's registered callback origins. An execution whose
//! `callback.url` has another origin (or any callback, when the adapter registered none) is
//! refused before anything runs, with a `failure` receipt saying why, and nothing is sent to
//! that URL: whoever can deliver operations cannot make Plinth post, with a bearer token of
//! their choosing, to an address of their choosing. The callback's token never reaches a log
//! (`Debug` shows the origin alone) and neither does its URL's path, which may be a capability.
//!
//! Which addresses: the same policy as git imports and the sandbox's egress proxy
//! ([`CallbackAddresses`]). Public addresses only, unless the operator allows a range
//! (`gateway.callback_allow`); an origin on a literal address outside them, or named
//! `localhost`, is refused when it is registered, and at send time the host is resolved once,
//! every address it gives is checked, and the call connects to the checked address (no
//! redirects are followed), so a name that answers otherwise later reaches nothing new.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use plinth_sandbox::egress::policy::Cidr;
use reqwest::Url;
use serde_json::Value;

use super::receipt::{Failure, codes};

/// How long Plinth waits for Brain to answer a `finish`.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// An execution's callback grant.
#[derive(Clone, PartialEq, Eq)]
pub struct Callback {
    url: Url,
    token: String,
}

impl fmt::Debug for Callback {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Callback")
            .field("origin", &self.url.origin().ascii_serialization())
            .field("token", &"<redacted>")
            .finish()
    }
}

impl Callback {
    /// The callback of an `execute` request, checked against the adapter's callback origins:
    /// none given → `Ok(None)`; one whose URL is at a registered origin → `Ok(Some)` when it
    /// grants `finish` (the one method Plinth calls), `Ok(None)` otherwise; anything else →
    /// the failure to answer, and the execution does not run.
    pub fn of_execution(
        request: &Value,
        adapter: &str,
        origins: &[String],
    ) -> Result<Option<Callback>, Failure> {
        let callback = match request.get("callback") {
            None | Some(Value::Null) => return Ok(None),
            Some(Value::Object(callback)) => callback,
            Some(_) => {
                return Err(invalid(
                    "operation.request.callback: expected an object {url, token, methods}",
                ));
            }
        };
        let url = callback
            .get("url")
            .and_then(Value::as_str)
            .and_then(|url| Url::parse(url).ok())
            .ok_or_else(|| invalid("operation.request.callback.url: expected an absolute URL"))?;
        let origin = url.origin().ascii_serialization();
        let registered = matches!(url.scheme(), "http" | "https")
            && url.username().is_empty()
            && url.password().is_none()
            && origins.contains(&origin);
        if !registered {
            return Err(refused(&origin, adapter, origins));
        }
        let grants_finish = callback
            .get("methods")
            .and_then(Value::as_array)
            .is_some_and(|methods| methods.iter().any(|m| m.as_str() == Some("finish")));
        let token = callback.get("token").and_then(Value::as_str);
        Ok(match (grants_finish, token) {
            (true, Some(token)) => Some(Callback {
                url,
                token: token.to_owned(),
            }),
            _ => None,
        })
    }

    /// The origin it is sent to, for logs.
    fn origin(&self) -> String {
        self.url.origin().ascii_serialization()
    }
}

fn invalid(message: &str) -> Failure {
    Failure {
        code: codes::INVALID_REQUEST.to_owned(),
        message: message.to_owned(),
        retryable: false,
        details: None,
    }
}

fn refused(origin: &str, adapter: &str, origins: &[String]) -> Failure {
    let registered = if origins.is_empty() {
        format!(
            "this adapter registered none: register the origins your Brain calls back from with \
             PATCH /v1/workspace-adapters/{adapter} {{\"callback_origins\": [\"https://brain.example:8443\"]}}"
        )
    } else {
        format!(
            "this adapter's callback_origins are {}; add it there if Brain calls back from it",
            origins.join(", ")
        )
    };
    Failure {
        code: codes::CALLBACK_REFUSED.to_owned(),
        message: format!(
            "the execution's callback URL is at origin {origin}, which is not a registered callback origin ({registered}); nothing ran and nothing was sent to it"
        ),
        retryable: false,
        details: Some(serde_json::json!({
            "origin": origin,
            "callback_origins": origins,
        })),
    }
}

/// The configuration key that allows callbacks to addresses that are not public.
pub const ALLOW_KEY: &str = "gateway.callback_allow";

/// Which addresses a callback (or any other outbound call a tenant names) may reach: public
/// ones, by the sandbox's table of what is not the internet (loopback, private, link-local and
/// metadata, shared, reserved, multicast, unique-local, and the IPv6 forms that carry such an
/// IPv4 address), plus the networks the operator allows.
#[derive(Debug, Clone, Default)]
pub struct CallbackAddresses {
    allow: Vec<Cidr>,
}

/// A callback origin whose address may not be called.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{why}: callbacks reach public addresses only, unless the operator allows the range in \
     {ALLOW_KEY} (such as [\"10.0.0.0/8\"])"
)]
pub struct OriginRefused {
    /// What the address is (loopback, a private network, …).
    pub why: String,
}

impl CallbackAddresses {
    /// Public addresses, and `allow` besides.
    pub fn new(allow: Vec<Cidr>) -> Self {
        CallbackAddresses { allow }
    }

    /// Why `ip` may not be called, or `None` when it may.
    pub fn refusal(&self, ip: IpAddr) -> Option<String> {
        if self.allow.iter().any(|net| net.contains(ip)) {
            return None;
        }
        plinth_sandbox::egress::policy::refusal(ip).map(|refusal| refusal.to_string())
    }

    /// Checks a callback origin as it is registered: an address literal must be one that may
    /// be called, and `localhost` (and names under it) is loopback. Other names are checked
    /// each time a callback is sent, when they are resolved. An origin that is not a URL is
    /// left to the catalog's rules.
    pub fn check_origin(&self, origin: &str) -> Result<(), OriginRefused> {
        let Ok(url) = Url::parse(origin) else {
            return Ok(());
        };
        let why = match url.host() {
            Some(url::Host::Ipv4(ip)) => self.refusal(ip.into()),
            Some(url::Host::Ipv6(ip)) => self.refusal(ip.into()),
            Some(url::Host::Domain(name)) => {
                let name = name.trim_end_matches('.').to_ascii_lowercase();
                let loopback = [
                    IpAddr::V4(Ipv4Addr::LOCALHOST),
                    IpAddr::V6(Ipv6Addr::LOCALHOST),
                ];
                if (name == "localhost" || name.ends_with(".localhost"))
                    && loopback.iter().any(|ip| self.refusal(*ip).is_some())
                {
                    Some(format!("{name} names the loopback interface"))
                } else {
                    None
                }
            }
            None => None,
        };
        match why {
            None => Ok(()),
            Some(why) => Err(OriginRefused { why }),
        }
    }

    /// Resolves `url`'s host once and checks every address it gives; answers the address to
    /// connect to, or why none may be.
    async fn resolve(&self, url: &Url) -> Result<(String, SocketAddr), String> {
        let port = url
            .port_or_known_default()
            .ok_or_else(|| "the URL has no port".to_owned())?;
        let (host, addresses) = match url.host() {
            Some(url::Host::Ipv4(ip)) => (ip.to_string(), vec![SocketAddr::new(ip.into(), port)]),
            Some(url::Host::Ipv6(ip)) => (ip.to_string(), vec![SocketAddr::new(ip.into(), port)]),
            Some(url::Host::Domain(name)) => {
                let found =
                    tokio::time::timeout(CALL_TIMEOUT, tokio::net::lookup_host((name, port)))
                        .await
                        .map_err(|_| format!("resolving {name} took too long"))?
                        .map_err(|_| format!("{name} does not resolve"))?;
                (name.to_owned(), found.collect())
            }
            None => return Err("the URL has no host".to_owned()),
        };
        let Some(first) = addresses.first().copied() else {
            return Err(format!("{host} resolves to no address"));
        };
        // Which address a refused name resolved to is not said: it may be internal.
        if addresses
            .iter()
            .any(|addr| self.refusal(addr.ip()).is_some())
        {
            return Err(format!(
                "{host} resolves to an address that is not public; callbacks reach public \
                 addresses only, unless the operator allows the range in {ALLOW_KEY}"
            ));
        }
        Ok((host, first))
    }
}

/// Calls Brain's invocation services.
pub struct Caller {
    /// Whether a client can be made at all (TLS set up).
    usable: bool,
    addresses: CallbackAddresses,
}

impl Caller {
    /// A caller for HTTP and HTTPS callbacks to the addresses `addresses` allows.
    pub fn new(addresses: CallbackAddresses) -> Self {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let usable = match Self::client(None) {
            Ok(_) => true,
            Err(error) => {
                tracing::error!(%error, "cannot make an HTTP client: Brain tools will not be finished through their callback");
                false
            }
        };
        Caller { usable, addresses }
    }

    /// Where callbacks may go.
    pub fn addresses(&self) -> &CallbackAddresses {
        &self.addresses
    }

    /// A client that follows no redirect and connects `host` to `pinned` alone.
    fn client(pinned: Option<(&str, SocketAddr)>) -> reqwest::Result<reqwest::Client> {
        let mut builder = reqwest::Client::builder()
            .timeout(CALL_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy();
        if let Some((host, addr)) = pinned {
            builder = builder.resolve(host, addr);
        }
        builder.build()
    }

    /// Finishes a Tool in the background: its answer is already stored, and a failed call
    /// changes nothing Plinth answers (Brain's own deadline bounds the Tool then).
    pub fn finish(&self, callback: Callback, session: &str, sequence: u64) {
        if !self.usable {
            return;
        }
        let session = session.to_owned();
        let addresses = self.addresses.clone();
        plinth_kit::tasks::spawn(async move {
            let origin = callback.origin();
            let pinned = match addresses.resolve(&callback.url).await {
                Ok(pinned) => pinned,
                Err(why) => {
                    tracing::warn!(brain_session = %session, sequence, %origin, %why, "brain tool's finish callback refused: nothing was sent");
                    return;
                }
            };
            let client = match Self::client(Some((&pinned.0, pinned.1))) {
                Ok(client) => client,
                Err(error) => {
                    tracing::warn!(brain_session = %session, sequence, %origin, %error, "brain tool's finish callback failed");
                    return;
                }
            };
            let sent = client
                .post(callback.url)
                .bearer_auth(&callback.token)
                .json(&serde_json::json!({ "method": "finish", "input": null }))
                .send()
                .await
                .and_then(reqwest::Response::error_for_status);
            match sent {
                Ok(_) => {
                    tracing::debug!(brain_session = %session, sequence, %origin, "brain tool finished through its callback");
                }
                Err(error) => {
                    // The URL's path may be a capability: only the origin is logged.
                    let error = error.without_url();
                    tracing::warn!(brain_session = %session, sequence, %origin, %error, "brain tool's finish callback failed");
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn origins(list: &[&str]) -> Vec<String> {
        list.iter().map(|&origin| origin.to_owned()).collect()
    }

    #[test]
    fn only_a_registered_origins_grant_of_finish_is_used() {
        let allowed = origins(&["http://brain:8080", "https://brain.example"]);
        let granted = serde_json::json!({"callback": {"url": "http://brain:8080/cb", "token": "t", "methods": ["emit", "finish"]}});
        let callback = Callback::of_execution(&granted, "wadp_x", &allowed)
            .expect("allowed")
            .expect("granted");
        assert_eq!(callback.url.as_str(), "http://brain:8080/cb");
        assert_eq!(callback.token, "t");
        let debug = format!("{callback:?}");
        assert!(
            !debug.contains("\"t\"") && debug.contains("<redacted>"),
            "{debug}"
        );
        assert!(!debug.contains("/cb"), "{debug}");
        for not_used in [
            serde_json::json!({}),
            serde_json::json!({"callback": null}),
            serde_json::json!({"callback": {"url": "https://brain.example:443/cb", "token": "t", "methods": ["emit"]}}),
            serde_json::json!({"callback": {"url": "http://brain:8080/cb", "methods": ["finish"]}}),
        ] {
            assert_eq!(
                Callback::of_execution(&not_used, "wadp_x", &allowed).expect("allowed"),
                None,
                "{not_used}"
            );
        }
    }

    #[test]
    fn a_callback_outside_the_registered_origins_is_refused() {
        let allowed = origins(&["http://brain:8080"]);
        for (url, origin) in [
            ("http://127.0.0.1:8080/cb", "http://127.0.0.1:8080"),
            ("http://brain:8081/cb", "http://brain:8081"),
            ("https://brain:8080/cb", "https://brain:8080"),
            ("http://brain.:8080/cb", "http://brain.:8080"),
            ("file:///etc/passwd", "null"),
        ] {
            let request = serde_json::json!({"callback": {"url": url, "token": "secret-token", "methods": ["finish"]}});
            let failure = Callback::of_execution(&request, "wadp_x", &allowed).expect_err(url);
            assert_eq!(failure.code, codes::CALLBACK_REFUSED, "{url}");
            assert!(failure.message.contains(origin), "{}", failure.message);
            assert!(!failure.message.contains("secret-token"));
            assert_eq!(failure.details.as_ref().expect("details")["origin"], origin);
        }
        let request = serde_json::json!({"callback": {"url": "http://user:pw@brain:8080/cb", "token": "t", "methods": ["finish"]}});
        assert!(Callback::of_execution(&request, "wadp_x", &allowed).is_err());
        let none = Callback::of_execution(
            &serde_json::json!({"callback": {"url": "http://brain:8080/cb", "token": "t", "methods": ["finish"]}}),
            "wadp_x",
            &[],
        )
        .expect_err("no origins registered");
        assert!(none.message.contains("registered none"), "{}", none.message);
        assert!(
            none.message.contains("/v1/workspace-adapters/wadp_x"),
            "{}",
            none.message
        );
        for malformed in [
            serde_json::json!({"callback": "http://brain:8080/cb"}),
            serde_json::json!({"callback": {"token": "t"}}),
            serde_json::json!({"callback": {"url": "not a url"}}),
        ] {
            assert_eq!(
                Callback::of_execution(&malformed, "wadp_x", &allowed)
                    .expect_err("malformed")
                    .code,
                codes::INVALID_REQUEST
            );
        }
    }

    #[test]
    fn origins_on_internal_addresses_are_refused_unless_allowed() {
        let public = CallbackAddresses::default();
        for (origin, why) in [
            ("http://127.0.0.1:8080", "loopback"),
            ("http://127.1", "loopback"),
            ("http://LOCALHOST:9", "loopback"),
            ("http://api.localhost", "loopback"),
            ("http://[::1]:7000", "loopback"),
            ("http://[::ffff:10.0.0.1]", "private"),
            ("http://10.0.0.1", "private"),
            ("http://169.254.169.254", "metadata"),
            ("http://[fe80::1]", "link-local"),
        ] {
            let refused = public.check_origin(origin).expect_err(origin);
            let said = refused.to_string();
            assert!(
                refused.why.contains(why) && said.contains(ALLOW_KEY),
                "{origin}: {said}"
            );
        }
        for fine in [
            "https://brain.example",
            "http://93.184.215.14:8080",
            "https://[2606:4700::1]",
            "not an origin",
        ] {
            public.check_origin(fine).expect(fine);
        }
        let loopback = CallbackAddresses::new(vec!["127.0.0.0/8".parse().expect("net")]);
        loopback
            .check_origin("http://127.0.0.1:8080")
            .expect("allowed");
        loopback.check_origin("http://127.9.9.9").expect("allowed");
        assert!(loopback.check_origin("http://10.0.0.1").is_err());
        assert!(loopback.check_origin("http://[::1]").is_err());
        // localhost may be either family: both must be allowed.
        assert!(loopback.check_origin("http://localhost").is_err());
    }

    #[tokio::test]
    async fn a_name_is_checked_where_it_resolves_and_the_answer_does_not_say_where() {
        let url = Url::parse("http://localhost:9/cb").expect("url");
        let refused = CallbackAddresses::default()
            .resolve(&url)
            .await
            .expect_err("loopback");
        assert!(refused.contains("localhost"), "{refused}");
        assert!(
            !refused.contains("127.0.0.1") && !refused.contains("::1"),
            "{refused}"
        );
        let literal = Url::parse("http://169.254.169.254/latest").expect("url");
        assert!(
            CallbackAddresses::default()
                .resolve(&literal)
                .await
                .is_err()
        );
        let allowed = CallbackAddresses::new(vec![
            "127.0.0.0/8".parse().expect("net"),
            "::1".parse().expect("net"),
        ]);
        let (host, addr) = allowed.resolve(&url).await.expect("allowed");
        assert_eq!(host, "localhost");
        assert!(addr.ip().is_loopback() && addr.port() == 9, "{addr}");
    }
}
