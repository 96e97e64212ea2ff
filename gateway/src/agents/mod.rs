//! The workspace adapters agent runtimes call: Novo's signed dispatch and Brain's
//! `environment/v1` operations over one tool engine, the adapters' credentials and rates, and
//! their management routes.

pub(crate) mod adapters;
pub(crate) mod brain;
pub(crate) mod novo;
pub(crate) mod tools;

use std::sync::Arc;

use crate::runtime::{AdapterClient, BrainClient, ReplayClient, Runtime, SessionClient};

/// What the adapters' handlers reach: the session runtime, and the adapters' own state.
#[derive(Clone)]
pub(crate) struct Agents {
    pub(crate) runtime: Runtime,
    pub(crate) brain_runtime: Arc<brain::Runtime>,
    /// Adapters' credentials as the catalog answered them in the last second.
    pub(crate) adapter_credentials: Arc<adapters::Credentials>,
    /// Each adapter's rate of calls on this gateway.
    pub(crate) adapter_rates: Arc<adapters::AdapterRates>,
    pub(crate) novo: novo::NovoOptions,
    /// The gateway's root URL as agent runtimes reach it, if configured.
    pub(crate) public_url: Option<String>,
}

impl Agents {
    /// Workspace adapters, in the catalog.
    pub(crate) fn adapters(&self) -> AdapterClient {
        self.runtime.services.adapters()
    }

    /// The Brain operation ledger, in the catalog.
    pub(crate) fn brain(&self) -> BrainClient {
        self.runtime.services.brain()
    }

    /// Novo's replay memory, in the catalog.
    pub(crate) fn replays(&self) -> ReplayClient {
        self.runtime.services.replays()
    }

    /// The catalog's sessions and turns.
    pub(crate) fn sessions(&self) -> SessionClient {
        self.runtime.sessions()
    }
}
