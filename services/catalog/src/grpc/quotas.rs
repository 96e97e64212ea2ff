//! The gRPC face of quotas (`plinth.catalog.v1.QuotaService`): what a scope uses of the
//! quotas the catalog enforces. The enforcing itself happens in the store, where each counted
//! thing is created.

use plinth_kit::PlinthError;
use plinth_proto::catalog::v1 as pb;
use tonic::{Request, Response, Status};

use crate::domain::model::Scope;
use crate::persistence::Store;

/// The `plinth.catalog.v1.QuotaService` implementation.
pub struct Quotas {
    store: Store,
}

impl Quotas {
    /// Answers from `store`.
    pub fn new(store: Store) -> Self {
        Quotas { store }
    }
}

fn used(used: u64, limit: u64) -> Option<pb::QuotaUse> {
    Some(pb::QuotaUse { used, limit })
}

#[tonic::async_trait]
impl pb::quota_service_server::QuotaService for Quotas {
    #[tracing::instrument(name = "catalog.get_usage", skip_all)]
    async fn get_usage(
        &self,
        request: Request<pb::GetUsageRequest>,
    ) -> Result<Response<pb::Usage>, Status> {
        let request = request.into_inner();
        let scope = Scope::parse(&request.scope)?;
        let usage = self
            .store
            .usage(&scope)
            .await
            .map_err(|error| PlinthError::internal(&error))?;
        Ok(Response::new(pb::Usage {
            environments: used(usage.environments, usage.limits.environments),
            sessions: used(usage.sessions, usage.limits.sessions),
            queued_builds: used(usage.queued_builds, usage.limits.queued_builds),
        }))
    }
}
