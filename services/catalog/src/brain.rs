//! The Brain environment service's durable state: bindings (one Environment of one Brain
//! session, and the Plinth session holding its resources) and the operation ledger that makes
//! every delivered operation run at most once and answer the same receipt however often it is
//! delivered, across restarts.
//!
//! Receipts are stored as the gateway wrote them: the catalog keeps and returns them, it does
//! not read them.

use crate::model::{EnvironmentId, Scope};
use crate::sessions::SessionId;

/// Most bytes of a Brain session id, an Environment name or an adapter id.
pub const MAX_NAME_BYTES: usize = 256;

/// Identifies an operation: Brain numbers a session's operations, and one adapter
/// registration serves one Brain deployment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperationKey {
    /// The adapter registration the operation came through.
    pub adapter_id: String,
    /// Brain's session id.
    pub session_id: String,
    /// Brain's sequence number in that session.
    pub sequence: u64,
}

/// Identifies a binding: one Environment (by Brain's name for it) of one Brain session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BindingKey {
    /// The adapter registration.
    pub adapter_id: String,
    /// Brain's session id.
    pub session_id: String,
    /// The Environment's name in that session (unique within it).
    pub environment: String,
}

impl BindingKey {
    /// What sessions made for this binding are labelled with.
    pub fn owner(&self) -> String {
        format!(
            "brain:{}:{}:{}",
            self.adapter_id, self.session_id, self.environment
        )
    }
}

/// Checks a name Brain or the gateway gave: not empty, at most [`MAX_NAME_BYTES`], no
/// control characters.
pub fn valid_name(text: &str) -> bool {
    !text.is_empty() && text.len() <= MAX_NAME_BYTES && !text.chars().any(char::is_control)
}

/// Where an operation is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OperationState {
    /// Claimed by a runner; no receipt yet.
    Started,
    /// Its receipt is stored.
    Finished,
}

impl OperationState {
    /// As stored and sent.
    pub fn as_str(self) -> &'static str {
        match self {
            OperationState::Started => "started",
            OperationState::Finished => "finished",
        }
    }

    /// From its stored form.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "started" => Some(OperationState::Started),
            "finished" => Some(OperationState::Finished),
            _ => None,
        }
    }
}

/// An operation as the ledger has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operation {
    /// Its identity.
    pub key: OperationKey,
    /// The Environment it addressed.
    pub environment: String,
    /// `setup`, `call`, `detach`, `teardown`, `execute`, `cancel`, …
    pub kind: String,
    /// A digest of the request as first delivered; a redelivery must match it.
    pub digest: String,
    /// Started or finished.
    pub state: OperationState,
    /// The claim of whoever runs it.
    pub runner: String,
    /// The runner's lease ends here (ms since the epoch) unless renewed.
    pub lease_until_ms: i64,
    /// An explicit cancellation was asked for while it ran.
    pub cancel_requested: bool,
    /// The receipt (JSON as the gateway wrote it); empty while started.
    pub receipt: String,
    /// When it was claimed.
    pub started_at_ms: i64,
    /// When its receipt was stored; 0 before.
    pub finished_at_ms: i64,
}

/// A new claim on an operation.
#[derive(Debug, Clone)]
pub struct NewOperation {
    /// Its identity.
    pub key: OperationKey,
    /// The Environment it addresses.
    pub environment: String,
    /// Its kind.
    pub kind: String,
    /// A digest of its request.
    pub digest: String,
    /// Whoever runs it.
    pub runner: String,
    /// How long the claim lasts unless renewed.
    pub lease_ms: i64,
}

/// What claiming an operation found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// It is new: the caller runs it.
    Started(Operation),
    /// It was delivered before; `lease_live` says whether a runner still holds it.
    Duplicate {
        /// The operation as stored.
        operation: Operation,
        /// True while its runner's lease has not run out.
        lease_live: bool,
    },
}

/// What a binding's resources last as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lifetime {
    /// A turn-end release ends the session's resources; the next tool call gets new ones.
    Disposable,
    /// A turn-end release keeps them: the working directory lasts until teardown.
    Workspace,
}

impl Lifetime {
    /// As stored and configured.
    pub fn as_str(self) -> &'static str {
        match self {
            Lifetime::Disposable => "disposable",
            Lifetime::Workspace => "workspace",
        }
    }

    /// From its stored or configured form.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "disposable" => Some(Lifetime::Disposable),
            "workspace" => Some(Lifetime::Workspace),
            _ => None,
        }
    }
}

/// Where a binding is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BindingState {
    /// Set up: tools run.
    Attached,
    /// Its Brain session ended: no more tools; a workspace's files are kept.
    Detached,
    /// Its Brain session was deleted: everything it had is gone.
    TornDown,
}

impl BindingState {
    /// As stored and sent.
    pub fn as_str(self) -> &'static str {
        match self {
            BindingState::Attached => "attached",
            BindingState::Detached => "detached",
            BindingState::TornDown => "torn_down",
        }
    }

    /// From its stored or sent form.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "attached" => Some(BindingState::Attached),
            "detached" => Some(BindingState::Detached),
            "torn_down" => Some(BindingState::TornDown),
            _ => None,
        }
    }
}

/// One Environment of one Brain session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binding {
    /// Its identity.
    pub key: BindingKey,
    /// The adapter's scope; every session it makes is of this scope.
    pub scope: Scope,
    /// The Plinth environment its sessions read.
    pub environment_id: EnvironmentId,
    /// The version pinned at setup; every session of the binding reads it.
    pub version: u32,
    /// What its resources last as.
    pub lifetime: Lifetime,
    /// Whether setup registered a turn-end release.
    pub release_on_turn_end: bool,
    /// The session holding its resources now; `None` when it has none.
    pub plinth_session: Option<SessionId>,
    /// Where it is in its life.
    pub state: BindingState,
    /// The configuration as setup received it (JSON).
    pub configuration: String,
    /// When it was set up.
    pub created_at_ms: i64,
    /// When it last changed.
    pub updated_at_ms: i64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_bounded_and_printable() {
        assert!(valid_name("ses_01"));
        assert!(!valid_name(""));
        assert!(!valid_name("a\nb"));
        assert!(!valid_name(&"x".repeat(MAX_NAME_BYTES + 1)));
    }

    #[test]
    fn kinds_round_trip() {
        for lifetime in [Lifetime::Disposable, Lifetime::Workspace] {
            assert_eq!(Lifetime::parse(lifetime.as_str()), Some(lifetime));
        }
        for state in [
            BindingState::Attached,
            BindingState::Detached,
            BindingState::TornDown,
        ] {
            assert_eq!(BindingState::parse(state.as_str()), Some(state));
        }
        assert_eq!(Lifetime::parse("forever"), None);
    }
}
