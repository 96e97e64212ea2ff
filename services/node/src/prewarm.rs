//! Versions fetched before any session asks: the catalog's heartbeat answer names the versions
//! to hold warm (every environment's active version, the most recently activated first), and
//! the node fetches those it lacks in the background, one at a time, each in its read order
//! (the files its first sessions read, first), while its cache has room under its budget.
//! Read orders are kept by the catalog ([`CatalogReadOrders`]).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use plinth_proto::catalog::v1 as pb;
use plinth_proto::catalog::v1::session_service_client::SessionServiceClient;
use tonic::service::interceptor::InterceptedService;

use crate::cache::{ReadOrders, VersionCache};

type Catalog = SessionServiceClient<
    InterceptedService<plinth_kit::grpc::Transport, plinth_kit::grpc::ClientInterceptor>,
>;

/// How long a read-order call to the catalog may take: it is never worth waiting for.
const ASK_WITHIN: Duration = Duration::from_secs(2);

/// Which environments a node holds warm (`node.prewarm`).
#[derive(Debug, Clone)]
pub struct Chosen(Vec<String>);

impl Chosen {
    /// `*`: every one the catalog lists; otherwise the ids and slugs named; empty: none.
    pub fn new(names: Vec<String>) -> Self {
        Chosen(names)
    }

    fn wants(&self, version: &pb::WarmVersion) -> bool {
        self.0
            .iter()
            .any(|name| name == "*" || *name == version.environment_id || *name == version.slug)
    }

    /// Whether it names none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Fetches, one at a time, the versions of the latest list it was given that the cache lacks,
/// while the cache has room. Runs until `list` closes.
pub async fn keep_warm(
    cache: Arc<VersionCache>,
    chosen: Chosen,
    mut list: tokio::sync::watch::Receiver<Vec<pb::WarmVersion>>,
) {
    loop {
        let wanted: Vec<pb::WarmVersion> = list
            .borrow_and_update()
            .iter()
            .filter(|version| chosen.wants(version))
            .cloned()
            .collect();
        metrics::gauge!("plinth_node_prewarm_listed").set(wanted.len() as f64);
        for version in wanted {
            if cache.holds(&version.environment_id, version.version) {
                continue;
            }
            if cache.blob_bytes() >= cache.cap_bytes() {
                metrics::counter!("plinth_node_prewarm_versions_total", "outcome" => "no_room")
                    .increment(1);
                tracing::info!(environment = %version.environment_id, version = version.version, "not pre-warming: the cache is at its budget (node.cache_max_bytes)");
                break;
            }
            match cache
                .materialize_in_order(
                    &version.environment_id,
                    version.version,
                    &version.layer_tree,
                )
                .await
            {
                Ok(done) => {
                    metrics::counter!("plinth_node_prewarm_versions_total", "outcome" => "fetched")
                        .increment(1);
                    metrics::counter!("plinth_node_prewarm_blobs_total").increment(done.fetched);
                    tracing::info!(environment = %version.environment_id, version = version.version, blobs = done.fetched, took_ms = done.took.as_millis() as u64, "pre-warmed a version");
                }
                Err(error) => {
                    metrics::counter!("plinth_node_prewarm_versions_total", "outcome" => "failed")
                        .increment(1);
                    tracing::warn!(environment = %version.environment_id, version = version.version, %error, "cannot pre-warm a version; its first session fetches it");
                }
            }
            // A newer list first.
            if list.has_changed().unwrap_or(false) {
                break;
            }
        }
        if list.changed().await.is_err() {
            return;
        }
    }
}

/// Read orders kept by the catalog; the node's id once it has registered.
#[derive(Clone)]
pub struct CatalogReadOrders {
    catalog: Catalog,
    node_id: Arc<Mutex<String>>,
}

impl CatalogReadOrders {
    /// Over `catalog`; `node_id` is filled in when the node registers.
    pub fn new(catalog: Catalog, node_id: Arc<Mutex<String>>) -> Self {
        CatalogReadOrders { catalog, node_id }
    }
}

impl ReadOrders for CatalogReadOrders {
    fn get(
        &self,
        environment: &str,
        version: u32,
    ) -> futures::future::BoxFuture<'static, Vec<String>> {
        let mut catalog = self.catalog.clone();
        let mut request = tonic::Request::new(pb::GetReadOrderRequest {
            environment_id: environment.to_owned(),
            version,
        });
        request.set_timeout(ASK_WITHIN);
        Box::pin(async move {
            match catalog.get_read_order(request).await {
                Ok(answer) => answer.into_inner().paths,
                Err(status) => {
                    tracing::debug!(error = %status.message(), "no read order from the catalog; fetching in tree order");
                    Vec::new()
                }
            }
        })
    }

    fn record(
        &self,
        environment: &str,
        version: u32,
        paths: Vec<String>,
    ) -> futures::future::BoxFuture<'static, ()> {
        let mut catalog = self.catalog.clone();
        let node_id = self
            .node_id
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        let environment = environment.to_owned();
        Box::pin(async move {
            let count = paths.len();
            let mut request = tonic::Request::new(pb::RecordReadOrderRequest {
                node_id,
                environment_id: environment.clone(),
                version,
                paths,
            });
            request.set_timeout(ASK_WITHIN);
            match catalog.record_read_order(request).await {
                Ok(answer) => {
                    tracing::info!(%environment, version, paths = count, stored = answer.into_inner().stored, "told the catalog what this version's sessions read first");
                }
                Err(status) => {
                    tracing::warn!(%environment, version, error = %status.message(), "cannot record a version's read order");
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn version(environment: &str, slug: &str) -> pb::WarmVersion {
        pb::WarmVersion {
            environment_id: environment.to_owned(),
            slug: slug.to_owned(),
            version: 1,
            layer_tree: String::new(),
        }
    }

    #[test]
    fn a_node_holds_warm_what_its_setting_names() {
        let (a, b) = (version("env_a", "alpha"), version("env_b", "beta"));
        let every = Chosen::new(vec!["*".into()]);
        assert!(every.wants(&a) && every.wants(&b));
        let named = Chosen::new(vec!["alpha".into(), "env_b".into()]);
        assert!(named.wants(&a) && named.wants(&b));
        let one = Chosen::new(vec!["beta".into()]);
        assert!(!one.wants(&a) && one.wants(&b));
        let none = Chosen::new(Vec::new());
        assert!(none.is_empty() && !none.wants(&a));
    }
}
