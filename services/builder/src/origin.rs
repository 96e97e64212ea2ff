//! The version a build gives installers when the source came from git.
//!
//! Projects that take their version from git (setuptools-scm, hatch-vcs, which uses
//! setuptools-scm) cannot compute it in a build: the source holds the commit's files, not
//! `.git`. The source service records, for the last git import, the commit, the ref and
//! `git describe --tags --always` (`GetOrigin`), and this module turns that into the version
//! setuptools-scm would compute with its default schemes (`guess-next-dev` and
//! `node-and-date`), exported as `SETUPTOOLS_SCM_PRETEND_VERSION`, which both read instead
//! of asking git:
//!
//! | `git describe`        | version                   |
//! |-----------------------|---------------------------|
//! | `v1.2.3` or `1.2.3`   | `1.2.3`                   |
//! | `v1.2.3-4-gabc1234`   | `1.2.4.dev4+gabc1234`     |
//! | `abc1234` (no tag)    | `0.1.dev0+gabc1234`       |
//!
//! Without a tag setuptools-scm counts every commit (`0.1.devN`); the describe string does
//! not carry that count, so `dev0` is given. A tag that is not a version (`release-x`) counts
//! as no tag. The next version bumps the tag's last number (`1.0rc1` → `1.0rc2`), as
//! setuptools-scm does. Edits made after the import do not mark the version dirty.

use plinth_proto::source::v1 as pb;

/// Where a source last came from by git.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    /// The commit's full id.
    pub commit: String,
    /// The ref the import asked for.
    pub reference: String,
    /// `git describe --tags --always` of the commit.
    pub describe: String,
}

impl From<pb::Origin> for Origin {
    fn from(origin: pb::Origin) -> Self {
        Origin {
            commit: origin.commit,
            reference: origin.r#ref,
            describe: origin.describe,
        }
    }
}

/// The variable setuptools-scm (and hatch-vcs through it) reads instead of asking git.
pub const PRETEND_VERSION: &str = "SETUPTOOLS_SCM_PRETEND_VERSION";

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

/// The variables installers get for `origin`.
pub fn env(origin: &Origin) -> Vec<(String, String)> {
    match version(origin) {
        Some(version) => vec![(PRETEND_VERSION.to_owned(), version)],
        None => Vec::new(),
    }
}

/// What the origin adds to a build's reuse key: a new commit or tag changes the version
/// installed into the layer, so a layer built for another one must not be reused.
pub fn key_material(origin: &Origin) -> String {
    format!(
        "origin {} {}\nversion {}\n",
        origin.commit,
        origin.describe,
        version(origin).unwrap_or_default()
    )
}

/// The version setuptools-scm would compute for `origin` (see the module), `None` when the
/// description is empty.
pub fn version(origin: &Origin) -> Option<String> {
    let describe = origin.describe.trim();
    if describe.is_empty() {
        return None;
    }
    let short = |sha: &str| sha.get(..7).unwrap_or(sha).to_ascii_lowercase();
    // Without a tag, `--always` answers the abbreviated commit itself.
    if is_hex(describe) && origin.commit.starts_with(describe) {
        return Some(format!("0.1.dev0+g{}", short(describe)));
    }
    if let Some((tag, distance, sha)) = split_distance(describe) {
        return Some(match tag_version(tag) {
            Some(release) if distance == 0 => release,
            Some(release) => format!("{}.dev{distance}+g{}", bump(&release), short(sha)),
            None => format!("0.1.dev{distance}+g{}", short(sha)),
        });
    }
    match tag_version(describe) {
        Some(release) => Some(release),
        None => Some(format!("0.1.dev0+g{}", short(&origin.commit))),
    }
}

fn is_hex(text: &str) -> bool {
    !text.is_empty() && text.bytes().all(|b| b.is_ascii_hexdigit())
}

/// `<tag>-<distance>-g<sha>` → its parts (a tag may hold `-` itself).
fn split_distance(describe: &str) -> Option<(&str, u64, &str)> {
    let (rest, sha) = describe.rsplit_once('-')?;
    let sha = sha.strip_prefix('g').filter(|sha| is_hex(sha))?;
    let (tag, distance) = rest.rsplit_once('-')?;
    let distance = distance.parse().ok()?;
    (!tag.is_empty()).then_some((tag, distance, sha))
}

/// A tag's version: `v1.2.3` → `1.2.3`, `my-tool-v1.5` → `1.5` (setuptools-scm's default
/// tag pattern allows a `name-` prefix); a tag with no part starting with a digit (after an
/// optional `v`) is no version. A local part (`+…`) is dropped.
fn tag_version(tag: &str) -> Option<String> {
    std::iter::once(tag)
        .chain(
            tag.match_indices('-')
                .filter_map(|(at, _)| tag.get(at + 1..)),
        )
        .find_map(plain_version)
}

fn plain_version(tag: &str) -> Option<String> {
    let version = tag
        .strip_prefix('v')
        .or_else(|| tag.strip_prefix('V'))
        .unwrap_or(tag);
    let version = version.split('+').next().unwrap_or(version);
    let starts_with_digit = version.bytes().next().is_some_and(|b| b.is_ascii_digit());
    let plausible = version
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-' || b == b'_');
    (starts_with_digit && plausible).then(|| version.to_owned())
}

/// The guessed next version: the last number bumped (`1.2.3` → `1.2.4`, `1.0rc1` →
/// `1.0rc2`); a version ending in no number gets `.1` appended.
fn bump(version: &str) -> String {
    let digits = version
        .bytes()
        .rev()
        .take_while(|b| b.is_ascii_digit())
        .count();
    let (head, number) = version.split_at(version.len() - digits);
    match number.parse::<u64>() {
        Ok(number) => format!("{head}{}", number.saturating_add(1)),
        Err(_) => format!("{version}.1"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn origin(describe: &str) -> Origin {
        Origin {
            commit: "abc1234def5678abc1234def5678abc1234def56".to_owned(),
            reference: "main".to_owned(),
            describe: describe.to_owned(),
        }
    }

    #[test]
    fn versions_are_what_setuptools_scm_computes() {
        for (describe, expected) in [
            ("v1.2.3", Some("1.2.3")),
            ("1.2.3", Some("1.2.3")),
            ("V2.0", Some("2.0")),
            ("v1.2.3-4-gabc1234", Some("1.2.4.dev4+gabc1234")),
            ("1.0rc1-2-gabc1234", Some("1.0rc2.dev2+gabc1234")),
            ("release-v1-1-gabc1234", Some("2.dev1+gabc1234")),
            ("my-tool-1.5-3-gABC1234", Some("1.6.dev3+gabc1234")),
            ("release-x-1-gabc1234", Some("0.1.dev1+gabc1234")),
            ("abc1234", Some("0.1.dev0+gabc1234")),
            ("nightly", Some("0.1.dev0+gabc1234")),
            ("", None),
        ] {
            assert_eq!(
                version(&origin(describe)).as_deref(),
                expected,
                "{describe:?}"
            );
        }
    }

    #[test]
    fn the_environment_carries_the_version_for_setuptools_scm_and_hatch_vcs() {
        assert_eq!(
            env(&origin("v0.13.1")),
            [(PRETEND_VERSION.to_owned(), "0.13.1".to_owned())]
        );
        assert!(env(&origin("")).is_empty());
    }

    #[test]
    fn the_key_material_changes_with_the_commit_and_the_tag() {
        let tagged = key_material(&origin("v1.0"));
        assert_ne!(tagged, key_material(&origin("v1.1")));
        let mut moved = origin("v1.0");
        moved.commit = "f".repeat(40);
        assert_ne!(tagged, key_material(&moved));
        assert_eq!(tagged, key_material(&origin("v1.0")));
    }
}
