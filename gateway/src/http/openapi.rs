//! The OpenAPI document's cross-cutting answers, added to every operation after the handlers
//! have described their own: what the edge can answer before a handler runs (an unknown query
//! parameter, a JSON body past 1 MiB, a missing token, a full gateway, a deadline), the
//! `500 internal` any operation can give, the adapters' own credentials, and the event schemas
//! of the streamed answers. One place, so a new operation is described as completely as the
//! old ones without repeating these in every handler; Schemathesis (`.ci/run`) checks the
//! result against the running server.

use std::collections::btree_map::Entry;

use utoipa::openapi::path::{Operation, ParameterBuilder, ParameterIn};
use utoipa::openapi::schema::{AnyOfBuilder, ObjectBuilder, OneOfBuilder, Schema};
use utoipa::openapi::security::{
    ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme,
};
use utoipa::openapi::{
    ContentBuilder, HeaderBuilder, Object, OpenApi, Ref, RefOr, Required, Response,
    ResponseBuilder, Type,
};

/// The security scheme of a Brain adapter's calls: the bearer token made with the adapter.
pub const ADAPTER_BEARER: &str = "adapterBearer";
/// The security scheme of a Novo adapter's calls: `Novo-Signature`, an HMAC of the body.
pub const NOVO_SIGNATURE: &str = "novoSignature";

/// Every operation of the document with its path (the methods the API uses).
pub(crate) fn operations_mut(
    openapi: &mut OpenApi,
) -> impl Iterator<Item = (&str, &mut Operation)> {
    openapi.paths.paths.iter_mut().flat_map(|(path, item)| {
        let utoipa::openapi::path::PathItem {
            get,
            put,
            post,
            delete,
            patch,
            ..
        } = item;
        [get, put, post, delete, patch]
            .into_iter()
            .flatten()
            .map(move |operation| (path.as_str(), operation))
    })
}

/// Completes `openapi` in place; see the module's comment.
pub fn complete(openapi: &mut OpenApi) {
    add_security_schemes(openapi);
    add_event_schemas(openapi);
    for (path, operation) in operations_mut(openapi) {
        let novo = path.ends_with("/novo");
        let brain = path.contains("/brain/");
        if novo {
            novo_credential(operation);
        } else if brain {
            operation.security = Some(vec![SecurityRequirement::new(
                ADAPTER_BEARER,
                Vec::<String>::new(),
            )]);
        }
        edge_answers(operation, path);
    }
    browser_answers(openapi);
    stream_exec_events(openapi);
    binary_bodies(openapi);
    session_file_answers(openapi);
    optional_bodies_are_not_null(openapi);
    server_rules(openapi);
}

/// Characters no source path, requirements path or callback origin may hold: control
/// characters (C0, DEL, C1: what `char::is_control` finds) and, in source paths, `\`.
const CONTROL: &str = r"\x00-\x1f\x7f-\x9f";

/// One path component of at most 31 characters (so at most 124 bytes whatever they are,
/// inside the 255-byte limit of a component) that is neither `.` nor `..`: one that starts
/// with another character, three dots or more, or one or two dots and then another character.
/// `first` names characters it may not start with, `also` characters it may not hold. No
/// lookahead and no separate length limit: Hypothesis (Schemathesis) draws such a pattern
/// directly instead of filtering what it draws.
fn component(first: &str, also: &str) -> String {
    let class = format!("[^/{CONTROL}{also}]");
    let other = format!("[^./{CONTROL}{also}{first}]");
    let not_dot = format!("[^./{CONTROL}{also}]");
    format!(r"(?:{other}{class}{{0,30}}|\.{{3,31}}|\.{{1,2}}{not_dot}{class}{{0,28}})")
}

/// A host name as the document promises one (a name whose last label starts with a letter, not
/// `localhost`): an address literal or a name on loopback may be one the server does not reach.
const HOST: &str = r"(?![^/]*localhost)(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)*[A-Za-z](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?";

/// An optional port, 1 to 59999.
const PORT: &str = r"(?::(?:[1-9][0-9]{0,3}|[1-5][0-9]{4}))?";

/// A source path as the source service checks it (`services/source/src/paths.rs`): relative,
/// components joined by `/`, none empty, `.` or `..`, no control character or backslash, no
/// drive letter. Its byte limits (1,024 in all, 255 a component) are stated as counts that
/// stay inside them whatever the characters: 8 components of 31 characters. The document
/// leaves `:` out altogether, which keeps a drive letter out without a lookahead.
fn source_path_pattern() -> String {
    let component = component("", r"\\:");
    format!(r"^{component}(?:/{component}){{0,7}}$")
}

/// Most characters of a source path the document promises (256 of up to 4 bytes each stay
/// inside the source's 1,024 bytes).
const SOURCE_PATH_CHARS: usize = 256;

/// A string schema with `pattern` and a length range.
fn text(pattern: &str, min: usize, max: usize, description: Option<String>) -> Schema {
    Schema::Object(
        ObjectBuilder::new()
            .schema_type(Type::String)
            .pattern(Some(pattern))
            .min_length(Some(min))
            .max_length(Some(max))
            .description(description)
            .build(),
    )
}

/// Adds `rule` to the component schema `name`: it becomes `allOf` the schema and the rule.
fn constrain(openapi: &mut OpenApi, name: &str, rule: Schema) {
    let Some(schemas) = openapi
        .components
        .as_mut()
        .map(|components| &mut components.schemas)
    else {
        return;
    };
    let Some(RefOr::T(schema)) = schemas.get_mut(name) else {
        return;
    };
    let description = match schema {
        Schema::Object(object) => object.description.clone(),
        _ => None,
    };
    *schema = Schema::AllOf(
        utoipa::openapi::schema::AllOfBuilder::new()
            .item(schema.clone())
            .item(rule)
            .description(description)
            .build(),
    );
}

/// The object schema `name` among the components.
fn component_object<'a>(openapi: &'a mut OpenApi, name: &str) -> Option<&'a mut Object> {
    match openapi.components.as_mut()?.schemas.get_mut(name)? {
        RefOr::T(Schema::Object(object)) => Some(object),
        _ => None,
    }
}

/// The items schema of the array property `field` of `object`, made a string schema by
/// `items`, with the array's own bounds.
fn string_items(object: &mut Object, field: &str, items: Schema, max_items: usize) {
    if let Some(RefOr::T(Schema::Array(array))) = object.properties.get_mut(field) {
        array.items = utoipa::openapi::schema::ArrayItems::RefOrSchema(Box::new(RefOr::T(items)));
        array.max_items = Some(max_items);
        array.unique_items = true;
    }
}

/// The rules the server enforces on values, stated in the document so that what the document
/// allows the server accepts (Schemathesis' positive-data check in `.ci/run`). Where a rule
/// is stricter in the server than a schema can say (a byte count of any characters), the
/// document states a tighter bound that stays inside it.
fn server_rules(openapi: &mut OpenApi) {
    let source_path = source_path_pattern();
    let path_text =
        |description: Option<String>| text(&source_path, 1, SOURCE_PATH_CHARS, description);
    // The path of every file route.
    for (path, operation) in operations_mut(openapi) {
        if !path.starts_with("/v1/environments/{id}/files/") {
            continue;
        }
        for parameter in operation.parameters.iter_mut().flatten() {
            let RefOr::T(parameter) = parameter else {
                continue;
            };
            if parameter.name == "path" && parameter.parameter_in == ParameterIn::Path {
                parameter.schema = Some(RefOr::T(path_text(None)));
            }
        }
    }
    // Headers and query parameters the server reads by a grammar of their own.
    let control_free = format!("^[^{CONTROL}]*$");
    let tag = r#"(?:W/)?"[\x21\x23-\x7e]*""#;
    let tags = format!(r"^(?:\*|{tag}(?:, ?{tag})*)?$");
    let rules: [(&str, &str, ParameterIn, Schema); 8] = [
        (
            "/import",
            "commit",
            ParameterIn::Query,
            text("^(?:[0-9A-Fa-f]{40}|[0-9A-Fa-f]{64})$", 40, 64, None),
        ),
        (
            "/import",
            "ref",
            ParameterIn::Query,
            text(&control_free, 0, 256, None),
        ),
        (
            "/import",
            "describe",
            ParameterIn::Query,
            text(&control_free, 1, 256, None),
        ),
        (
            "",
            "If-Match",
            ParameterIn::Header,
            text(&tags, 0, 4096, None),
        ),
        (
            "",
            "If-None-Match",
            ParameterIn::Header,
            text(&tags, 0, 4096, None),
        ),
        (
            "",
            "Idempotency-Key",
            ParameterIn::Header,
            text("^[\\x21-\\x7e]+$", 1, 255, None),
        ),
        (
            "/v1/sessions",
            "state",
            ParameterIn::Query,
            Schema::Object(
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .enum_values(Some(["active", "ended"]))
                    .build(),
            ),
        ),
        (
            "/v1/sessions",
            "environment",
            ParameterIn::Query,
            text("^henv_[0-9a-f]{32}$", 37, 37, None),
        ),
    ];
    for (path, operation) in operations_mut(openapi) {
        for parameter in operation.parameters.iter_mut().flatten() {
            let RefOr::T(parameter) = parameter else {
                continue;
            };
            for (suffix, name, location, schema) in &rules {
                if path.ends_with(suffix)
                    && parameter.name == *name
                    && parameter.parameter_in == *location
                {
                    let description = match &parameter.schema {
                        Some(RefOr::T(Schema::Object(old))) => old.description.clone(),
                        _ => None,
                    };
                    let mut schema = schema.clone();
                    if let Schema::Object(object) = &mut schema {
                        object.description = description;
                    }
                    parameter.schema = Some(RefOr::T(schema));
                }
            }
        }
    }
    // Free text: anything but NUL.
    for name in ["CreateEnvironment", "UpdateEnvironment"] {
        if let Some(object) = component_object(openapi, name) {
            for field in ["description", "entry"] {
                if let Some(RefOr::T(Schema::Object(text))) = object.properties.get_mut(field) {
                    text.pattern = Some("^[^\\x00]*$".to_owned());
                }
            }
        }
    }
    // `GET …/exec` only opens terminals.
    if let Some(operation) = openapi
        .paths
        .paths
        .get_mut("/v1/sessions/{id}/exec")
        .and_then(|item| item.get.as_mut())
    {
        for parameter in operation.parameters.iter_mut().flatten() {
            if let RefOr::T(parameter) = parameter
                && parameter.name == "pty"
            {
                parameter.required = Required::True;
                parameter.schema = Some(RefOr::T(Schema::Object(
                    ObjectBuilder::new()
                        .schema_type(Type::Boolean)
                        .enum_values(Some([true]))
                        .build(),
                )));
            }
        }
    }
    // A command is not blank; its input is text or base64 (standard, padded), not both.
    if let Some(object) = component_object(openapi, "ExecBody") {
        if let Some(RefOr::T(Schema::Object(command))) = object.properties.get_mut("command") {
            command.pattern = Some(r"\S".to_owned());
        }
        if let Some(RefOr::T(Schema::Object(base64))) = object.properties.get_mut("stdin_base64") {
            base64.pattern =
                Some("^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$".to_owned());
        }
    }
    let null = || ObjectBuilder::new().schema_type(Type::Null);
    constrain(
        openapi,
        "ExecBody",
        AnyOfBuilder::new()
            .item(ObjectBuilder::new().property("stdin", null()))
            .item(ObjectBuilder::new().property("stdin_base64", null()))
            .into(),
    );
    if let Some(object) = component_object(openapi, "MakeDirectory")
        && let Some(RefOr::T(schema)) = object.properties.get_mut("path")
    {
        let description = match schema {
            Schema::Object(old) => old.description.clone(),
            _ => None,
        };
        *schema = path_text(description);
    }
    // `install.python`: requirements files and the project's groups and extras
    // (`plinth_kit::python_install`), and at least one of the two.
    // Not starting with `-` (an installer would read an option); 7 components at most, which
    // keeps it inside 255 characters.
    let requirements = format!(
        r"^{first}(?:/{rest}){{0,6}}$",
        first = component(r"\-", ""),
        rest = component("", "")
    );
    if let Some(object) = component_object(openapi, "PythonBody") {
        string_items(
            object,
            "requirements",
            text(
                &requirements,
                1,
                plinth_kit::python_install::MAX_PATH_CHARS,
                None,
            ),
            plinth_kit::python_install::MAX_NAMES,
        );
    }
    let name = format!(
        "^[A-Za-z0-9](?:[A-Za-z0-9._-]{{0,{}}}[A-Za-z0-9])?$",
        plinth_kit::python_install::MAX_NAME_CHARS - 2
    );
    if let Some(object) = component_object(openapi, "ProjectBody") {
        for field in ["groups", "extras"] {
            string_items(
                object,
                field,
                text(&name, 1, plinth_kit::python_install::MAX_NAME_CHARS, None),
                plinth_kit::python_install::MAX_NAMES,
            );
        }
    }
    let string = || ObjectBuilder::new().schema_type(Type::String);
    let array = || utoipa::openapi::schema::ArrayBuilder::new();
    // Names at least one of the two (`install.python: {}` names nothing to install).
    constrain(
        openapi,
        "PythonBody",
        AnyOfBuilder::new()
            .item(
                ObjectBuilder::new()
                    .required("requirements")
                    .property("requirements", array().min_items(Some(1))),
            )
            .item(
                ObjectBuilder::new()
                    .required("project")
                    .property("project", Ref::from_schema_name("ProjectBody")),
            )
            .into(),
    );
    // A session names its environment, or a harness that does.
    constrain(
        openapi,
        "CreateSession",
        AnyOfBuilder::new()
            .item(
                ObjectBuilder::new()
                    .required("environment")
                    .property("environment", string()),
            )
            .item(
                ObjectBuilder::new()
                    .required("harness_id")
                    .property("harness_id", string().min_length(Some(1))),
            )
            .into(),
    );
    // Callback origins: `http` or `https`, a host name (an address literal or `localhost`
    // may be one callbacks cannot reach, `invalid_request`) and a port, nothing more.
    let origin = format!(r"^https?://{HOST}{PORT}/?$");
    // A git import's repository: https (other schemes only where configured), on a name.
    if let Some(object) = component_object(openapi, "GitSource")
        && let Some(RefOr::T(Schema::Object(url))) = object.properties.get_mut("url")
    {
        url.pattern = Some(format!(r"^https://{HOST}{PORT}(?:/[\x21-\x7e]*)?$"));
        url.max_length = Some(2048);
    }
    for name in ["CreateAdapter", "UpdateAdapter"] {
        if let Some(object) = component_object(openapi, name) {
            object.properties.insert(
                "callback_origins".to_owned(),
                RefOr::T(Schema::Array(
                    array()
                        .items(utoipa::openapi::schema::ArrayItems::RefOrSchema(Box::new(
                            RefOr::T(text(&origin, 1, 2048, None)),
                        )))
                        .max_items(Some(32))
                        .description(Some(
                            "Brain only: the origins (scheme, host and port: \
                             `https://brain.internal:8443`) its Brain calls back from; an \
                             execution whose callback URL is elsewhere is refused.",
                        ))
                        .build(),
                )),
            );
        }
    }
    // A Novo adapter takes no callback origins; a Brain adapter's token is always made by
    // Plinth, so it takes no secret.
    constrain(
        openapi,
        "CreateAdapter",
        OneOfBuilder::new()
            .item(
                ObjectBuilder::new()
                    .property("protocol", string().enum_values(Some(["novo"])))
                    .property("callback_origins", array().max_items(Some(0))),
            )
            .item(
                ObjectBuilder::new()
                    .property("protocol", string().enum_values(Some(["brain"])))
                    .property("secret", string().max_length(Some(0))),
            )
            .into(),
    );
}

/// An optional JSON body (`Option<T>` in a handler's `request_body`) may be left out, but
/// when sent it is a `T`: `null` is refused like any other non-object (see
/// `json::optional`), so the document's schema is `T`, not `T` or `null`.
fn optional_bodies_are_not_null(openapi: &mut OpenApi) {
    for (_, operation) in operations_mut(openapi) {
        let Some(RefOr::T(body)) = operation.request_body.as_mut() else {
            continue;
        };
        if body.required == Some(utoipa::openapi::Required::True) {
            continue;
        }
        for content in body.content.values_mut() {
            let RefOr::T(content) = content else {
                continue;
            };
            if let Some(RefOr::T(Schema::OneOf(one_of))) = &content.schema {
                let mut not_null = one_of.items.iter().filter(|item| {
                    !matches!(item, RefOr::T(Schema::Object(object))
                        if object.schema_type == utoipa::openapi::schema::SchemaType::Type(Type::Null))
                });
                if let (Some(only), None) = (not_null.next(), not_null.next()) {
                    content.schema = Some(only.clone());
                }
            }
        }
    }
}

/// A schema for raw bytes of `media_type`: a binary string, so generated clients take and
/// give bytes (a file), not a JSON array of numbers.
fn binary(media_type: &str) -> RefOr<Schema> {
    RefOr::T(Schema::Object(
        ObjectBuilder::new()
            .schema_type(Type::String)
            .format(Some(utoipa::openapi::schema::SchemaFormat::KnownFormat(
                utoipa::openapi::schema::KnownFormat::Binary,
            )))
            .content_media_type(media_type)
            .build(),
    ))
}

/// Every body that is bytes (file reads and writes, archive imports) is described as bytes.
fn binary_bodies(openapi: &mut OpenApi) {
    for (path, operation) in operations_mut(openapi) {
        if let Some(RefOr::T(body)) = operation.request_body.as_mut() {
            // The archive is recognised by its bytes, whatever type the request names
            // (other than JSON, which is a git import); octet-stream stands for them all.
            if path.ends_with("/import") {
                body.content.insert(
                    "application/octet-stream".to_owned(),
                    ContentBuilder::new()
                        .schema(Some(binary("application/octet-stream")))
                        .build()
                        .into(),
                );
            }
            for (media_type, content) in &mut body.content {
                if let RefOr::T(content) = content
                    && media_type == "application/octet-stream"
                {
                    content.schema = Some(binary(media_type));
                }
            }
        }
        // A file is answered with a content type guessed from its name (`text/x-python`,
        // `application/x-sh`), so its read is documented as any type of bytes.
        let any_type = path.contains("/files/{path}");
        for response in operation.responses.responses.values_mut() {
            if let RefOr::T(response) = response {
                if any_type
                    && let Some(RefOr::T(mut content)) =
                        response.content.shift_remove("application/octet-stream")
                {
                    content.schema = Some(binary("application/octet-stream"));
                    response.content.insert("*/*".to_owned(), content.into());
                    continue;
                }
                for (media_type, content) in &mut response.content {
                    if let RefOr::T(content) = content
                        && media_type == "application/octet-stream"
                    {
                        content.schema = Some(binary(media_type));
                    }
                }
            }
        }
    }
}

/// The JSON a session's file write and delete answer (their handlers describe it in words).
fn session_file_answers(openapi: &mut OpenApi) {
    let Some(item) = openapi
        .paths
        .paths
        .get_mut("/v1/sessions/{id}/files/{path}")
    else {
        return;
    };
    let integer = |description: &str| {
        ObjectBuilder::new()
            .schema_type(Type::Integer)
            .minimum(Some(0))
            .description(Some(description))
            .build()
    };
    let written = ObjectBuilder::new()
        .schema_type(Type::Object)
        .property(
            "path",
            ObjectBuilder::new()
                .schema_type(Type::String)
                .description(Some("Relative to the working directory")),
        )
        .required("path")
        .property("size", integer("Bytes written"))
        .required("size")
        .property(
            "version",
            integer("The environment version the session reads"),
        )
        .required("version")
        .build();
    let deleted = ObjectBuilder::new()
        .schema_type(Type::Object)
        .property(
            "path",
            ObjectBuilder::new()
                .schema_type(Type::String)
                .description(Some("Relative to the working directory")),
        )
        .required("path")
        .property("deleted", Object::with_type(Type::Boolean))
        .required("deleted")
        .property(
            "version",
            integer("The environment version the session reads"),
        )
        .required("version")
        .build();
    for (operation, schema) in [(&mut item.put, written), (&mut item.delete, deleted)] {
        if let Some(RefOr::T(ok)) = operation
            .as_mut()
            .and_then(|operation| operation.responses.responses.get_mut("200"))
            && ok.content.is_empty()
        {
            ok.content.insert(
                "application/json".to_owned(),
                ContentBuilder::new()
                    .schema(Some(Schema::Object(schema)))
                    .build()
                    .into(),
            );
        }
    }
}

fn add_security_schemes(openapi: &mut OpenApi) {
    let components = openapi.components.get_or_insert_with(Default::default);
    components.add_security_scheme(
        ADAPTER_BEARER,
        SecurityScheme::Http(
            HttpBuilder::new()
                .scheme(HttpAuthScheme::Bearer)
                .description(Some(
                    "A Brain workspace adapter's token, shown once when the adapter is made (or its secret rotated); it acts only on that adapter's runs",
                ))
                .build(),
        ),
    );
    components.add_security_scheme(
        NOVO_SIGNATURE,
        SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::with_description(
            "Novo-Signature",
            "`t=<unix seconds>,v1=<hex>[,v1=…]`: HMAC-SHA256 of `\"{t}.{raw body}\"` with the Novo adapter's secret (or the previous one within its grace window); `t` within ±300 s of the server's clock, each signed request accepted once",
        ))),
    );
}

/// A Novo dispatch is signed, not bearer-authenticated, and names its run and call in headers.
fn novo_credential(operation: &mut Operation) {
    operation.security = Some(vec![SecurityRequirement::new(
        NOVO_SIGNATURE,
        Vec::<String>::new(),
    )]);
    let parameters = operation.parameters.get_or_insert_with(Vec::new);
    for (name, description) in [
        (
            "Novo-Request-Id",
            "The call's idempotency key: a retry with the same id answers the first call's stored answer and never runs it again",
        ),
        (
            "Novo-Run-Id",
            "The agent run the call belongs to; one session per run",
        ),
        (
            "Novo-Workspace-Method",
            "The method, as the body names it; when both are given they must agree",
        ),
    ] {
        parameters.push(
            ParameterBuilder::new()
                .name(name)
                .parameter_in(ParameterIn::Header)
                .required(Required::False)
                .description(Some(description))
                .schema(Some(
                    ObjectBuilder::new()
                        .schema_type(Type::String)
                        .max_length(Some(256)),
                ))
                .build()
                .into(),
        );
    }
}

fn error_content() -> utoipa::openapi::Content {
    ContentBuilder::new()
        .schema(Some(Ref::from_schema_name("ErrorBody")))
        .build()
}

fn error_response(description: &str) -> Response {
    ResponseBuilder::new()
        .description(description)
        .content("application/json", error_content())
        .build()
}

fn integer_header(description: &str) -> utoipa::openapi::header::Header {
    HeaderBuilder::new()
        .schema(Some(Object::with_type(Type::Integer)))
        .description(Some(description))
        .build()
}

fn string_header(description: &str) -> utoipa::openapi::header::Header {
    HeaderBuilder::new()
        .schema(Some(Object::with_type(Type::String)))
        .description(Some(description))
        .build()
}

/// Adds `description` to the answer at `status`, or the answer itself when the operation has
/// none; `edit` then adjusts it (headers).
fn answer(
    operation: &mut Operation,
    status: &str,
    description: &str,
    also: &str,
    edit: impl FnOnce(&mut Response),
) {
    match operation.responses.responses.entry(status.to_owned()) {
        Entry::Vacant(slot) => {
            let mut response = error_response(description);
            edit(&mut response);
            slot.insert(RefOr::T(response));
        }
        Entry::Occupied(mut slot) => {
            if let RefOr::T(response) = slot.get_mut() {
                if !also.is_empty() && !response.description.contains(also) {
                    response.description.push_str("; or ");
                    response.description.push_str(also);
                }
                if response.content.is_empty() {
                    response
                        .content
                        .insert("application/json".to_owned(), error_content().into());
                }
                edit(response);
            }
        }
    }
}

/// What the gateway's edge (and any handler) can answer for any operation.
fn edge_answers(operation: &mut Operation, path: &str) {
    let bearer = operation
        .security
        .as_ref()
        .is_some_and(|security| !security.is_empty());
    answer(
        operation,
        "400",
        "environment_invalid: a query parameter this operation does not take (the message names what it takes)",
        "a query parameter this operation does not take",
        |_| {},
    );
    if bearer {
        answer(
            operation,
            "401",
            "unauthenticated: no credential, or not one this server knows",
            "",
            |response| {
                response.headers.insert(
                    "WWW-Authenticate".to_owned(),
                    string_header("`Bearer realm=\"plinth\"`").into(),
                );
            },
        );
    }
    if path.contains('{') {
        answer(
            operation,
            "404",
            "not_found or environment_not_found: nothing of that id in the caller's scope",
            "",
            |_| {},
        );
    }
    let json_body = operation
        .request_body
        .as_ref()
        .is_some_and(|body| match body {
            RefOr::T(body) => body.content.contains_key("application/json"),
            RefOr::Ref(_) => false,
        });
    if json_body {
        answer(
            operation,
            "413",
            "file_too_large: a JSON body past 1 MiB (detail.max_bytes)",
            "a JSON body past 1 MiB",
            |_| {},
        );
    }
    // The adapters' dispatch endpoints are signed by their callers; an import's body is an
    // archive unless it is declared JSON.
    let client_json = json_body
        && !path.ends_with("/novo")
        && !path.contains("/brain/")
        && !path.ends_with("/import");
    if client_json {
        answer(
            operation,
            "415",
            "unsupported_media_type: a body not declared `Content-Type: application/json` (another type, or none)",
            "",
            |_| {},
        );
    }
    answer(
        operation,
        "500",
        "internal: a fault of the server's own; the message says what failed",
        "",
        |_| {},
    );
    answer(
        operation,
        "507",
        "insufficient_storage: a disk the server writes to is full; detail.store names it (database, blobs, node_cache, spool, other); nothing was written; retry after Retry-After seconds, or once space is freed",
        "",
        |response| {
            response.headers.insert(
                "Retry-After".to_owned(),
                integer_header("Seconds to wait before retrying").into(),
            );
        },
    );
    answer(
        operation,
        "503",
        "unavailable: a service behind the gateway did not answer, a database or the blob store did not answer or is overloaded, the gateway has as many requests in flight as it takes (gateway.max_concurrent_requests), or the request passed its deadline (gateway.request_timeout_seconds); retry after Retry-After seconds when given",
        "the gateway is at its requests in flight or past the request deadline (Retry-After)",
        |response| {
            response.headers.insert(
                "Retry-After".to_owned(),
                integer_header("Seconds to wait before retrying, when the gateway says").into(),
            );
        },
    );
}

/// What the browser rules (`browsers.rs`) answer: `421 host_not_allowed` for any operation
/// under a name that is not the server's, `403 origin_not_allowed` for a state-changing one
/// (or the terminal) from a web page whose origin is not allowed.
fn browser_answers(openapi: &mut OpenApi) {
    for (path, item) in &mut openapi.paths.paths {
        let terminal = path == "/v1/sessions/{id}/exec";
        let utoipa::openapi::path::PathItem {
            get,
            put,
            post,
            delete,
            patch,
            ..
        } = item;
        let methods = [
            (get, terminal),
            (put, true),
            (post, true),
            (delete, true),
            (patch, true),
        ];
        for (operation, changes) in methods {
            let Some(operation) = operation else {
                continue;
            };
            answer(
                operation,
                "421",
                "host_not_allowed: the request's Host is not one of the server's names (gateway.allowed_hosts)",
                "",
                |_| {},
            );
            if changes {
                answer(
                    operation,
                    "403",
                    "origin_not_allowed: sent by a web page whose Origin is not in gateway.allowed_origins",
                    "origin_not_allowed: sent by a web page whose Origin is not allowed",
                    |_| {},
                );
            }
        }
    }
}

/// `ExecEvent`: one line of a streamed exec answer.
fn add_event_schemas(openapi: &mut OpenApi) {
    let components = openapi.components.get_or_insert_with(Default::default);
    let text_event = |field: &str, description: &str| {
        Schema::Object(
            ObjectBuilder::new()
                .schema_type(Type::Object)
                .property(field, Object::with_type(Type::String))
                .required(field)
                .additional_properties(Some(
                    utoipa::openapi::schema::AdditionalProperties::FreeForm(false),
                ))
                .description(Some(description))
                .build(),
        )
    };
    let error_event = Schema::Object(
        ObjectBuilder::new()
            .schema_type(Type::Object)
            .property("error", Ref::from_schema_name("ErrorObject"))
            .required("error")
            .description(Some(
                "The command could not finish (its node stopped answering): the last line",
            ))
            .build(),
    );
    components.schemas.insert(
        "ExecEvent".to_owned(),
        RefOr::T(Schema::OneOf(
            OneOfBuilder::new()
                .item(text_event("stdout", "Bytes the command wrote to stdout, as they came"))
                .item(text_event("stderr", "Bytes the command wrote to stderr, as they came"))
                .item(Ref::from_schema_name("ExecResultBody"))
                .item(error_event)
                .description(Some(
                    "One line of `POST /v1/sessions/{id}/exec?stream=true`: output as it comes, then the result (or an error) as the last line",
                ))
                .build(),
        )),
    );
}

/// The streamed form of exec's answer (`?stream=true`): newline-delimited `ExecEvent`s; and
/// its body, which a terminal's upgrade (`?pty=true`) does not send.
fn stream_exec_events(openapi: &mut OpenApi) {
    let Some(operation) = openapi
        .paths
        .paths
        .get_mut("/v1/sessions/{id}/exec")
        .and_then(|item| item.post.as_mut())
    else {
        return;
    };
    // With `pty=true` the request is a WebSocket upgrade, which has no body.
    if let Some(RefOr::T(body)) = operation.request_body.as_mut() {
        body.required = Some(Required::False);
    }
    if let Some(RefOr::T(ok)) = operation.responses.responses.get_mut("200") {
        ok.content.insert(
            "application/x-ndjson".to_owned(),
            ContentBuilder::new()
                .schema(Some(Ref::from_schema_name("ExecEvent")))
                .build()
                .into(),
        );
    }
}
