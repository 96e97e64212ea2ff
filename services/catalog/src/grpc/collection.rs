//! The gRPC face of the catalog's part in garbage collection (`plinth.catalog.v1.
//! CollectionService`): digests are checked on receipt, `persistence::collection` does the
//! work. Builders hold what they are about to store; the collector (the source service) asks
//! what the catalog keeps.

use plinth_kit::{ErrorCode, PlinthError};
use plinth_proto::catalog::v1 as pb;
use tonic::{Request, Response, Status};

use crate::domain::model::LeaseToken;
use crate::persistence::{CollectionRoots, Store, StoreError};

/// The longest fence a collection round may raise, in milliseconds (ten minutes).
pub const MAX_FENCE_MS: u32 = 600_000;

/// Most digests one `HoldBlobs` call may name (a call is then well under 4 MiB).
pub const MAX_HOLDS_PER_CALL: usize = 20_000;

/// The `plinth.catalog.v1.CollectionService` implementation.
pub struct Collection {
    store: Store,
}

impl Collection {
    pub fn new(store: Store) -> Self {
        Collection { store }
    }
}

/// Whether `text` is a blob's name as Plinth writes it: `sha256:` and 64 lowercase hex digits.
fn is_digest(text: &str) -> bool {
    text.strip_prefix("sha256:").is_some_and(|hex| {
        hex.len() == 64
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

fn store_error(error: StoreError) -> PlinthError {
    match error {
        StoreError::LeaseLost => PlinthError::new(
            ErrorCode::LeaseLost,
            "the lease expired or was handed to another builder; stop this build",
        ),
        other => PlinthError::internal(&other),
    }
}

impl From<CollectionRoots> for pb::CollectionRoots {
    fn from(roots: CollectionRoots) -> Self {
        pb::CollectionRoots {
            trees: roots.trees,
            blobs: roots.blobs,
            deleted_environments: roots.deleted_environments,
            fence_until_ms: roots.fence_until_ms,
        }
    }
}

#[tonic::async_trait]
impl pb::collection_service_server::CollectionService for Collection {
    #[tracing::instrument(name = "catalog.hold_blobs", skip_all, fields(blobs = request.get_ref().blobs.len(), trees = request.get_ref().trees.len()))]
    async fn hold_blobs(
        &self,
        request: Request<pb::HoldBlobsRequest>,
    ) -> Result<Response<pb::HoldBlobsResponse>, Status> {
        let request = request.into_inner();
        let named = request.blobs.len() + request.trees.len();
        if named > MAX_HOLDS_PER_CALL {
            return Err(PlinthError::invalid(format!(
                "a hold names at most {MAX_HOLDS_PER_CALL} digests; this one names {named}: split it"
            ))
            .into());
        }
        if let Some(bad) = request
            .blobs
            .iter()
            .chain(&request.trees)
            .find(|digest| !is_digest(digest))
        {
            return Err(PlinthError::invalid(format!(
                "{bad:?} is not a blob digest (sha256: and 64 lowercase hex digits)"
            ))
            .into());
        }
        let token = LeaseToken::from_wire(request.lease_token);
        self.store
            .hold_blobs(&token, &request.blobs, &request.trees)
            .await
            .map_err(store_error)?;
        Ok(Response::new(pb::HoldBlobsResponse {}))
    }

    #[tracing::instrument(name = "catalog.begin_collection", skip_all)]
    async fn begin_collection(
        &self,
        request: Request<pb::BeginCollectionRequest>,
    ) -> Result<Response<pb::CollectionRoots>, Status> {
        let fence_ms = request.get_ref().fence_ms;
        if fence_ms > MAX_FENCE_MS {
            return Err(PlinthError::invalid(format!(
                "fence_ms is {fence_ms}; give at most {MAX_FENCE_MS}"
            ))
            .into());
        }
        let roots = self
            .store
            .begin_collection(i64::from(fence_ms))
            .await
            .map_err(store_error)?;
        Ok(Response::new(roots.into()))
    }

    #[tracing::instrument(name = "catalog.end_collection", skip_all)]
    async fn end_collection(
        &self,
        _request: Request<pb::EndCollectionRequest>,
    ) -> Result<Response<pb::EndCollectionResponse>, Status> {
        self.store.end_collection().await.map_err(store_error)?;
        Ok(Response::new(pb::EndCollectionResponse {}))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plinth_digests_are_digests() {
        let hex = "0123456789abcdef".repeat(4);
        assert!(is_digest(&format!("sha256:{hex}")));
        for bad in [
            String::new(),
            hex.clone(),
            format!("sha256:{}", hex.to_uppercase()),
            format!("sha256:{}", &hex[1..]),
            format!("sha512:{hex}"),
            format!("sha256:{hex}0"),
            format!("sha256:{}g", &hex[1..]),
        ] {
            assert!(!is_digest(&bad), "{bad}");
        }
    }
}
