//! Each public RPC's `google.api.http` option, read from the descriptor set: the REST
//! operation it is, and how a request message becomes that operation's path, query and body.

use http::Method;
use prost_reflect::{DynamicMessage, MethodDescriptor, ReflectMessage, Value};

/// One RPC's HTTP binding.
#[derive(Debug, Clone)]
pub struct Rule {
    /// The REST method.
    pub method: Method,
    /// The path template, split at `/`.
    pub template: Vec<Segment>,
    /// Which request fields are the body.
    pub body: Body,
    /// The response field the raw HTTP body streams into (`data` of a chunk message); none: the
    /// response is JSON (NDJSON for a server-streaming RPC).
    pub response_body: Option<String>,
}

/// One segment of a path template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Segment {
    /// Literal text.
    Literal(String),
    /// `{field}`: one segment from a request field.
    Field(String),
    /// `{field=**}`: the rest of the path from a request field, slashes kept.
    Rest(String),
}

/// Which request fields are the HTTP body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Body {
    /// None: every field the path does not bind is a query parameter.
    None,
    /// `*`: every field the path does not bind is the JSON body.
    All,
    /// One `bytes` field is the raw body (streamed, for a client-streaming RPC); the others
    /// are query parameters.
    Bytes(String),
}

/// Why an RPC's binding cannot be served.
#[derive(Debug, thiserror::Error)]
#[error("{method}: {reason}")]
pub struct RuleError {
    method: String,
    reason: String,
}

impl Rule {
    /// The binding `method` declares.
    pub fn of(method: &MethodDescriptor) -> Result<Rule, RuleError> {
        let fail = |reason: &str| RuleError {
            method: method.full_name().to_owned(),
            reason: reason.to_owned(),
        };
        let pool = method.parent_pool();
        let extension = pool
            .get_extension_by_name("google.api.http")
            .ok_or_else(|| fail("the descriptor set lacks google.api.http"))?;
        let options = method.options();
        if !options.has_extension(&extension) {
            return Err(fail("no google.api.http option"));
        }
        let http = options.get_extension(&extension);
        let http = http
            .as_message()
            .ok_or_else(|| fail("google.api.http is not a message"))?;
        let text = |name: &str| -> Option<String> {
            let field = http.descriptor().get_field_by_name(name)?;
            http.has_field(&field)
                .then(|| http.get_field(&field).as_str().map(str::to_owned))
                .flatten()
        };
        let (verb, path) = [
            (Method::GET, "get"),
            (Method::PUT, "put"),
            (Method::POST, "post"),
            (Method::DELETE, "delete"),
            (Method::PATCH, "patch"),
        ]
        .into_iter()
        .find_map(|(verb, name)| text(name).map(|path| (verb, path)))
        .ok_or_else(|| fail("no get, put, post, delete or patch pattern"))?;
        let template = parse_template(&path).map_err(|reason| fail(&reason))?;
        let body = match text("body").as_deref() {
            None | Some("") => Body::None,
            Some("*") => Body::All,
            Some(field) => {
                let input = method.input();
                let kind = input.get_field_by_name(field).map(|field| field.kind());
                if !matches!(kind, Some(prost_reflect::Kind::Bytes)) {
                    return Err(fail("a body field must be `bytes`"));
                }
                Body::Bytes(field.to_owned())
            }
        };
        if method.is_client_streaming() != matches!(body, Body::Bytes(_)) {
            return Err(fail(
                "a client-streaming RPC (and only one) names a bytes body field",
            ));
        }
        let response_body = text("response_body").filter(|field| !field.is_empty());
        if let Some(field) = &response_body {
            let kind = method.output().get_field_by_name(field).map(|f| f.kind());
            if !matches!(kind, Some(prost_reflect::Kind::Bytes)) || !method.is_server_streaming() {
                return Err(fail(
                    "response_body names a bytes field of a server-streaming RPC",
                ));
            }
        }
        for segment in &template {
            if let Segment::Field(name) | Segment::Rest(name) = segment
                && method.input().get_field_by_name(name).is_none()
            {
                return Err(fail(&format!("the path binds `{name}`, no request field")));
            }
        }
        Ok(Rule {
            method: verb,
            template,
            body,
            response_body,
        })
    }

    /// The path for `request`'s fields, each percent-encoded as one segment (a `**` field's
    /// slashes kept); the bound fields are taken out of `fields`. A bound field left empty is
    /// refused, naming it.
    pub fn path(
        &self,
        fields: &mut serde_json::Map<String, serde_json::Value>,
    ) -> Result<String, MissingField> {
        let mut path = String::new();
        for segment in &self.template {
            path.push('/');
            match segment {
                Segment::Literal(text) => path.push_str(text),
                Segment::Field(name) | Segment::Rest(name) => {
                    let value = fields
                        .remove(name)
                        .map(|value| scalar(&value))
                        .filter(|value| !value.is_empty())
                        .ok_or_else(|| MissingField(name.clone()))?;
                    let pieces: Vec<&str> = if matches!(segment, Segment::Rest(_)) {
                        value.split('/').collect()
                    } else {
                        vec![value.as_str()]
                    };
                    let encoded: Vec<String> = pieces.iter().map(|piece| encode(piece)).collect();
                    path.push_str(&encoded.join("/"));
                }
            }
        }
        Ok(path)
    }
}

/// A field the path is made of, absent or empty in the request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is required")]
pub struct MissingField(pub String);

/// Splits `/v1/environments/{environment_id}/files/{path=**}` into segments.
fn parse_template(path: &str) -> Result<Vec<Segment>, String> {
    let rest = path
        .strip_prefix('/')
        .ok_or_else(|| format!("path template `{path}` does not start with /"))?;
    rest.split('/')
        .map(|segment| {
            let Some(inner) = segment
                .strip_prefix('{')
                .and_then(|inner| inner.strip_suffix('}'))
            else {
                if segment.contains(['{', '}']) || segment.is_empty() {
                    return Err(format!("path template `{path}`: bad segment `{segment}`"));
                }
                return Ok(Segment::Literal(segment.to_owned()));
            };
            match inner.split_once('=') {
                None => Ok(Segment::Field(inner.to_owned())),
                Some((name, "**")) => Ok(Segment::Rest(name.to_owned())),
                Some(_) => Err(format!(
                    "path template `{path}`: only {{field}} and {{field=**}} are served"
                )),
            }
        })
        .collect()
}

/// A scalar JSON value as text (a query value or a path segment).
pub fn scalar(value: &serde_json::Value) -> String {
    match value {
        serde_json::Value::String(text) => text.clone(),
        serde_json::Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// Percent-encodes everything but RFC 3986's unreserved characters.
pub fn encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// The bytes of `message`'s field `name`, if it has one.
pub fn bytes_field(message: &DynamicMessage, name: &str) -> bytes::Bytes {
    match message.get_field_by_name(name).as_deref() {
        Some(Value::Bytes(bytes)) => bytes.clone(),
        _ => bytes::Bytes::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_parse_and_fill_with_encoded_segments() {
        let template =
            parse_template("/v1/environments/{environment_id}/files/{path=**}").expect("parses");
        let rule = Rule {
            method: Method::GET,
            template,
            body: Body::None,
            response_body: None,
        };
        let mut fields = serde_json::json!({
            "environment_id": "henv_1",
            "path": "src/a b/c?.py",
            "limit": 3
        })
        .as_object()
        .cloned()
        .expect("object");
        assert_eq!(
            rule.path(&mut fields).expect("filled"),
            "/v1/environments/henv_1/files/src/a%20b/c%3F.py"
        );
        assert_eq!(fields.len(), 1, "bound fields are taken out: {fields:?}");
        let mut empty = serde_json::Map::new();
        assert_eq!(
            rule.path(&mut empty).expect_err("refused").to_string(),
            "`environment_id` is required"
        );
        for bad in ["v1/x", "/v1/{a=*}", "/v1//x", "/v1/x{y}"] {
            assert!(parse_template(bad).is_err(), "{bad} accepted");
        }
    }
}
