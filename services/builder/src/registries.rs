//! How installers reach package registries on a real network: the certificate authority a
//! network's TLS inspection or private mirror uses, its proxies, and private indexes.
//!
//! Installers run with an explicit environment (nothing of the builder's own is inherited), so
//! every setting they need is passed on here, under each installer's own names: uv, pip, npm,
//! git and curl each read different variables for the same thing. The certificate bundle is a
//! copy the builder placed where the build user can read it ([`crate::tools::place_ca_bundle`]):
//! the file the setting names may sit under a home directory or `/tmp` the sandbox hides.
//!
//! When an installer fails on a certificate, a proxy or an unreachable registry, [`hint`]
//! names the setting to look at and what the build used, so the error says what to do.

use std::path::PathBuf;

use crate::sandbox::Network;

/// The public registries builds reach by name when they have the network (over HTTPS):
/// PyPI's index and its files, and npm's registry (which serves its tarballs too).
pub const PUBLIC_REGISTRIES: &[&str] =
    &["pypi.org", "files.pythonhosted.org", "registry.npmjs.org"];

/// A registry setting's URL builds cannot be let out to: not `http://` or `https://`, or
/// naming no host.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{url} is not an http:// or https:// URL with a host")]
pub struct NotARegistryUrl {
    /// The URL as set, any password in it redacted.
    pub url: String,
}

/// What builds use to reach registries. Every value is optional: an absent one leaves the
/// installers' own default (the public registries, the system's certificate authorities).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Registries {
    /// A PEM bundle of trusted certificate authorities, as the sandbox sees it: in the tools
    /// directory (`crate::tools::place_ca_bundle`) or a system directory, which builds are shown.
    pub ca_bundle: Option<PathBuf>,
    /// The proxy for HTTPS requests (`http://proxy.internal:3128`).
    pub https_proxy: Option<String>,
    /// The proxy for plain HTTP requests.
    pub http_proxy: Option<String>,
    /// Hosts reached without a proxy (comma-separated, as `NO_PROXY`).
    pub no_proxy: Option<String>,
    /// The Python package index used instead of PyPI.
    pub python_index_url: Option<String>,
    /// Further Python indexes searched after it.
    pub python_extra_index_urls: Vec<String>,
    /// The npm registry used instead of the public one.
    pub npm_registry: Option<String>,
}

impl Registries {
    /// Where builds must be able to go, as egress `allow` entries (`host:port`, see
    /// [`plinth_sandbox::egress::Allow`]): each [`PUBLIC_REGISTRIES`] on 443, and the host of
    /// each configured index and registry on its URL's port. Allowed by name, so whatever the
    /// builder's resolver answers for them is reached, a mirror on a private address included;
    /// an error names a URL without a host or with a scheme other than `http` and `https`.
    pub fn egress_allow(&self) -> Result<Vec<String>, NotARegistryUrl> {
        let mut entries: Vec<String> = PUBLIC_REGISTRIES
            .iter()
            .map(|host| format!("{host}:443"))
            .collect();
        for url in self
            .python_index_url
            .iter()
            .chain(&self.python_extra_index_urls)
            .chain(&self.npm_registry)
        {
            let entry = host_and_port(url).ok_or_else(|| NotARegistryUrl {
                url: plinth_kit::config::redact_url(url),
            })?;
            if !entries.contains(&entry) {
                entries.push(entry);
            }
        }
        Ok(entries)
    }

    /// The variables that tell uv, pip, npm, git and curl about these settings.
    pub fn env(&self) -> Vec<(String, String)> {
        let mut env = Vec::new();
        let mut set = |names: &[&str], value: &str| {
            for name in names {
                env.push(((*name).to_owned(), value.to_owned()));
            }
        };
        if let Some(bundle) = &self.ca_bundle {
            let bundle = bundle.to_string_lossy();
            set(
                &[
                    "SSL_CERT_FILE",
                    "REQUESTS_CA_BUNDLE",
                    "PIP_CERT",
                    "CURL_CA_BUNDLE",
                    "GIT_SSL_CAINFO",
                    "NODE_EXTRA_CA_CERTS",
                    "npm_config_cafile",
                ],
                &bundle,
            );
        }
        if let Some(proxy) = &self.https_proxy {
            set(
                &["HTTPS_PROXY", "https_proxy", "npm_config_https_proxy"],
                proxy,
            );
        }
        if let Some(proxy) = &self.http_proxy {
            set(&["HTTP_PROXY", "http_proxy", "npm_config_proxy"], proxy);
        }
        if let Some(hosts) = &self.no_proxy {
            set(&["NO_PROXY", "no_proxy", "npm_config_noproxy"], hosts);
        }
        if let Some(index) = &self.python_index_url {
            set(&["UV_INDEX_URL", "PIP_INDEX_URL"], index);
        }
        if !self.python_extra_index_urls.is_empty() {
            let extra = self.python_extra_index_urls.join(" ");
            set(&["UV_EXTRA_INDEX_URL", "PIP_EXTRA_INDEX_URL"], &extra);
        }
        if let Some(registry) = &self.npm_registry {
            set(&["npm_config_registry"], registry);
        }
        env
    }
}

/// `host:port` of an `http` or `https` URL (the scheme's port when it names none), without its
/// credentials; an IPv6 host stays bracketed.
fn host_and_port(url: &str) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    let default = match scheme.to_ascii_lowercase().as_str() {
        "https" => 443,
        "http" => 80,
        _ => return None,
    };
    let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
    let authority = authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host);
    let (host, port) = match authority.rsplit_once(':') {
        // `[::1]` alone has colons but no port after its bracket.
        Some((host, port)) if !port.contains(']') => (host, port.parse::<u16>().ok()?),
        _ => (authority, default),
    };
    (!host.is_empty() && port != 0).then(|| format!("{}:{port}", host.to_ascii_lowercase()))
}

/// What went wrong, as far as an installer's output tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Trouble {
    Certificate,
    Proxy,
    Unreachable,
}

/// Phrases uv (rustls), pip (OpenSSL), npm (Node) and git (curl) print for each kind of
/// trouble, lowercased.
const CERTIFICATE: &[&str] = &[
    "unknownissuer",
    "invalid peer certificate",
    "certificate verify failed",
    "self signed certificate",
    "self-signed certificate",
    "unable to get local issuer certificate",
    "unable_to_get_issuer_cert",
    "unable to verify the first certificate",
    "ssl certificate problem",
    "server certificate verification failed",
];
const PROXY: &[&str] = &[
    "plinth egress:",
    "unsuccessful tunnel",
    "tunnel error",
    "proxyerror",
    "proxy error",
    "tunnel connection failed",
    "proxy authentication required",
    "failed to connect to proxy",
    "unable to connect to proxy",
    "could not resolve proxy",
];
const UNREACHABLE: &[&str] = &[
    "failed to lookup address",
    "temporary failure in name resolution",
    "name or service not known",
    "getaddrinfo",
    "code enotfound",
    "eai_again",
    "could not resolve host",
    "network is unreachable",
    "code enetunreach",
    "failed to establish a new connection",
    "connection refused",
    "code econnrefused",
    "dns error",
];

fn trouble(output: &str) -> Option<Trouble> {
    let output = output.to_ascii_lowercase();
    let said = |phrases: &[&str]| phrases.iter().any(|phrase| output.contains(phrase));
    if said(CERTIFICATE) {
        Some(Trouble::Certificate)
    } else if said(PROXY) {
        Some(Trouble::Proxy)
    } else if said(UNREACHABLE) {
        Some(Trouble::Unreachable)
    } else {
        None
    }
}

/// A line naming the setting to look at, when `output` (a failed installer's) shows a
/// certificate, proxy or reachability failure; `network` is what the build was given.
pub fn hint(registries: &Registries, network: &Network, output: &str) -> Option<String> {
    let offline = matches!(network, Network::None);
    let egress = matches!(network, Network::Join(_));
    let shown = |value: &Option<String>| match value {
        Some(value) => plinth_kit::config::redact_url(value),
        None => "not set".to_owned(),
    };
    let text = match trouble(output)? {
        Trouble::Certificate => format!(
            "a registry's certificate was not trusted. If this network reaches registries \
             through its own certificate authority, set builder.ca_bundle (or SSL_CERT_FILE in \
             the builder's environment) to its PEM bundle; builds used {}",
            match &registries.ca_bundle {
                Some(bundle) => format!("the bundle {}", bundle.display()),
                None => "the installers' default authorities".to_owned(),
            }
        ),
        Trouble::Proxy | Trouble::Unreachable
            if egress && (registries.https_proxy.is_some() || registries.http_proxy.is_some()) =>
        {
            format!(
                "builds reach the network through the egress proxy, which goes on through the \
                 upstream proxy: check builder.https_proxy and builder.http_proxy (or HTTPS_PROXY \
                 and HTTP_PROXY in the builder's environment), which must be reachable from the \
                 builder and allow CONNECT; builds used https_proxy: {}, http_proxy: {}. The \
                 egress proxy also refuses loopback, private, link-local and metadata addresses \
                 except the package registries and builder.egress_allow",
                shown(&registries.https_proxy),
                shown(&registries.http_proxy)
            )
        }
        Trouble::Proxy | Trouble::Unreachable if egress => "builds reach the network only \
             through the egress proxy (HTTPS_PROXY in their environment), which refuses \
             loopback, private, link-local and metadata addresses and the node's own, except \
             for the package registries (pypi.org, files.pythonhosted.org, registry.npmjs.org, \
             the configured builder.python_index_url, builder.python_extra_index_urls and \
             builder.npm_registry) and builder.egress_allow: add a host builds need there (a \
             private mirror); a tool that ignores the proxy variables reaches nothing"
            .to_owned(),
        Trouble::Proxy => format!(
            "the proxy failed. Check builder.https_proxy and builder.http_proxy (or HTTPS_PROXY \
             and HTTP_PROXY in the builder's environment) and builder.no_proxy; builds used \
             https_proxy: {}, http_proxy: {}",
            shown(&registries.https_proxy),
            shown(&registries.http_proxy)
        ),
        Trouble::Unreachable if offline => "a registry was needed, and builds have no network \
             (builder.network = false): add the packages to the project (wheels, `file:` \
             packages), or turn builder.network on"
            .to_owned(),
        Trouble::Unreachable => format!(
            "a registry could not be reached. Behind a proxy, set builder.https_proxy (or \
             HTTPS_PROXY in the builder's environment); for a private mirror, \
             builder.python_index_url or builder.npm_registry. Builds used https_proxy: {}, \
             python_index_url: {}, npm_registry: {}",
            shown(&registries.https_proxy),
            shown(&registries.python_index_url),
            shown(&registries.npm_registry)
        ),
    };
    Some(format!("hint: {text}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_installer_hears_of_each_setting_under_its_own_name() {
        let registries = Registries {
            ca_bundle: Some(PathBuf::from("/var/lib/plinth/tools/ca-bundle.pem")),
            https_proxy: Some("http://proxy:3128".to_owned()),
            http_proxy: None,
            no_proxy: Some("localhost,.internal".to_owned()),
            python_index_url: Some("https://pypi.internal/simple".to_owned()),
            python_extra_index_urls: vec![
                "https://a/simple".to_owned(),
                "https://b/simple".to_owned(),
            ],
            npm_registry: Some("https://npm.internal/".to_owned()),
        };
        let env = registries.env();
        let get = |name: &str| {
            env.iter()
                .find(|(key, _)| key == name)
                .map(|(_, value)| value.as_str())
        };
        for name in [
            "SSL_CERT_FILE",
            "PIP_CERT",
            "NODE_EXTRA_CA_CERTS",
            "npm_config_cafile",
        ] {
            assert_eq!(
                get(name),
                Some("/var/lib/plinth/tools/ca-bundle.pem"),
                "{name}"
            );
        }
        assert_eq!(get("https_proxy"), Some("http://proxy:3128"));
        assert_eq!(get("npm_config_https_proxy"), Some("http://proxy:3128"));
        assert_eq!(get("HTTP_PROXY"), None);
        assert_eq!(get("no_proxy"), Some("localhost,.internal"));
        assert_eq!(get("UV_INDEX_URL"), Some("https://pypi.internal/simple"));
        assert_eq!(
            get("PIP_EXTRA_INDEX_URL"),
            Some("https://a/simple https://b/simple")
        );
        assert_eq!(get("npm_config_registry"), Some("https://npm.internal/"));
        assert!(Registries::default().env().is_empty());
    }

    #[test]
    fn builds_may_reach_the_public_registries_and_each_configured_one_on_its_port() {
        assert_eq!(
            Registries::default().egress_allow(),
            Ok(vec![
                "pypi.org:443".to_owned(),
                "files.pythonhosted.org:443".to_owned(),
                "registry.npmjs.org:443".to_owned(),
            ])
        );
        let registries = Registries {
            python_index_url: Some("https://user:secret@Pypi.Internal/simple".to_owned()),
            python_extra_index_urls: vec![
                "http://10.0.0.5:3141/root/pypi/+simple/".to_owned(),
                "https://[fd00::5]:8443/simple".to_owned(),
                "https://pypi.org/simple".to_owned(),
            ],
            npm_registry: Some("http://npm.internal?x=1".to_owned()),
            ..Registries::default()
        };
        let allowed = registries.egress_allow().expect("entries");
        assert_eq!(
            allowed[3..],
            [
                "pypi.internal:443",
                "10.0.0.5:3141",
                "[fd00::5]:8443",
                "npm.internal:80"
            ]
        );
        for entry in &allowed {
            assert!(
                entry.parse::<plinth_sandbox::egress::Allow>().is_ok(),
                "{entry}"
            );
        }
        let bad = Registries {
            npm_registry: Some("ftp://user:secret@npm.internal".to_owned()),
            ..Registries::default()
        };
        let error = bad.egress_allow().expect_err("not http");
        assert!(!format!("{error} {error:?}").contains("secret"), "{error}");
        assert!(error.url.ends_with("@npm.internal"), "{error}");
    }

    #[test]
    fn a_failure_names_the_setting_to_look_at_and_hides_credentials() {
        let registries = Registries {
            https_proxy: Some("http://user:hunter2@proxy:3128".to_owned()),
            ..Registries::default()
        };
        let uv = "error: Request failed after 3 retries\n  Caused by: invalid peer certificate: UnknownIssuer";
        let said = hint(&registries, &Network::Host, uv).expect("a certificate hint");
        assert!(said.contains("builder.ca_bundle"), "{said}");
        let npm = "npm error code ECONNREFUSED\nnpm error errno ECONNREFUSED";
        let said = hint(&registries, &Network::Host, npm).expect("a reachability hint");
        assert!(said.contains("builder.https_proxy"), "{said}");
        assert!(!said.contains("hunter2"), "{said}");
        let said = hint(&registries, &Network::None, npm).expect("an offline hint");
        assert!(said.contains("builder.network = false"), "{said}");
        let pip = "ProxyError('Cannot connect to proxy.', OSError('Tunnel connection failed: 407 Proxy Authentication Required'))";
        assert!(
            hint(&registries, &Network::Host, pip)
                .expect("a proxy hint")
                .contains("builder.http_proxy")
        );
        assert_eq!(
            hint(
                &registries,
                &Network::Host,
                "ModuleNotFoundError: No module named 'x'"
            ),
            None
        );
        // Through the egress proxy, a refusal names builder.egress_allow.
        let netns = std::sync::Arc::new(
            rustix::fs::open(
                "/proc/self/ns/net",
                rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
                rustix::fs::Mode::empty(),
            )
            .expect("our network namespace"),
        );
        let refused = "ERROR: Could not install packages due to an OSError: \
            HTTPSConnectionPool(host='mirror.example', port=443): Max retries exceeded \
            (Caused by ProxyError('Unable to connect to proxy', OSError('Tunnel connection \
            failed: 403 Forbidden')))";
        let said =
            hint(&registries, &Network::Join(netns.clone()), refused).expect("an egress hint");
        assert!(said.contains("builder.egress_allow"), "{said}");
        // Behind an upstream proxy the egress proxy chains to, a failed tunnel names the
        // upstream's settings, its credentials redacted.
        let upstream = Registries {
            https_proxy: Some("http://user:secret@proxy.internal:3128".to_owned()),
            ..registries.clone()
        };
        let uv = "error: Request failed after 3 retries\n  cause: client error (Connect)\n  \
            cause: tunnel error: unsuccessful";
        let said = hint(&upstream, &Network::Join(netns), uv).expect("an upstream proxy hint");
        assert!(said.contains("builder.https_proxy"), "{said}");
        assert!(said.contains("builder.egress_allow"), "{said}");
        assert!(!said.contains("secret"), "{said}");
    }
}
