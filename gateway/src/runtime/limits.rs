//! Session limits: what a client may ask for in `POST /v1/sessions` (`limits`), the configured
//! default and maximum of each, and how a session shows the limits it has.
//!
//! The gateway decides a session's limits because it holds the configuration; the catalog
//! stores them with the session (and ends it past `lifetime_ms` or `idle_ms`), the node keeps
//! them in the session's record. A refused limit is `invalid_request` whose message and
//! `detail` (`{"limit", "max"}`) name the limit and its maximum.

use plinth_kit::{ErrorCode, PlinthError};
use plinth_proto::catalog::v1 as pb;
use serde::Serialize;
use serde_json::{Value, json};
use utoipa::ToSchema;

/// Largest value any limit may have (the catalog refuses more): far beyond any host.
pub const MAX_LIMIT_VALUE: u64 = 1 << 40;

/// One kind of limit. Its name is its JSON key, and the name of its default in the
/// configuration's `[sessions]`; its maximum there is `max_<name>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// Memory, in MiB.
    MemoryMb,
    /// Processes and threads at once.
    Pids,
    /// CPU, in cores (fractional); kept in thousandths of a core.
    Cpu,
    /// Disk used in the working directory, in MiB.
    DiskMb,
    /// Milliseconds from creation until the session is ended.
    LifetimeMs,
    /// Milliseconds without a call until the session is ended.
    IdleMs,
}

impl Limit {
    /// Every limit, in the order the API lists them.
    pub const ALL: [Limit; 6] = [
        Limit::MemoryMb,
        Limit::Pids,
        Limit::Cpu,
        Limit::DiskMb,
        Limit::LifetimeMs,
        Limit::IdleMs,
    ];

    /// Its JSON key.
    pub fn name(self) -> &'static str {
        match self {
            Limit::MemoryMb => "memory_mb",
            Limit::Pids => "pids",
            Limit::Cpu => "cpu",
            Limit::DiskMb => "disk_mb",
            Limit::LifetimeMs => "lifetime_ms",
            Limit::IdleMs => "idle_ms",
        }
    }

    fn unit(self) -> &'static str {
        match self {
            Limit::MemoryMb | Limit::DiskMb => "MiB",
            Limit::Pids => "processes",
            Limit::Cpu => "cores",
            Limit::LifetimeMs | Limit::IdleMs => "ms",
        }
    }

    fn index(self) -> usize {
        self as usize
    }

    fn parse(name: &str) -> Option<Limit> {
        Limit::ALL.into_iter().find(|limit| limit.name() == name)
    }

    /// A stored value as the API shows it: CPU in cores, the rest as they are.
    fn show(self, value: u64) -> Value {
        match self {
            Limit::Cpu => json!(cores(value)),
            _ => json!(value),
        }
    }
}

/// Thousandths of a core as cores.
fn cores(millicores: u64) -> f64 {
    millicores as f64 / 1000.0
}

/// Cores as thousandths of a core, or `None` when they are not a positive finite number.
pub fn millicores(cores: f64) -> Option<u64> {
    let millicores = (cores * 1000.0).round();
    (cores.is_finite() && cores > 0.0 && millicores <= MAX_LIMIT_VALUE as f64)
        .then_some(millicores as u64)
}

/// A value for every limit, in the units kept (CPU in thousandths of a core); `None` is no
/// limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SessionLimits([Option<u64>; 6]);

impl SessionLimits {
    /// The value of `limit`.
    pub fn get(&self, limit: Limit) -> Option<u64> {
        self.0[limit.index()]
    }

    /// With `limit` set to `value`.
    pub fn with(mut self, limit: Limit, value: Option<u64>) -> Self {
        self.0[limit.index()] = value;
        self
    }

    /// As the catalog takes them: 0 for none.
    pub fn to_catalog(self) -> pb::SessionLimits {
        let value = |limit| self.get(limit).unwrap_or(0);
        pb::SessionLimits {
            memory_mb: value(Limit::MemoryMb),
            pids: value(Limit::Pids),
            cpu_millicores: value(Limit::Cpu),
            disk_mb: value(Limit::DiskMb),
            lifetime_ms: value(Limit::LifetimeMs),
            idle_ms: value(Limit::IdleMs),
        }
    }

    /// As the catalog stores them (0 is none; absent, for a session from before limits, is
    /// none at all).
    pub fn from_catalog(limits: Option<&pb::SessionLimits>) -> Self {
        let Some(limits) = limits else {
            return SessionLimits::default();
        };
        let value = |value: u64| (value > 0).then_some(value);
        SessionLimits([
            value(limits.memory_mb),
            value(limits.pids),
            value(limits.cpu_millicores),
            value(limits.disk_mb),
            value(limits.lifetime_ms),
            value(limits.idle_ms),
        ])
    }

    /// As a session shows them.
    pub fn body(self) -> LimitsBody {
        LimitsBody {
            memory_mb: self.get(Limit::MemoryMb),
            pids: self.get(Limit::Pids),
            cpu: self.get(Limit::Cpu).map(cores),
            disk_mb: self.get(Limit::DiskMb),
            lifetime_ms: self.get(Limit::LifetimeMs),
            idle_ms: self.get(Limit::IdleMs),
        }
    }
}

/// A session's effective limits, every key present; `null` is no limit.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct LimitsBody {
    /// Memory, in MiB.
    pub memory_mb: Option<u64>,
    /// Processes and threads at once.
    pub pids: Option<u64>,
    /// CPU, in cores (0.5 is half a core).
    pub cpu: Option<f64>,
    /// Disk used in the working directory, in MiB.
    pub disk_mb: Option<u64>,
    /// Milliseconds from creation until the session is ended.
    pub lifetime_ms: Option<u64>,
    /// Milliseconds without an exec or file call until the session is ended.
    pub idle_ms: Option<u64>,
}

/// What `POST /v1/sessions` takes as `limits`: any of these; the others get their defaults.
/// Each must be more than 0 and at most its configured maximum.
/// The served document gives each its configured maximum ([`LimitPolicy::document`]).
#[derive(Debug, ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
pub struct LimitsRequest {
    /// Memory, in MiB (a whole number).
    #[schema(minimum = 1)]
    memory_mb: Option<u64>,
    /// Processes and threads at once (a whole number).
    #[schema(minimum = 1)]
    pids: Option<u64>,
    /// CPU, in cores; fractional (0.5), at least 0.001.
    #[schema(minimum = 0.001)]
    cpu: Option<f64>,
    /// Disk used in the working directory, in MiB (a whole number).
    #[schema(minimum = 1)]
    disk_mb: Option<u64>,
    /// Milliseconds from creation until the session is ended (a whole number).
    #[schema(minimum = 1)]
    lifetime_ms: Option<u64>,
    /// Milliseconds without an exec or file call until the session is ended (a whole number).
    #[schema(minimum = 1)]
    idle_ms: Option<u64>,
}

/// The configured default and maximum of every limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitPolicy {
    defaults: SessionLimits,
    maxima: [u64; 6],
}

/// What is wrong with the `[sessions]` limits as configured; each names its keys.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitSettingError {
    /// A maximum of 0 or past [`MAX_LIMIT_VALUE`].
    #[error("sessions.max_{name} must be more than 0 and at most {most}")]
    Maximum {
        /// The limit's name.
        name: &'static str,
        /// The largest maximum, in the limit's units.
        most: Value,
    },
    /// A default of 0.
    #[error("sessions.{name} must be more than 0")]
    ZeroDefault {
        /// The limit's name.
        name: &'static str,
    },
    /// A default a client could not ask for.
    #[error(
        "sessions.{name} ({default}) is above sessions.max_{name} ({max}): a default must be \
         one a client could ask for"
    )]
    DefaultAboveMaximum {
        /// The limit's name.
        name: &'static str,
        /// The default, in the limit's units.
        default: Value,
        /// The maximum, in the limit's units.
        max: Value,
    },
}

impl LimitPolicy {
    /// `defaults` (none for a limit without one) and `maxima`, in the units kept. Refuses a
    /// maximum of 0 or past [`MAX_LIMIT_VALUE`], and a default of 0 or above its maximum,
    /// naming the configuration keys (`[sessions]` `<name>`, `max_<name>`).
    pub fn new(defaults: SessionLimits, maxima: [u64; 6]) -> Result<Self, LimitSettingError> {
        for limit in Limit::ALL {
            let (name, max) = (limit.name(), maxima[limit.index()]);
            if max == 0 || max > MAX_LIMIT_VALUE {
                return Err(LimitSettingError::Maximum {
                    name,
                    most: limit.show(MAX_LIMIT_VALUE),
                });
            }
            match defaults.get(limit) {
                Some(0) => return Err(LimitSettingError::ZeroDefault { name }),
                Some(default) if default > max => {
                    return Err(LimitSettingError::DefaultAboveMaximum {
                        name,
                        default: limit.show(default),
                        max: limit.show(max),
                    });
                }
                _ => {}
            }
        }
        Ok(LimitPolicy { defaults, maxima })
    }

    /// The defaults: what a session gets when it asks for nothing (tasks, workspace adapters).
    pub fn defaults(&self) -> SessionLimits {
        self.defaults
    }

    /// The maximum of `limit`.
    pub fn max(&self, limit: Limit) -> u64 {
        self.maxima[limit.index()]
    }

    /// Writes each limit's configured maximum into the document's `LimitsRequest`, so the
    /// served document states the range [`LimitPolicy::resolve`] accepts.
    pub fn document(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::{RefOr, Schema};
        let Some(RefOr::T(Schema::Object(request))) = openapi
            .components
            .as_mut()
            .and_then(|components| components.schemas.get_mut("LimitsRequest"))
        else {
            return;
        };
        for limit in Limit::ALL {
            let max = self.max(limit);
            let maximum = match limit {
                Limit::Cpu => utoipa::Number::Float(cores(max)),
                _ => utoipa::Number::UInt(usize::try_from(max).unwrap_or(usize::MAX)),
            };
            if let Some(RefOr::T(property)) = request.properties.get_mut(limit.name()) {
                set_maximum(property, maximum);
            }
        }
    }

    /// The limits a session gets for `requested` (the body's `limits`; absent or `null`: the
    /// defaults). Every given value must be a number of its kind (whole, except `cpu`), more
    /// than 0 and at most its maximum; an unknown key is refused.
    pub fn resolve(&self, requested: Option<&Value>) -> Result<SessionLimits, PlinthError> {
        let mut limits = self.defaults;
        let object = match requested {
            None | Some(Value::Null) => return Ok(limits),
            Some(Value::Object(object)) => object,
            Some(_) => {
                return Err(PlinthError::new(
                    ErrorCode::InvalidRequest,
                    format!(
                        "limits: expected an object, such as {{\"memory_mb\": 1024, \"cpu\": 0.5}}; \
                         the limits are {}",
                        Self::names()
                    ),
                ));
            }
        };
        for (key, value) in object {
            let Some(limit) = Limit::parse(key) else {
                return Err(PlinthError::new(
                    ErrorCode::InvalidRequest,
                    format!(
                        "limits.{key}: no such limit; the limits are {}",
                        Self::names()
                    ),
                )
                .with_detail(json!({ "limit": key, "limits": Limit::ALL.map(Limit::name) })));
            };
            if value.is_null() {
                continue;
            }
            limits = limits.with(limit, Some(self.check(limit, value)?));
        }
        Ok(limits)
    }

    /// One given value in the units kept, or why not.
    fn check(&self, limit: Limit, value: &Value) -> Result<u64, PlinthError> {
        let (name, unit, max) = (limit.name(), limit.unit(), self.max(limit));
        let shown_max = limit.show(max);
        let least = if limit == Limit::Cpu { "0.001" } else { "1" };
        let refuse = |what: String| {
            PlinthError::new(
                ErrorCode::InvalidRequest,
                format!("limits.{name}: {what}; it must be from {least} to {shown_max} {unit}"),
            )
            .with_detail(json!({ "limit": name, "max": shown_max }))
        };
        let kept = match (limit, value) {
            (Limit::Cpu, Value::Number(number)) => {
                let cores = number.as_f64().unwrap_or(f64::NAN);
                if cores.is_nan() || cores <= 0.0 {
                    return Err(refuse(format!("{number} is too small")));
                }
                match millicores(cores) {
                    Some(0) => return Err(refuse(format!("{number} is too small"))),
                    Some(millicores) => millicores,
                    None => u64::MAX,
                }
            }
            (_, Value::Number(number)) => match (number.as_u64(), number.as_i64()) {
                (Some(0), _) | (None, Some(_)) => {
                    return Err(refuse(format!("{number} is too small")));
                }
                (Some(value), _) => value,
                // JSON has one number type: `232574.0` is the whole number 232574.
                (None, None)
                    if number
                        .as_f64()
                        .is_some_and(|float| float.fract() == 0.0 && float >= 1.0) =>
                {
                    let float = number.as_f64().unwrap_or_default();
                    if float > u64::MAX as f64 {
                        u64::MAX
                    } else {
                        float as u64
                    }
                }
                (None, None) => {
                    return Err(refuse(format!("{number} is not a whole number")));
                }
            },
            (_, other) => {
                let expected = if limit == Limit::Cpu {
                    "a number"
                } else {
                    "a whole number"
                };
                return Err(refuse(format!("expected {expected}, got {}", kind(other))));
            }
        };
        if kept > max {
            return Err(refuse(format!("{value} is more than its maximum")));
        }
        Ok(kept)
    }

    fn names() -> String {
        Limit::ALL.map(Limit::name).join(", ")
    }
}

/// Sets `maximum` on a property's schema, or on the non-null branch of an optional one.
fn set_maximum(schema: &mut utoipa::openapi::Schema, maximum: utoipa::Number) {
    use utoipa::openapi::{RefOr, Schema};
    match schema {
        Schema::Object(object) => object.maximum = Some(maximum),
        Schema::OneOf(one_of) => {
            for item in &mut one_of.items {
                if let RefOr::T(item) = item {
                    set_maximum(item, maximum.clone());
                }
            }
        }
        _ => {}
    }
}

/// A JSON value's kind, for messages.
fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> LimitPolicy {
        let defaults = SessionLimits::default()
            .with(Limit::MemoryMb, Some(1024))
            .with(Limit::Pids, Some(512))
            .with(Limit::Cpu, Some(1000))
            .with(Limit::LifetimeMs, Some(86_400_000))
            .with(Limit::IdleMs, Some(3_600_000));
        LimitPolicy::new(
            defaults,
            [4096, 4096, 4000, 10_240, 604_800_000, 86_400_000],
        )
        .expect("valid")
    }

    fn refused(body: Value) -> PlinthError {
        policy().resolve(Some(&body)).expect_err("refused")
    }

    #[test]
    fn given_limits_replace_their_defaults_and_the_rest_stay() {
        let limits = policy()
            .resolve(Some(
                &json!({"memory_mb": 2048, "cpu": 0.5, "disk_mb": 100, "idle_ms": null}),
            ))
            .expect("valid");
        assert_eq!(
            limits.body(),
            LimitsBody {
                memory_mb: Some(2048),
                pids: Some(512),
                cpu: Some(0.5),
                disk_mb: Some(100),
                lifetime_ms: Some(86_400_000),
                idle_ms: Some(3_600_000),
            }
        );
        assert_eq!(
            policy().resolve(None).expect("defaults"),
            policy().defaults()
        );
        assert_eq!(
            policy().resolve(Some(&Value::Null)).expect("defaults"),
            policy().defaults()
        );
        let at_max = policy()
            .resolve(Some(&json!({"memory_mb": 4096, "cpu": 4})))
            .expect("the maximum itself is allowed");
        assert_eq!(at_max.get(Limit::Cpu), Some(4000));
        let whole = policy()
            .resolve(Some(&json!({"memory_mb": 2048.0, "idle_ms": 232_574.0})))
            .expect("a whole number written with a point is that number");
        assert_eq!(whole.body().memory_mb, Some(2048));
        assert_eq!(whole.body().idle_ms, Some(232_574));
    }

    #[test]
    fn refusals_name_the_limit_and_its_maximum() {
        for (body, limit, max) in [
            (json!({"memory_mb": 4097}), "memory_mb", json!(4096)),
            (json!({"memory_mb": 0}), "memory_mb", json!(4096)),
            (json!({"pids": -3}), "pids", json!(4096)),
            (json!({"pids": 1.5}), "pids", json!(4096)),
            (
                json!({"lifetime_ms": "60"}),
                "lifetime_ms",
                json!(604_800_000),
            ),
            (json!({"idle_ms": true}), "idle_ms", json!(86_400_000)),
            (json!({"cpu": 4.5}), "cpu", json!(4.0)),
            (json!({"cpu": 0}), "cpu", json!(4.0)),
            (json!({"cpu": -1}), "cpu", json!(4.0)),
            (json!({"cpu": 0.0001}), "cpu", json!(4.0)),
            (json!({"cpu": "half"}), "cpu", json!(4.0)),
        ] {
            let error = refused(body.clone());
            assert_eq!(error.code, ErrorCode::InvalidRequest, "{body}");
            assert_eq!(
                error.detail,
                Some(json!({"limit": limit, "max": max})),
                "{body}"
            );
            assert!(
                error.message.starts_with(&format!("limits.{limit}:"))
                    && error.message.contains(&max.to_string()),
                "{body}: {}",
                error.message
            );
        }
        let unknown = refused(json!({"memory": 10}));
        assert_eq!(unknown.code, ErrorCode::InvalidRequest);
        assert!(
            unknown.message.contains("limits.memory"),
            "{}",
            unknown.message
        );
        assert!(unknown.message.contains("memory_mb"), "{}", unknown.message);
        assert_eq!(unknown.detail.expect("detail")["limit"], "memory");
        let not_an_object = refused(json!([1024]));
        assert_eq!(not_an_object.code, ErrorCode::InvalidRequest);
    }

    #[test]
    fn a_default_above_its_maximum_or_zero_is_refused() {
        let too_much = SessionLimits::default().with(Limit::MemoryMb, Some(9000));
        let error = LimitPolicy::new(too_much, [8192; 6]).expect_err("refused");
        assert_eq!(
            error.to_string(),
            "sessions.memory_mb (9000) is above sessions.max_memory_mb (8192): a default must be \
             one a client could ask for"
        );
        let error =
            LimitPolicy::new(SessionLimits::default(), [8192, 1, 1, 1, 0, 1]).expect_err("refused");
        assert!(
            matches!(
                error,
                LimitSettingError::Maximum {
                    name: "lifetime_ms",
                    ..
                }
            ),
            "{error}"
        );
        let zero = SessionLimits::default().with(Limit::Pids, Some(0));
        assert_eq!(
            LimitPolicy::new(zero, [8192; 6]).expect_err("refused"),
            LimitSettingError::ZeroDefault { name: "pids" }
        );
        assert_eq!(millicores(0.5), Some(500));
        assert_eq!(millicores(f64::NAN), None);
    }

    #[test]
    fn limits_travel_as_zero_for_none() {
        let limits = SessionLimits::default()
            .with(Limit::Cpu, Some(250))
            .with(Limit::IdleMs, Some(30));
        let wire = limits.to_catalog();
        assert_eq!(
            (wire.cpu_millicores, wire.memory_mb, wire.idle_ms),
            (250, 0, 30)
        );
        assert_eq!(SessionLimits::from_catalog(Some(&wire)), limits);
        assert_eq!(SessionLimits::from_catalog(None), SessionLimits::default());
    }
}
