//! The processes `plinth` runs: every service in one (`serve`), or one service each
//! (`catalog`, `gateway`). Services talk gRPC even inside one process, exactly as they do
//! across hosts, so `serve` exercises the same paths a cluster does.

use std::net::SocketAddr;

use anyhow::Context as _;
use plinth_catalog::CatalogOptions;
use plinth_gateway::GatewayOptions;
use plinth_kit::tasks::CancellationToken;
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tracing::Instrument as _;

use crate::config::Config;

/// A running set of services.
pub struct Running {
    /// Where REST is served (the gRPC address for `plinth catalog`).
    pub http_addr: SocketAddr,
    /// Where the catalog serves gRPC.
    pub catalog_addr: SocketAddr,
    /// Cancel to stop everything.
    pub shutdown: CancellationToken,
    services: JoinSet<(&'static str, anyhow::Result<()>)>,
}

impl Running {
    /// Waits until every service has stopped. A service that fails, or stops while nothing
    /// asked it to, stops the others; the first such error is returned.
    pub async fn wait(mut self) -> anyhow::Result<()> {
        let mut first_error = None;
        while let Some(joined) = self.services.join_next().await {
            let error = match joined {
                Ok((_, Ok(()))) if self.shutdown.is_cancelled() => continue,
                Ok((name, Ok(()))) => anyhow::anyhow!("{name} stopped unexpectedly"),
                Ok((name, Err(error))) => error.context(format!("{name} stopped")),
                Err(join) => anyhow::anyhow!("a service panicked: {join}"),
            };
            self.shutdown.cancel();
            first_error.get_or_insert(error);
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Stops everything and waits for it.
    pub async fn stop(self) -> anyhow::Result<()> {
        self.shutdown.cancel();
        self.wait().await
    }
}

/// Starts every service in this process: the catalog on its gRPC listener, the gateway on
/// `http`. The embedded database and object store live under `config.data_dir`.
pub async fn start_all(config: &Config, http: TcpListener) -> anyhow::Result<Running> {
    let blobs = config.data_dir.join("blobs");
    std::fs::create_dir_all(&blobs).with_context(|| {
        format!(
            "cannot create the data directory {}; choose another with --data-dir or PLINTH_DATA_DIR",
            config.data_dir.display()
        )
    })?;
    let catalog_listen = config
        .catalog
        .listen
        .context("catalog listen address is not resolved")?;
    let catalog_listener = TcpListener::bind(catalog_listen)
        .await
        .with_context(|| format!("cannot listen for the catalog on {catalog_listen}"))?;
    let shutdown = CancellationToken::new();
    let catalog_addr = catalog_listener.local_addr()?;
    let mut services = JoinSet::new();
    spawn_catalog(
        &mut services,
        config,
        catalog_listener,
        None,
        shutdown.clone(),
    )?;
    let http_addr = http.local_addr()?;
    spawn_gateway(
        &mut services,
        config,
        http,
        &format!("http://{catalog_addr}"),
        shutdown.clone(),
    )?;
    tracing::info!(%http_addr, %catalog_addr, data_dir = %config.data_dir.display(), "plinth serving");
    Ok(Running {
        http_addr,
        catalog_addr,
        shutdown,
        services,
    })
}

/// Starts the catalog alone.
pub async fn start_catalog(config: &Config) -> anyhow::Result<Running> {
    let listen = config
        .catalog
        .listen
        .context("catalog listen address is not resolved")?;
    if !listen.ip().is_loopback() && config.internal_token.is_none() {
        tracing::warn!(%listen, "the catalog listens beyond loopback without an internal token: anything that reaches it can act in any scope; set PLINTH_INTERNAL_TOKEN");
    }
    if let Some(url) = &config.catalog.database_url
        && url.starts_with("sqlite:")
    {
        std::fs::create_dir_all(&config.data_dir).with_context(|| {
            format!(
                "cannot create the data directory {}",
                config.data_dir.display()
            )
        })?;
    }
    let listener = TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen}"))?;
    let admin = match config.catalog.admin_listen {
        Some(address) => Some(
            TcpListener::bind(address)
                .await
                .with_context(|| format!("cannot listen on {address}"))?,
        ),
        None => None,
    };
    let shutdown = CancellationToken::new();
    let catalog_addr = listener.local_addr()?;
    let mut services = JoinSet::new();
    spawn_catalog(&mut services, config, listener, admin, shutdown.clone())?;
    Ok(Running {
        http_addr: catalog_addr,
        catalog_addr,
        shutdown,
        services,
    })
}

/// Starts the gateway alone.
pub async fn start_gateway(config: &Config) -> anyhow::Result<Running> {
    let listen = config.gateway.listen;
    let listener = TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen}"))?;
    let shutdown = CancellationToken::new();
    let http_addr = listener.local_addr()?;
    let mut services = JoinSet::new();
    spawn_gateway(
        &mut services,
        config,
        listener,
        &config.gateway.catalog_url,
        shutdown.clone(),
    )?;
    Ok(Running {
        http_addr,
        catalog_addr: http_addr,
        shutdown,
        services,
    })
}

type Services = JoinSet<(&'static str, anyhow::Result<()>)>;

fn spawn_catalog(
    services: &mut Services,
    config: &Config,
    listener: TcpListener,
    admin: Option<TcpListener>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let options = CatalogOptions {
        database_url: config
            .catalog
            .database_url
            .clone()
            .context("database URL is not resolved")?,
        max_connections: config.catalog.max_connections,
        internal_token: config.internal_token.clone(),
    };
    let result = async move {
        let result = plinth_catalog::run(options, listener, admin, shutdown).await;
        ("catalog", result.map_err(anyhow::Error::from))
    };
    services.spawn(result.instrument(tracing::Span::current()));
    Ok(())
}

fn spawn_gateway(
    services: &mut Services,
    config: &Config,
    listener: TcpListener,
    catalog_url: &str,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let channel = plinth_kit::grpc::connect_lazy(catalog_url)
        .with_context(|| format!("catalog URL {catalog_url:?} is not a valid http:// URL"))?;
    let options = GatewayOptions {
        environments: config.gateway.environments,
        tokens: config.token_scopes(),
        internal_token: config.internal_token.clone(),
    };
    let result = async move {
        let result = plinth_gateway::run(options, listener, channel, shutdown).await;
        ("gateway", result.map_err(anyhow::Error::from))
    };
    services.spawn(result.instrument(tracing::Span::current()));
    Ok(())
}
