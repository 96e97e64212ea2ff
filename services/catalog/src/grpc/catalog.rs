//! The gRPC face of environments, versions and builds (`plinth.catalog.v1.CatalogService`):
//! wire types are validated into domain types on receipt, the store does the work, and domain
//! types go back out. No rule lives here.

use std::sync::Arc;
use std::time::Duration;

use plinth_kit::auth::Principal;
use plinth_kit::clock::now_ms;
use plinth_kit::tasks::CancellationToken;
use plinth_kit::{ErrorCode, PlinthError};
use plinth_proto::catalog::v1 as pb;
use tokio::time::Instant;
use tonic::{Request, Response, Status};

use crate::background::wakeups::Wakeups;
use crate::domain::model::{
    Build, BuildStatus, Environment, EnvironmentChanges, EnvironmentId, EnvironmentStatus,
    LeaseToken, NewEnvironment, Outcome, Package, PackageManager, PageRequest, Scope, Toolchain,
    ToolchainName,
};
use crate::persistence::{LeasePolicy, Store, StoreError};

/// How long a `ClaimBuild` with nothing to hand out waits for a build before it answers empty
/// (a long poll). A builder hears of a build queued meanwhile at once (see `crate::background::wakeups`),
/// and of a lease that ran out when it runs out, so the wait can be long; it ends early when
/// the catalog stops.
const CLAIM_HOLD: Duration = Duration::from_secs(20);
/// How often a waiting `ClaimBuild` looks at the queue all the same while builds queued
/// through other catalogs are announced to nobody (PostgreSQL's listener not connected).
const CLAIM_RECHECK: Duration = Duration::from_millis(500);
/// How long after a lease's expiry a waiting claim looks again: the lease counts as expired
/// only once the clock is past it.
const EXPIRY_MARGIN_MS: i64 = 5;

/// The `plinth.catalog.v1.CatalogService` implementation.
pub struct Catalog {
    store: Store,
    leases: LeasePolicy,
    /// Wakes waiting `ClaimBuild` calls when a build is queued.
    wakeups: Arc<Wakeups>,
    /// Ends waiting `ClaimBuild` calls when the catalog stops.
    shutdown: CancellationToken,
}

impl Catalog {
    pub fn new(
        store: Store,
        leases: LeasePolicy,
        wakeups: Arc<Wakeups>,
        shutdown: CancellationToken,
    ) -> Self {
        Catalog {
            store,
            leases,
            wakeups,
            shutdown,
        }
    }

    /// Until when a claim that found nothing waits, at most `deadline`: sooner when the
    /// earliest running build's lease runs out (its builder may be dead), or, while some
    /// queuing may go unannounced, after [`CLAIM_RECHECK`].
    async fn wait_until(&self, deadline: Instant) -> Result<Instant, StoreError> {
        let now = Instant::now();
        let mut until = deadline;
        if !self.wakeups.complete() {
            until = until.min(now + CLAIM_RECHECK);
        }
        if let Some(expires_at_ms) = self.store.next_lease_expiry().await? {
            let in_ms = (expires_at_ms + EXPIRY_MARGIN_MS - now_ms()).max(EXPIRY_MARGIN_MS);
            until = until.min(now + Duration::from_millis(u64::try_from(in_ms).unwrap_or(0)));
        }
        Ok(until)
    }
}

fn store_error(error: StoreError, id: &str) -> PlinthError {
    match error {
        StoreError::Busy => PlinthError::new(
            ErrorCode::EnvironmentBusy,
            "a build of this environment is queued or running; wait for it to end",
        ),
        StoreError::NotReady(status) => PlinthError::new(
            ErrorCode::EnvironmentNotReady,
            format!(
                "the version is {}; only a ready version can be activated",
                status.as_str()
            ),
        ),
        StoreError::LeaseLost => PlinthError::new(
            ErrorCode::LeaseLost,
            "the lease expired or was handed to another builder; stop this build",
        ),
        StoreError::QuotaExceeded { quota, limit, used } => {
            plinth_kit::quota::exceeded(quota, limit, used)
        }
        StoreError::NotFound => PlinthError::not_found(format_args!("environment {id}")),
        StoreError::SlugTaken => PlinthError::new(
            ErrorCode::EnvironmentExists,
            "another environment in this scope already has this slug, and so its mount path; choose a different name",
        ),
        other => PlinthError::internal(&other),
    }
}

/// Errors about one version: a missing build is named by its version.
fn version_error(error: StoreError, id: &str, version: u32) -> PlinthError {
    match error {
        StoreError::NotFound => {
            PlinthError::not_found(format_args!("version {version} of environment {id}"))
        }
        other => store_error(other, id),
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
        )?
        .with_install(request.install)?;
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
        let request = request.into_inner();
        let scope = Scope::parse(&request.scope)?;
        let page = PageRequest::new(request.limit, &request.after)?;
        let page = self
            .store
            .list_environments_page(&scope, &page)
            .await
            .map_err(|error| store_error(error, ""))?;
        Ok(Response::new(pb::ListEnvironmentsResponse {
            environments: page.items.into_iter().map(Into::into).collect(),
            has_more: page.next.is_some(),
            next: page.next.map(|cursor| cursor.encode()).unwrap_or_default(),
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
        let changes = EnvironmentChanges::new(request.name, request.description, request.entry)?
            .with_install(request.install)?;
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

    #[tracing::instrument(name = "catalog.start_build", skip_all, fields(scope = %request.get_ref().scope, id = %request.get_ref().id))]
    async fn start_build(
        &self,
        request: Request<pb::StartBuildRequest>,
    ) -> Result<Response<pb::Build>, Status> {
        let request = request.into_inner();
        let scope = Scope::parse(&request.scope)?;
        let id = parse_id(&request.id)?;
        let build = self
            .store
            .start_build(&scope, &id, &request.source_tree, request.clean)
            .await
            .map_err(|error| store_error(error, &request.id))?;
        tracing::info!(version = build.version, "build queued");
        self.wakeups.wake();
        Ok(Response::new(build.into()))
    }

    #[tracing::instrument(name = "catalog.get_build", skip_all, fields(scope = %request.get_ref().scope, id = %request.get_ref().id))]
    async fn get_build(
        &self,
        request: Request<pb::GetBuildRequest>,
    ) -> Result<Response<pb::Build>, Status> {
        let request = request.into_inner();
        let scope = Scope::parse(&request.scope)?;
        let id = parse_id(&request.id)?;
        let build = self
            .store
            .get_build(&scope, &id, request.version)
            .await
            .map_err(|error| version_error(error, &request.id, request.version))?;
        Ok(Response::new(build.into()))
    }

    #[tracing::instrument(name = "catalog.read_build_log", skip_all, fields(scope = %request.get_ref().scope, id = %request.get_ref().id))]
    async fn read_build_log(
        &self,
        request: Request<pb::ReadBuildLogRequest>,
    ) -> Result<Response<pb::ReadBuildLogResponse>, Status> {
        let request = request.into_inner();
        let scope = Scope::parse(&request.scope)?;
        let id = parse_id(&request.id)?;
        let (text, next_offset, finished) = self
            .store
            .read_log(&scope, &id, request.version, request.offset)
            .await
            .map_err(|error| version_error(error, &request.id, request.version))?;
        Ok(Response::new(pb::ReadBuildLogResponse {
            text,
            next_offset,
            finished,
        }))
    }

    #[tracing::instrument(name = "catalog.activate_version", skip_all, fields(scope = %request.get_ref().scope, id = %request.get_ref().id))]
    async fn activate_version(
        &self,
        request: Request<pb::ActivateVersionRequest>,
    ) -> Result<Response<pb::Environment>, Status> {
        let request = request.into_inner();
        let scope = Scope::parse(&request.scope)?;
        let id = parse_id(&request.id)?;
        self.store
            .activate(&scope, &id, request.version)
            .await
            .map_err(|error| version_error(error, &request.id, request.version))?;
        let environment = self
            .store
            .get_environment(&scope, &id)
            .await
            .map_err(|error| store_error(error, &request.id))?;
        tracing::info!(version = request.version, "version activated");
        Ok(Response::new(environment.into()))
    }

    #[tracing::instrument(name = "catalog.claim_build", skip_all, fields(builder = %request.get_ref().builder))]
    async fn claim_build(
        &self,
        request: Request<pb::ClaimBuildRequest>,
    ) -> Result<Response<pb::ClaimBuildResponse>, Status> {
        let builder = &request.get_ref().builder;
        if let Some(caller) = Principal::of(&request)
            && !caller.may_act_as(builder)
        {
            return Err(Status::permission_denied(format!(
                "this credential is builder {:?}'s and claims builds for no other builder",
                caller.name.as_deref().unwrap_or_default()
            )));
        }
        let deadline = Instant::now() + CLAIM_HOLD;
        let claim = loop {
            // Listening before looking: a build queued between the two still wakes this call.
            let queued = self.wakeups.notified();
            tokio::pin!(queued);
            queued.as_mut().enable();
            let claim = self
                .store
                .claim_build(builder, self.leases)
                .await
                .map_err(|error| store_error(error, ""))?;
            if claim.is_some() || Instant::now() >= deadline || self.shutdown.is_cancelled() {
                break claim;
            }
            let until = self
                .wait_until(deadline)
                .await
                .map_err(|error| store_error(error, ""))?;
            tokio::select! {
                () = queued => {}
                () = tokio::time::sleep_until(until) => {}
                () = self.shutdown.cancelled() => {}
            }
        };
        Ok(Response::new(pb::ClaimBuildResponse {
            claim: claim.map(|claim| {
                tracing::info!(environment = %claim.build.environment_id, version = claim.build.version, attempt = claim.build.attempt, "build leased");
                pb::BuildClaim {
                    build: Some(claim.build.into()),
                    slug: claim.slug.as_str().to_owned(),
                    scope: claim.scope.as_str().to_owned(),
                    install: Some(claim.install.to_wire()),
                    lease_token: claim.token.as_str().to_owned(),
                    expires_at_ms: claim.expires_at_ms,
                    renew_every_ms: (self.leases.lease_ms / 3).max(1),
                }
            }),
        }))
    }

    #[tracing::instrument(name = "catalog.renew_lease", skip_all)]
    async fn renew_lease(
        &self,
        request: Request<pb::RenewLeaseRequest>,
    ) -> Result<Response<pb::RenewLeaseResponse>, Status> {
        let token = LeaseToken::from_wire(request.into_inner().lease_token);
        let expires_at_ms = self
            .store
            .heartbeat(&token, self.leases.lease_ms)
            .await
            .map_err(|error| store_error(error, ""))?;
        Ok(Response::new(pb::RenewLeaseResponse { expires_at_ms }))
    }

    #[tracing::instrument(name = "catalog.release_build", skip_all)]
    async fn release_build(
        &self,
        request: Request<pb::ReleaseBuildRequest>,
    ) -> Result<Response<pb::ReleaseBuildResponse>, Status> {
        let token = LeaseToken::from_wire(request.into_inner().lease_token);
        self.store
            .release_build(&token)
            .await
            .map_err(|error| store_error(error, ""))?;
        // Builders waiting for work hear of it as of a newly queued build.
        self.wakeups.wake();
        tracing::info!("a builder gave its build back to the queue");
        Ok(Response::new(pb::ReleaseBuildResponse {}))
    }

    #[tracing::instrument(name = "catalog.append_build_log", skip_all)]
    async fn append_build_log(
        &self,
        request: Request<pb::AppendBuildLogRequest>,
    ) -> Result<Response<pb::AppendBuildLogResponse>, Status> {
        let request = request.into_inner();
        let token = LeaseToken::from_wire(request.lease_token);
        let log_bytes = self
            .store
            .append_log(&token, &request.chunk)
            .await
            .map_err(|error| store_error(error, ""))?;
        Ok(Response::new(pb::AppendBuildLogResponse { log_bytes }))
    }

    #[tracing::instrument(name = "catalog.find_reusable", skip_all)]
    async fn find_reusable(
        &self,
        request: Request<pb::FindReusableRequest>,
    ) -> Result<Response<pb::FindReusableResponse>, Status> {
        let request = request.into_inner();
        let token = LeaseToken::from_wire(request.lease_token);
        let (whole, dependencies) = self
            .store
            .find_reusable(&token, &request.dependency_key)
            .await
            .map_err(|error| store_error(error, ""))?;
        let reusable = |build: Build| pb::ReusableBuild {
            environment_id: build.environment_id.as_str().to_owned(),
            version: build.version,
            layer_tree: build.layer_tree,
            packages: build.packages.iter().map(package).collect(),
            size: build.size,
            toolchains: build.toolchains.iter().map(toolchain).collect(),
        };
        Ok(Response::new(pb::FindReusableResponse {
            whole: whole.map(reusable),
            dependencies: dependencies.map(reusable),
        }))
    }

    #[tracing::instrument(name = "catalog.complete_build", skip_all)]
    async fn complete_build(
        &self,
        request: Request<pb::CompleteBuildRequest>,
    ) -> Result<Response<pb::Build>, Status> {
        let request = request.into_inner();
        let token = LeaseToken::from_wire(request.lease_token);
        let outcome = match request.outcome {
            Some(pb::complete_build_request::Outcome::Ready(ready)) => Outcome::Ready {
                dependency_key: ready.dependency_key,
                layer_tree: ready.layer_tree,
                packages: ready
                    .packages
                    .into_iter()
                    .map(|p| {
                        Ok(Package {
                            manager: PackageManager::from_wire(p.manager).map_err(|error| {
                                PlinthError::invalid(format!("packages[].manager: {error}"))
                            })?,
                            name: p.name,
                            version: p.version,
                        })
                    })
                    .collect::<Result<_, PlinthError>>()?,
                size: ready.size,
                toolchains: ready
                    .toolchains
                    .into_iter()
                    .map(|t| {
                        Ok(Toolchain {
                            name: ToolchainName::from_wire(t.name).map_err(|error| {
                                PlinthError::invalid(format!("toolchains[].name: {error}"))
                            })?,
                            version: t.version,
                            path: t.path,
                        })
                    })
                    .collect::<Result<_, PlinthError>>()?,
            },
            Some(pb::complete_build_request::Outcome::Failed(error)) => Outcome::Failed { error },
            None => return Err(PlinthError::invalid("outcome: ready or failed is required").into()),
        };
        let build = self
            .store
            .complete_build(&token, outcome)
            .await
            .map_err(|error| store_error(error, ""))?;
        tracing::info!(environment = %build.environment_id, version = build.version, status = build.status.as_str(), "build ended");
        // Its slot is free: a builder waiting while the scope was at its cap may take the next.
        self.wakeups.wake();
        Ok(Response::new(build.into()))
    }
}

fn build_status(status: BuildStatus) -> pb::BuildStatus {
    match status {
        BuildStatus::Queued => pb::BuildStatus::Queued,
        BuildStatus::Building => pb::BuildStatus::Building,
        BuildStatus::Ready => pb::BuildStatus::Ready,
        BuildStatus::Failed => pb::BuildStatus::Failed,
    }
}

fn package(package: &Package) -> pb::Package {
    pb::Package {
        manager: pb::PackageManager::from(package.manager).into(),
        name: package.name.clone(),
        version: package.version.clone(),
    }
}

fn toolchain(toolchain: &Toolchain) -> pb::Toolchain {
    pb::Toolchain {
        name: pb::ToolchainName::from(toolchain.name).into(),
        version: toolchain.version.clone(),
        path: toolchain.path.clone(),
    }
}

impl From<Build> for pb::Build {
    fn from(build: Build) -> Self {
        pb::Build {
            environment_id: build.environment_id.as_str().to_owned(),
            version: build.version,
            status: build_status(build.status).into(),
            source_tree: build.source_tree,
            layer_tree: build.layer_tree,
            error: build.error,
            packages: build.packages.iter().map(package).collect(),
            size: build.size,
            attempt: build.attempt,
            log_bytes: build.log_bytes,
            queued_at_ms: build.queued_at_ms,
            started_at_ms: build.started_at_ms,
            finished_at_ms: build.finished_at_ms,
            clean: build.clean,
            toolchains: build.toolchains.iter().map(toolchain).collect(),
        }
    }
}

impl From<Environment> for pb::Environment {
    fn from(environment: Environment) -> Self {
        let status = match environment.status() {
            EnvironmentStatus::Empty => pb::EnvironmentStatus::Empty,
            EnvironmentStatus::Building => pb::EnvironmentStatus::Building,
            EnvironmentStatus::Ready => pb::EnvironmentStatus::Ready,
            EnvironmentStatus::Failed => pb::EnvironmentStatus::Failed,
        };
        let packages = environment.packages().iter().map(package).collect();
        let versions = environment
            .builds
            .iter()
            .map(|build| pb::VersionSummary {
                version: build.version,
                status: build_status(build.status).into(),
                started_at_ms: build.started_at_ms,
                finished_at_ms: build.finished_at_ms,
                packages: u32::try_from(build.packages.len()).unwrap_or(u32::MAX),
                toolchains: build.toolchains.iter().map(toolchain).collect(),
            })
            .collect();
        let build = environment.builds.first().map(|build| pb::BuildSummary {
            version: build.version,
            status: build_status(build.status).into(),
            started_at_ms: build.started_at_ms,
            finished_at_ms: build.finished_at_ms,
            error: build.error.clone(),
        });
        pb::Environment {
            mount: environment.slug.mount(),
            id: environment.id.as_str().to_owned(),
            scope: environment.scope.as_str().to_owned(),
            name: environment.name,
            slug: environment.slug.as_str().to_owned(),
            description: environment.description,
            entry: environment.entry,
            install: Some(environment.install.to_wire()),
            status: status.into(),
            version: environment.active_version,
            latest_version: environment.latest_version,
            files: Some(pb::FileStats {
                count: environment.files_count,
                bytes: environment.files_bytes,
            }),
            packages,
            versions,
            build,
            created_at_ms: environment.created_at_ms,
            updated_at_ms: environment.updated_at_ms,
        }
    }
}
