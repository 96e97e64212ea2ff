//! The Brain environment service's durable state: bindings (one Environment of one Brain
//! session, and the Plinth session holding its resources) and the operation ledger that makes
//! every delivered operation run at most once and answer the same receipt however often it is
//! delivered, across restarts.
//!
//! Receipts are stored as the gateway wrote them: the catalog keeps and returns them, it does
//! not read them.

use crate::domain::model::{EnvironmentId, Scope};
use crate::domain::sessions::SessionId;

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

/// Where an operation is, what it is, what a binding's resources last as and where a binding
/// is in its life: the contract's enums themselves, whose labels (stored and shown) are
/// defined once, in `plinth_proto`. `Unspecified` never gets past the service's edge.
pub use plinth_proto::catalog::v1::{
    BindingLifetime as Lifetime, BindingState, OperationKind, OperationState,
};

/// An operation as the ledger has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operation {
    /// Its identity.
    pub key: OperationKey,
    /// The Environment it addressed.
    pub environment: String,
    /// What it is.
    pub kind: OperationKind,
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
    pub kind: OperationKind,
    /// A digest of its request.
    pub digest: String,
    /// Whoever runs it.
    pub runner: String,
    /// How long the claim lasts unless renewed.
    pub lease_ms: i64,
}

/// What claiming an operation found: the ledger's decision, which the gateway only maps to a
/// receipt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// It is new: the caller runs it.
    Claimed(Operation),
    /// It was delivered before and finished: its stored receipt.
    Duplicate(Operation),
    /// It was delivered before and its runner's lease is live.
    InProgress(Operation),
    /// It was delivered before and its runner stopped renewing with no receipt: it is
    /// settled now (in the claim's transaction) with the `unknown` receipt the delivery
    /// carried, or with the one a concurrent delivery stored first.
    SettledUnknown(Operation),
    /// The sequence was delivered before with another request; nothing changed.
    SequenceReused(Operation),
}

impl Claim {
    /// The operation as stored.
    pub fn operation(&self) -> &Operation {
        match self {
            Claim::Claimed(operation)
            | Claim::Duplicate(operation)
            | Claim::InProgress(operation)
            | Claim::SettledUnknown(operation)
            | Claim::SequenceReused(operation) => operation,
        }
    }
}

/// Whether a binding in state `from` may move to `to`: attached and detached move either way
/// (a detached Environment is set up again with what it kept), either may be torn down, and
/// torn down is final. Moving to the state it is in is allowed (a redelivered detach or
/// teardown changes nothing).
pub fn may_move(from: BindingState, to: BindingState) -> bool {
    use BindingState::{Attached, Detached, TornDown, Unspecified};
    match (from, to) {
        (_, Unspecified) | (Unspecified, _) => false,
        (TornDown, TornDown) => true,
        (TornDown, Attached | Detached) => false,
        (Attached | Detached, Attached | Detached | TornDown) => true,
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
    fn a_torn_down_binding_stays_torn_down() {
        use BindingState::{Attached, Detached, TornDown, Unspecified};
        assert!(may_move(Attached, Detached));
        assert!(may_move(Detached, Attached));
        assert!(may_move(Detached, TornDown));
        assert!(may_move(TornDown, TornDown));
        assert!(!may_move(TornDown, Attached));
        assert!(!may_move(TornDown, Detached));
        assert!(!may_move(Attached, Unspecified));
    }
}
