//! The argument rules every tool's fields follow, whichever adapter carried them: one
//! definition of what a string, a whole number, a flag or a map of strings is, and one
//! wording of what is wrong with a field (under the adapter's own name for the object:
//! Novo's `args`, Brain's `input`).

use std::borrow::Cow;
use std::collections::HashMap;

use serde_json::{Map, Value};

/// What is wrong with a call's arguments, said so the caller can fix it; nothing ran.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Invalid(pub String);

/// A call's arguments object.
pub(crate) struct Args<'a> {
    map: &'a Map<String, Value>,
    /// How the adapter names the object in its messages (`args`, `input`; an array's item
    /// `args.operations[2]`).
    prefix: Cow<'static, str>,
}

impl<'a> Args<'a> {
    pub(crate) fn new(map: &'a Map<String, Value>, prefix: &'static str) -> Self {
        Args {
            map,
            prefix: Cow::Borrowed(prefix),
        }
    }

    fn invalid(&self, field: &str, what: &str) -> Invalid {
        Invalid(format!("{}.{field}: {what}", self.prefix))
    }

    /// A field absent or `null` is not given.
    fn given(&self, field: &str) -> Option<&'a Value> {
        self.map.get(field).filter(|value| !value.is_null())
    }

    /// An optional string.
    pub(crate) fn string(&self, field: &str) -> Result<Option<String>, Invalid> {
        match self.given(field) {
            None => Ok(None),
            Some(Value::String(text)) => Ok(Some(text.clone())),
            Some(_) => Err(self.invalid(field, "must be a string")),
        }
    }

    /// A string that must be given.
    pub(crate) fn required(&self, field: &str) -> Result<String, Invalid> {
        self.string(field)?
            .ok_or_else(|| self.invalid(field, "required, a string"))
    }

    /// An optional whole number at least 0. JSON has one number type, and some clients
    /// write every number as a float: `3.0` is 3, `3.5` and `-1` are refused.
    pub(crate) fn whole(&self, field: &str) -> Result<Option<u64>, Invalid> {
        let Some(value) = self.given(field) else {
            return Ok(None);
        };
        value
            .as_u64()
            .or_else(|| {
                value
                    .as_f64()
                    .filter(|float| *float >= 0.0 && float.fract() == 0.0 && *float < 2f64.powi(64))
                    // Checked just above: whole, at least 0 and below 2^64.
                    .map(|float| float as u64)
            })
            .map(Some)
            .ok_or_else(|| self.invalid(field, "must be a non-negative integer"))
    }

    /// An optional whole number; 0 when not given.
    pub(crate) fn whole_or_zero(&self, field: &str) -> Result<u64, Invalid> {
        Ok(self.whole(field)?.unwrap_or(0))
    }

    /// An optional flag; false when not given.
    pub(crate) fn flag(&self, field: &str) -> Result<bool, Invalid> {
        match self.given(field) {
            None => Ok(false),
            Some(Value::Bool(flag)) => Ok(*flag),
            Some(_) => Err(self.invalid(field, "must be a boolean")),
        }
    }

    /// An optional object whose values are strings (a command's environment).
    pub(crate) fn strings(&self, field: &str) -> Result<HashMap<String, String>, Invalid> {
        match self.given(field) {
            None => Ok(HashMap::new()),
            Some(Value::Object(given)) => given
                .iter()
                .map(|(key, value)| {
                    value
                        .as_str()
                        .map(|value| (key.clone(), value.to_owned()))
                        .ok_or_else(|| self.invalid(&format!("{field}.{key}"), "must be a string"))
                })
                .collect(),
            Some(_) => Err(self.invalid(field, "must be an object of strings")),
        }
    }

    /// A required array of objects, each read with its own rules (`{prefix}.{field}[i]`).
    pub(crate) fn objects(&self, field: &str) -> Result<Vec<Args<'a>>, Invalid> {
        let Some(Value::Array(items)) = self.given(field) else {
            return Err(self.invalid(field, "required, an array of objects"));
        };
        items
            .iter()
            .enumerate()
            .map(|(index, item)| match item {
                Value::Object(map) => Ok(Args {
                    map,
                    prefix: Cow::Owned(format!("{}.{field}[{index}]", self.prefix)),
                }),
                _ => Err(self.invalid(&format!("{field}[{index}]"), "must be an object")),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn args(value: Value) -> Map<String, Value> {
        match value {
            Value::Object(map) => map,
            _ => unreachable!("test arguments are objects"),
        }
    }

    #[test]
    fn whole_numbers_accept_integral_floats_and_refuse_the_rest() {
        let map = args(json!({
            "int": 3, "float": 3.0, "half": 3.5, "negative": -1, "text": "3", "null": null,
            "huge": 1e30
        }));
        let given = Args::new(&map, "args");
        assert_eq!(given.whole("int"), Ok(Some(3)));
        assert_eq!(given.whole("float"), Ok(Some(3)));
        assert_eq!(given.whole("null"), Ok(None));
        assert_eq!(given.whole("absent"), Ok(None));
        for field in ["half", "negative", "text", "huge"] {
            assert_eq!(
                given.whole(field),
                Err(Invalid(format!(
                    "args.{field}: must be a non-negative integer"
                ))),
                "{field}"
            );
        }
    }

    #[test]
    fn strings_flags_and_maps_say_which_field_is_wrong_under_the_adapters_name() {
        let map = args(json!({
            "path": "a.txt", "number": 1, "yes": true, "no": "false",
            "env": { "A": "1", "B": 2 }, "list": ["x"]
        }));
        let given = Args::new(&map, "input");
        assert_eq!(given.required("path"), Ok("a.txt".to_owned()));
        assert_eq!(
            given.required("missing"),
            Err(Invalid("input.missing: required, a string".into()))
        );
        assert_eq!(
            given.string("number"),
            Err(Invalid("input.number: must be a string".into()))
        );
        assert_eq!(given.flag("yes"), Ok(true));
        assert_eq!(given.flag("absent"), Ok(false));
        assert_eq!(
            given.flag("no"),
            Err(Invalid("input.no: must be a boolean".into()))
        );
        assert_eq!(
            given.strings("env"),
            Err(Invalid("input.env.B: must be a string".into()))
        );
        assert_eq!(
            given.strings("list"),
            Err(Invalid("input.list: must be an object of strings".into()))
        );
        assert_eq!(given.strings("absent"), Ok(HashMap::new()));
    }

    #[test]
    fn array_items_are_named_by_their_position() {
        let map = args(json!({ "operations": [{ "path": "a" }, { "path": 2 }, 3] }));
        let given = Args::new(&map, "args");
        let Err(Invalid(message)) = given.objects("operations") else {
            panic!("a non-object item is refused");
        };
        assert_eq!(message, "args.operations[2]: must be an object");
        let map = args(json!({ "operations": [{ "path": "a" }, { "path": 2 }] }));
        let given = Args::new(&map, "args");
        let items = given.objects("operations").expect("objects");
        assert_eq!(items[0].required("path"), Ok("a".to_owned()));
        assert_eq!(
            items[1].required("path"),
            Err(Invalid("args.operations[1].path: must be a string".into()))
        );
        let map = args(json!({}));
        assert_eq!(
            Args::new(&map, "args").objects("operations").err(),
            Some(Invalid(
                "args.operations: required, an array of objects".into()
            ))
        );
    }
}
