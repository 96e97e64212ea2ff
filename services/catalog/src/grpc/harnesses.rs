//! The gRPC face of the harness registry (`plinth.catalog.v1.HarnessService`): wire types are
//! validated into domain types on receipt, the store does the work, and domain types go back
//! out. No rule lives here.

use plinth_kit::{ErrorCode, PlinthError};
use plinth_proto::catalog::v1 as pb;
use tonic::{Request, Response, Status};

use crate::domain::model::{EnvironmentId, Harness, HarnessFields, HarnessId, PageRequest, Scope};
use crate::persistence::{Store, StoreError};

/// The `plinth.catalog.v1.HarnessService` implementation.
pub struct Harnesses {
    store: Store,
}

impl Harnesses {
    pub fn new(store: Store) -> Self {
        Harnesses { store }
    }
}

/// A harness that is not in the scope is `not_found`; the environment a write names, when it
/// is not in the scope, is `environment_not_found`.
fn store_error(error: StoreError, id: &str, environment: &str) -> PlinthError {
    match error {
        StoreError::NotFound => harness_not_found(id),
        StoreError::NoSuchEnvironment => environment_not_in_scope(environment),
        other => PlinthError::internal(&other),
    }
}

fn harness_not_found(id: &str) -> PlinthError {
    PlinthError::new(ErrorCode::NotFound, format!("harness {id:?} was not found"))
}

fn environment_not_in_scope(environment: &str) -> PlinthError {
    PlinthError::new(
        ErrorCode::EnvironmentNotFound,
        format!(
            "environment {environment:?} was not found in this scope; a harness can name only an environment of its own scope"
        ),
    )
}

/// An id that is not well formed cannot name a harness: it is reported as not found.
fn parse_id(id: &str) -> Result<HarnessId, PlinthError> {
    HarnessId::parse(id).ok_or_else(|| harness_not_found(id))
}

#[tonic::async_trait]
impl pb::harness_service_server::HarnessService for Harnesses {
    #[tracing::instrument(name = "catalog.create_harness", skip_all, fields(scope = %request.get_ref().scope, environment = %request.get_ref().environment_id))]
    async fn create_harness(
        &self,
        request: Request<pb::CreateHarnessRequest>,
    ) -> Result<Response<pb::Harness>, Status> {
        let request = request.into_inner();
        let fields = HarnessFields::new(
            Scope::parse(&request.scope)?,
            request.name,
            request.base,
            &request.environment_id,
        )?;
        let harness = self
            .store
            .create_harness(fields)
            .await
            .map_err(|error| store_error(error, "", &request.environment_id))?;
        tracing::info!(id = %harness.id, "harness created");
        Ok(Response::new(harness.into()))
    }

    #[tracing::instrument(name = "catalog.get_harness", skip_all, fields(scope = %request.get_ref().scope, id = %request.get_ref().id))]
    async fn get_harness(
        &self,
        request: Request<pb::GetHarnessRequest>,
    ) -> Result<Response<pb::Harness>, Status> {
        let request = request.into_inner();
        let scope = Scope::parse(&request.scope)?;
        let id = parse_id(&request.id)?;
        let harness = self
            .store
            .get_harness(&scope, &id)
            .await
            .map_err(|error| store_error(error, &request.id, ""))?;
        Ok(Response::new(harness.into()))
    }

    #[tracing::instrument(name = "catalog.list_harnesses", skip_all, fields(scope = %request.get_ref().scope))]
    async fn list_harnesses(
        &self,
        request: Request<pb::ListHarnessesRequest>,
    ) -> Result<Response<pb::ListHarnessesResponse>, Status> {
        let request = request.into_inner();
        let scope = Scope::parse(&request.scope)?;
        let page = PageRequest::new(request.limit, &request.after)?;
        let environment = match &request.environment_id {
            None => None,
            Some(environment) => Some(EnvironmentId::parse(environment).ok_or_else(|| {
                PlinthError::not_found(format_args!("environment {environment:?}"))
            })?),
        };
        let page = self
            .store
            .list_harnesses_page(&scope, environment.as_ref(), &page)
            .await
            .map_err(|error| match (error, &request.environment_id) {
                (StoreError::NotFound, Some(environment)) => {
                    PlinthError::not_found(format_args!("environment {environment}"))
                }
                (other, environment) => {
                    store_error(other, "", environment.as_deref().unwrap_or_default())
                }
            })?;
        Ok(Response::new(pb::ListHarnessesResponse {
            harnesses: page.items.into_iter().map(Into::into).collect(),
            has_more: page.next.is_some(),
            next: page.next.map(|cursor| cursor.encode()).unwrap_or_default(),
        }))
    }

    #[tracing::instrument(name = "catalog.update_harness", skip_all, fields(scope = %request.get_ref().scope, id = %request.get_ref().id, environment = %request.get_ref().environment_id))]
    async fn update_harness(
        &self,
        request: Request<pb::UpdateHarnessRequest>,
    ) -> Result<Response<pb::Harness>, Status> {
        let request = request.into_inner();
        let scope = Scope::parse(&request.scope)?;
        let id = parse_id(&request.id)?;
        let fields =
            HarnessFields::new(scope, request.name, request.base, &request.environment_id)?;
        let harness = self
            .store
            .update_harness(&id, fields)
            .await
            .map_err(|error| store_error(error, &request.id, &request.environment_id))?;
        Ok(Response::new(harness.into()))
    }

    #[tracing::instrument(name = "catalog.delete_harness", skip_all, fields(scope = %request.get_ref().scope, id = %request.get_ref().id))]
    async fn delete_harness(
        &self,
        request: Request<pb::DeleteHarnessRequest>,
    ) -> Result<Response<pb::DeleteHarnessResponse>, Status> {
        let request = request.into_inner();
        let scope = Scope::parse(&request.scope)?;
        let id = parse_id(&request.id)?;
        self.store
            .delete_harness(&scope, &id)
            .await
            .map_err(|error| store_error(error, &request.id, ""))?;
        tracing::info!("harness deleted");
        Ok(Response::new(pb::DeleteHarnessResponse {}))
    }
}

impl From<Harness> for pb::Harness {
    fn from(harness: Harness) -> Self {
        pb::Harness {
            id: harness.id.as_str().to_owned(),
            scope: harness.scope.as_str().to_owned(),
            name: harness.name,
            base: harness.base,
            environment_id: harness.environment_id.as_str().to_owned(),
            created_at_ms: harness.created_at_ms,
            updated_at_ms: harness.updated_at_ms,
        }
    }
}
