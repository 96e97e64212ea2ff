//! The one spelling of each closed set of the adapter and Brain contracts
//! (`plinth/catalog/v1/adapters.proto`, `brain.proto`) as text: what the database stores,
//! what logs and REST answers show. The wire carries the enum; every other place that needs
//! the word asks `label()`, and reads it back with `from_label()`, so no second table of the
//! same words exists.

use crate::catalog::v1::{
    AdapterProtocol, BindingLifetime, BindingState, OperationKind, OperationState,
};

/// Defines `label()` and `from_label()` from one table. `UNSPECIFIED` has the label
/// `unspecified`, which `from_label` never answers: it is not a value, only its absence.
macro_rules! labels {
    ($enum:ident { $($variant:ident => $label:literal),+ $(,)? }) => {
        impl $enum {
            /// Every value but `Unspecified`.
            pub const ALL: &'static [$enum] = &[$($enum::$variant),+];

            /// Its text, as stored and shown.
            pub fn label(self) -> &'static str {
                match self {
                    $($enum::$variant => $label,)+
                    $enum::Unspecified => "unspecified",
                }
            }

            /// From its text; `None` for anything that is not one of its labels.
            pub fn from_label(text: &str) -> Option<Self> {
                $enum::ALL.iter().copied().find(|value| value.label() == text)
            }
        }
    };
}

labels!(AdapterProtocol {
    Novo => "novo",
    Brain => "brain",
});

labels!(OperationKind {
    Setup => "setup",
    Call => "call",
    Detach => "detach",
    Teardown => "teardown",
    Execute => "execute",
    Cancel => "cancel",
    Other => "other",
});

labels!(OperationState {
    Started => "started",
    Finished => "finished",
});

labels!(BindingLifetime {
    Disposable => "disposable",
    Workspace => "workspace",
});

labels!(BindingState {
    Attached => "attached",
    Detached => "detached",
    TornDown => "torn_down",
});

impl std::fmt::Display for AdapterProtocol {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.label())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_round_trip_and_unspecified_is_no_label() {
        for protocol in AdapterProtocol::ALL {
            assert_eq!(
                AdapterProtocol::from_label(protocol.label()),
                Some(*protocol)
            );
        }
        for kind in OperationKind::ALL {
            assert_eq!(OperationKind::from_label(kind.label()), Some(*kind));
        }
        for state in BindingState::ALL {
            assert_eq!(BindingState::from_label(state.label()), Some(*state));
        }
        assert_eq!(BindingState::from_label("unspecified"), None);
        assert_eq!(BindingLifetime::from_label("forever"), None);
        assert_eq!(OperationState::Finished.label(), "finished");
    }
}
