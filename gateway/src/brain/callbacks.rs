//! Brain's invocation services, as far as an environment that answers every Tool in its
//! receipt needs them: once a Tool's receipt is stored, Plinth calls the execution's granted
//! `finish` (`POST {callback.url} {"method": "finish", "input": null}` with the callback's
//! bearer token), so Brain completes the Tool. `null` says there is no new result: the receipt
//! already carried it. The callback belongs to that one delivery: it is used once, never
//! stored, never called again for a duplicate delivery or after a restart.

use std::time::Duration;

use serde_json::Value;

/// How long Plinth waits for Brain to answer a `finish`.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// An execution's callback grant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Callback {
    url: String,
    token: String,
}

impl Callback {
    /// The grant in an `execute` request, when it grants `finish`.
    pub fn finish_grant(request: &Value) -> Option<Callback> {
        let callback = request.get("callback")?;
        let grants_finish = callback
            .get("methods")?
            .as_array()?
            .iter()
            .any(|method| method.as_str() == Some("finish"));
        let url = callback.get("url")?.as_str()?;
        let token = callback.get("token")?.as_str()?;
        (grants_finish && (url.starts_with("http://") || url.starts_with("https://"))).then(|| {
            Callback {
                url: url.to_owned(),
                token: token.to_owned(),
            }
        })
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
            let sent = client
                .post(&callback.url)
                .bearer_auth(&callback.token)
                .json(&serde_json::json!({ "method": "finish", "input": null }))
                .send()
                .await
                .and_then(reqwest::Response::error_for_status);
            match sent {
                Ok(_) => {
                    tracing::debug!(brain_session = %session, sequence, "brain tool finished through its callback");
                }
                Err(error) => {
                    tracing::warn!(brain_session = %session, sequence, %error, "brain tool's finish callback failed");
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_grant_of_finish_is_used() {
        let granted = serde_json::json!({"callback": {"url": "http://brain/cb", "token": "t", "methods": ["emit", "finish"]}});
        assert_eq!(
            Callback::finish_grant(&granted),
            Some(Callback {
                url: "http://brain/cb".into(),
                token: "t".into()
            })
        );
        for refused in [
            serde_json::json!({}),
            serde_json::json!({"callback": {"url": "http://brain/cb", "token": "t", "methods": ["emit"]}}),
            serde_json::json!({"callback": {"url": "file:///etc/passwd", "token": "t", "methods": ["finish"]}}),
            serde_json::json!({"callback": {"url": "http://brain/cb", "methods": ["finish"]}}),
        ] {
            assert_eq!(Callback::finish_grant(&refused), None, "{refused}");
        }
    }
}
