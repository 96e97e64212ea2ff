//! A build's status, phase and times as REST shows them, for the build and version records
//! and the environment's summary of its latest build alike.

use plinth_proto::catalog::v1 as pb;
use serde::Serialize;
use utoipa::ToSchema;

/// A build's status as REST shows it. UHP §4: the record "says building, then ready or
/// failed"; where a building build is goes in [`BuildPhase`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum BuildState {
    /// Accepted and not finished: waiting for a builder or being built.
    Building,
    /// Built; it can be activated (and was, unless a newer build was).
    Ready,
    /// It failed; nothing changed.
    Failed,
}

/// Where a `building` build is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum BuildPhase {
    /// Waiting for a builder.
    Queued,
    /// A builder is installing it.
    Running,
}

/// The catalog's build status as REST's status and phase: the catalog's `queued` and
/// `building` are both `building`, told apart by the phase, which a finished build has none of.
pub(crate) fn build_state(status: i32) -> (BuildState, Option<BuildPhase>) {
    match pb::BuildStatus::try_from(status) {
        Ok(pb::BuildStatus::Ready) => (BuildState::Ready, None),
        Ok(pb::BuildStatus::Failed) => (BuildState::Failed, None),
        Ok(pb::BuildStatus::Building) => (BuildState::Building, Some(BuildPhase::Running)),
        Ok(pb::BuildStatus::Queued | pb::BuildStatus::Unspecified) | Err(_) => {
            (BuildState::Building, Some(BuildPhase::Queued))
        }
    }
}

/// A time the catalog keeps, as REST shows every time: milliseconds since the Unix epoch,
/// `null` until known (the catalog's 0).
pub(crate) fn millis(ms: i64) -> Option<i64> {
    (ms > 0).then_some(ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_catalog_status_is_building_ready_or_failed_and_only_building_has_a_phase() {
        let shown = |status: pb::BuildStatus| {
            serde_json::to_value(build_state(status as i32)).expect("json")
        };
        assert_eq!(
            shown(pb::BuildStatus::Queued),
            serde_json::json!(["building", "queued"])
        );
        assert_eq!(
            shown(pb::BuildStatus::Building),
            serde_json::json!(["building", "running"])
        );
        assert_eq!(
            shown(pb::BuildStatus::Ready),
            serde_json::json!(["ready", null])
        );
        assert_eq!(
            shown(pb::BuildStatus::Failed),
            serde_json::json!(["failed", null])
        );
        assert_eq!(build_state(99).0, BuildState::Building, "an unknown value");
    }
}
