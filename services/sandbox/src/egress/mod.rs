//! The network a sandbox is given: `none` (its own loopback only) or `egress` (the internet,
//! never the node's loopback services, private or link-local networks or a cloud metadata
//! address, unless the configuration allows one).
//!
//! Both start from a network namespace of the sandbox's own, which holds nothing but a
//! loopback interface. For `egress`, the node adds one thing to it: a listening socket on the
//! sandbox's loopback ([`listen_in`], by convention `127.0.0.1:3128`) that the node accepts
//! on and serves with a filtering HTTP proxy ([`serve`]). The proxy resolves the destination,
//! checks every address with the [`EgressPolicy`] and connects only to an address it checked.
//! [`proxy_env`] is what the sandbox's processes are told, so that package managers, `git` and
//! `curl` use it. This needs no netfilter, no virtual interface and no route: nothing leaves
//! the namespace except through that socket, on every kernel.
//!
//! What it does not give: UDP, ICMP, and DNS inside the sandbox (names are resolved by the
//! proxy); a tool that ignores the proxy variables reaches nothing. TLS passes through the
//! proxy's tunnels untouched: the policy is about addresses, not contents.
//!
//! - [`policy`]: the table of refused ranges and the configuration's `allow`/`deny` entries;
//! - [`proxy`]: the proxy server;
//! - [`netns`]: a new namespace, the socket inside it, bringing `lo` up, the node's own
//!   addresses.

pub mod netns;
pub mod policy;
pub mod proxy;

#[cfg(test)]
mod tests;

use std::net::SocketAddr;

pub use netns::{
    SpareNetwork, SpareNetworks, listen_in, loopback_up, new_namespace, node_addresses,
};
pub use policy::{Allow, Cidr, EgressPolicy, Host, Permitted, PolicyError, Reason, Refusal};
pub use proxy::{Connect, Limits, Proxy, Resolve, SystemResolver, TcpConnect, serve};

/// Where the proxy listens inside a sandbox unless the node says otherwise.
pub const DEFAULT_PROXY_ADDR: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 3128);

/// The environment that sends a sandbox's HTTP(S) through the proxy at `addr` (the socket
/// [`listen_in`] made, as the sandbox sees it), while the sandbox's own loopback stays
/// direct.
///
/// Who reads what:
/// - curl and git (libcurl): `http_proxy` in lower case only (the upper case one can be set
///   by a CGI request's `Proxy:` header), `HTTPS_PROXY`/`https_proxy`,
///   `ALL_PROXY`/`all_proxy`, `NO_PROXY`/`no_proxy`;
/// - pip (requests, urllib) and Python generally: either case of each;
/// - uv, cargo's registry client and Go programs: the upper or lower case names (Go ignores
///   `ALL_PROXY`);
/// - npm: its `proxy`, `https-proxy` and `noproxy` settings, which default to the variables
///   above; `npm_config_*` sets them outright in case a project's `.npmrc` names another;
/// - Yarn 2 and later: only its own `YARN_HTTP_PROXY`/`YARN_HTTPS_PROXY`.
pub fn proxy_env(addr: SocketAddr) -> Vec<(String, String)> {
    let url = format!("http://{addr}");
    let no_proxy = "localhost,127.0.0.1,::1";
    [
        ("http_proxy", url.as_str()),
        ("https_proxy", &url),
        ("HTTP_PROXY", &url),
        ("HTTPS_PROXY", &url),
        ("all_proxy", &url),
        ("ALL_PROXY", &url),
        ("no_proxy", no_proxy),
        ("NO_PROXY", no_proxy),
        ("npm_config_proxy", &url),
        ("npm_config_https_proxy", &url),
        ("npm_config_noproxy", no_proxy),
        ("YARN_HTTP_PROXY", &url),
        ("YARN_HTTPS_PROXY", &url),
    ]
    .into_iter()
    .map(|(name, value)| (name.to_owned(), value.to_owned()))
    .collect()
}
