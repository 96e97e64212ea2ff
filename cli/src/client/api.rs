//! The REST API as the client calls it: one `reqwest` client (rustls), the bearer token on
//! every request, and every answer that is not a success turned into an [`ApiFailure`]
//! carrying the server's own code and message, which is what a person needs to act on.

use std::fmt;
use std::time::Duration;

use anyhow::Context as _;
use reqwest::{Method, RequestBuilder, Response, Url};
use serde_json::Value;

use super::Usage;
use super::profile::{self, Profile};

/// `--url`: the server this process's commands talk to, over `PLINTH_URL` and the saved one.
static URL: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Makes `--url`'s server the one every [`Api::from_profile`] of this process talks to (the
/// token is still `PLINTH_TOKEN`'s or the saved one, as with `PLINTH_URL`).
pub fn use_url(url: String) {
    let _ = URL.set(url);
}

/// A server's answer that was not a success: `{"error": {"code", "message", "detail"?}}`.
#[derive(Debug)]
pub struct ApiFailure {
    /// The HTTP status.
    pub status: u16,
    /// The API's error code (`environment_not_found`, …), or `http_<status>` when the answer
    /// was not the API's error envelope (a proxy's page, say).
    pub code: String,
    /// What the server said.
    pub message: String,
    /// The answer as JSON, for `--output json`.
    pub body: Value,
}

impl fmt::Display for ApiFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({}, HTTP {})", self.message, self.code, self.status)
    }
}

impl std::error::Error for ApiFailure {}

impl ApiFailure {
    /// Reads a failed answer's body into the API's code and message.
    pub(crate) async fn from_response(response: Response) -> Self {
        let status = response.status();
        let text = response.text().await.unwrap_or_default();
        let parsed: Option<Value> = serde_json::from_str(&text).ok();
        let error = parsed.as_ref().and_then(|body| body.get("error"));
        let field = |name: &str| {
            error
                .and_then(|error| error.get(name))
                .and_then(Value::as_str)
                .map(str::to_owned)
        };
        let code = field("code").unwrap_or_else(|| format!("http_{}", status.as_u16()));
        let message = field("message").unwrap_or_else(|| {
            let text = text.trim();
            if text.is_empty() {
                status
                    .canonical_reason()
                    .unwrap_or("the server answered with an error")
                    .to_owned()
            } else {
                text.chars().take(500).collect()
            }
        });
        let body = match parsed {
            Some(body) if error.is_some() => body,
            _ => serde_json::json!({ "error": { "code": code, "message": message } }),
        };
        ApiFailure {
            status: status.as_u16(),
            code,
            message,
            body,
        }
    }
}

/// A client of one server.
#[derive(Debug, Clone)]
pub struct Api {
    base: Url,
    token: Option<String>,
    http: reqwest::Client,
}

impl Api {
    /// A client of the server `--url`, `PLINTH_URL` or `plinth login` named (the first of
    /// them given), with its token.
    pub fn from_profile() -> anyhow::Result<Self> {
        let mut profile = profile::effective()?;
        if let Some(url) = URL.get() {
            profile.url = Some(url.clone());
        }
        Self::new(&profile)
    }

    /// A client of `profile`'s server (`http://127.0.0.1:8080` when it names none).
    pub fn new(profile: &Profile) -> anyhow::Result<Self> {
        let url = profile.url.as_deref().unwrap_or(profile::DEFAULT_URL);
        let base = parse_url(url)?;
        plinth_blobs::install_tls_provider();
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .user_agent(concat!("plinth/", env!("CARGO_PKG_VERSION")))
            .build()
            .context("cannot make an HTTP client")?;
        Ok(Api {
            base,
            token: profile.token.clone(),
            http,
        })
    }

    /// The server's URL, for messages.
    pub fn base(&self) -> &Url {
        &self.base
    }

    /// The URL of `segments` under the base, each one percent-encoded as a path segment (so
    /// a file named `a b#c` is that file, not a fragment).
    pub fn url<'a>(&self, segments: impl IntoIterator<Item = &'a str>) -> Url {
        let mut url = self.base.clone();
        if let Ok(mut path) = url.path_segments_mut() {
            path.pop_if_empty().extend(segments);
        }
        url
    }

    /// A request with the token attached.
    pub fn request(&self, method: Method, url: Url) -> RequestBuilder {
        let request = self.http.request(method, url);
        match &self.token {
            Some(token) => request.bearer_auth(token),
            None => request,
        }
    }

    /// A request that asks the server to switch protocols (a terminal's WebSocket), with the
    /// token attached. HTTP/1.1 only: an upgrade is an HTTP/1.1 exchange, and HTTP/2 (which
    /// TLS could negotiate) has none.
    pub fn upgrade_request(&self, method: Method, url: Url) -> anyhow::Result<RequestBuilder> {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .user_agent(concat!("plinth/", env!("CARGO_PKG_VERSION")))
            .http1_only()
            .build()
            .context("cannot make an HTTP client")?;
        let request = http.request(method, url);
        Ok(match &self.token {
            Some(token) => request.bearer_auth(token),
            None => request,
        })
    }

    /// Sends `request`; an answer that is not a success is an [`ApiFailure`].
    pub async fn send(&self, request: RequestBuilder) -> anyhow::Result<Response> {
        let response = request
            .send()
            .await
            .map_err(|error| self.unreachable(error))?;
        if response.status().is_success() {
            Ok(response)
        } else {
            Err(ApiFailure::from_response(response).await.into())
        }
    }

    /// Sends `request` and reads its JSON answer.
    pub async fn json(&self, request: RequestBuilder) -> anyhow::Result<Value> {
        let response = self.send(request).await?;
        let bytes = response
            .bytes()
            .await
            .map_err(|error| self.unreachable(error))?;
        serde_json::from_slice(&bytes).with_context(|| {
            format!(
                "the server at {} answered something that is not JSON; is PLINTH_URL the \
                 Plinth REST address?",
                self.base
            )
        })
    }

    /// `GET` of `segments`, as JSON.
    pub async fn get<'a>(
        &self,
        segments: impl IntoIterator<Item = &'a str>,
    ) -> anyhow::Result<Value> {
        self.json(self.request(Method::GET, self.url(segments)))
            .await
    }

    /// `POST` of `segments` with a JSON body, as JSON.
    pub async fn post<'a>(
        &self,
        segments: impl IntoIterator<Item = &'a str>,
        body: &Value,
    ) -> anyhow::Result<Value> {
        self.json(self.request(Method::POST, self.url(segments)).json(body))
            .await
    }

    /// `DELETE` of `segments`, as JSON.
    pub async fn delete<'a>(
        &self,
        segments: impl IntoIterator<Item = &'a str>,
    ) -> anyhow::Result<Value> {
        self.json(self.request(Method::DELETE, self.url(segments)))
            .await
    }

    /// A transport error, with what to check.
    pub fn unreachable(&self, error: reqwest::Error) -> anyhow::Error {
        let mut message = format!("cannot reach the server at {}: {error}", self.base);
        let mut source = std::error::Error::source(&error);
        while let Some(cause) = source {
            message.push_str(&format!(": {cause}"));
            source = cause.source();
        }
        anyhow::anyhow!(
            "{message}; is it running? Set {} or run `plinth login URL` to point at another",
            profile::URL_VARIABLE
        )
    }
}

/// A server URL as given to `plinth login` or `PLINTH_URL`.
pub fn parse_url(url: &str) -> anyhow::Result<Url> {
    let parsed = Url::parse(url.trim()).map_err(|error| {
        Usage(format!(
            "{url:?} is not a URL ({error}); give the server's REST address, e.g. {}",
            profile::DEFAULT_URL
        ))
    })?;
    if !matches!(parsed.scheme(), "http" | "https") || parsed.host().is_none() {
        return Err(Usage(format!(
            "{url:?} is not an http:// or https:// URL; give the server's REST address, e.g. {}",
            profile::DEFAULT_URL
        ))
        .into());
    }
    Ok(parsed)
}
