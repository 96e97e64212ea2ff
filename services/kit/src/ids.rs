//! Plinth's ids: a prefix and 32 lowercase hex digits, made at random. One definition of
//! each kind, shared by every crate that makes, stores or checks one, so a session id the
//! catalog makes is exactly what the node accepts as a directory name and the command line
//! recognises as an id.

/// Declares an id newtype: a prefix and 32 lowercase hex digits, made by `generate` and
/// accepted by `parse` in exactly that shape.
macro_rules! prefixed_id {
    ($(#[$doc:meta])* $name:ident, $prefix:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(String);

        impl $name {
            /// What every id of this kind starts with.
            pub const PREFIX: &'static str = $prefix;

            /// A fresh random id.
            pub fn generate() -> Self {
                $name(format!("{}{}", Self::PREFIX, uuid::Uuid::new_v4().simple()))
            }

            /// Accepts exactly the shape `generate` makes; anything else names nothing, and
            /// callers report it as not found.
            pub fn parse(text: &str) -> Option<Self> {
                is_generated(text, Self::PREFIX).then(|| $name(text.to_owned()))
            }

            /// Whether `text` has the shape of one (it is then safe as a path segment).
            pub fn is_valid(text: &str) -> bool {
                is_generated(text, Self::PREFIX)
            }

            /// The id as text.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}

prefixed_id!(
    /// An environment: `henv_` and 32 lowercase hex digits.
    EnvironmentId,
    "henv_"
);
prefixed_id!(
    /// A harness: `chrn_` and 32 lowercase hex digits.
    HarnessId,
    "chrn_"
);
prefixed_id!(
    /// A session: `sess_` and 32 lowercase hex digits (its working directory's name on a
    /// node).
    SessionId,
    "sess_"
);
prefixed_id!(
    /// A node agent: `node_` and 32 lowercase hex digits.
    NodeId,
    "node_"
);
prefixed_id!(
    /// A task: `task_` and 32 lowercase hex digits.
    TaskId,
    "task_"
);
prefixed_id!(
    /// A workspace adapter: `wadp_` and 32 lowercase hex digits.
    AdapterId,
    "wadp_"
);
prefixed_id!(
    /// A command's kept output on its node: `out_` and 32 lowercase hex digits.
    OutputId,
    "out_"
);
prefixed_id!(
    /// What undoes one workspace change: `rb_` and 32 lowercase hex digits.
    RollbackToken,
    "rb_"
);

/// Whether `text` is `prefix` and 32 lowercase hex digits: the shape of every generated id.
fn is_generated(text: &str, prefix: &str) -> bool {
    text.strip_prefix(prefix).is_some_and(|hex| {
        hex.len() == 32
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_is_its_prefix_and_32_lowercase_hex_digits() {
        let made = SessionId::generate();
        assert!(made.as_str().starts_with("sess_"), "{made}");
        assert_eq!(SessionId::parse(made.as_str()), Some(made.clone()));
        assert!(SessionId::is_valid(made.as_str()));
        let hex = &made.as_str()[5..];
        for refused in [
            String::new(),
            "sess_".to_owned(),
            format!("sess_{}", hex.to_uppercase()),
            format!("sess_{hex}0"),
            format!("sess_{}", &hex[1..]),
            format!("henv_{hex}"),
            format!("sess_{}/", &hex[1..]),
            format!("sess_../{}", &hex[3..]),
        ] {
            assert_eq!(SessionId::parse(&refused), None, "{refused:?}");
        }
        assert!(EnvironmentId::parse(&format!("henv_{hex}")).is_some());
        assert_eq!(OutputId::PREFIX, "out_");
        assert!(RollbackToken::generate().as_str().starts_with("rb_"));
    }
}
