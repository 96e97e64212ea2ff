//! The gRPC face of the catalog: wire types are validated into domain types on receipt,
//! the store does the work, and domain types go back out. No rule lives here.

use plinth_kit::{ErrorCode, PlinthError};
use plinth_proto::catalog::v1 as pb;
use tonic::{Request, Response, Status};

use crate::model::{
    Environment, EnvironmentChanges, EnvironmentId, EnvironmentStatus, NewEnvironment, Scope,
};
use crate::persistence::{Store, StoreError};

/// The `plinth.catalog.v1.CatalogService` implementation.
pub struct Catalog {
    store: Store,
}

impl Catalog {
    pub fn new(store: Store) -> Self {
        Catalog { store }
    }
}

fn store_error(error: StoreError, id: &str) -> PlinthError {
    match error {
        StoreError::NotFound => PlinthError::not_found(format_args!("environment {id}")),
        StoreError::SlugTaken => PlinthError::new(
            ErrorCode::EnvironmentExists,
            "another environment in this scope already has this slug, and so its mount path; choose a different name",
        ),
        other => PlinthError::internal(&other),
    }
}

/// An id that is not well formed cannot name anything: it is reported as not found.
fn parse_id(id: &str) -> Result<EnvironmentId, PlinthError> {
    EnvironmentId::parse(id)
        .ok_or_else(|| PlinthError::not_found(format_args!("environment {id:?}")))
}

#[tonic::async_trait]
impl pb::catalog_service_server::CatalogService for Catalog {
    #[tracing::instrument(name = "catalog.create_environment", skip_all, fields(scope = %request.get_ref().scope))]
    async fn create_environment(
        &self,
        request: Request<pb::CreateEnvironmentRequest>,
    ) -> Result<Response<pb::Environment>, Status> {
        let request = request.into_inner();
        let new = NewEnvironment::new(
            Scope::parse(&request.scope)?,
            request.name,
            request.description,
            request.entry,
        )?;
        let environment = self
            .store
            .create_environment(new)
            .await
            .map_err(|error| store_error(error, ""))?;
        tracing::info!(id = %environment.id, slug = environment.slug.as_str(), "environment created");
        Ok(Response::new(environment.into()))
    }

    #[tracing::instrument(name = "catalog.get_environment", skip_all, fields(scope = %request.get_ref().scope, id = %request.get_ref().id))]
    async fn get_environment(
        &self,
        request: Request<pb::GetEnvironmentRequest>,
    ) -> Result<Response<pb::Environment>, Status> {
        let request = request.into_inner();
        let scope = Scope::parse(&request.scope)?;
        let id = parse_id(&request.id)?;
        let environment = self
            .store
            .get_environment(&scope, &id)
            .await
            .map_err(|error| store_error(error, &request.id))?;
        Ok(Response::new(environment.into()))
    }

    #[tracing::instrument(name = "catalog.list_environments", skip_all, fields(scope = %request.get_ref().scope))]
    async fn list_environments(
        &self,
        request: Request<pb::ListEnvironmentsRequest>,
    ) -> Result<Response<pb::ListEnvironmentsResponse>, Status> {
        let scope = Scope::parse(&request.get_ref().scope)?;
        let environments = self
            .store
            .list_environments(&scope)
            .await
            .map_err(|error| store_error(error, ""))?;
        Ok(Response::new(pb::ListEnvironmentsResponse {
            environments: environments.into_iter().map(Into::into).collect(),
        }))
    }

    #[tracing::instrument(name = "catalog.update_environment", skip_all, fields(scope = %request.get_ref().scope, id = %request.get_ref().id))]
    async fn update_environment(
        &self,
        request: Request<pb::UpdateEnvironmentRequest>,
    ) -> Result<Response<pb::Environment>, Status> {
        let request = request.into_inner();
        let scope = Scope::parse(&request.scope)?;
        let id = parse_id(&request.id)?;
        let changes = EnvironmentChanges::new(request.name, request.description, request.entry)?;
        let environment = self
            .store
            .update_environment(&scope, &id, changes)
            .await
            .map_err(|error| store_error(error, &request.id))?;
        Ok(Response::new(environment.into()))
    }

    #[tracing::instrument(name = "catalog.delete_environment", skip_all, fields(scope = %request.get_ref().scope, id = %request.get_ref().id))]
    async fn delete_environment(
        &self,
        request: Request<pb::DeleteEnvironmentRequest>,
    ) -> Result<Response<pb::DeleteEnvironmentResponse>, Status> {
        let request = request.into_inner();
        let scope = Scope::parse(&request.scope)?;
        let id = parse_id(&request.id)?;
        self.store
            .delete_environment(&scope, &id)
            .await
            .map_err(|error| store_error(error, &request.id))?;
        tracing::info!("environment deleted");
        Ok(Response::new(pb::DeleteEnvironmentResponse {}))
    }
}

impl From<Environment> for pb::Environment {
    fn from(environment: Environment) -> Self {
        let status = match environment.status() {
            EnvironmentStatus::Empty => pb::EnvironmentStatus::Empty,
            EnvironmentStatus::Ready => pb::EnvironmentStatus::Ready,
        };
        pb::Environment {
            mount: environment.slug.mount(),
            id: environment.id.as_str().to_owned(),
            scope: environment.scope.as_str().to_owned(),
            name: environment.name,
            slug: environment.slug.as_str().to_owned(),
            description: environment.description,
            entry: environment.entry,
            status: status.into(),
            version: environment.active_version,
            latest_version: environment.latest_version,
            files: Some(pb::FileStats {
                count: environment.files_count,
                bytes: environment.files_bytes,
            }),
            packages: Vec::new(),
            versions: Vec::new(),
            build: None,
            created_at_ms: environment.created_at_ms,
            updated_at_ms: environment.updated_at_ms,
        }
    }
}
