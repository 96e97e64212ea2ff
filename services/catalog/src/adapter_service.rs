//! The gRPC face of workspace adapters (`plinth.catalog.v1.AdapterService`): wire types are
//! validated into domain types on receipt, the store does the work.

use std::time::Duration;

use plinth_kit::{ErrorCode, PlinthError};
use plinth_proto::catalog::v1 as pb;
use tonic::{Request, Response, Status};

use crate::adapters::{Adapter, AdapterId, Credential, NewAdapter, Protocol};
use crate::model::{EnvironmentId, Scope};
use crate::persistence::{Store, StoreError};

/// The `plinth.catalog.v1.AdapterService` implementation.
pub struct Adapters {
    store: Store,
    grace: Duration,
}

impl Adapters {
    /// `grace`: how long a rotated-out credential is still accepted.
    pub fn new(store: Store, grace: Duration) -> Self {
        Adapters { store, grace }
    }
}

/// An adapter that is not in the scope (or not at all) is `not_found`; the environment a
/// create names, when it is not in the scope, is `environment_not_found`.
fn store_error(error: StoreError, id: &str, environment: &str) -> PlinthError {
    match error {
        StoreError::NotFound => adapter_not_found(id),
        StoreError::NoSuchEnvironment => PlinthError::new(
            ErrorCode::EnvironmentNotFound,
            format!(
                "environment {environment:?} was not found in this scope; an adapter can name only an environment of its own scope"
            ),
        ),
        other => PlinthError::internal(&other),
    }
}

fn adapter_not_found(id: &str) -> PlinthError {
    PlinthError::new(
        ErrorCode::NotFound,
        format!("workspace adapter {id:?} was not found"),
    )
}

fn parse_id(id: &str) -> Result<AdapterId, PlinthError> {
    AdapterId::parse(id).ok_or_else(|| adapter_not_found(id))
}

impl From<Adapter> for pb::Adapter {
    fn from(adapter: Adapter) -> Self {
        pb::Adapter {
            id: adapter.id.as_str().to_owned(),
            scope: adapter.scope.as_str().to_owned(),
            protocol: adapter.protocol.as_str().to_owned(),
            environment_id: adapter.environment_id.as_str().to_owned(),
            created_at_ms: adapter.created_at_ms,
            rotated_at_ms: adapter.rotated_at_ms,
            previous_expires_at_ms: adapter.previous_expires_at_ms,
        }
    }
}

#[tonic::async_trait]
impl pb::adapter_service_server::AdapterService for Adapters {
    #[tracing::instrument(name = "catalog.create_adapter", skip_all, fields(scope = %request.get_ref().scope, protocol = %request.get_ref().protocol))]
    async fn create_adapter(
        &self,
        request: Request<pb::CreateAdapterRequest>,
    ) -> Result<Response<pb::AdapterWithCredential>, Status> {
        let request = request.into_inner();
        let scope = Scope::parse(&request.scope)?;
        let protocol = Protocol::parse(&request.protocol).ok_or_else(|| {
            PlinthError::invalid(format!(
                "protocol: {:?} is not one of \"novo\", \"brain\"",
                request.protocol
            ))
        })?;
        let environment_id = EnvironmentId::parse(&request.environment_id).ok_or_else(|| {
            store_error(StoreError::NoSuchEnvironment, "", &request.environment_id)
        })?;
        let credential = Credential::new(protocol, &request.secret)?;
        let adapter = self
            .store
            .create_adapter(NewAdapter {
                scope,
                protocol,
                environment_id,
                stored_credential: credential.stored,
            })
            .await
            .map_err(|error| store_error(error, "", &request.environment_id))?;
        tracing::info!(id = %adapter.id, environment = %adapter.environment_id, "workspace adapter created");
        Ok(Response::new(pb::AdapterWithCredential {
            adapter: Some(adapter.into()),
            credential: credential.shown,
        }))
    }

    #[tracing::instrument(name = "catalog.get_adapter", skip_all, fields(scope = %request.get_ref().scope, id = %request.get_ref().id))]
    async fn get_adapter(
        &self,
        request: Request<pb::GetAdapterRequest>,
    ) -> Result<Response<pb::Adapter>, Status> {
        let request = request.into_inner();
        let scope = Scope::parse(&request.scope)?;
        let id = parse_id(&request.id)?;
        let adapter = self
            .store
            .get_adapter(&scope, &id)
            .await
            .map_err(|error| store_error(error, &request.id, ""))?;
        Ok(Response::new(adapter.into()))
    }

    #[tracing::instrument(name = "catalog.delete_adapter", skip_all, fields(scope = %request.get_ref().scope, id = %request.get_ref().id))]
    async fn delete_adapter(
        &self,
        request: Request<pb::DeleteAdapterRequest>,
    ) -> Result<Response<pb::DeleteAdapterResponse>, Status> {
        let request = request.into_inner();
        let scope = Scope::parse(&request.scope)?;
        let id = parse_id(&request.id)?;
        self.store
            .delete_adapter(&scope, &id)
            .await
            .map_err(|error| store_error(error, &request.id, ""))?;
        tracing::info!("workspace adapter deleted");
        Ok(Response::new(pb::DeleteAdapterResponse {}))
    }

    #[tracing::instrument(name = "catalog.rotate_adapter_credential", skip_all, fields(scope = %request.get_ref().scope, id = %request.get_ref().id))]
    async fn rotate_adapter_credential(
        &self,
        request: Request<pb::RotateAdapterCredentialRequest>,
    ) -> Result<Response<pb::AdapterWithCredential>, Status> {
        let request = request.into_inner();
        let scope = Scope::parse(&request.scope)?;
        let id = parse_id(&request.id)?;
        let existing = self
            .store
            .get_adapter(&scope, &id)
            .await
            .map_err(|error| store_error(error, &request.id, ""))?;
        let credential = Credential::new(existing.protocol, &request.secret)?;
        let grace_ms = i64::try_from(self.grace.as_millis()).unwrap_or(i64::MAX);
        let adapter = self
            .store
            .rotate_adapter(&scope, &id, &credential.stored, grace_ms)
            .await
            .map_err(|error| store_error(error, &request.id, ""))?;
        tracing::info!(
            previous_expires_at_ms = adapter.previous_expires_at_ms,
            "workspace adapter credential rotated"
        );
        Ok(Response::new(pb::AdapterWithCredential {
            adapter: Some(adapter.into()),
            credential: credential.shown,
        }))
    }

    #[tracing::instrument(name = "catalog.get_adapter_credentials", skip_all, fields(id = %request.get_ref().id))]
    async fn get_adapter_credentials(
        &self,
        request: Request<pb::GetAdapterCredentialsRequest>,
    ) -> Result<Response<pb::AdapterCredentials>, Status> {
        let request = request.into_inner();
        let id = parse_id(&request.id)?;
        let found = self
            .store
            .adapter_credentials(&id)
            .await
            .map_err(|error| store_error(error, &request.id, ""))?;
        Ok(Response::new(pb::AdapterCredentials {
            adapter: Some(found.adapter.into()),
            current: found.current,
            previous: found.previous.unwrap_or_default(),
        }))
    }
}
