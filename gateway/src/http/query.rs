//! One rule for query strings: an operation takes exactly the query parameters its OpenAPI
//! operation declares, and a request naming any other is `400 environment_invalid` naming it
//! and what the operation takes. A misspelt `?folow=true` is an error, not a silent no-op,
//! on every route alike. The rules are read from the generated document itself, so a
//! parameter added to a handler's `IntoParams` is accepted as soon as it is documented.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use axum::extract::{MatchedPath, Request, State};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use plinth_kit::PlinthError;
use utoipa::openapi::path::ParameterIn;

use crate::http::error::ApiError;

/// The query parameters of each documented operation, by method and axum route.
#[derive(Debug, Clone, Default)]
pub struct QueryRules(Arc<HashMap<(Method, String), HashSet<String>>>);

impl QueryRules {
    /// Reads the rules from `openapi`, whose paths are spelt as axum routes them.
    pub fn from_openapi(openapi: &utoipa::openapi::OpenApi) -> Self {
        let mut rules = HashMap::new();
        for (path, item) in &openapi.paths.paths {
            let shared: Vec<String> = query_names(item.parameters.as_deref());
            let operations = [
                (Method::GET, &item.get),
                (Method::PUT, &item.put),
                (Method::POST, &item.post),
                (Method::DELETE, &item.delete),
                (Method::PATCH, &item.patch),
                (Method::HEAD, &item.head),
            ];
            for (method, operation) in operations {
                let Some(operation) = operation else {
                    continue;
                };
                let mut names: HashSet<String> = shared.iter().cloned().collect();
                names.extend(query_names(operation.parameters.as_deref()));
                rules.insert((method, path.clone()), names);
            }
        }
        QueryRules(Arc::new(rules))
    }
}

/// The names of the query parameters among `parameters` (a reference to a shared one is not
/// followed: the document defines every parameter in place).
fn query_names(
    parameters: Option<&[utoipa::openapi::RefOr<utoipa::openapi::path::Parameter>]>,
) -> Vec<String> {
    parameters
        .unwrap_or_default()
        .iter()
        .filter_map(|parameter| match parameter {
            utoipa::openapi::RefOr::T(parameter) => Some(parameter),
            utoipa::openapi::RefOr::Ref(_) => None,
        })
        .filter(|parameter| parameter.parameter_in == ParameterIn::Query)
        .map(|parameter| parameter.name.clone())
        .collect()
}

/// Refuses a request whose query names a parameter its operation does not take. Routes the
/// document does not describe are left alone.
pub async fn known_parameters(
    State(rules): State<QueryRules>,
    matched: Option<MatchedPath>,
    request: Request,
    next: Next,
) -> Response {
    let method = if request.method() == Method::HEAD {
        Method::GET
    } else {
        request.method().clone()
    };
    if let (Some(matched), Some(query)) = (matched, request.uri().query())
        && let Some(allowed) = rules.0.get(&(method, matched.as_str().to_owned()))
    {
        for (name, _) in url::form_urlencoded::parse(query.as_bytes()) {
            if !allowed.contains(name.as_ref()) {
                let mut takes: Vec<&str> = allowed.iter().map(String::as_str).collect();
                takes.sort_unstable();
                let takes = if takes.is_empty() {
                    "none".to_owned()
                } else {
                    takes.join(", ")
                };
                return ApiError(PlinthError::invalid(format!(
                    "query: unknown parameter {name:?}; this operation takes: {takes}"
                )))
                .into_response();
            }
        }
    }
    next.run(request).await
}

/// A boolean query parameter: `true` or `false` in any case (`True`, `FALSE`), as clients
/// spell them; anything else is refused naming the parameter. For `Option<bool>` fields with
/// `#[serde(default, deserialize_with = "crate::http::query::flag")]`.
pub fn flag<'de, D>(deserializer: D) -> Result<Option<bool>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    let text = <std::borrow::Cow<'de, str> as serde::Deserialize>::deserialize(deserializer)?;
    if text.eq_ignore_ascii_case("true") {
        Ok(Some(true))
    } else if text.eq_ignore_ascii_case("false") {
        Ok(Some(false))
    } else {
        Err(serde::de::Error::custom(format!(
            "{text:?} is not true or false"
        )))
    }
}

#[cfg(test)]
mod tests {
    #[derive(Debug, serde::Deserialize)]
    struct Flags {
        #[serde(default, deserialize_with = "super::flag")]
        follow: Option<bool>,
    }

    fn follow(query: &str) -> Result<Option<bool>, String> {
        let uri: axum::http::Uri = format!("/log?{query}").parse().expect("a URI");
        axum::extract::Query::<Flags>::try_from_uri(&uri)
            .map(|flags| flags.0.follow)
            .map_err(|error| error.body_text())
    }

    #[test]
    fn booleans_are_true_or_false_in_any_case() {
        assert_eq!(follow("follow=true"), Ok(Some(true)));
        assert_eq!(follow("follow=False"), Ok(Some(false)));
        assert_eq!(follow("follow=TRUE"), Ok(Some(true)));
        assert_eq!(follow(""), Ok(None));
        let refused = follow("follow=yes").expect_err("yes is no boolean");
        assert!(
            refused.contains("\"yes\" is not true or false"),
            "{refused}"
        );
        assert!(follow("follow=").is_err());
    }
}
