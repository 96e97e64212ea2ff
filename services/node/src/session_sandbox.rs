//! A session's running sandbox, as the node holds it: its keeper, cgroup and egress proxy.
//! `isolation` makes one; `spawn` starts commands inside it; dropping it ends all three. (The
//! mechanisms it is made of are the `plinth_sandbox` crate's.)

use plinth_sandbox::keeper::Keeper;

/// A session's running sandbox: its keeper (its namespaces and processes), its cgroup, and
/// the egress proxy listening inside its network namespace. Dropping it ends all three.
#[derive(Debug)]
pub struct Sandbox {
    /// The first process of its PID namespace.
    pub keeper: Keeper,
    /// Its limits (none on a node without cgroups).
    pub cgroup: Option<plinth_sandbox::cgroup::SessionCgroup>,
    /// Where its commands find the egress proxy, when it has one.
    pub proxy: Option<std::net::SocketAddr>,
    /// The proxy's listener, bound inside its network namespace, until the proxy serves it.
    pub listener: Option<std::net::TcpListener>,
    /// Stops the proxy.
    pub stop_proxy: plinth_kit::tasks::CancellationToken,
    /// Its part of its scope's CPU weight, until it ends.
    pub share: std::sync::Mutex<Option<crate::shares::Held>>,
    /// Its mount of a lazily served version, seen at `/env/<slug>` and served while it lives.
    pub version: Option<std::sync::Arc<crate::lazy::SessionMount>>,
}

impl Sandbox {
    /// Ends every process of the session and removes its cgroup. Blocks for as long as the
    /// kernel takes to empty the namespace.
    pub fn end(&self) {
        self.stop_proxy.cancel();
        drop(
            self.share
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .take(),
        );
        self.keeper.kill();
        if let Some(cgroup) = &self.cgroup
            && let Err(error) = cgroup.kill_all()
        {
            tracing::warn!(cgroup = cgroup.name(), %error, "cannot empty a session's cgroup");
        }
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        self.end();
        if let Some(cgroup) = self.cgroup.take() {
            let name = cgroup.name().to_owned();
            if let Err(error) = cgroup.remove() {
                tracing::warn!(cgroup = %name, %error, "cannot remove a session's cgroup");
            }
        }
    }
}
