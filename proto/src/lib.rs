//! The gRPC contracts between Plinth's services, generated from `proto/plinth/**.proto`.
//!
//! Only generated wire types live here, with the one spelling of each enum value as text
//! (`labels!`: the strings REST, the database and logs use). Validation into domain types
//! happens at each service's edge (`TryFrom<proto>`), never in this crate.

/// `plinth.catalog.v1`: environments, versions, builds, sessions and scopes.
pub mod catalog {
    /// Version 1 of the catalog contract.
    pub mod v1 {
        #![allow(clippy::all, missing_docs)]
        tonic::include_proto!("plinth.catalog.v1");
    }
}

mod adapter_labels;

/// `plinth.source.v1`: environment files, imports and snapshots.
pub mod source {
    /// Version 1 of the source contract.
    pub mod v1 {
        #![allow(clippy::all, missing_docs)]
        tonic::include_proto!("plinth.source.v1");
    }
}

/// `plinth.node.v1`: the node agent's sessions, commands and workdir files.
pub mod node {
    /// Version 1 of the node contract.
    pub mod v1 {
        #![allow(clippy::all, missing_docs)]
        tonic::include_proto!("plinth.node.v1");
    }
}

/// `plinth.v1`: the tenant API the gateway serves beside REST (clients only).
pub mod public {
    /// Version 1 of the tenant API.
    pub mod v1 {
        #![allow(clippy::all, missing_docs)]
        tonic::include_proto!("plinth.v1");
    }
}

/// Every compiled `.proto` as one `FileDescriptorSet`, for gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("plinth_descriptor");

/// The tenant API, `plinth.v1` (`proto/plinth/v1`), with its imports, as one
/// `FileDescriptorSet`: the gateway serves it over gRPC by its `google.api.http` options, and
/// its reflection lists it.
pub const PUBLIC_DESCRIPTOR_SET: &[u8] =
    tonic::include_file_descriptor_set!("plinth_public_descriptor");

/// An enum value off the wire that is none of its enum's values: unset (0, `…_UNSPECIFIED`,
/// which no sender sends) or a number from a newer contract than this build's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnknownValue {
    /// The enum, as the contract names it (`plinth.catalog.v1.TurnKind`).
    pub enumeration: &'static str,
    /// The number that came.
    pub value: i32,
}

impl std::fmt::Display for UnknownValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.value == 0 {
            write!(f, "{} was not set (0, unspecified)", self.enumeration)
        } else {
            write!(
                f,
                "{} {} is not a value this build knows (a newer peer?)",
                self.enumeration, self.value
            )
        }
    }
}

impl std::error::Error for UnknownValue {}

/// Gives a generated enum its text form, written once here: `label`, `from_label`, `ALL` and
/// `from_wire`. The `match` in `label` has no wildcard, so a value added to the `.proto`
/// without a label here does not compile.
macro_rules! labels {
    ($package:literal, $module:ident :: $version:ident :: $name:ident { $($variant:ident => $label:literal,)+ }) => {
        impl $module::$version::$name {
            /// The enum as the contract names it, for errors.
            pub const NAME: &'static str = concat!($package, ".", stringify!($name));

            /// Every value but `Unspecified`, in the contract's order.
            pub const ALL: &'static [Self] = &[$(Self::$variant),+];

            /// The value as text: what REST and JSON answers show, what the catalog's
            /// database holds and what logs print. `Unspecified` is `"unspecified"`, which
            /// [`Self::from_label`] does not read back: it is never a value to store or show.
            pub const fn label(self) -> &'static str {
                match self {
                    Self::Unspecified => "unspecified",
                    $(Self::$variant => $label,)+
                }
            }

            /// The value a [`Self::label`] names; `None` for any other text.
            pub fn from_label(text: &str) -> Option<Self> {
                match text {
                    $($label => Some(Self::$variant),)+
                    _ => None,
                }
            }

            /// The value a message carried: an error that says what came when it is unset or
            /// unknown to this build.
            pub fn from_wire(value: i32) -> Result<Self, UnknownValue> {
                match Self::try_from(value) {
                    Ok(Self::Unspecified) | Err(_) => Err(UnknownValue {
                        enumeration: Self::NAME,
                        value,
                    }),
                    Ok(known) => Ok(known),
                }
            }
        }
    };
}

labels!("plinth.catalog.v1", catalog::v1::SessionStatus {
    Active => "active",
    Ended => "ended",
});

labels!("plinth.catalog.v1", catalog::v1::TurnKind {
    Exec => "exec",
    ReadFile => "read_file",
    WriteFile => "write_file",
    DeleteFile => "delete_file",
    ListFiles => "list_files",
    SearchFiles => "search_files",
    FindFiles => "find_files",
    EditFile => "edit_file",
    ApplyPatch => "apply_patch",
    ReadOutput => "read_output",
    Restore => "restore",
    ListChanges => "list_changes",
});

labels!("plinth.catalog.v1", catalog::v1::PackageManager {
    Pip => "pip",
    Npm => "npm",
});

labels!("plinth.catalog.v1", catalog::v1::ToolchainName {
    Python => "python",
    Node => "node",
});

labels!("plinth.source.v1", source::v1::EntryKind {
    File => "file",
    Directory => "directory",
    Symlink => "symlink",
});

labels!("plinth.node.v1", node::v1::EntryKind {
    File => "file",
    Directory => "directory",
    Symlink => "symlink",
});

labels!("plinth.node.v1", node::v1::PatchOperationKind {
    CreateFile => "create_file",
    UpdateFile => "update_file",
    DeleteFile => "delete_file",
});

labels!("plinth.node.v1", node::v1::PatchOperationStatus {
    Ok => "ok",
    Skipped => "skipped",
    Error => "error",
});

labels!("plinth.node.v1", node::v1::FileChangeKind {
    Created => "created",
    Modified => "modified",
    Deleted => "deleted",
});

labels!("plinth.node.v1", node::v1::NoSnippetReason {
    Binary => "binary",
    PartialPriorRead => "partial-prior-read",
    SnippetTooLarge => "snippet-too-large",
    Deleted => "deleted",
});

#[cfg(test)]
mod tests {
    use super::{UnknownValue, catalog, node, source};

    /// Holds one enum's labels to their promises: every value the contract defines (but
    /// `Unspecified`) is in `ALL` and has a label; labels are unique and read back to their
    /// value; `from_wire` refuses 0 and numbers past the last value, saying which.
    macro_rules! round_trip {
        ($test:ident, $enum:ty, $name:literal) => {
            #[test]
            fn $test() {
                let defined: Vec<$enum> = (1..=64)
                    .filter_map(|value| <$enum>::try_from(value).ok())
                    .collect();
                assert_eq!(<$enum>::ALL, defined.as_slice(), "ALL lists every value");
                let mut seen = std::collections::HashSet::new();
                for &value in <$enum>::ALL {
                    let label = value.label();
                    assert!(
                        !label.is_empty() && label != "unspecified",
                        "{value:?}: {label}"
                    );
                    assert!(seen.insert(label), "{label} labels two values");
                    assert_eq!(<$enum>::from_label(label), Some(value));
                    assert_eq!(<$enum>::from_wire(value as i32), Ok(value));
                }
                assert_eq!(<$enum>::from_label("unspecified"), None);
                assert_eq!(<$enum>::from_label(""), None);
                assert_eq!(
                    <$enum>::from_wire(0),
                    Err(UnknownValue {
                        enumeration: $name,
                        value: 0
                    })
                );
                let past = <$enum>::ALL.len() as i32 + 1;
                let refused = <$enum>::from_wire(past).expect_err("past the last value");
                assert!(
                    refused.to_string().contains(&format!("{} {past}", $name)),
                    "{refused}"
                );
            }
        };
    }

    round_trip!(
        session_status,
        catalog::v1::SessionStatus,
        "plinth.catalog.v1.SessionStatus"
    );
    round_trip!(
        turn_kind,
        catalog::v1::TurnKind,
        "plinth.catalog.v1.TurnKind"
    );
    round_trip!(
        package_manager,
        catalog::v1::PackageManager,
        "plinth.catalog.v1.PackageManager"
    );
    round_trip!(
        toolchain_name,
        catalog::v1::ToolchainName,
        "plinth.catalog.v1.ToolchainName"
    );
    round_trip!(entry_kind, node::v1::EntryKind, "plinth.node.v1.EntryKind");
    round_trip!(
        source_entry_kind,
        source::v1::EntryKind,
        "plinth.source.v1.EntryKind"
    );
    round_trip!(
        patch_kind,
        node::v1::PatchOperationKind,
        "plinth.node.v1.PatchOperationKind"
    );
    round_trip!(
        patch_status,
        node::v1::PatchOperationStatus,
        "plinth.node.v1.PatchOperationStatus"
    );
    round_trip!(
        file_change,
        node::v1::FileChangeKind,
        "plinth.node.v1.FileChangeKind"
    );
    round_trip!(
        no_snippet,
        node::v1::NoSnippetReason,
        "plinth.node.v1.NoSnippetReason"
    );
}
