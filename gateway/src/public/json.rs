//! REST JSON ↔ `plinth.v1` messages. The REST shapes are UHP's (mixed `camelCase` and
//! `snake_case`, lower-case strings for closed sets, times in milliseconds under names
//! without `_ms`, `null` for absent); the messages are typed (enums, `*_ms` times). This is the whole difference, in
//! one place:
//!
//! - a REST key is the field of that name, or of that JSON name, or the one [`RENAMED`] says;
//! - a string of an enum field is the value `<ENUM>_<STRING>` (`ready` → `BUILD_STATUS_READY`);
//! - `null` and keys with no field (`object`) are left out;
//! - a REST object that is one case of a `oneof` without naming it (an exec's result line)
//!   becomes the case whose message takes all its keys.

use prost_reflect::{
    DeserializeOptions, DynamicMessage, EnumDescriptor, Kind, MessageDescriptor, ReflectMessage,
    SerializeOptions,
};
use serde_json::{Map, Value};

/// REST keys whose field has another name: `(key, field)`. Both hold milliseconds since the
/// Unix epoch; REST names its times without the unit.
const RENAMED: &[(&str, &str)] = &[
    ("createdAt", "created_at_ms"),
    ("updatedAt", "updated_at_ms"),
    ("endedAt", "ended_at_ms"),
    ("rotatedAt", "rotated_at_ms"),
    (
        "previousCredentialExpiresAt",
        "previous_credential_expires_at_ms",
    ),
    ("at", "at_ms"),
    ("started_at", "started_at_ms"),
    ("finished_at", "finished_at_ms"),
    ("queued_at", "queued_at_ms"),
];

/// Why a message and REST's JSON could not be turned into each other: the gateway's own
/// fault (or the REST answer's), never the caller's.
#[derive(Debug, thiserror::Error)]
pub enum Translation {
    /// A REST answer that is not the message it should be.
    #[error("{message}: {source}")]
    Answer {
        /// The message's full name.
        message: String,
        /// What did not fit.
        source: serde_json::Error,
    },
    /// A request message that would not serialize.
    #[error("the request as JSON: {0}")]
    Request(serde_json::Error),
    /// A request message that serialized to something other than an object.
    #[error("a request is not an object")]
    NotAnObject,
}

/// A REST answer as the message `descriptor`.
pub fn message_from_rest(
    descriptor: &MessageDescriptor,
    value: Value,
) -> Result<DynamicMessage, Translation> {
    let value = to_proto(descriptor, value);
    DynamicMessage::deserialize_with_options(
        descriptor.clone(),
        value,
        &DeserializeOptions::new().deny_unknown_fields(false),
    )
    .map_err(|source| Translation::Answer {
        message: descriptor.full_name().to_owned(),
        source,
    })
}

/// A request message as REST JSON fields: proto names, enums as REST's strings. Fields with
/// presence (`optional`, messages) are sent only when set. Other scalars at their default
/// (`""`, `0`, `false`) are sent when `defaults` (a JSON body, where REST then judges an
/// empty name as it would from any client) and left out otherwise (a query, where REST applies
/// its own default for an absent `limit`). Empty lists and maps are never sent.
pub fn rest_fields(
    message: &DynamicMessage,
    defaults: bool,
) -> Result<Map<String, Value>, Translation> {
    let options = SerializeOptions::new()
        .use_proto_field_name(true)
        .skip_default_fields(!defaults)
        .stringify_64_bit_integers(false);
    let value = message
        .serialize_with_options(serde_json::value::Serializer, &options)
        .map_err(Translation::Request)?;
    match to_rest(&message.descriptor(), value) {
        Value::Object(mut fields) => {
            fields.retain(|_, value| match value {
                Value::Array(items) => !items.is_empty(),
                Value::Object(entries) => !entries.is_empty(),
                Value::Null => false,
                _ => true,
            });
            Ok(fields)
        }
        _ => Err(Translation::NotAnObject),
    }
}

fn to_proto(descriptor: &MessageDescriptor, value: Value) -> Value {
    let Value::Object(object) = value else {
        return value;
    };
    if is_free_form(descriptor) {
        return Value::Object(object);
    }
    let known = |key: &str| {
        descriptor.get_field_by_name(key).is_some()
            || descriptor.get_field_by_json_name(key).is_some()
            || RENAMED
                .iter()
                .any(|(rest, field)| *rest == key && descriptor.get_field_by_name(field).is_some())
    };
    // An object with keys that are no field of a message with a `oneof` of messages: it is
    // the case that takes all its keys (an exec's result line has `stdout` too, and
    // `exit_code`).
    let takes_all = |message: &MessageDescriptor| {
        object.keys().all(|key| {
            message.get_field_by_name(key).is_some()
                || message.get_field_by_json_name(key).is_some()
        })
    };
    let case = descriptor
        .oneofs()
        .flat_map(|oneof| oneof.fields().collect::<Vec<_>>())
        .find(|field| matches!(field.kind(), Kind::Message(message) if takes_all(&message)));
    if let Some(case) = case.filter(|_| !object.keys().all(|key| known(key))) {
        let mut wrapped = Map::new();
        wrapped.insert(case.name().to_owned(), Value::Object(object));
        return to_proto(descriptor, Value::Object(wrapped));
    }
    let mut out = Map::new();
    for (key, value) in object {
        if value.is_null() {
            continue;
        }
        let direct = descriptor
            .get_field_by_name(&key)
            .or_else(|| descriptor.get_field_by_json_name(&key));
        let renamed = || {
            RENAMED.iter().find_map(|(rest, field)| {
                (*rest == key)
                    .then(|| descriptor.get_field_by_name(field))
                    .flatten()
            })
        };
        let Some(field) = direct.or_else(renamed) else {
            continue;
        };
        let value = if field.is_list() {
            match value {
                Value::Array(items) => Value::Array(
                    items
                        .into_iter()
                        .map(|item| scalar_to_proto(&field.kind(), item))
                        .collect(),
                ),
                other => other,
            }
        } else if field.is_map() {
            let value_kind = match field.kind() {
                Kind::Message(entry) => entry.map_entry_value_field().kind(),
                other => other,
            };
            match value {
                Value::Object(entries) => Value::Object(
                    entries
                        .into_iter()
                        .map(|(k, v)| (k, scalar_to_proto(&value_kind, v)))
                        .collect(),
                ),
                other => other,
            }
        } else {
            scalar_to_proto(&field.kind(), value)
        };
        out.insert(field.name().to_owned(), value);
    }
    Value::Object(out)
}

fn scalar_to_proto(kind: &Kind, value: Value) -> Value {
    match (kind, value) {
        (Kind::Enum(descriptor), Value::String(text)) => {
            Value::String(enum_value_name(descriptor, &text).unwrap_or(text))
        }
        (Kind::Message(descriptor), value) => to_proto(descriptor, value),
        (_, value) => value,
    }
}

/// `google.protobuf.Struct` and `Value` take any JSON as it is.
fn is_free_form(descriptor: &MessageDescriptor) -> bool {
    matches!(
        descriptor.full_name(),
        "google.protobuf.Struct" | "google.protobuf.Value" | "google.protobuf.ListValue"
    )
}

/// `ready` of `BuildStatus` → `BUILD_STATUS_READY`.
fn enum_value_name(descriptor: &EnumDescriptor, text: &str) -> Option<String> {
    let wanted = format!("_{}", text.to_ascii_uppercase().replace('-', "_"));
    descriptor
        .values()
        .find(|value| value.number() != 0 && value.name().ends_with(&wanted))
        .map(|value| value.name().to_owned())
}

/// `BUILD_STATUS_READY` of `BuildStatus` → `ready`: the value's name after the prefix every
/// value shares (the `UNSPECIFIED` value's, less `UNSPECIFIED`).
fn enum_rest_name(descriptor: &EnumDescriptor, name: &str) -> String {
    let prefix = descriptor
        .values()
        .find(|value| value.number() == 0)
        .and_then(|value| value.name().strip_suffix("UNSPECIFIED").map(str::to_owned))
        .unwrap_or_default();
    name.strip_prefix(&prefix)
        .unwrap_or(name)
        .to_ascii_lowercase()
}

fn to_rest(descriptor: &MessageDescriptor, value: Value) -> Value {
    let Value::Object(object) = value else {
        return value;
    };
    if is_free_form(descriptor) {
        return Value::Object(object);
    }
    let mut out = Map::new();
    for (key, value) in object {
        let Some(field) = descriptor.get_field_by_name(&key) else {
            out.insert(key, value);
            continue;
        };
        let convert = |value: Value| match (field.kind(), value) {
            (Kind::Enum(descriptor), Value::String(name)) => {
                Value::String(enum_rest_name(&descriptor, &name))
            }
            (Kind::Message(descriptor), value) if !field.is_map() => to_rest(&descriptor, value),
            (_, value) => value,
        };
        let value = match value {
            Value::Array(items) if field.is_list() => {
                Value::Array(items.into_iter().map(convert).collect())
            }
            other => convert(other),
        };
        out.insert(key, value);
    }
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost_reflect::DescriptorPool;

    fn pool() -> DescriptorPool {
        DescriptorPool::decode(plinth_proto::PUBLIC_DESCRIPTOR_SET).expect("descriptor set")
    }

    #[test]
    fn an_environment_from_rest_is_typed_with_times_in_milliseconds() {
        let pool = pool();
        let descriptor = pool
            .get_message_by_name("plinth.v1.Environment")
            .expect("Environment");
        let rest = serde_json::json!({
            "id": "henv_1", "object": "environment", "name": "Demo", "slug": "demo",
            "description": "", "entry": "", "status": "ready", "mount": "/env/demo",
            "version": 2, "latestVersion": 3, "files": {"count": 4, "bytes": 5},
            "packages": [{"manager": "npm", "name": "left-pad", "version": "1.3.0"}],
            "versions": [{"version": 3, "status": "building", "phase": "running",
                          "started_at": 1790570000000_i64, "finished_at": null, "packages": 0}],
            "build": null, "createdAt": 1790560000000_i64, "updatedAt": 1790570094000_i64,
            "a_field_rest_added_later": true
        });
        let message = message_from_rest(&descriptor, rest).expect("converts");
        let back = serde_json::to_value(&message).expect("json");
        assert_eq!(back["status"], "ENVIRONMENT_STATUS_READY");
        assert_eq!(back["latestVersion"], 3);
        assert_eq!(back["packages"][0]["manager"], "PACKAGE_MANAGER_NPM");
        assert_eq!(back["versions"][0]["status"], "BUILD_STATUS_BUILDING");
        assert_eq!(back["versions"][0]["phase"], "BUILD_PHASE_RUNNING");
        assert_eq!(back["versions"][0]["startedAtMs"], "1790570000000");
        assert_eq!(back["createdAtMs"], "1790560000000");
        assert!(back.get("build").is_none());
    }

    #[test]
    fn an_exec_result_line_is_the_result_case_and_output_lines_are_theirs() {
        let pool = pool();
        let descriptor = pool
            .get_message_by_name("plinth.v1.ExecEvent")
            .expect("ExecEvent");
        let result = serde_json::json!({"exit_code": 3, "stdout": "", "stderr": "", "duration_ms": 5,
            "timed_out": false, "oom_killed": false, "stdout_truncated": false,
            "stderr_truncated": false, "version": 1, "turn": 2});
        let message = message_from_rest(&descriptor, result).expect("converts");
        let back = serde_json::to_value(&message).expect("json");
        assert_eq!(back["result"]["exitCode"], 3);
        let output = message_from_rest(&descriptor, serde_json::json!({"stdout": "hi\n"}))
            .expect("converts");
        assert_eq!(
            serde_json::to_value(&output).expect("json")["stdout"],
            "hi\n"
        );
    }

    #[test]
    fn a_request_becomes_rest_fields_with_enums_as_rest_strings() {
        let pool = pool();
        let descriptor = pool
            .get_message_by_name("plinth.v1.CreateAdapterRequest")
            .expect("CreateAdapterRequest");
        let message = DynamicMessage::deserialize(
            descriptor,
            serde_json::json!({"protocol": "ADAPTER_PROTOCOL_BRAIN", "environment": "demo"}),
        )
        .expect("request");
        let fields = rest_fields(&message, false).expect("fields");
        assert_eq!(
            Value::Object(fields),
            serde_json::json!({"protocol": "brain", "environment": "demo"})
        );
    }
}
