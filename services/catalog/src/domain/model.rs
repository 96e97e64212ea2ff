//! The catalog's domain types and the rules that make them valid. Wire types (prost) are
//! converted into these at the edge (`crate::grpc`), and nothing here knows about gRPC or SQL;
//! the one exception is the text of a closed set (a status, a kind), which is the contract's
//! label from `plinth_proto` so that the database, REST and logs spell it one way
//! (`contract_enum!`).

use plinth_kit::{ErrorCode, PlinthError};
use plinth_proto::catalog::v1 as pb;

/// Most characters a name may have.
pub const MAX_NAME_CHARS: usize = 200;
/// Most characters a description or an entry may have.
pub const MAX_TEXT_CHARS: usize = 4000;
/// Most characters a slug keeps; longer derivations are cut at a segment boundary or here.
pub const MAX_SLUG_CHARS: usize = plinth_kit::slug::MAX_CHARS;
/// Most bytes a scope may have.
pub const MAX_SCOPE_BYTES: usize = 128;

pub use plinth_kit::ids::{EnvironmentId, HarnessId};

/// Declares a domain enum tied to the contract enum it mirrors (`pb::$wire`, without
/// `Unspecified`):
/// the text it is stored as and logged as is the contract's label (`plinth_proto` spells each
/// once); it becomes the contract's value without fail, and a contract value becomes it with
/// an error that says what came. Stored as JSON, it is its label too.
macro_rules! contract_enum {
    (
        $(#[$meta:meta])*
        pub enum $domain:ident mirrors $wire:ident {
            $($(#[$variant_meta:meta])* $variant:ident,)+
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum $domain {
            $($(#[$variant_meta])* $variant,)+
        }

        impl $domain {
            /// As stored, shown and logged: the contract's label.
            pub fn as_str(self) -> &'static str {
                pb::$wire::from(self).label()
            }

            /// From its stored form; `None` for text that labels no value.
            pub fn parse(text: &str) -> Option<Self> {
                pb::$wire::from_label(text).and_then(|value| Self::try_from(value).ok())
            }

            /// From a message's number: unset or unknown is an error that says what came.
            pub fn from_wire(value: i32) -> Result<Self, plinth_proto::UnknownValue> {
                Self::try_from(pb::$wire::from_wire(value)?)
            }
        }

        impl From<$domain> for pb::$wire {
            fn from(value: $domain) -> Self {
                match value {
                    $($domain::$variant => pb::$wire::$variant,)+
                }
            }
        }

        impl TryFrom<pb::$wire> for $domain {
            type Error = plinth_proto::UnknownValue;

            fn try_from(value: pb::$wire) -> Result<Self, Self::Error> {
                match value {
                    $(pb::$wire::$variant => Ok($domain::$variant),)+
                    pb::$wire::Unspecified => Err(plinth_proto::UnknownValue {
                        enumeration: pb::$wire::NAME,
                        value: 0,
                    }),
                }
            }
        }

        impl serde::Serialize for $domain {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(self.as_str())
            }
        }

        impl<'de> serde::Deserialize<'de> for $domain {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
                Self::parse(&text).ok_or_else(|| {
                    serde::de::Error::custom(format!(
                        "{text:?} is no {} this build knows",
                        pb::$wire::NAME
                    ))
                })
            }
        }
    };
}
pub(crate) use contract_enum;

/// The tenant an object belongs to; every query is confined to one.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Scope(String);

impl Scope {
    /// A scope is 1 to 128 bytes of printable ASCII; the gateway derives it from a token.
    pub fn parse(text: &str) -> Result<Self, PlinthError> {
        let ok = !text.is_empty()
            && text.len() <= MAX_SCOPE_BYTES
            && text.bytes().all(|b| b.is_ascii_graphic());
        if ok {
            Ok(Scope(text.to_owned()))
        } else {
            Err(PlinthError::invalid(
                "scope must be 1 to 128 printable ASCII characters",
            ))
        }
    }

    /// The scope as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The last segment of an environment's mount path: lowercase ASCII letters and digits in
/// runs joined by single `-`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Slug(String);

impl Slug {
    /// Derives the slug from a name: ASCII letters lowercased, digits kept, every other run of
    /// characters (spaces, punctuation, non-ASCII letters) becomes one `-`, and the ends are
    /// trimmed. `None` when nothing is left.
    pub fn from_name(name: &str) -> Option<Self> {
        let mut slug = String::with_capacity(name.len().min(MAX_SLUG_CHARS));
        let mut pending_dash = false;
        for c in name.chars() {
            if c.is_ascii_alphanumeric() {
                if pending_dash && !slug.is_empty() {
                    if slug.len() + 1 >= MAX_SLUG_CHARS {
                        break;
                    }
                    slug.push('-');
                }
                pending_dash = false;
                if slug.len() >= MAX_SLUG_CHARS {
                    break;
                }
                slug.push(c.to_ascii_lowercase());
            } else {
                pending_dash = true;
            }
        }
        let trimmed = slug.trim_end_matches('-');
        (!trimmed.is_empty()).then(|| Slug(trimmed.to_owned()))
    }

    /// Reads a slug back from storage, where it was made by [`Slug::from_name`].
    pub fn from_stored(text: String) -> Self {
        Slug(text)
    }

    /// The slug as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Where sessions see the environment.
    pub fn mount(&self) -> String {
        plinth_kit::slug::mount(&self.0)
    }
}

/// An environment as the catalog holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Environment {
    /// Its id.
    pub id: EnvironmentId,
    /// Its owner.
    pub scope: Scope,
    /// Display name.
    pub name: String,
    /// Fixed at creation.
    pub slug: Slug,
    /// Free text.
    pub description: String,
    /// How to run the project.
    pub entry: String,
    /// How its builds install.
    pub install: InstallSettings,
    /// The version sessions get, once one is built.
    pub active_version: Option<u32>,
    /// The newest version started.
    pub latest_version: Option<u32>,
    /// Regular files in the source.
    pub files_count: u64,
    /// Their bytes.
    pub files_bytes: u64,
    /// Milliseconds since the Unix epoch.
    pub created_at_ms: i64,
    /// Milliseconds since the Unix epoch.
    pub updated_at_ms: i64,
    /// Every build, newest first.
    pub builds: Vec<Build>,
}

/// Where an environment stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EnvironmentStatus {
    /// Nothing built yet.
    Empty,
    /// No version is active and a build is queued or running.
    Building,
    /// A version is active.
    Ready,
    /// No version is active and the latest build failed.
    Failed,
}

impl Environment {
    /// Ready whenever a version is active; otherwise what the latest build says.
    pub fn status(&self) -> EnvironmentStatus {
        if self.active_version.is_some() {
            return EnvironmentStatus::Ready;
        }
        match self.builds.first().map(|build| build.status) {
            None => EnvironmentStatus::Empty,
            Some(BuildStatus::Queued | BuildStatus::Building) => EnvironmentStatus::Building,
            Some(BuildStatus::Failed) => EnvironmentStatus::Failed,
            // A ready build that is not active was deactivated by a rollback elsewhere; the
            // environment has something to activate but nothing active.
            Some(BuildStatus::Ready) => EnvironmentStatus::Empty,
        }
    }

    /// The packages the active version installed.
    pub fn packages(&self) -> &[Package] {
        self.active_version
            .and_then(|active| self.builds.iter().find(|build| build.version == active))
            .map_or(&[], |build| build.packages.as_slice())
    }
}

/// Where a build stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BuildStatus {
    /// Waiting for a builder.
    Queued,
    /// A builder holds its lease.
    Building,
    /// Finished; activatable.
    Ready,
    /// Finished without a usable version.
    Failed,
}

impl BuildStatus {
    /// The stored spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            BuildStatus::Queued => "queued",
            BuildStatus::Building => "building",
            BuildStatus::Ready => "ready",
            BuildStatus::Failed => "failed",
        }
    }

    /// Reads the stored spelling.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "queued" => Some(BuildStatus::Queued),
            "building" => Some(BuildStatus::Building),
            "ready" => Some(BuildStatus::Ready),
            "failed" => Some(BuildStatus::Failed),
            _ => None,
        }
    }
}

contract_enum! {
    /// Which installer installed a package.
    pub enum PackageManager mirrors PackageManager {
        /// Python's, through uv.
        Pip,
        /// Node's.
        Npm,
    }
}

/// One installed package.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Package {
    /// Which installer.
    pub manager: PackageManager,
    /// As its manager spells it.
    pub name: String,
    /// As its manager spells it.
    pub version: String,
}

contract_enum! {
    /// A toolchain a build installs with.
    pub enum ToolchainName mirrors ToolchainName {
        /// Python.
        Python,
        /// Node.js.
        Node,
    }
}

/// A toolchain a build's installers ran with.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Toolchain {
    /// Which program.
    pub name: ToolchainName,
    /// As the program reports it.
    pub version: String,
    /// The program's path, as builds and sessions see it.
    pub path: String,
}

/// One build: a version of an environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Build {
    /// Its environment.
    pub environment_id: EnvironmentId,
    /// Its version number, from 1.
    pub version: u32,
    /// Where it stands.
    pub status: BuildStatus,
    /// The source tree it builds (`sha256:…`).
    pub source_tree: String,
    /// The layer tree it produced, once ready.
    pub layer_tree: String,
    /// Why it failed.
    pub error: String,
    /// What it installed.
    pub packages: Vec<Package>,
    /// The layer's bytes.
    pub size: u64,
    /// Leases handed out so far.
    pub attempt: u32,
    /// Bytes of log appended.
    pub log_bytes: u64,
    /// Milliseconds since the Unix epoch.
    pub queued_at_ms: i64,
    /// Milliseconds since the Unix epoch; 0 until a builder takes it.
    pub started_at_ms: i64,
    /// Milliseconds since the Unix epoch; 0 until it ends.
    pub finished_at_ms: i64,
    /// Asked to reuse nothing from earlier builds.
    pub clean: bool,
    /// The toolchains its installers ran with, once ready.
    pub toolchains: Vec<Toolchain>,
}

/// Proof that a builder holds a build: every write of the builder carries it, and a token
/// whose lease expired is refused (fencing).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseToken(String);

impl LeaseToken {
    /// A fresh, unguessable token.
    pub fn generate() -> Self {
        LeaseToken(format!("lease_{}", uuid::Uuid::new_v4().simple()))
    }

    /// Wraps a token received from a builder.
    pub fn from_wire(text: String) -> Self {
        LeaseToken(text)
    }

    /// The token as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A build handed to a builder.
#[derive(Debug, Clone)]
pub struct Claim {
    /// The build.
    pub build: Build,
    /// Its environment's slug: where it builds (`/env/<slug>`).
    pub slug: Slug,
    /// Its environment's scope.
    pub scope: Scope,
    /// How to install, as the environment said when the build was started.
    pub install: InstallSettings,
    /// The lease.
    pub token: LeaseToken,
    /// When the lease ends unless renewed, ms since the Unix epoch.
    pub expires_at_ms: i64,
}

/// How a build ended, as its builder reports it.
#[derive(Debug, Clone)]
pub enum Outcome {
    /// The layer is stored: the version is ready and becomes active.
    Ready {
        /// The layer tree's digest.
        layer_tree: String,
        /// What was installed.
        packages: Vec<Package>,
        /// The layer's bytes.
        size: u64,
        /// What the dependencies were installed from; empty when nothing was.
        dependency_key: String,
        /// The toolchains the installers ran with.
        toolchains: Vec<Toolchain>,
    },
    /// The build failed; nothing else changes.
    Failed {
        /// Why.
        error: String,
    },
}

/// A validated request to create an environment.
#[derive(Debug, Clone)]
pub struct NewEnvironment {
    /// The owner.
    pub scope: Scope,
    /// Display name, checked.
    pub name: String,
    /// Derived from the name.
    pub slug: Slug,
    /// Checked.
    pub description: String,
    /// Checked.
    pub entry: String,
    /// Checked.
    pub install: InstallSettings,
}

impl NewEnvironment {
    /// Checks every field; the error names the field at fault.
    pub fn new(
        scope: Scope,
        name: String,
        description: String,
        entry: String,
    ) -> Result<Self, PlinthError> {
        let slug = check_name(&name)?;
        check_text("description", &description)?;
        check_text("entry", &entry)?;
        Ok(NewEnvironment {
            scope,
            name,
            slug,
            description,
            entry,
            install: InstallSettings::default(),
        })
    }

    /// With these install settings from the wire, checked; none leaves the default (the
    /// manifests found decide).
    pub fn with_install(
        mut self,
        install: Option<pb::InstallSettings>,
    ) -> Result<Self, PlinthError> {
        if let Some(install) = install {
            self.install = InstallSettings::from_wire(install)?;
        }
        Ok(self)
    }
}

/// How an environment's builds install, where its owner says rather than the manifests found
/// (`install` on the environment object); checked by the rules the builder applies too
/// ([`plinth_kit::python_install`]). Stored as JSON, empty when nothing is said.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct InstallSettings {
    /// The Python manifest to install; `None`: chosen from the manifests found.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub python: Option<PythonInstall>,
}

pub use plinth_kit::python_install::{PythonInstall, PythonProject};

impl InstallSettings {
    /// From the wire, checked: the error names the field at fault and what to write.
    pub fn from_wire(wire: pb::InstallSettings) -> Result<Self, PlinthError> {
        let python = wire.python.map(|python| PythonInstall {
            requirements: python.requirements,
            project: python.project.map(|project| PythonProject {
                groups: project.groups.map(|groups| groups.names),
                extras: project.extras,
            }),
        });
        if let Some(python) = &python {
            python
                .check()
                .map_err(|error| PlinthError::invalid(error.to_string()))?;
        }
        Ok(InstallSettings { python })
    }

    /// As the wire carries it.
    pub fn to_wire(&self) -> pb::InstallSettings {
        pb::InstallSettings {
            python: self.python.as_ref().map(|python| pb::PythonInstall {
                requirements: python.requirements.clone(),
                project: python.project.as_ref().map(|project| pb::PythonProject {
                    groups: project.groups.clone().map(|names| pb::Names { names }),
                    extras: project.extras.clone(),
                }),
            }),
        }
    }

    /// The stored text: empty when nothing is said, else JSON.
    pub fn stored(&self) -> String {
        if *self == InstallSettings::default() {
            return String::new();
        }
        serde_json::to_string(self).unwrap_or_default()
    }

    /// From its stored text; JSON that does not read as settings is the error.
    pub fn from_stored(text: &str) -> Result<Self, serde_json::Error> {
        if text.is_empty() {
            return Ok(InstallSettings::default());
        }
        serde_json::from_str(text)
    }
}

/// A validated change to an environment; `None` leaves a field as it is.
#[derive(Debug, Clone, Default)]
pub struct EnvironmentChanges {
    /// New display name; the slug stays.
    pub name: Option<String>,
    /// New description.
    pub description: Option<String>,
    /// New entry.
    pub entry: Option<String>,
    /// New install settings, replacing the old whole.
    pub install: Option<InstallSettings>,
}

impl EnvironmentChanges {
    /// Checks every field that is set with the same rules as creation.
    pub fn new(
        name: Option<String>,
        description: Option<String>,
        entry: Option<String>,
    ) -> Result<Self, PlinthError> {
        if let Some(name) = &name {
            check_name(name)?;
        }
        if let Some(description) = &description {
            check_text("description", description)?;
        }
        if let Some(entry) = &entry {
            check_text("entry", entry)?;
        }
        Ok(EnvironmentChanges {
            name,
            description,
            entry,
            install: None,
        })
    }

    /// With new install settings from the wire, checked, replacing the old whole (an empty
    /// message clears them); none leaves them as they are.
    pub fn with_install(
        mut self,
        install: Option<pb::InstallSettings>,
    ) -> Result<Self, PlinthError> {
        self.install = install.map(InstallSettings::from_wire).transpose()?;
        Ok(self)
    }

    /// Whether nothing would change.
    pub fn is_empty(&self) -> bool {
        self.name.is_none()
            && self.description.is_none()
            && self.entry.is_none()
            && self.install.is_none()
    }
}

/// A harness as the catalog holds it: a named agent configuration and the environment its
/// tasks read (UHP §5).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Harness {
    /// Its id.
    pub id: HarnessId,
    /// Its owner.
    pub scope: Scope,
    /// Display name.
    pub name: String,
    /// The agent it builds on, such as `codex`.
    pub base: String,
    /// The environment its tasks read. It was in the scope when the harness was last written;
    /// it may have been deleted since, and the reference is kept.
    pub environment_id: EnvironmentId,
    /// Milliseconds since the Unix epoch.
    pub created_at_ms: i64,
    /// Milliseconds since the Unix epoch.
    pub updated_at_ms: i64,
}

/// A validated harness write: every field of a harness its owner sets, for creation and for
/// replacement alike. Whether the environment is one of the scope is the store's to check,
/// in the same statement as the write.
#[derive(Debug, Clone)]
pub struct HarnessFields {
    /// The owner.
    pub scope: Scope,
    /// Display name, checked.
    pub name: String,
    /// Checked.
    pub base: String,
    /// A well-formed environment id.
    pub environment_id: EnvironmentId,
}

impl HarnessFields {
    /// Checks every field; the error names the field at fault. An environment that is empty
    /// or cannot be an id is `environment_not_found` (§5: a harness names an environment of
    /// its scope or is refused), after the other fields are checked.
    pub fn new(
        scope: Scope,
        name: String,
        base: String,
        environment: &str,
    ) -> Result<Self, PlinthError> {
        check_label("name", &name)?;
        check_label("base", &base)?;
        if environment.is_empty() {
            return Err(PlinthError::new(
                ErrorCode::EnvironmentNotFound,
                "environment: a harness must name an environment of its scope",
            ));
        }
        let environment_id = EnvironmentId::parse(environment)
            .ok_or_else(|| PlinthError::not_found(format_args!("environment {environment:?}")))?;
        Ok(HarnessFields {
            scope,
            name,
            base,
            environment_id,
        })
    }
}

/// A harness's name or base: not blank, at most [`MAX_NAME_CHARS`], no control characters.
fn check_label(field: &str, text: &str) -> Result<(), PlinthError> {
    if text.trim().is_empty() {
        return Err(PlinthError::invalid(format!("{field}: must not be empty")));
    }
    let chars = text.chars().count();
    if chars > MAX_NAME_CHARS {
        return Err(PlinthError::invalid(format!(
            "{field}: {chars} characters is longer than the limit of {MAX_NAME_CHARS}"
        ))
        .with_detail(serde_json_limit(field, MAX_NAME_CHARS)));
    }
    if text.chars().any(char::is_control) {
        return Err(PlinthError::invalid(format!(
            "{field}: control characters are not allowed"
        )));
    }
    Ok(())
}

fn check_name(name: &str) -> Result<Slug, PlinthError> {
    let chars = name.chars().count();
    if chars > MAX_NAME_CHARS {
        return Err(PlinthError::invalid(format!(
            "name: {chars} characters is longer than the limit of {MAX_NAME_CHARS}"
        ))
        .with_detail(serde_json_limit("name", MAX_NAME_CHARS)));
    }
    if name.chars().any(char::is_control) {
        return Err(PlinthError::invalid(
            "name: control characters are not allowed",
        ));
    }
    Slug::from_name(name).ok_or_else(|| {
        PlinthError::invalid(format!(
            "name: {name:?} yields no path segment; a name needs at least one ASCII letter or digit"
        ))
    })
}

fn check_text(field: &str, text: &str) -> Result<(), PlinthError> {
    let chars = text.chars().count();
    if chars > MAX_TEXT_CHARS {
        return Err(PlinthError::invalid(format!(
            "{field}: {chars} characters is longer than the limit of {MAX_TEXT_CHARS}"
        ))
        .with_detail(serde_json_limit(field, MAX_TEXT_CHARS)));
    }
    if text.contains('\0') {
        return Err(PlinthError::invalid(format!(
            "{field}: NUL characters are not allowed"
        )));
    }
    Ok(())
}

fn serde_json_limit(field: &str, max: usize) -> plinth_kit::error::Value {
    let mut detail = plinth_kit::error::Map::new();
    detail.insert("field".to_owned(), field.into());
    detail.insert("max_chars".to_owned(), max.into());
    detail.into()
}

/// Items a page holds when the caller names no limit.
pub const DEFAULT_PAGE_ITEMS: u32 = 100;
/// Most items a page holds: a page of the largest objects still fits well inside a 4 MiB
/// gRPC message.
pub const MAX_PAGE_ITEMS: u32 = 1000;

/// Where a listing resumes: just past the item with this sort key (a number, then an id).
/// Clients see it only as an opaque string, so the sort key can change without breaking them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor {
    /// The last item's sort key: its creation time in ms (environments, harnesses, sessions)
    /// or its sequence (a session's turns).
    pub key: i64,
    /// The last item's id, which breaks ties between items created in the same millisecond;
    /// for turns, `turns_` and their session's id, so a cursor from another session's turns
    /// (or from a list of sessions) is refused.
    pub id: String,
}

impl Cursor {
    /// The string a client hands back as `after`.
    pub fn encode(&self) -> String {
        use base64::Engine;
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(format!("{}:{}", self.key, self.id))
    }

    /// Reads a cursor this catalog handed out; anything else is `environment_invalid`, since
    /// a list cannot resume from a place it never gave.
    pub fn decode(text: &str) -> Result<Self, PlinthError> {
        use base64::Engine;
        let refused = || {
            PlinthError::invalid(
                "after: not a cursor this list handed out; pass the `next` of the previous page",
            )
        };
        let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(text)
            .map_err(|_| refused())?;
        let text = String::from_utf8(bytes).map_err(|_| refused())?;
        let (at, id) = text.split_once(':').ok_or_else(refused)?;
        let key = at.parse().map_err(|_| refused())?;
        if id.is_empty()
            || id.len() > 64
            || !id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        {
            return Err(refused());
        }
        Ok(Cursor {
            key,
            id: id.to_owned(),
        })
    }
}

/// Which page of a listing to read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PageRequest {
    /// At most this many items, from 1 to [`MAX_PAGE_ITEMS`].
    pub limit: u32,
    /// Items after this one; the first page when absent.
    pub after: Option<Cursor>,
}

impl PageRequest {
    /// The first page at the default size.
    pub fn first() -> Self {
        PageRequest {
            limit: DEFAULT_PAGE_ITEMS,
            after: None,
        }
    }

    /// Validates a wire request: a limit of 0 means the default; above the maximum, or a cursor
    /// that does not decode, is `environment_invalid` naming the field.
    pub fn new(limit: u32, after: &str) -> Result<Self, PlinthError> {
        let limit = match limit {
            0 => DEFAULT_PAGE_ITEMS,
            n if n > MAX_PAGE_ITEMS => {
                return Err(PlinthError::invalid(format!(
                    "limit: at most {MAX_PAGE_ITEMS} items a page; follow `next` for the rest"
                ))
                .with_detail(serde_json::json!({ "max": MAX_PAGE_ITEMS })));
            }
            n => n,
        };
        let after = match after {
            "" => None,
            text => Some(Cursor::decode(text)?),
        };
        Ok(PageRequest { limit, after })
    }
}

/// The refusal of a cursor that decodes but that this list did not hand out (another list's,
/// or another session's turns').
pub fn foreign_cursor() -> PlinthError {
    PlinthError::invalid(
        "after: not a cursor this list handed out; pass the `next` of the previous page",
    )
}

/// One page of a listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page<T> {
    /// The items, in the listing's order.
    pub items: Vec<T>,
    /// Where the next page starts; absent on the last page.
    pub next: Option<Cursor>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Packages and toolchains are stored as JSON (`builds.packages`, `builds.toolchains`):
    /// what rows written before the contract had enums hold must read back, and what is
    /// written now must be the same text, so no migration is needed.
    #[test]
    fn stored_packages_and_toolchains_keep_their_text() {
        let stored = r#"[{"manager":"pip","name":"requests","version":"2.32.3"},{"manager":"npm","name":"left-pad","version":"1.3.0"}]"#;
        let packages: Vec<Package> = serde_json::from_str(stored).expect("rows as written before");
        assert_eq!(packages[0].manager, PackageManager::Pip);
        assert_eq!(packages[1].manager, PackageManager::Npm);
        assert_eq!(serde_json::to_string(&packages).expect("written"), stored);

        let stored = r#"[{"name":"python","version":"3.11.7","path":"/usr/bin/python3"},{"name":"node","version":"20.20.2","path":"/usr/bin/node"}]"#;
        let toolchains: Vec<Toolchain> =
            serde_json::from_str(stored).expect("rows as written before");
        assert_eq!(toolchains[0].name, ToolchainName::Python);
        assert_eq!(toolchains[1].name, ToolchainName::Node);
        assert_eq!(serde_json::to_string(&toolchains).expect("written"), stored);

        let refused =
            serde_json::from_str::<Package>(r#"{"manager":"cargo","name":"x","version":"1"}"#)
                .expect_err("no such manager");
        assert!(
            refused
                .to_string()
                .contains(r#""cargo" is no plinth.catalog.v1.PackageManager"#),
            "{refused}"
        );
    }

    /// A contract value converts to the domain's and back; `Unspecified` is refused, saying
    /// which enum it was.
    #[test]
    fn contract_values_convert_both_ways() {
        for &wire in pb::PackageManager::ALL {
            let domain = PackageManager::try_from(wire).expect("every value but unspecified");
            assert_eq!(pb::PackageManager::from(domain), wire);
            assert_eq!(domain.as_str(), wire.label());
            assert_eq!(PackageManager::parse(wire.label()), Some(domain));
        }
        let refused = PackageManager::from_wire(0).expect_err("unset");
        assert_eq!(refused.enumeration, "plinth.catalog.v1.PackageManager");
        assert!(PackageManager::from_wire(7).is_err());
    }

    fn slug(name: &str) -> Option<String> {
        Slug::from_name(name).map(|slug| slug.as_str().to_owned())
    }

    #[test]
    fn slugs_follow_the_documented_rule() {
        assert_eq!(slug("Content Studio").as_deref(), Some("content-studio"));
        assert_eq!(
            slug("  --Hello,   World!!  ").as_deref(),
            Some("hello-world")
        );
        assert_eq!(slug("Café Ünïcode 2").as_deref(), Some("caf-n-code-2"));
        assert_eq!(slug("v1.2.3").as_deref(), Some("v1-2-3"));
        assert_eq!(slug("日本語"), None);
        assert_eq!(slug("---"), None);
        assert_eq!(slug(""), None);
    }

    #[test]
    fn long_slugs_are_cut_without_a_trailing_dash() {
        let name = "ab ".repeat(100);
        let cut = slug(&name).expect("slug");
        assert!(cut.len() <= MAX_SLUG_CHARS, "{cut}");
        assert!(!cut.ends_with('-'));
        let word = "x".repeat(200);
        assert_eq!(slug(&word).map(|s| s.len()), Some(MAX_SLUG_CHARS));
    }

    #[test]
    fn ids_are_checked_strictly() {
        let id = EnvironmentId::generate();
        assert_eq!(id.as_str().len(), 37);
        assert_eq!(EnvironmentId::parse(id.as_str()), Some(id));
        assert_eq!(
            EnvironmentId::parse("henv_2F1C9D4E8A7B4C3D9E6F5A4B3C2D1E0F"),
            None
        );
        assert_eq!(EnvironmentId::parse("henv_../../etc/passwd"), None);
        assert_eq!(
            EnvironmentId::parse("chrn_2f1c9d4e8a7b4c3d9e6f5a4b3c2d1e0f"),
            None
        );
    }

    #[test]
    fn names_are_limited_and_named_in_errors() {
        let scope = Scope::parse("default").expect("scope");
        let long = "a".repeat(MAX_NAME_CHARS + 1);
        let error = NewEnvironment::new(scope.clone(), long, String::new(), String::new())
            .expect_err("too long");
        assert!(error.message.starts_with("name:"), "{}", error.message);
        let error = NewEnvironment::new(scope, "a\nb".into(), String::new(), String::new())
            .expect_err("control");
        assert!(error.message.starts_with("name:"));
    }

    #[test]
    fn harness_ids_are_checked_strictly() {
        let id = HarnessId::generate();
        assert_eq!(id.as_str().len(), 37);
        assert!(id.as_str().starts_with("chrn_"));
        assert_eq!(HarnessId::parse(id.as_str()), Some(id));
        assert_eq!(
            HarnessId::parse("henv_2f1c9d4e8a7b4c3d9e6f5a4b3c2d1e0f"),
            None
        );
        assert_eq!(
            HarnessId::parse("chrn_2F1C9D4E8A7B4C3D9E6F5A4B3C2D1E0F"),
            None
        );
        assert_eq!(HarnessId::parse("chrn_"), None);
    }

    #[test]
    fn harness_fields_name_the_field_at_fault() {
        let scope = Scope::parse("default").expect("scope");
        let environment = EnvironmentId::generate();
        let fields = |name: &str, base: &str, environment: &str| {
            HarnessFields::new(scope.clone(), name.into(), base.into(), environment)
        };
        fields("Teaser cutter", "codex", environment.as_str()).expect("valid");
        for (name, base, field) in [
            ("", "codex", "name:"),
            ("   ", "codex", "name:"),
            ("a\nb", "codex", "name:"),
            ("ok", "", "base:"),
            ("ok", "\u{7}", "base:"),
        ] {
            let error = fields(name, base, environment.as_str()).expect_err("refused");
            assert_eq!(error.code, ErrorCode::EnvironmentInvalid);
            assert!(error.message.starts_with(field), "{}", error.message);
        }
        let long = "b".repeat(MAX_NAME_CHARS + 1);
        let error = fields("ok", &long, environment.as_str()).expect_err("too long");
        assert_eq!(
            error.detail.as_ref().map(|detail| &detail["max_chars"]),
            Some(&MAX_NAME_CHARS.into())
        );
        for missing in ["", "henv_nope", "chrn_2f1c9d4e8a7b4c3d9e6f5a4b3c2d1e0f"] {
            let error = fields("ok", "codex", missing).expect_err("no environment");
            assert_eq!(error.code, ErrorCode::EnvironmentNotFound, "{missing:?}");
        }
        let error = fields("", "codex", "").expect_err("both wrong");
        assert_eq!(error.code, ErrorCode::EnvironmentInvalid, "fields first");
    }
}
