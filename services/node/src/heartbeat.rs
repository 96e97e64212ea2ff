//! What a node's heartbeat tells the catalog of its cache: the whole set of cached versions
//! only when the catalog does not hold it (the first heartbeat after registering, a changed
//! cache, a catalog whose database lost it), else only the set's digest. Every answer says
//! which digest the catalog holds, so whatever happened meanwhile (a restart of either side,
//! another catalog replica, an older catalog that keeps no sets) the next heartbeat sends
//! the whole set again whenever the two differ.
//!
//! An answer that lists the active versions also names the versions to hold warm (every
//! environment's active version, the most recently activated first); one that does not
//! (`active_unchanged`, or a set the catalog did not hold) leaves the list the node holds as
//! it is, as it leaves the active versions.

use std::collections::HashSet;

use plinth_proto::catalog::v1 as pb;
use sha2::Digest as _;

use crate::cache::VersionKey;

/// The digest of a set of cached versions: 64 bits of a SHA-256 of the sorted, distinct
/// versions, never 0 (which says "no digest" on the wire).
pub fn cache_digest(versions: &[VersionKey]) -> u64 {
    let mut sorted: Vec<&VersionKey> = versions.iter().collect();
    sorted.sort();
    sorted.dedup();
    let mut hash = sha2::Sha256::new();
    for (environment, version) in sorted {
        hash.update(environment.as_bytes());
        hash.update(b"\0");
        hash.update(version.to_be_bytes());
    }
    let bytes: [u8; 32] = hash.finalize().into();
    let mut first = [0u8; 8];
    first.copy_from_slice(&bytes[..8]);
    u64::from_be_bytes(first).max(1)
}

/// One node's side of the cache report, from one heartbeat to the next.
#[derive(Debug, Default)]
pub struct CacheReporter {
    /// The digest the catalog last said it holds; 0 until it says, and after registering.
    held: u64,
    /// The activation epoch of the active list the node holds; 0 for none (until the
    /// catalog answers one, and after registering).
    epoch: u64,
    /// The versions to hold warm, as the last answer that listed them named them.
    warm: Vec<pb::WarmVersion>,
}

/// What a heartbeat sent, for reading its answer.
#[derive(Debug, Clone, Copy)]
pub struct Sent {
    digest: u64,
    whole: bool,
}

impl CacheReporter {
    /// A reporter for a node the catalog knows nothing of yet.
    pub fn new() -> Self {
        CacheReporter::default()
    }

    /// The versions to hold warm, most recently activated first: as the last answer that
    /// listed the active versions named them (none before one did). Kept through answers that
    /// do not list them, and through registering again until the next one that does.
    pub fn warm(&self) -> &[pb::WarmVersion] {
        &self.warm
    }

    /// The node (re)registered: the next heartbeat sends its whole set.
    pub fn forget(&mut self) {
        self.held = 0;
        self.epoch = 0;
    }

    /// The heartbeat of `node_id` caching `versions`: the whole set unless the catalog said
    /// it holds this very one.
    pub fn request(
        &self,
        node_id: String,
        versions: Vec<VersionKey>,
    ) -> (pb::NodeHeartbeatRequest, Sent) {
        let digest = cache_digest(&versions);
        let unchanged = digest == self.held;
        let cached = if unchanged {
            Vec::new()
        } else {
            versions
                .into_iter()
                .map(|(environment_id, version)| pb::CachedVersion {
                    environment_id,
                    version,
                })
                .collect()
        };
        let request = pb::NodeHeartbeatRequest {
            node_id,
            cached,
            cache_digest: digest,
            cache_unchanged: unchanged,
            active_epoch: self.epoch,
            ..pb::NodeHeartbeatRequest::default()
        };
        (
            request,
            Sent {
                digest,
                whole: !unchanged,
            },
        )
    }

    /// Reads the answer to the heartbeat `sent`: the cached versions that are active, or
    /// `None` when the answer does not say: nothing changed since the list the node holds
    /// (`active_unchanged`), or the catalog did not hold the set the heartbeat named (the
    /// next heartbeat sends it whole). The node keeps what it knew meanwhile. An answer that
    /// lists the active versions replaces the versions to hold warm ([`CacheReporter::warm`]).
    pub fn answered(
        &mut self,
        sent: Sent,
        answer: &pb::NodeHeartbeatResponse,
    ) -> Option<HashSet<VersionKey>> {
        self.held = answer.cache_digest;
        if answer.active_unchanged {
            return None;
        }
        if !sent.whole && answer.cache_digest != sent.digest {
            self.epoch = 0;
            return None;
        }
        self.epoch = answer.active_epoch;
        self.warm.clone_from(&answer.warm);
        Some(
            answer
                .active
                .iter()
                .map(|version| (version.environment_id.clone(), version.version))
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn versions(names: &[(&str, u32)]) -> Vec<VersionKey> {
        names
            .iter()
            .map(|(environment, version)| ((*environment).to_owned(), *version))
            .collect()
    }

    fn answer(digest: u64, active: &[(&str, u32)]) -> pb::NodeHeartbeatResponse {
        pb::NodeHeartbeatResponse {
            active: active
                .iter()
                .map(|(environment, version)| pb::CachedVersion {
                    environment_id: (*environment).to_owned(),
                    version: *version,
                })
                .collect(),
            cache_digest: digest,
            ..pb::NodeHeartbeatResponse::default()
        }
    }

    #[test]
    fn the_digest_names_the_set_whatever_its_order() {
        let one = cache_digest(&versions(&[("henv_a", 1), ("henv_b", 2)]));
        assert_eq!(
            one,
            cache_digest(&versions(&[("henv_b", 2), ("henv_a", 1), ("henv_a", 1)]))
        );
        assert_ne!(
            one,
            cache_digest(&versions(&[("henv_a", 1), ("henv_b", 3)]))
        );
        assert_ne!(one, cache_digest(&versions(&[("henv_a", 1)])));
        assert_ne!(cache_digest(&[]), 0);
    }

    #[test]
    fn the_whole_set_goes_until_the_catalog_holds_it_then_only_its_digest() {
        let mut reporter = CacheReporter::new();
        let cache = versions(&[("henv_a", 1), ("henv_b", 2)]);
        let (first, sent) = reporter.request("node_x".into(), cache.clone());
        assert!(!first.cache_unchanged);
        assert_eq!(first.cached.len(), 2);
        let active = reporter.answered(sent, &answer(first.cache_digest, &[("henv_a", 1)]));
        assert_eq!(active, Some(HashSet::from([("henv_a".to_owned(), 1)])));

        let (second, sent) = reporter.request("node_x".into(), cache.clone());
        assert!(second.cache_unchanged);
        assert!(second.cached.is_empty());
        assert_eq!(second.cache_digest, first.cache_digest);
        assert_eq!(
            reporter.answered(sent, &answer(second.cache_digest, &[])),
            Some(HashSet::new()),
            "the catalog held the set: its answer says what is active"
        );

        // A changed cache goes whole.
        let changed = versions(&[("henv_a", 1)]);
        let (third, _) = reporter.request("node_x".into(), changed);
        assert!(!third.cache_unchanged);
        assert_eq!(third.cached.len(), 1);
    }

    #[test]
    fn the_active_list_held_is_named_by_its_epoch_and_kept_while_unchanged() {
        let mut reporter = CacheReporter::new();
        let cache = versions(&[("henv_a", 1), ("henv_b", 2)]);
        let (first, sent) = reporter.request("node_x".into(), cache.clone());
        assert_eq!(
            first.active_epoch, 0,
            "a node that holds no list names none"
        );
        let mut listed = answer(first.cache_digest, &[("henv_a", 1)]);
        listed.active_epoch = 7;
        assert!(reporter.answered(sent, &listed).is_some());

        let (second, sent) = reporter.request("node_x".into(), cache.clone());
        assert_eq!(second.active_epoch, 7);
        let mut unchanged = answer(second.cache_digest, &[]);
        (unchanged.active_epoch, unchanged.active_unchanged) = (7, true);
        assert_eq!(
            reporter.answered(sent, &unchanged),
            None,
            "an unchanged list is not an empty one: the node keeps what it holds"
        );
        let (third, _) = reporter.request("node_x".into(), cache.clone());
        assert_eq!(third.active_epoch, 7);

        // Registering again forgets the list's epoch with the set.
        reporter.forget();
        let (again, _) = reporter.request("node_x".into(), cache);
        assert_eq!((again.active_epoch, again.cache_unchanged), (0, false));
    }

    fn warm(names: &[(&str, u32)]) -> Vec<pb::WarmVersion> {
        names
            .iter()
            .map(|(environment, version)| pb::WarmVersion {
                environment_id: (*environment).to_owned(),
                slug: environment.trim_start_matches("henv_").to_owned(),
                version: *version,
                layer_tree: format!("sha256:{environment}{version}"),
            })
            .collect()
    }

    #[test]
    fn the_warm_list_is_kept_until_an_answer_lists_it_again() {
        let mut reporter = CacheReporter::new();
        assert!(
            reporter.warm().is_empty(),
            "none before the catalog names one"
        );
        let cache = versions(&[("henv_a", 1)]);
        let (first, sent) = reporter.request("node_x".into(), cache.clone());
        let mut listed = answer(first.cache_digest, &[("henv_a", 1)]);
        listed.active_epoch = 3;
        listed.warm = warm(&[("henv_b", 4), ("henv_a", 1)]);
        reporter.answered(sent, &listed);
        assert_eq!(reporter.warm(), warm(&[("henv_b", 4), ("henv_a", 1)]));

        // Unchanged: the answer carries no list, and the node keeps the one it holds.
        let (second, sent) = reporter.request("node_x".into(), cache.clone());
        let mut unchanged = answer(second.cache_digest, &[]);
        (unchanged.active_epoch, unchanged.active_unchanged) = (3, true);
        assert_eq!(reporter.answered(sent, &unchanged), None);
        assert_eq!(reporter.warm(), warm(&[("henv_b", 4), ("henv_a", 1)]));

        // A catalog that does not hold the set answers no list either.
        let (third, sent) = reporter.request("node_x".into(), cache.clone());
        assert!(third.cache_unchanged);
        assert_eq!(reporter.answered(sent, &answer(9, &[])), None);
        assert_eq!(reporter.warm(), warm(&[("henv_b", 4), ("henv_a", 1)]));

        // Registering again keeps it until an answer lists the versions again.
        reporter.forget();
        assert_eq!(reporter.warm(), warm(&[("henv_b", 4), ("henv_a", 1)]));

        // A listed answer replaces it, an empty list included (a rollback, then none).
        let (fourth, sent) = reporter.request("node_x".into(), cache.clone());
        let mut rolled = answer(fourth.cache_digest, &[("henv_a", 1)]);
        rolled.active_epoch = 4;
        rolled.warm = warm(&[("henv_b", 3), ("henv_a", 1)]);
        reporter.answered(sent, &rolled);
        assert_eq!(reporter.warm(), warm(&[("henv_b", 3), ("henv_a", 1)]));
        let (fifth, sent) = reporter.request("node_x".into(), cache);
        let mut none = answer(fifth.cache_digest, &[]);
        none.active_epoch = 5;
        reporter.answered(sent, &none);
        assert!(reporter.warm().is_empty());
    }

    #[test]
    fn a_catalog_that_does_not_hold_the_set_gets_it_whole_next_time() {
        let mut reporter = CacheReporter::new();
        let cache = versions(&[("henv_a", 1)]);
        let (first, sent) = reporter.request("node_x".into(), cache.clone());
        reporter.answered(sent, &answer(first.cache_digest, &[("henv_a", 1)]));
        let (unchanged, sent) = reporter.request("node_x".into(), cache.clone());
        assert!(unchanged.cache_unchanged);
        // Another catalog, whose database holds another set (or none).
        assert_eq!(reporter.answered(sent, &answer(7, &[])), None);
        let (again, sent) = reporter.request("node_x".into(), cache.clone());
        assert!(!again.cache_unchanged);
        assert_eq!(again.cached.len(), 1);

        // After registering again, the set goes whole too.
        assert!(
            reporter
                .answered(sent, &answer(again.cache_digest, &[]))
                .is_some()
        );
        reporter.forget();
        let (registered, _) = reporter.request("node_x".into(), cache);
        assert!(!registered.cache_unchanged);
    }

    #[test]
    fn a_catalog_that_keeps_no_sets_gets_the_whole_set_every_time() {
        let mut reporter = CacheReporter::new();
        let cache = versions(&[("henv_a", 1), ("henv_b", 1)]);
        for _ in 0..3 {
            let (request, sent) = reporter.request("node_x".into(), cache.clone());
            assert!(!request.cache_unchanged);
            assert_eq!(request.cached.len(), 2);
            let active = reporter.answered(sent, &answer(0, &[("henv_b", 1)]));
            assert_eq!(active, Some(HashSet::from([("henv_b".to_owned(), 1)])));
        }
    }
}
