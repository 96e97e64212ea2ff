//! What every request path shares below the REST resources and the agent adapters: the
//! clients of the services behind, node clients and placement, live sessions, limits, and
//! the claim-holding loop of the catalog's ledger.

pub(crate) mod ledger;
pub mod limits;
pub(crate) mod live;
pub(crate) mod nodes;
pub(crate) mod recent;

use std::sync::Arc;

use plinth_kit::grpc::{ClientInterceptor, Transport};
use plinth_proto::catalog::v1::adapter_service_client::AdapterServiceClient;
use plinth_proto::catalog::v1::brain_service_client::BrainServiceClient;
use plinth_proto::catalog::v1::catalog_service_client::CatalogServiceClient;
use plinth_proto::catalog::v1::harness_service_client::HarnessServiceClient;
use plinth_proto::catalog::v1::quota_service_client::QuotaServiceClient;
use plinth_proto::catalog::v1::replay_memory_service_client::ReplayMemoryServiceClient;
use plinth_proto::catalog::v1::request_key_service_client::RequestKeyServiceClient;
use plinth_proto::catalog::v1::session_service_client::SessionServiceClient;
use plinth_proto::source::v1::source_service_client::SourceServiceClient;
use tonic::service::interceptor::InterceptedService;

/// The largest message to and from the catalog's `RequestKeyService`, as it takes them.
pub(crate) const REQUEST_KEY_MESSAGE_BYTES: usize = 16 * 1024 * 1024;
/// Largest message to and from the catalog's Brain ledger (a receipt holds a tool's output).
pub(crate) const BRAIN_MESSAGE_BYTES: usize = 12 * 1024 * 1024;

type Channel = InterceptedService<Transport, ClientInterceptor>;
pub(crate) type CatalogClient = CatalogServiceClient<Channel>;
pub(crate) type SourceClient = SourceServiceClient<Channel>;
pub(crate) type HarnessClient = HarnessServiceClient<Channel>;
pub(crate) type SessionClient = SessionServiceClient<Channel>;
pub(crate) type BrainClient = BrainServiceClient<Channel>;
pub(crate) type AdapterClient = AdapterServiceClient<Channel>;
pub(crate) type ReplayClient = ReplayMemoryServiceClient<Channel>;
pub(crate) type QuotaClient = QuotaServiceClient<Channel>;
pub(crate) type RequestKeyClient = RequestKeyServiceClient<Channel>;

/// The clients of the services behind the gateway; each accessor hands out a client for one
/// request, and clones share the channel.
#[derive(Clone)]
pub(crate) struct Services {
    catalog: CatalogClient,
    harnesses: HarnessClient,
    sessions: SessionClient,
    brain: BrainClient,
    adapters: AdapterClient,
    replays: ReplayClient,
    quotas: QuotaClient,
    request_keys: RequestKeyClient,
    source: SourceClient,
}

impl Services {
    /// Clients of the catalog's services on `catalog` and of the source service on `source`,
    /// each call carrying `interceptor`'s credential.
    pub(crate) fn new(
        catalog: &Transport,
        source: &Transport,
        interceptor: &ClientInterceptor,
    ) -> Services {
        let on_catalog = || InterceptedService::new(catalog.clone(), interceptor.clone());
        Services {
            catalog: CatalogServiceClient::new(on_catalog()),
            harnesses: HarnessServiceClient::new(on_catalog()),
            sessions: SessionServiceClient::new(on_catalog()),
            replays: ReplayMemoryServiceClient::new(on_catalog()),
            adapters: AdapterServiceClient::new(on_catalog()),
            quotas: QuotaServiceClient::new(on_catalog()),
            request_keys: RequestKeyServiceClient::new(on_catalog())
                .max_decoding_message_size(REQUEST_KEY_MESSAGE_BYTES)
                .max_encoding_message_size(REQUEST_KEY_MESSAGE_BYTES),
            brain: BrainServiceClient::new(on_catalog())
                .max_decoding_message_size(BRAIN_MESSAGE_BYTES)
                .max_encoding_message_size(BRAIN_MESSAGE_BYTES),
            source: SourceServiceClient::new(InterceptedService::new(
                source.clone(),
                interceptor.clone(),
            ))
            .max_decoding_message_size(4 * 1024 * 1024),
        }
    }

    /// The catalog's environments, versions and builds.
    pub(crate) fn catalog(&self) -> CatalogClient {
        self.catalog.clone()
    }

    /// The catalog's harnesses.
    pub(crate) fn harnesses(&self) -> HarnessClient {
        self.harnesses.clone()
    }

    /// The catalog's sessions and turns.
    pub(crate) fn sessions(&self) -> SessionClient {
        self.sessions.clone()
    }

    /// Novo's replay memory, in the catalog.
    pub(crate) fn replays(&self) -> ReplayClient {
        self.replays.clone()
    }

    /// Workspace adapters, in the catalog.
    pub(crate) fn adapters(&self) -> AdapterClient {
        self.adapters.clone()
    }

    /// Quotas and usage, in the catalog.
    pub(crate) fn quotas(&self) -> QuotaClient {
        self.quotas.clone()
    }

    /// The tenant API's idempotency keys, in the catalog.
    pub(crate) fn request_keys(&self) -> RequestKeyClient {
        self.request_keys.clone()
    }

    /// The Brain operation ledger, in the catalog.
    pub(crate) fn brain(&self) -> BrainClient {
        self.brain.clone()
    }

    /// The source service: files, imports, layers.
    pub(crate) fn source(&self) -> SourceClient {
        self.source.clone()
    }
}

/// Running sessions: where they are, how to reach their node, and what they may use.
#[derive(Clone)]
pub(crate) struct Runtime {
    pub(crate) services: Services,
    pub(crate) nodes: nodes::Nodes,
    pub(crate) live: Arc<live::LiveSessions>,
    /// Sessions' limits: the default and maximum of each.
    pub(crate) session_limits: limits::LimitPolicy,
}

impl Runtime {
    /// The catalog's sessions and turns.
    pub(crate) fn sessions(&self) -> SessionClient {
        self.services.sessions()
    }

    /// The catalog's harnesses.
    pub(crate) fn harnesses(&self) -> HarnessClient {
        self.services.harnesses()
    }
}
