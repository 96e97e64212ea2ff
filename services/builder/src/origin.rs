//! The version a build gives installers when the source came from git.
//!
//! Projects that take their version from git (setuptools-scm, hatch-vcs) cannot compute it in a
//! build: the source holds the commit's files, not `.git`. The source service records where the
//! source last came from by git (`GetOrigin`: commit, ref, `git describe`, uncommitted changes);
//! this module turns that into the version setuptools-scm would compute in the checkout, exported
//! as `SETUPTOOLS_SCM_PRETEND_VERSION`, with the schemes the project's `pyproject.toml` chooses.
//! A scheme or setting it does not compute is named in the build log and the defaults are used;
//! when no version can be derived, none is given and the log says why.
//!
//! The schemes supported, the versions the defaults give, and how tags are read:
//! `docs/design/builds.md#the-version-from-git`.

use std::path::Path;
use std::str::FromStr as _;

use plinth_proto::source::v1 as pb;

/// Where a source last came from by git.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Origin {
    /// The commit's full id.
    pub commit: String,
    /// The ref a git import asked for; a pushed checkout's branch.
    pub reference: String,
    /// `git describe --tags --always --match '*[0-9]*'` of the commit.
    pub describe: String,
    /// A pushed checkout had uncommitted changes to tracked files.
    pub dirty: bool,
    /// A git import could not fetch the history or tags `describe` needs.
    pub history_incomplete: bool,
    /// When the origin was recorded, seconds since the Unix epoch (0: not known).
    pub recorded_at: i64,
    /// Commits reachable from the commit (0: not known).
    pub commits: u64,
}

impl From<pb::Origin> for Origin {
    fn from(origin: pb::Origin) -> Self {
        Origin {
            commit: origin.commit,
            reference: origin.r#ref,
            describe: origin.describe,
            dirty: origin.dirty,
            history_incomplete: origin.history_incomplete,
            recorded_at: origin.recorded_at,
            commits: origin.commits,
        }
    }
}

/// The variable setuptools-scm (and hatch-vcs through it) reads instead of asking git.
pub const PRETEND_VERSION: &str = "SETUPTOOLS_SCM_PRETEND_VERSION";

/// The largest `pyproject.toml` read for the settings.
const PYPROJECT_MAX_BYTES: u64 = 1024 * 1024;

/// The source service, where layers are counted in their scope's stored bytes.
pub type LayerLedger = plinth_proto::source::v1::source_service_client::SourceServiceClient<
    tonic::service::interceptor::InterceptedService<
        plinth_kit::grpc::Transport,
        plinth_kit::grpc::ClientInterceptor,
    >,
>;

/// Asks the source service where `environment_id`'s source came from. A failure is logged
/// and answered as no origin: the build goes on, and a project that needs a version from git
/// fails with setuptools-scm's own message.
pub async fn fetch(ledger: &LayerLedger, environment_id: &str) -> Option<Origin> {
    let answer = ledger
        .clone()
        .get_origin(pb::GetOriginRequest {
            environment_id: environment_id.to_owned(),
        })
        .await;
    match answer {
        Ok(answer) => answer.into_inner().origin.map(Origin::from),
        Err(status) => {
            tracing::warn!(error = %status.message(), "asking the source where this source came from failed; building without a version from git");
            None
        }
    }
}

/// The version a build gives installers for an origin, by the project's settings, and what
/// the build log says of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Derived {
    /// Where the source came from.
    pub origin: Origin,
    /// The version; `None` when the description is empty or a scheme could derive none.
    pub version: Option<String>,
    /// Lines for the build log, each ending in a newline.
    pub log: Vec<String>,
}

/// The version for `origin`, by the settings of the `pyproject.toml` in `scratch` (read
/// beneath it, through no link; the defaults when there is none).
pub fn derive(origin: &Origin, scratch: &Path) -> Derived {
    let text = crate::beneath::open_root(scratch)
        .ok()
        .and_then(|root| crate::beneath::read_small(&root, "pyproject.toml", PYPROJECT_MAX_BYTES))
        .and_then(|bytes| String::from_utf8(bytes).ok());
    derive_with(origin, &Settings::parse(text.as_deref().unwrap_or("")))
}

/// The variables installers get.
pub fn env(derived: &Derived) -> Vec<(String, String)> {
    match &derived.version {
        Some(version) => vec![(PRETEND_VERSION.to_owned(), version.clone())],
        None => Vec::new(),
    }
}

/// What the origin adds to a build's reuse key: a new commit, tag or version (its schemes,
/// uncommitted changes) changes the version installed into the layer, so a layer built for
/// another one must not be reused.
pub fn key_material(derived: &Derived) -> String {
    format!(
        "origin {} {}\nversion {}\n",
        derived.origin.commit,
        derived.origin.describe,
        derived.version.as_deref().unwrap_or_default()
    )
}

/// The project's setuptools-scm settings that change the version.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Settings {
    /// `version_scheme`, one name or a list; empty: the default.
    pub version_scheme: Vec<String>,
    /// `local_scheme`, one name or a list; empty: the default.
    pub local_scheme: Vec<String>,
    /// `fallback_version` (hatch-vcs: `fallback-version`).
    pub fallback_version: Option<String>,
    /// Where they were read, for the log; `None`: nowhere (the defaults).
    pub place: Option<&'static str>,
    /// Settings that change the version which this module does not follow.
    pub unfollowed: Vec<String>,
}

impl Settings {
    /// The settings in a `pyproject.toml`'s text; the defaults when it holds none (or is not
    /// TOML: the build then fails on it anyway).
    pub fn parse(text: &str) -> Settings {
        let Ok(document) = text.parse::<toml::Table>() else {
            return Settings::default();
        };
        let tool = document.get("tool").and_then(toml::Value::as_table);
        let hatch = tool
            .and_then(|tool| tool.get("hatch"))
            .and_then(toml::Value::as_table)
            .and_then(|hatch| hatch.get("version"))
            .and_then(toml::Value::as_table)
            .filter(|version| version.get("source").and_then(toml::Value::as_str) == Some("vcs"));
        // hatch-vcs passes `raw-options` to setuptools-scm, which then reads nothing else.
        if let Some(hatch) = hatch {
            let raw = hatch.get("raw-options").and_then(toml::Value::as_table);
            let mut settings = Settings::from_table(raw);
            settings.place = Some(if raw.is_some() {
                "[tool.hatch.version.raw-options]"
            } else {
                "[tool.hatch.version]"
            });
            if let Some(fallback) = hatch.get("fallback-version").and_then(toml::Value::as_str)
                && !fallback.is_empty()
            {
                settings.fallback_version = Some(fallback.to_owned());
            }
            if hatch
                .get("tag-pattern")
                .and_then(toml::Value::as_str)
                .is_some_and(|pattern| !pattern.is_empty())
            {
                settings.unfollowed.push("tag-pattern".to_owned());
            }
            return settings;
        }
        match tool
            .and_then(|tool| tool.get("setuptools_scm"))
            .and_then(toml::Value::as_table)
        {
            Some(table) => Settings {
                place: Some("[tool.setuptools_scm]"),
                ..Settings::from_table(Some(table))
            },
            None => Settings::default(),
        }
    }

    fn from_table(table: Option<&toml::Table>) -> Settings {
        let Some(table) = table else {
            return Settings::default();
        };
        let names = |key: &str| match table.get(key) {
            Some(toml::Value::String(name)) => vec![name.clone()],
            Some(toml::Value::Array(names)) => names
                .iter()
                .filter_map(|name| name.as_str().map(str::to_owned))
                .collect(),
            _ => Vec::new(),
        };
        let mut unfollowed: Vec<String> = [
            "tag_regex",
            "git_describe_command",
            "parse",
            "version_cls",
            "parentdir_prefix_version",
        ]
        .into_iter()
        .filter(|key| table.contains_key(*key))
        .map(str::to_owned)
        .collect();
        if table.get("normalize").and_then(toml::Value::as_bool) == Some(false) {
            unfollowed.push("normalize".to_owned());
        }
        if table
            .get("scm")
            .and_then(toml::Value::as_table)
            .and_then(|scm| scm.get("git"))
            .and_then(toml::Value::as_table)
            .is_some_and(|git| git.contains_key("describe_command"))
        {
            unfollowed.push("scm.git.describe_command".to_owned());
        }
        if let Some(tag) = table.get("tag").and_then(toml::Value::as_table) {
            unfollowed.extend(tag.keys().map(|key| format!("tag.{key}")));
        }
        Settings {
            version_scheme: names("version_scheme"),
            local_scheme: names("local_scheme"),
            fallback_version: table
                .get("fallback_version")
                .and_then(toml::Value::as_str)
                .map(str::to_owned),
            place: None,
            unfollowed,
        }
    }
}

/// A version scheme this module computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum VersionScheme {
    GuessNextDev,
    NoGuessDev,
    PostRelease,
    OnlyVersion,
    Semver,
    SemverReleaseBranch,
}

impl VersionScheme {
    fn named(name: &str) -> Option<VersionScheme> {
        Some(match name {
            "guess-next-dev" => VersionScheme::GuessNextDev,
            "no-guess-dev" => VersionScheme::NoGuessDev,
            "post-release" => VersionScheme::PostRelease,
            "only-version" => VersionScheme::OnlyVersion,
            "semver-pep440" | "python-simplified-semver" => VersionScheme::Semver,
            "semver-pep440-release-branch" | "release-branch-semver" => {
                VersionScheme::SemverReleaseBranch
            }
            _ => return None,
        })
    }
}

/// A local scheme this module computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LocalScheme {
    NodeAndDate,
    NodeAndTimestamp,
    DirtyTag,
    NoLocalVersion,
    NoLocalVersionStrict,
    FailOnUncommittedChanges,
}

impl LocalScheme {
    fn named(name: &str) -> Option<LocalScheme> {
        Some(match name {
            "node-and-date" => LocalScheme::NodeAndDate,
            "node-and-timestamp" => LocalScheme::NodeAndTimestamp,
            "dirty-tag" => LocalScheme::DirtyTag,
            "no-local-version" => LocalScheme::NoLocalVersion,
            "no-local-version-strict" => LocalScheme::NoLocalVersionStrict,
            "fail-on-uncommitted-changes" => LocalScheme::FailOnUncommittedChanges,
            _ => return None,
        })
    }
}

/// What setuptools-scm knows of the checkout, as `ScmVersion` holds it.
struct Facts {
    /// The tag's version, or the fallback version when no tag reaches the commit.
    tag: pep440_rs::Version,
    /// Commits since the tag.
    distance: u64,
    /// Whether `distance` is known (no tag and no count: it is not, and the version is never
    /// the tag's own).
    distance_known: bool,
    /// `g` and the commit's first 9 hex digits.
    node: String,
    dirty: bool,
    branch: Option<String>,
    /// Seconds since the Unix epoch, for the dirty date.
    time: i64,
}

impl Facts {
    /// Checked out exactly on a tag, with no local changes.
    fn exact(&self) -> bool {
        self.distance == 0 && self.distance_known && !self.dirty
    }
}

/// The version for `origin` under `settings` (see the module).
pub fn derive_with(origin: &Origin, settings: &Settings) -> Derived {
    let mut log = Vec::new();
    let version = compute(origin, settings, &mut log);
    if origin.history_incomplete {
        log.push(format!(
            "==> warning: the git import's history/tags were not fetched; the version from git is {}, counted from no tag (import again once the repository's history can be fetched, or set the version in the project)\n",
            version.as_deref().unwrap_or("none")
        ));
    }
    if let Some(version) = &version {
        let mut describe = origin.describe.trim().to_owned();
        if origin.dirty {
            describe.push_str(", uncommitted changes");
        }
        log.push(format!(
            "==> version from git: {version} ({describe}; {}) as {PRETEND_VERSION}\n",
            settings
                .place
                .map_or("setuptools-scm's default schemes".to_owned(), |place| {
                    format!("the schemes of {place}")
                }),
        ));
    }
    Derived {
        origin: origin.clone(),
        version,
        log,
    }
}

fn compute(origin: &Origin, settings: &Settings, log: &mut Vec<String>) -> Option<String> {
    let describe = origin.describe.trim();
    if describe.is_empty() {
        return None;
    }
    let place = settings.place.unwrap_or("pyproject.toml");
    for key in &settings.unfollowed {
        log.push(format!(
            "==> warning: {place} sets {key}, which builds do not follow: the version from git is read with setuptools-scm's default tag pattern\n"
        ));
    }
    let facts = facts(origin, describe, settings, log);
    let version_scheme = match settings.version_scheme.first() {
        None => VersionScheme::GuessNextDev,
        Some(name) => VersionScheme::named(name).unwrap_or_else(|| {
            log.push(format!(
                "==> warning: {place} names the version_scheme {name:?}, which builds do not compute: guess-next-dev is used\n"
            ));
            VersionScheme::GuessNextDev
        }),
    };
    let main = match main_version(&facts, version_scheme) {
        Ok(main) => main,
        Err(reason) => {
            log.push(format!(
                "==> warning: no version from git: {reason}; installers get none, as setuptools-scm would derive none\n"
            ));
            return None;
        }
    };
    let local = match local_version(&facts, &settings.local_scheme, place, log) {
        Ok(local) => local,
        Err(reason) => {
            log.push(format!(
                "==> warning: no version from git: {reason}; installers get none, as setuptools-scm would derive none\n"
            ));
            return None;
        }
    };
    let tag_local = local_of(&facts.tag);
    Some(combine_local(&main, &[tag_local.as_str(), local.as_str()]))
}

/// What the description says, with the commit, the count and the settings' fallback.
fn facts(origin: &Origin, describe: &str, settings: &Settings, log: &mut Vec<String>) -> Facts {
    let hex: String = origin
        .commit
        .chars()
        .take(9)
        .collect::<String>()
        .to_ascii_lowercase();
    let (describe, dirty_suffix) = match describe.strip_suffix("-dirty") {
        Some(rest) => (rest, true),
        None => (describe, false),
    };
    let mut untagged = || {
        let fallback = settings.fallback_version.as_deref().and_then(|fallback| {
            let parsed = pep440_rs::Version::from_str(fallback).ok();
            if parsed.is_none() {
                log.push(format!(
                    "==> warning: the fallback_version {fallback:?} is not a version: 0.0 is counted from\n"
                ));
            }
            parsed
        });
        fallback.unwrap_or_else(|| pep440_rs::Version::new([0, 0]))
    };
    let (tag, distance, distance_known) = if is_hex(describe)
        && origin
            .commit
            .to_ascii_lowercase()
            .starts_with(&describe.to_ascii_lowercase())
    {
        // Without a tag, `--always` answers the abbreviated commit itself, and
        // setuptools-scm counts every commit.
        (untagged(), origin.commits, origin.commits > 0)
    } else {
        let (tag, distance) = split_distance(describe).unwrap_or((describe, 0));
        match tag_version(tag) {
            Some(version) => (version, distance, true),
            // A tag that holds no version counts as none.
            None => (untagged(), distance, distance > 0),
        }
    };
    Facts {
        tag,
        distance,
        distance_known,
        node: format!("g{hex}"),
        dirty: origin.dirty || dirty_suffix,
        branch: (!origin.reference.is_empty()).then(|| origin.reference.clone()),
        time: if origin.recorded_at > 0 {
            origin.recorded_at
        } else {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |since| i64::try_from(since.as_secs()).unwrap_or(0))
        },
    }
}

fn is_hex(text: &str) -> bool {
    !text.is_empty() && text.bytes().all(|b| b.is_ascii_hexdigit())
}

/// `<tag>-<distance>-g<sha>` → the tag and the distance (a tag may hold `-` itself).
fn split_distance(describe: &str) -> Option<(&str, u64)> {
    let (rest, sha) = describe.rsplit_once('-')?;
    sha.strip_prefix('g').filter(|sha| is_hex(sha))?;
    let (tag, distance) = rest.rsplit_once('-')?;
    if distance.is_empty() || !distance.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let distance = distance.parse().ok()?;
    (!tag.is_empty()).then_some((tag, distance))
}

/// A tag's version as setuptools-scm's default tag pattern reads it,
/// `^(?:[\w-]+-)?(?P<version>[vV]?\d+(?:\.\d+){0,2}[^\+]*)(?:\+.*)?$`: an optional prefix of
/// word characters and dashes ending in a dash (the longest that leaves a version), then a
/// version starting with a digit (after an optional `v`); what follows a `+` is its local
/// part, kept when the whole still parses. Normalized as PEP 440 (`v1.02` → `1.2`).
fn tag_version(tag: &str) -> Option<pep440_rs::Version> {
    let rest = pattern_version(tag)?;
    let (version, suffix) = match rest.find('+') {
        Some(plus) => (&rest[..plus], &rest[plus..]),
        None => (rest, ""),
    };
    let parsed = pep440_rs::Version::from_str(version).ok()?;
    if !suffix.is_empty()
        && let Ok(whole) = pep440_rs::Version::from_str(rest)
    {
        return Some(whole);
    }
    Some(parsed)
}

/// What the default tag pattern takes as the version in `text` (a tag or a branch name), its
/// local part included: after the longest prefix of word characters and dashes ending in a
/// dash that leaves a digit (after an optional `v`) next.
fn pattern_version(text: &str) -> Option<&str> {
    let word = |c: char| c.is_alphanumeric() || c == '_' || c == '-';
    let run = text.find(|c: char| !word(c)).unwrap_or(text.len());
    text[..run]
        .match_indices('-')
        .map(|(at, _)| at + 1)
        .filter(|&start| start > 1)
        .rev()
        .chain(std::iter::once(0))
        .map(|start| &text[start..])
        .find(|rest| {
            rest.strip_prefix(['v', 'V'])
                .unwrap_or(rest)
                .starts_with(|c: char| c.is_ascii_digit())
        })
}

/// A version's local part as PEP 440 writes it, without the `+`; empty when none.
fn local_of(version: &pep440_rs::Version) -> String {
    version
        .local()
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(".")
}

/// The version scheme's part (`format_next_version` and friends).
fn main_version(facts: &Facts, scheme: VersionScheme) -> Result<String, String> {
    let base = facts.tag.clone().without_local();
    let tag = base.to_string();
    if facts.exact() || scheme == VersionScheme::OnlyVersion {
        return Ok(tag);
    }
    let next = |guessed: String| format!("{guessed}.dev{}", facts.distance);
    Ok(match scheme {
        VersionScheme::GuessNextDev | VersionScheme::OnlyVersion => next(guess_next(&tag)?),
        VersionScheme::NoGuessDev => next(match bump_dev(&tag)? {
            Some(bumped) => bumped,
            None if tag.contains("post") => {
                return Err(format!(
                    "{tag} already is a post release, and no-guess-dev refuses to guess the update"
                ));
            }
            None => format!("{tag}.post1"),
        }),
        VersionScheme::PostRelease => format!("{tag}.post{}", facts.distance),
        VersionScheme::Semver => {
            let feature = facts
                .branch
                .as_deref()
                .is_some_and(|branch| branch.contains("feature"));
            next(simple_semver(&base, if feature { 2 } else { 3 }))
        }
        VersionScheme::SemverReleaseBranch => {
            let up_to_minor = |text: &str| -> Vec<String> {
                text.split('.').take(2).map(str::to_owned).collect()
            };
            let release_branch = facts.branch.as_deref().is_some_and(|branch| {
                let last = branch.rsplit('/').next().unwrap_or(branch);
                branch_version(last)
                    .is_some_and(|version| up_to_minor(&version) == up_to_minor(&tag))
            });
            if release_branch {
                // A release (maintenance) branch: the next patch, rc or beta.
                next(guess_next(&tag)?)
            } else {
                // A development branch: the next minor.
                next(simple_semver(&base, 2))
            }
        }
    })
}

/// The version part of a branch name as the default tag pattern reads it, without a leading
/// `v` (as setuptools-scm compares it, unnormalized).
fn branch_version(name: &str) -> Option<String> {
    let rest = pattern_version(name)?;
    let version = rest.split('+').next().unwrap_or(rest);
    Some(version.strip_prefix('v').unwrap_or(version).to_owned())
}

/// `guess_next_version`: a `.dev0` tag's release, otherwise the last number bumped (`1.2.3` →
/// `1.2.4`, `1.0rc1` → `1.0rc2`).
fn guess_next(tag: &str) -> Result<String, String> {
    if let Some(bumped) = bump_dev(tag)? {
        return Ok(bumped);
    }
    let digits = tag.bytes().rev().take_while(u8::is_ascii_digit).count();
    if digits == 0 {
        return Err(format!("{tag} does not end with a number to bump"));
    }
    let (head, number) = tag.split_at(tag.len() - digits);
    Ok(format!("{head}{}", increment(number)))
}

/// `_bump_dev`: `1.0.dev0` → `1.0`; another dev number is refused, as setuptools-scm does.
fn bump_dev(tag: &str) -> Result<Option<String>, String> {
    let Some((prefix, tail)) = tag.rsplit_once(".dev") else {
        return Ok(None);
    };
    if tail != "0" {
        return Err(format!(
            "the tag {tag} names a .dev number other than 0, which setuptools-scm cannot bump"
        ));
    }
    Ok(Some(prefix.to_owned()))
}

/// A decimal number plus one, of any length.
fn increment(number: &str) -> String {
    let trimmed = number.trim_start_matches('0');
    let mut digits: Vec<u8> = trimmed.bytes().collect();
    let mut carry = true;
    for digit in digits.iter_mut().rev() {
        if !carry {
            break;
        }
        if *digit == b'9' {
            *digit = b'0';
        } else {
            *digit += 1;
            carry = false;
        }
    }
    if carry {
        digits.insert(0, b'1');
    }
    String::from_utf8(digits).unwrap_or_default()
}

/// `guess_next_simple_semver`: the release kept to `retain` parts, the last one bumped, padded
/// to three (a `.dev0` tag's own release instead, padded).
fn simple_semver(tag: &pep440_rs::Version, retain: usize) -> String {
    let epoch = if tag.epoch() == 0 {
        String::new()
    } else {
        format!("{}!", tag.epoch())
    };
    let mut parts: Vec<u64> = if tag.dev() == Some(0) {
        tag.release().to_vec()
    } else {
        let mut parts: Vec<u64> = tag.release().iter().take(retain).copied().collect();
        parts.resize(retain, 0);
        if let Some(last) = parts.last_mut() {
            *last = last.saturating_add(1);
        }
        parts
    };
    if parts.len() < 3 {
        parts.resize(3, 0);
    }
    let release: Vec<String> = parts.iter().map(ToString::to_string).collect();
    format!("{epoch}{}", release.join("."))
}

/// The local scheme's part, with its `+`; empty when none.
fn local_version(
    facts: &Facts,
    names: &[String],
    place: &str,
    log: &mut Vec<String>,
) -> Result<String, String> {
    let default = [LocalScheme::NodeAndDate];
    let mut schemes: Vec<LocalScheme> = Vec::new();
    for name in names {
        match LocalScheme::named(name) {
            Some(scheme) => schemes.push(scheme),
            None => {
                log.push(format!(
                    "==> warning: {place} names the local_scheme {name:?}, which builds do not compute: node-and-date is used\n"
                ));
                schemes = default.to_vec();
                break;
            }
        }
    }
    if schemes.is_empty() {
        schemes = default.to_vec();
    }
    let uncommitted = "the pushed checkout had uncommitted changes";
    for scheme in schemes {
        let local = match scheme {
            LocalScheme::NodeAndDate => node_and_time(facts, "%Y%m%d"),
            LocalScheme::NodeAndTimestamp => node_and_time(facts, "%Y%m%d%H%M%S"),
            LocalScheme::DirtyTag if facts.dirty => "+dirty".to_owned(),
            LocalScheme::DirtyTag | LocalScheme::NoLocalVersion => String::new(),
            LocalScheme::NoLocalVersionStrict | LocalScheme::FailOnUncommittedChanges
                if facts.dirty =>
            {
                return Err(format!("{uncommitted}, which the local_scheme refuses"));
            }
            LocalScheme::NoLocalVersionStrict => String::new(),
            LocalScheme::FailOnUncommittedChanges => continue,
        };
        return Ok(local);
    }
    // Every scheme passed: setuptools-scm's default answer then.
    Ok("+unknown".to_owned())
}

/// `node-and-date` and `node-and-timestamp`: nothing on a tag, the node past it, and the
/// date (or time) of the changes when they were not committed.
fn node_and_time(facts: &Facts, format: &str) -> String {
    if facts.exact() {
        return String::new();
    }
    if facts.dirty {
        format!("+{}.d{}", facts.node, utc(facts.time, format))
    } else {
        format!("+{}", facts.node)
    }
}

/// `seconds` since the Unix epoch, UTC, as `%Y%m%d` or `%Y%m%d%H%M%S`.
fn utc(seconds: i64, format: &str) -> String {
    let (year, month, day, hour, minute, second) = plinth_kit::clock::civil(seconds);
    let date = format!("{year:04}{month:02}{day:02}");
    if format == "%Y%m%d" {
        return date;
    }
    format!("{date}{hour:02}{minute:02}{second:02}")
}

/// `combine_version_with_local_parts`: the local parts added to the version's own, each
/// segment once.
fn combine_local(main: &str, parts: &[&str]) -> String {
    let (public, mut segments) = match main.split_once('+') {
        Some((public, local)) => (public, local.split('.').map(str::to_owned).collect()),
        None => (main, Vec::<String>::new()),
    };
    for part in parts {
        for segment in part.trim().trim_matches('+').split('.') {
            if !segment.is_empty() && !segments.iter().any(|known| known == segment) {
                segments.push(segment.to_owned());
            }
        }
    }
    if segments.is_empty() {
        public.to_owned()
    } else {
        format!("{public}+{}", segments.join("."))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const COMMIT: &str = "abc1234def5678abc1234def5678abc1234def56";

    fn origin(describe: &str) -> Origin {
        Origin {
            commit: COMMIT.to_owned(),
            reference: "main".to_owned(),
            describe: describe.to_owned(),
            // 2026-03-04T05:06:07Z
            recorded_at: 1_772_600_767,
            ..Origin::default()
        }
    }

    fn version_of(origin: &Origin, pyproject: &str) -> Option<String> {
        derive_with(origin, &Settings::parse(pyproject)).version
    }

    fn with(version_scheme: &str, local_scheme: &str) -> String {
        format!(
            "[tool.setuptools_scm]\nversion_scheme = {version_scheme:?}\nlocal_scheme = {local_scheme:?}\n"
        )
    }

    #[test]
    fn the_default_schemes_give_what_setuptools_scm_computes() {
        let mut untagged = origin("abc1234");
        untagged.commits = 12;
        for (origin, expected) in [
            (origin("v1.2.3"), Some("1.2.3")),
            (origin("1.2.3"), Some("1.2.3")),
            (origin("V2.0"), Some("2.0")),
            (origin("v1.02"), Some("1.2")),
            (origin("v1.2.3-4-gabc1234"), Some("1.2.4.dev4+gabc1234de")),
            (origin("1.0rc1-2-gabc1234"), Some("1.0rc2.dev2+gabc1234de")),
            (origin("1.0-rc1-2-gabc1234"), Some("1.0rc2.dev2+gabc1234de")),
            (origin("release-v1-1-gabc1234"), Some("2.dev1+gabc1234de")),
            (
                origin("my-tool-1.5-3-gabc1234"),
                Some("1.6.dev3+gabc1234de"),
            ),
            (origin("v1.0.dev0-3-gabc1234"), Some("1.0.dev3+gabc1234de")),
            (origin("1!2.0-1-gabc1234"), Some("1!2.1.dev1+gabc1234de")),
            (
                origin("v1.0+build.5-1-gabc1234"),
                Some("1.1.dev1+build.5.gabc1234de"),
            ),
            (origin("release-x-1-gabc1234"), Some("0.1.dev1+gabc1234de")),
            (untagged, Some("0.1.dev12+gabc1234de")),
            // Not counted (an origin recorded before commits were): dev0, as before.
            (origin("abc1234"), Some("0.1.dev0+gabc1234de")),
            (origin("nightly"), Some("0.1.dev0+gabc1234de")),
            (origin(""), None),
        ] {
            assert_eq!(
                version_of(&origin, "").as_deref(),
                expected,
                "{:?}",
                origin.describe
            );
        }
    }

    #[test]
    fn the_node_is_the_commits_first_nine_hex_digits_whatever_describe_abbreviated() {
        for describe in [
            "v1.2.3-4-gabc1",
            "v1.2.3-4-gabc1234",
            "v1.2.3-4-gabc1234def5",
        ] {
            assert_eq!(
                version_of(&origin(describe), "").as_deref(),
                Some("1.2.4.dev4+gabc1234de"),
                "{describe}"
            );
        }
        let mut upper = origin("v1.2.3-4-gABC1234");
        upper.commit = COMMIT.to_ascii_uppercase();
        assert_eq!(
            version_of(&upper, "").as_deref(),
            Some("1.2.4.dev4+gabc1234de")
        );
    }

    #[test]
    fn version_schemes_follow_the_projects_settings() {
        let past = origin("v1.2.3-4-gabc1234");
        let at = origin("v1.2.3");
        for (scheme, on_tag, after) in [
            ("guess-next-dev", "1.2.3", "1.2.4.dev4"),
            ("no-guess-dev", "1.2.3", "1.2.3.post1.dev4"),
            ("post-release", "1.2.3", "1.2.3.post4"),
            ("only-version", "1.2.3", "1.2.3"),
            ("semver-pep440", "1.2.3", "1.2.4.dev4"),
            ("python-simplified-semver", "1.2.3", "1.2.4.dev4"),
            ("semver-pep440-release-branch", "1.2.3", "1.3.0.dev4"),
            ("release-branch-semver", "1.2.3", "1.3.0.dev4"),
        ] {
            let pyproject = with(scheme, "no-local-version");
            assert_eq!(
                version_of(&at, &pyproject).as_deref(),
                Some(on_tag),
                "{scheme}"
            );
            assert_eq!(
                version_of(&past, &pyproject).as_deref(),
                Some(after),
                "{scheme}"
            );
        }
        // On a release branch the next patch; on a feature branch the next minor.
        let mut maintenance = past.clone();
        maintenance.reference = "release/v1.2".to_owned();
        let pyproject = with("release-branch-semver", "no-local-version");
        assert_eq!(
            version_of(&maintenance, &pyproject).as_deref(),
            Some("1.2.4.dev4")
        );
        let mut feature = past.clone();
        feature.reference = "feature/x".to_owned();
        assert_eq!(
            version_of(&feature, &with("semver-pep440", "no-local-version")).as_deref(),
            Some("1.3.0.dev4")
        );
        // A list: its first entry.
        assert_eq!(
            version_of(
                &past,
                "[tool.setuptools_scm]\nversion_scheme = [\"post-release\", \"guess-next-dev\"]\n"
            )
            .as_deref(),
            Some("1.2.3.post4+gabc1234de")
        );
    }

    #[test]
    fn local_schemes_follow_the_projects_settings_and_uncommitted_changes() {
        let past = origin("v1.2.3-4-gabc1234");
        let mut dirty = past.clone();
        dirty.dirty = true;
        let mut dirty_on_tag = origin("v1.2.3");
        dirty_on_tag.dirty = true;
        for (scheme, clean, changed, changed_on_tag) in [
            (
                "node-and-date",
                Some("1.2.4.dev4+gabc1234de"),
                Some("1.2.4.dev4+gabc1234de.d20260304"),
                Some("1.2.4.dev0+gabc1234de.d20260304"),
            ),
            (
                "node-and-timestamp",
                Some("1.2.4.dev4+gabc1234de"),
                Some("1.2.4.dev4+gabc1234de.d20260304050607"),
                Some("1.2.4.dev0+gabc1234de.d20260304050607"),
            ),
            (
                "dirty-tag",
                Some("1.2.4.dev4"),
                Some("1.2.4.dev4+dirty"),
                Some("1.2.4.dev0+dirty"),
            ),
            (
                "no-local-version",
                Some("1.2.4.dev4"),
                Some("1.2.4.dev4"),
                Some("1.2.4.dev0"),
            ),
            ("no-local-version-strict", Some("1.2.4.dev4"), None, None),
        ] {
            let pyproject = with("guess-next-dev", scheme);
            assert_eq!(version_of(&past, &pyproject).as_deref(), clean, "{scheme}");
            assert_eq!(
                version_of(&dirty, &pyproject).as_deref(),
                changed,
                "{scheme}"
            );
            assert_eq!(
                version_of(&dirty_on_tag, &pyproject).as_deref(),
                changed_on_tag,
                "{scheme}"
            );
        }
        // On the tag and clean, no local part at all.
        assert_eq!(
            version_of(&origin("v1.2.3"), &with("guess-next-dev", "node-and-date")).as_deref(),
            Some("1.2.3")
        );
        let strict = "[tool.setuptools_scm]\nlocal_scheme = [\"fail-on-uncommitted-changes\", \"no-local-version\"]\n";
        assert_eq!(version_of(&past, strict).as_deref(), Some("1.2.4.dev4"));
        let refused = derive_with(&dirty, &Settings::parse(strict));
        assert_eq!(refused.version, None);
        assert!(
            refused.log.iter().any(|line| line.contains("uncommitted")),
            "{:?}",
            refused.log
        );
    }

    #[test]
    fn settings_are_read_where_hatch_vcs_and_setuptools_scm_read_them() {
        let past = origin("v26.1.0-70-gc1dc5dc");
        // attrs: hatch-vcs with raw-options.
        let attrs = "[tool.hatch.version]\nsource = \"vcs\"\nraw-options = { local_scheme = \"no-local-version\" }\n";
        assert_eq!(version_of(&past, attrs).as_deref(), Some("26.1.1.dev70"));
        let nested = "[tool.hatch.version]\nsource = \"vcs\"\n\n[tool.hatch.version.raw-options]\nversion_scheme = \"no-guess-dev\"\n";
        assert_eq!(
            version_of(&past, nested).as_deref(),
            Some("26.1.0.post1.dev70+gabc1234de")
        );
        // hatch-vcs reads raw-options only, not [tool.setuptools_scm].
        let both = format!(
            "{}\n{}",
            with("post-release", "no-local-version"),
            "[tool.hatch.version]\nsource = \"vcs\"\n"
        );
        assert_eq!(
            version_of(&past, &both).as_deref(),
            Some("26.1.1.dev70+gabc1234de")
        );
        // Another hatch version source: [tool.setuptools_scm] is setuptools'.
        let regex_source = format!(
            "{}\n[tool.hatch.version]\npath = \"src/x/__init__.py\"\n",
            with("post-release", "no-local-version")
        );
        assert_eq!(
            version_of(&past, &regex_source).as_deref(),
            Some("26.1.0.post70")
        );
        // The fallback version counts commits where no tag reaches.
        let mut untagged = origin("abc1234");
        untagged.commits = 3;
        let fallback = "[tool.hatch.version]\nsource = \"vcs\"\nfallback-version = \"2.0.0\"\n";
        assert_eq!(
            version_of(&untagged, fallback).as_deref(),
            Some("2.0.1.dev3+gabc1234de")
        );
        assert_eq!(
            version_of(
                &untagged,
                "[tool.setuptools_scm]\nfallback_version = \"0.5\"\n"
            )
            .as_deref(),
            Some("0.6.dev3+gabc1234de")
        );
        // Nothing to read: the defaults.
        assert_eq!(
            version_of(&past, "not [ toml").as_deref(),
            Some("26.1.1.dev70+gabc1234de")
        );
    }

    #[test]
    fn what_builds_do_not_compute_is_named_and_the_defaults_used() {
        let past = origin("v1.2.3-4-gabc1234");
        let derived = derive_with(
            &past,
            &Settings::parse(
                "[tool.setuptools_scm]\nversion_scheme = \"calver-by-date\"\ntag_regex = \"^v(?P<version>.*)$\"\n",
            ),
        );
        assert_eq!(derived.version.as_deref(), Some("1.2.4.dev4+gabc1234de"));
        let log = derived.log.concat();
        assert!(log.contains("calver-by-date"), "{log}");
        assert!(log.contains("tag_regex"), "{log}");
        // A tag with nothing to bump: no version, as setuptools-scm derives none.
        let derived = derive_with(&origin("v1.0.dev3-1-gabc1234"), &Settings::default());
        assert_eq!(derived.version, None);
        assert!(derived.log.concat().contains("no version from git"));
        assert_eq!(
            version_of(
                &origin("v1.0.post2-1-gabc1234"),
                &with("no-guess-dev", "node-and-date")
            ),
            None
        );
    }

    #[test]
    fn an_import_without_its_history_says_so_in_the_log() {
        let mut origin = origin("abc1234");
        origin.history_incomplete = true;
        let derived = derive_with(&origin, &Settings::default());
        assert_eq!(derived.version.as_deref(), Some("0.1.dev0+gabc1234de"));
        let log = derived.log.concat();
        assert!(
            log.contains("==> warning: the git import's history/tags were not fetched; the version from git is 0.1.dev0+gabc1234de"),
            "{log}"
        );
        assert!(
            log.contains("==> version from git: 0.1.dev0+gabc1234de"),
            "{log}"
        );
    }

    #[test]
    fn the_environment_carries_the_version_for_setuptools_scm_and_hatch_vcs() {
        let derived = derive_with(&origin("v0.13.1"), &Settings::default());
        assert_eq!(
            env(&derived),
            [(PRETEND_VERSION.to_owned(), "0.13.1".to_owned())]
        );
        assert!(env(&derive_with(&origin(""), &Settings::default())).is_empty());
    }

    #[test]
    fn the_key_material_changes_with_the_commit_the_tag_and_the_version() {
        let key = |origin: &Origin, pyproject: &str| {
            key_material(&derive_with(origin, &Settings::parse(pyproject)))
        };
        let tagged = key(&origin("v1.0"), "");
        assert_ne!(tagged, key(&origin("v1.1"), ""));
        let mut moved = origin("v1.0");
        moved.commit = "f".repeat(40);
        assert_ne!(tagged, key(&moved, ""));
        let mut dirty = origin("v1.0");
        dirty.dirty = true;
        assert_ne!(tagged, key(&dirty, ""));
        let past = origin("v1.0-1-gabc1234");
        assert_ne!(
            key(&past, ""),
            key(&past, &with("post-release", "node-and-date"))
        );
        assert_eq!(tagged, key(&origin("v1.0"), ""));
    }

    #[test]
    fn dates_are_utc_days_and_times() {
        assert_eq!(utc(0, "%Y%m%d"), "19700101");
        assert_eq!(utc(951_782_400, "%Y%m%d"), "20000229");
        assert_eq!(utc(1_772_600_767, "%Y%m%d%H%M%S"), "20260304050607");
        assert_eq!(increment("9"), "10");
        assert_eq!(increment("199"), "200");
        assert_eq!(increment("18446744073709551615"), "18446744073709551616");
    }

    #[test]
    fn the_settings_are_read_from_the_sources_pyproject() {
        let scratch = tempfile::tempdir().expect("scratch");
        std::fs::write(
            scratch.path().join("pyproject.toml"),
            "[tool.setuptools_scm]\nlocal_scheme = \"no-local-version\"\n",
        )
        .expect("write");
        let derived = derive(&origin("v1.2.3-2-gabc1234"), scratch.path());
        assert_eq!(derived.version.as_deref(), Some("1.2.4.dev2"));
        // A link is not followed: the defaults.
        let elsewhere = tempfile::tempdir().expect("elsewhere");
        std::fs::rename(
            scratch.path().join("pyproject.toml"),
            elsewhere.path().join("pyproject.toml"),
        )
        .expect("move");
        std::os::unix::fs::symlink(
            elsewhere.path().join("pyproject.toml"),
            scratch.path().join("pyproject.toml"),
        )
        .expect("link");
        let derived = derive(&origin("v1.2.3-2-gabc1234"), scratch.path());
        assert_eq!(derived.version.as_deref(), Some("1.2.4.dev2+gabc1234de"));
    }
}
