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

use std::fmt;
use std::time::Duration;

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

/// Calls Brain's invocation services.
pub struct Caller {
    client: Option<reqwest::Client>,
}

impl Caller {
    /// A client for HTTP and HTTPS callbacks.
    pub fn new() -> Self {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            .timeout(CALL_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .build();
        match client {
            Ok(client) => Caller {
                client: Some(client),
            },
            Err(error) => {
                tracing::error!(%error, "cannot make an HTTP client: Brain tools will not be finished through their callback");
                Caller { client: None }
            }
        }
    }

    /// Finishes a Tool in the background: its answer is already stored, and a failed call
    /// changes nothing Plinth answers (Brain's own deadline bounds the Tool then).
    pub fn finish(&self, callback: Callback, session: &str, sequence: u64) {
        let Some(client) = self.client.clone() else {
            return;
        };
        let session = session.to_owned();
        plinth_kit::tasks::spawn(async move {
            let origin = callback.origin();
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
}
