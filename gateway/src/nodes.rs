//! Clients to node agents: transports by address, shared by the REST handlers, the workspace
//! adapters and terminals.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use plinth_kit::grpc::{ClientInterceptor, Internal, Transport};
use plinth_kit::{ErrorCode, PlinthError};
use plinth_proto::node::v1::node_service_client::NodeServiceClient;
use plinth_proto::node::v1::workspace_service_client::WorkspaceServiceClient;
use tonic::service::interceptor::InterceptedService;

use crate::error::ApiError;

/// Most bytes of a working-directory file through the API.
pub const MAX_SESSION_FILE_BYTES: usize = 64 * 1024 * 1024;

pub(crate) type WorkspaceClient =
    WorkspaceServiceClient<InterceptedService<Transport, ClientInterceptor>>;
type NodeClient = NodeServiceClient<InterceptedService<Transport, ClientInterceptor>>;

/// Transports to node agents, by address: those in this process given at the start, the
/// others channels made on first use and shared.
pub struct NodeClients {
    interceptor: ClientInterceptor,
    internal: Internal,
    channels: Mutex<HashMap<String, Transport>>,
}

impl NodeClients {
    /// Only `local` nodes known yet; every call carries `interceptor`'s credential, and
    /// `https://` nodes are reached with `internal`'s TLS.
    pub fn new(
        interceptor: ClientInterceptor,
        internal: Internal,
        local: Vec<(String, Transport)>,
    ) -> Self {
        NodeClients {
            interceptor,
            internal,
            channels: Mutex::new(local.into_iter().collect()),
        }
    }

    pub(crate) fn client(&self, address: &str) -> Result<NodeClient, ApiError> {
        Ok(
            NodeServiceClient::with_interceptor(self.channel(address)?, self.interceptor.clone())
                .max_decoding_message_size(Self::LIMIT)
                .max_encoding_message_size(Self::LIMIT),
        )
    }

    /// A workspace client for the node at `address` (the same channel).
    pub(crate) fn workspace(&self, address: &str) -> Result<WorkspaceClient, ApiError> {
        Ok(WorkspaceServiceClient::with_interceptor(
            self.channel(address)?,
            self.interceptor.clone(),
        )
        .max_decoding_message_size(Self::LIMIT)
        .max_encoding_message_size(Self::LIMIT))
    }

    const LIMIT: usize = MAX_SESSION_FILE_BYTES + 64 * 1024;

    fn channel(&self, address: &str) -> Result<Transport, ApiError> {
        let mut channels = self
            .channels
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let channel = match channels.get(address) {
            Some(channel) => channel.clone(),
            None => {
                let channel = self
                    .internal
                    .connect(address)
                    .map(Transport::remote)
                    .map_err(|error| {
                        PlinthError::new(
                            ErrorCode::Unavailable,
                            format!("the session's node ({address}) cannot be reached: {error}"),
                        )
                    })?;
                channels.insert(address.to_owned(), channel.clone());
                channel
            }
        };
        Ok(channel)
    }
}

/// Shared handle to node channels.
pub type Nodes = Arc<NodeClients>;
