//! The JSON request extractor. Unlike axum's own, every refusal is `environment_invalid`
//! in the error envelope, and the message names the field at fault (`name: invalid type:
//! integer 5, expected a string`), found with `serde_path_to_error`.
//!
//! A JSON body is read only when the request declares it `application/json`: anything else
//! (`text/plain`, a form, no type at all) is `415 unsupported_media_type` before a byte is
//! read. A web page may send those types anywhere without the browser asking the server
//! first (a CORS preflight); `application/json` it may not, and the gateway grants no
//! preflight, so no page can make the API act on a JSON body.

use axum::extract::{FromRequest, Request};
use axum::http::{HeaderMap, header};
use plinth_kit::{ErrorCode, PlinthError};
use serde::de::DeserializeOwned;

use crate::http::error::ApiError;

/// Largest JSON body accepted; every JSON request of the API fits well inside it.
pub const MAX_JSON_BYTES: usize = 1024 * 1024;

/// A JSON body, parsed strictly.
pub struct JsonBody<T>(pub T);

impl<S, T> FromRequest<S> for JsonBody<T>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request(request: Request, _state: &S) -> Result<Self, Self::Rejection> {
        declared_json(request.headers())?;
        let bytes = read(request.into_body()).await?;
        parse(&bytes).map(JsonBody).map_err(ApiError)
    }
}

/// Whether a request's `Content-Type` is `application/json` (with any parameters, such as
/// `charset=utf-8`, in any case).
pub fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| {
            value
                .split(';')
                .next()
                .unwrap_or_default()
                .trim()
                .eq_ignore_ascii_case("application/json")
        })
}

/// `415 unsupported_media_type` unless the request declares a JSON body.
pub fn declared_json(headers: &HeaderMap) -> Result<(), PlinthError> {
    if is_json(headers) {
        return Ok(());
    }
    let given = match headers.get(header::CONTENT_TYPE) {
        None => "no Content-Type".to_owned(),
        Some(value) => format!(
            "Content-Type {:?}",
            String::from_utf8_lossy(value.as_bytes())
        ),
    };
    Err(PlinthError::new(
        ErrorCode::UnsupportedMediaType,
        format!(
            "request body: this endpoint takes JSON, sent as Content-Type: application/json; \
             the request has {given} (with curl: --json '{{…}}' or -H 'Content-Type: \
             application/json')"
        ),
    ))
}

/// An optional JSON body: none (or only white space) is `T::default()`; anything else must be
/// declared `application/json` and parse as `T`.
pub async fn optional<T: DeserializeOwned + Default>(
    headers: &HeaderMap,
    body: axum::body::Body,
) -> Result<T, PlinthError> {
    let bytes = read(body).await?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    declared_json(headers)?;
    parse(&bytes)
}

/// A JSON request's body, read whole up to [`MAX_JSON_BYTES`]: every JSON body of the API is
/// read through here, never under axum's implicit limit. Past the limit it is
/// `413 file_too_large` with `detail.max_bytes`, as every size limit of the API is; a body
/// that stops arriving is `environment_invalid`.
pub async fn read(body: axum::body::Body) -> Result<axum::body::Bytes, PlinthError> {
    axum::body::to_bytes(body, MAX_JSON_BYTES)
        .await
        .map_err(|error| {
            if past_the_limit(&error) {
                PlinthError::new(
                    ErrorCode::FileTooLarge,
                    format!("request body: larger than {MAX_JSON_BYTES} bytes"),
                )
                .with_detail(serde_json::json!({ "max_bytes": MAX_JSON_BYTES }))
            } else {
                PlinthError::invalid("request body: not received whole")
            }
        })
}

/// Whether reading a body failed because it passed its length limit (somewhere in the
/// error's chain), rather than because it stopped arriving.
fn past_the_limit(error: &axum::Error) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(current) = cause {
        if current.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        cause = current.source();
    }
    false
}

/// Parses `bytes` as `T`, naming the field at fault on failure.
pub fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, PlinthError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(PlinthError::invalid(
            "request body: expected a JSON object, got an empty body",
        ));
    }
    // Derived structs would also accept a JSON array of their fields, in order; a body is an
    // object or it is refused.
    if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(PlinthError::invalid("request body: expected a JSON object"));
    }
    // JSON (and JSON Schema) have one number type: `194.0` is the integer 194, and some
    // clients write whole numbers so. A body that does not parse as written, and has such
    // numbers, is read again with them written as integers; one without them stays refused as
    // it was. Bodies that parse are read once.
    parse_exactly(bytes).or_else(|error| match whole_numbers(bytes) {
        Some(rewritten) => parse_exactly(&rewritten),
        None => Err(error),
    })
}

/// `bytes` with every whole-number float (`194.0`, `1e3`) written as an integer, when there
/// is one and the JSON parses; `None` otherwise.
fn whole_numbers(bytes: &[u8]) -> Option<Vec<u8>> {
    fn rewrite(value: &mut serde_json::Value) -> bool {
        match value {
            serde_json::Value::Number(number) if number.is_f64() => {
                let float = number.as_f64().unwrap_or(f64::NAN);
                // Exactly representable integers only (below 2^53).
                if float.fract() == 0.0 && float.abs() < 9_007_199_254_740_992.0 {
                    *number = if float < 0.0 {
                        serde_json::Number::from(float as i64)
                    } else {
                        serde_json::Number::from(float as u64)
                    };
                    true
                } else {
                    false
                }
            }
            serde_json::Value::Array(items) => {
                items.iter_mut().map(rewrite).fold(false, |a, b| a | b)
            }
            serde_json::Value::Object(map) => {
                map.values_mut().map(rewrite).fold(false, |a, b| a | b)
            }
            _ => false,
        }
    }
    let mut value: serde_json::Value = serde_json::from_slice(bytes).ok()?;
    if !rewrite(&mut value) {
        return None;
    }
    serde_json::to_vec(&value).ok()
}

/// Parses `bytes` as `T` exactly as written.
fn parse_exactly<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, PlinthError> {
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut deserializer).map_err(|error| {
        let path = error.path().to_string();
        let inner = error.into_inner();
        let message = if inner.is_syntax() || inner.is_eof() {
            format!("request body: not valid JSON: {inner}")
        } else if path == "." {
            format!("request body: {inner}")
        } else {
            format!("{path}: {inner}")
        };
        PlinthError::invalid(message)
    })?;
    deserializer
        .end()
        .map_err(|error| PlinthError::invalid(format!("request body: not valid JSON: {error}")))?;
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Sample {
        name: String,
        inner: Option<Inner>,
    }

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Inner {
        count: u32,
    }

    fn message(body: &str) -> String {
        parse::<Sample>(body.as_bytes())
            .expect_err("refused")
            .message
    }

    #[test]
    fn only_a_body_declared_json_is_json() {
        let with = |value: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(header::CONTENT_TYPE, value.parse().expect("a header value"));
            headers
        };
        assert!(is_json(&with("application/json")));
        assert!(is_json(&with("Application/JSON; charset=utf-8")));
        for refused in [
            "text/plain",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
            "application/jsonx",
            "text/plain; application/json",
        ] {
            let error = declared_json(&with(refused)).expect_err(refused);
            assert_eq!(error.code, ErrorCode::UnsupportedMediaType);
            assert!(
                error.message.contains("application/json"),
                "{}",
                error.message
            );
        }
        let none = declared_json(&HeaderMap::new()).expect_err("no type");
        assert_eq!(none.code.http_status(), 415);
        assert!(none.message.contains("no Content-Type"));
    }

    #[test]
    fn whole_numbers_written_as_floats_are_integers() {
        let sample: Sample =
            parse(br#"{"name": "a", "inner": {"count": 194.0}}"#).expect("194.0 is 194");
        assert_eq!(sample.inner.map(|inner| inner.count), Some(194));
        let sample: Sample = parse(br#"{"name": "a", "inner": {"count": 2e2}}"#).expect("2e2");
        assert_eq!(sample.inner.map(|inner| inner.count), Some(200));
        assert!(message(r#"{"name": "a", "inner": {"count": 1.5}}"#).contains("inner.count"));
        assert!(message(r#"{"name": "a", "inner": {"count": -1.0}}"#).contains("inner.count"));
    }

    #[test]
    fn refusals_name_the_field() {
        assert!(message(r#"{"name": 5}"#).starts_with("name: invalid type"));
        assert!(message(r#"{"name": "a", "inner": {"count": "x"}}"#).starts_with("inner.count:"));
        assert!(message(r#"{"name": "a", "extra": 1}"#).contains("unknown field `extra`"));
        assert!(message(r#"{}"#).contains("missing field `name`"));
        assert!(message(r#"{"name": "a""#).starts_with("request body: not valid JSON"));
        assert!(message(r#"{"name": "a"} trailing"#).starts_with("request body: not valid JSON"));
        assert!(message("  ").contains("empty body"));
        assert!(message(r#"["a", null]"#).contains("expected a JSON object"));
    }
}
