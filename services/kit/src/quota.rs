//! Quotas per scope: which there are, the limit each has for a scope (a default, and
//! overrides for named scopes), and the one error a refusal is. Counting what a scope uses,
//! and refusing, is each owning service's business (the catalog counts environments,
//! sessions and queued builds; the source service counts stored bytes), inside the same
//! transaction as the write that would pass the limit.

use std::collections::HashMap;
use std::fmt;

use crate::error::{ErrorCode, PlinthError};

/// Something a scope may have only so much of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Quota {
    /// Environments that exist.
    Environments,
    /// Bytes of distinct blobs the scope's sources and layers hold, each blob counted once.
    StoredBytes,
    /// Sessions that are active (not ended).
    Sessions,
    /// Builds queued or running.
    QueuedBuilds,
}

impl Quota {
    /// Every quota, in the order answers list them.
    pub const ALL: [Quota; 4] = [
        Quota::Environments,
        Quota::StoredBytes,
        Quota::Sessions,
        Quota::QueuedBuilds,
    ];

    /// The quota's name, as configuration and answers spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Quota::Environments => "environments",
            Quota::StoredBytes => "stored_bytes",
            Quota::Sessions => "sessions",
            Quota::QueuedBuilds => "queued_builds",
        }
    }

    /// What to do about reaching it, for the refusal's message.
    fn advice(self) -> &'static str {
        match self {
            Quota::Environments => "delete environments it no longer needs",
            Quota::StoredBytes => {
                "delete files or environments it no longer needs (a blob counts once however many files hold it)"
            }
            Quota::Sessions => "end sessions it no longer needs (DELETE /v1/sessions/{id})",
            Quota::QueuedBuilds => "wait for its queued builds to finish",
        }
    }
}

impl fmt::Display for Quota {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The limits of one scope.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuotaLimits {
    /// Environments.
    pub environments: u64,
    /// Bytes of distinct blobs.
    pub stored_bytes: u64,
    /// Active sessions.
    pub sessions: u64,
    /// Builds queued or running.
    pub queued_builds: u64,
}

impl QuotaLimits {
    /// The defaults: 1000 environments, 50 GiB, 100 sessions, 20 queued builds.
    pub const DEFAULT: QuotaLimits = QuotaLimits {
        environments: 1000,
        stored_bytes: 50 * 1024 * 1024 * 1024,
        sessions: 100,
        queued_builds: 20,
    };

    /// The limit of one quota.
    pub fn of(&self, quota: Quota) -> u64 {
        match quota {
            Quota::Environments => self.environments,
            Quota::StoredBytes => self.stored_bytes,
            Quota::Sessions => self.sessions,
            Quota::QueuedBuilds => self.queued_builds,
        }
    }
}

impl Default for QuotaLimits {
    fn default() -> Self {
        QuotaLimits::DEFAULT
    }
}

/// One scope's overrides: each quota it names replaces the default for that scope.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QuotaOverride {
    /// Environments.
    pub environments: Option<u64>,
    /// Bytes of distinct blobs.
    pub stored_bytes: Option<u64>,
    /// Active sessions.
    pub sessions: Option<u64>,
    /// Builds queued or running.
    pub queued_builds: Option<u64>,
}

/// Every scope's limits: the defaults, and the overrides of named scopes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Quotas {
    defaults: QuotaLimits,
    scopes: HashMap<String, QuotaOverride>,
}

impl Quotas {
    /// These defaults, no overrides.
    pub fn new(defaults: QuotaLimits) -> Self {
        Quotas {
            defaults,
            scopes: HashMap::new(),
        }
    }

    /// Adds (or replaces) the overrides of one scope.
    pub fn with_scope(mut self, scope: impl Into<String>, overrides: QuotaOverride) -> Self {
        self.scopes.insert(scope.into(), overrides);
        self
    }

    /// The defaults.
    pub fn defaults(&self) -> QuotaLimits {
        self.defaults
    }

    /// The limits of `scope`: its overrides over the defaults.
    pub fn for_scope(&self, scope: &str) -> QuotaLimits {
        let defaults = self.defaults;
        match self.scopes.get(scope) {
            None => defaults,
            Some(own) => QuotaLimits {
                environments: own.environments.unwrap_or(defaults.environments),
                stored_bytes: own.stored_bytes.unwrap_or(defaults.stored_bytes),
                sessions: own.sessions.unwrap_or(defaults.sessions),
                queued_builds: own.queued_builds.unwrap_or(defaults.queued_builds),
            },
        }
    }

    /// One limit of `scope`.
    pub fn limit(&self, scope: &str, quota: Quota) -> u64 {
        self.for_scope(scope).of(quota)
    }
}

/// The refusal of a write that would take a scope past a quota: `429 quota_exceeded`, with
/// `detail` `{quota, limit, used}` (`used` is what the scope has without this write).
pub fn exceeded(quota: Quota, limit: u64, used: u64) -> PlinthError {
    let what = match quota {
        Quota::StoredBytes => format!("{used} of its {limit} stored bytes are used"),
        Quota::Environments => format!("it has {used} of its {limit} environments"),
        Quota::Sessions => format!("it has {used} of its {limit} active sessions"),
        Quota::QueuedBuilds => format!("it has {used} of its {limit} builds queued or running"),
    };
    PlinthError::new(
        ErrorCode::QuotaExceeded,
        format!(
            "this scope is at its {quota} quota: {what}; {}, or ask the operator for a higher quota",
            quota.advice()
        ),
    )
    .with_detail(serde_json::json!({
        "quota": quota.as_str(),
        "limit": limit,
        "used": used,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scope_override_replaces_only_what_it_names() {
        let quotas = Quotas::new(QuotaLimits::DEFAULT).with_scope(
            "acme",
            QuotaOverride {
                sessions: Some(500),
                ..QuotaOverride::default()
            },
        );
        assert_eq!(quotas.limit("acme", Quota::Sessions), 500);
        assert_eq!(quotas.limit("acme", Quota::Environments), 1000);
        assert_eq!(quotas.limit("globex", Quota::Sessions), 100);
        assert_eq!(quotas.limit("globex", Quota::StoredBytes), 53_687_091_200);
    }

    #[test]
    fn a_refusal_is_429_with_the_quota_its_limit_and_the_use() {
        let refused = exceeded(Quota::Sessions, 2, 2);
        assert_eq!(refused.code, ErrorCode::QuotaExceeded);
        assert_eq!(refused.code.http_status(), 429);
        assert_eq!(
            refused.detail,
            Some(serde_json::json!({"quota": "sessions", "limit": 2, "used": 2}))
        );
        assert!(
            refused.message.contains("end sessions"),
            "{}",
            refused.message
        );
    }
}
