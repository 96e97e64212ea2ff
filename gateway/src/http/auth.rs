//! Who is calling: a bearer token maps to a scope. With no tokens configured the gateway runs
//! one scope, `default`, for everyone (and the binary refuses to listen beyond loopback then).

use std::sync::Arc;

use axum::extract::{FromRef, FromRequestParts};
use axum::http::request::Parts;
use plinth_kit::config::Secret;
use plinth_kit::grpc::constant_time_eq;
use plinth_kit::{ErrorCode, PlinthError};

use crate::http::error::ApiError;

/// The scope every caller gets when no tokens are configured.
pub const DEFAULT_SCOPE: &str = "default";

/// Token → scope.
pub(crate) struct Tokens {
    pairs: Vec<(Secret, String)>,
}

impl Tokens {
    /// The configured pairs; empty means one open scope.
    pub fn new(pairs: Vec<(Secret, String)>) -> Self {
        Tokens { pairs }
    }

    /// The scope `header` authenticates, if any. Every configured token is compared, in
    /// constant time, so timing says nothing about which prefix matched.
    fn scope_for(&self, header: Option<&[u8]>) -> Result<String, PlinthError> {
        if self.pairs.is_empty() {
            return Ok(DEFAULT_SCOPE.to_owned());
        }
        let Some(header) = header else {
            return Err(unauthenticated(
                "this server needs `Authorization: Bearer <token>`",
            ));
        };
        if strip_bearer(header).is_none() {
            return Err(unauthenticated(
                "the Authorization header must be `Bearer <token>`",
            ));
        }
        self.identify(Some(header))
            .map(|index| self.pairs[index].1.clone())
            .ok_or_else(|| unauthenticated("the bearer token is not one this server knows"))
    }

    /// How many tokens are configured.
    pub fn count(&self) -> usize {
        self.pairs.len()
    }

    /// Which configured token `header` carries (its position in the configuration), if any.
    /// Every token is compared, in constant time.
    pub fn identify(&self, header: Option<&[u8]>) -> Option<usize> {
        let token = strip_bearer(header?)?;
        let mut found = None;
        for (index, (candidate, _)) in self.pairs.iter().enumerate() {
            if constant_time_eq(token, candidate.expose().as_bytes()) {
                found = Some(index);
            }
        }
        found
    }
}

fn strip_bearer(header: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = header.split_at_checked(7)?;
    scheme
        .eq_ignore_ascii_case(b"bearer ")
        .then(|| rest.trim_ascii())
        .filter(|token| !token.is_empty())
}

fn unauthenticated(message: &str) -> PlinthError {
    PlinthError::new(ErrorCode::Unauthenticated, message)
}

/// The authenticated caller of a request.
pub struct Caller {
    /// The scope every object it touches must belong to.
    pub scope: String,
}

impl<S> FromRequestParts<S> for Caller
where
    S: Send + Sync,
    Arc<Tokens>: FromRef<S>,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let header = parts
            .headers
            .get(axum::http::header::AUTHORIZATION)
            .map(|value| value.as_bytes());
        let scope = Arc::<Tokens>::from_ref(state).scope_for(header)?;
        Ok(Caller { scope })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_map_to_scopes_and_refuse_everything_else() {
        let tokens = Tokens::new(vec![
            (Secret::new("tok-a"), "acme".into()),
            (Secret::new("tok-b"), "globex".into()),
        ]);
        assert_eq!(
            tokens.scope_for(Some(b"Bearer tok-b")).expect("ok"),
            "globex"
        );
        assert_eq!(tokens.scope_for(Some(b"bearer tok-a")).expect("ok"), "acme");
        for bad in [
            None,
            Some(&b"Bearer "[..]),
            Some(b"tok-a"),
            Some(b"Basic tok-a"),
            Some(b"Bearer tok-c"),
        ] {
            let error = tokens.scope_for(bad).expect_err("refused");
            assert_eq!(error.code, ErrorCode::Unauthenticated);
        }
        let open = Tokens::new(Vec::new());
        assert_eq!(open.scope_for(None).expect("open"), DEFAULT_SCOPE);
    }
}
