//! The network (see the module documentation's heading of that name): a build's own
//! namespace with the egress proxy serving it, which reaches what it lets through directly or,
//! when the host has an upstream proxy, through that proxy (`CONNECT` to the checked address).

use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use plinth_sandbox::egress::{
    Connect, DEFAULT_PROXY_ADDR, EgressPolicy, Permitted, Proxy, SystemResolver,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::{CancellationToken, DropGuard};
use tracing::Instrument;

/// A build's network namespace and the egress proxy serving the socket in it, for as long as
/// the build runs.
pub(super) struct Egress {
    pub(super) netns: Arc<OwnedFd>,
    /// Stops the proxy when the build is over (or abandoned).
    _stop: DropGuard,
}

impl Egress {
    pub(super) async fn start(
        policy: Arc<EgressPolicy>,
        upstream: Option<Arc<Upstream>>,
        label: String,
    ) -> std::io::Result<Egress> {
        // Two short-lived threads (one makes the namespace, one listens in it): off the
        // runtime.
        let (netns, listener) = tokio::task::spawn_blocking(|| {
            let netns = plinth_sandbox::egress::new_namespace()?;
            let listener = plinth_sandbox::egress::listen_in(netns.as_fd(), DEFAULT_PROXY_ADDR)?;
            listener.set_nonblocking(true)?;
            std::io::Result::Ok((netns, listener))
        })
        .await
        .map_err(|join| std::io::Error::other(join.to_string()))??;
        let listener = tokio::net::TcpListener::from_std(listener)?;
        let stop = CancellationToken::new();
        let serving = stop.clone();
        plinth_kit::tasks::spawn(
            async move {
                let proxy = Proxy::new(label, policy, Arc::new(SystemResolver));
                let proxy = match upstream {
                    Some(upstream) => proxy.with_connector(upstream),
                    None => proxy,
                };
                proxy.serve(listener, serving).await;
            }
            .instrument(tracing::Span::current()),
        );
        Ok(Egress {
            netns: Arc::new(netns),
            _stop: stop.drop_guard(),
        })
    }
}

/// The host's upstream proxy (`builder.https_proxy`, `HTTPS_PROXY`): every connection the
/// egress proxy makes for a build, once its destination passed the policy, is a `CONNECT`
/// tunnel through it to the checked address. The build never reaches the upstream proxy
/// itself, nor anything the policy refuses.
#[derive(Debug)]
pub struct Upstream {
    /// `host:port` of the proxy.
    authority: String,
    /// `Proxy-Authorization` value, from the URL's user information.
    authorization: Option<String>,
}

/// The largest answer head read from the upstream proxy.
const UPSTREAM_HEAD_BYTES: usize = 16 * 1024;

/// Why an upstream proxy's URL is not one the egress proxy can use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UpstreamError {
    /// Another scheme than `http://` (an `https://` proxy is not supported).
    #[error("the upstream proxy must be an http:// URL")]
    NotHttp,
    /// No host between `http://` (and any user) and the path.
    #[error("the upstream proxy's URL names no host")]
    NoHost,
}

impl Upstream {
    /// The proxy of an `http://[user[:password]@]host[:port]` URL (port 80 when absent). Only
    /// plain-HTTP proxies: the tunnel's contents are TLS where the destination speaks it.
    pub fn parse(url: &str) -> Result<Upstream, UpstreamError> {
        let rest = url.strip_prefix("http://").ok_or(UpstreamError::NotHttp)?;
        let rest = rest.split(['/', '?', '#']).next().unwrap_or_default();
        let (userinfo, host) = match rest.rsplit_once('@') {
            Some((userinfo, host)) => (Some(userinfo), host),
            None => (None, rest),
        };
        if host.is_empty() {
            return Err(UpstreamError::NoHost);
        }
        let has_port = host
            .rsplit_once(':')
            .is_some_and(|(_, port)| !port.contains(']') && port.parse::<u16>().is_ok());
        let authority = if has_port {
            host.to_owned()
        } else {
            format!("{host}:80")
        };
        let authorization = userinfo.map(|userinfo| {
            let decoded = percent_decode(userinfo);
            format!("Basic {}", base64(decoded.as_bytes()))
        });
        Ok(Upstream {
            authority,
            authorization,
        })
    }

    async fn tunnel(&self, to: std::net::SocketAddr) -> std::io::Result<TcpStream> {
        let mut stream = TcpStream::connect(self.authority.as_str()).await?;
        let mut head = format!("CONNECT {to} HTTP/1.1\r\nHost: {to}\r\n");
        if let Some(authorization) = &self.authorization {
            head.push_str(&format!("Proxy-Authorization: {authorization}\r\n"));
        }
        head.push_str("\r\n");
        stream.write_all(head.as_bytes()).await?;
        // Byte by byte up to the blank line: nothing of the tunnel is read past the head.
        let mut answer = Vec::new();
        while !answer.ends_with(b"\r\n\r\n") {
            if answer.len() >= UPSTREAM_HEAD_BYTES {
                return Err(std::io::Error::other(
                    "the upstream proxy's answer is too long",
                ));
            }
            let mut byte = [0u8; 1];
            if stream.read(&mut byte).await? == 0 {
                return Err(std::io::Error::other(
                    "the upstream proxy closed the connection",
                ));
            }
            answer.push(byte[0]);
        }
        let line = String::from_utf8_lossy(&answer);
        let status = line.lines().next().unwrap_or_default().to_owned();
        let code = status.split_whitespace().nth(1).unwrap_or_default();
        if code.len() == 3 && code.starts_with('2') {
            Ok(stream)
        } else {
            Err(std::io::Error::other(format!(
                "the upstream proxy refused the tunnel: {status}"
            )))
        }
    }
}

impl Connect for Upstream {
    fn connect(
        &self,
        to: Permitted,
    ) -> std::pin::Pin<Box<dyn Future<Output = std::io::Result<TcpStream>> + Send + '_>> {
        Box::pin(self.tunnel(to.addr()))
    }
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        if bytes[index] == b'%'
            && let Some(byte) = text
                .get(index + 1..index + 3)
                .and_then(|hex| u8::from_str_radix(hex, 16).ok())
        {
            out.push(byte);
            index += 3;
            continue;
        }
        out.push(bytes[index]);
        index += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn base64(bytes: &[u8]) -> String {
    const TABLE: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let group = (u32::from(chunk[0]) << 16)
            | (u32::from(*chunk.get(1).unwrap_or(&0)) << 8)
            | u32::from(*chunk.get(2).unwrap_or(&0));
        for position in 0..4 {
            if position <= chunk.len() {
                out.push(char::from(
                    TABLE[((group >> (18 - 6 * position)) & 63) as usize],
                ));
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_proxy_urls_give_an_authority_and_credentials() {
        let plain = Upstream::parse("http://proxy.corp:3128/").expect("parse");
        assert_eq!(plain.authority, "proxy.corp:3128");
        assert!(plain.authorization.is_none());
        let default_port = Upstream::parse("http://proxy.corp").expect("parse");
        assert_eq!(default_port.authority, "proxy.corp:80");
        let with_user = Upstream::parse("http://Aladdin:open%20sesame@[::1]:8080").expect("parse");
        assert_eq!(with_user.authority, "[::1]:8080");
        assert_eq!(
            with_user.authorization.as_deref(),
            Some("Basic QWxhZGRpbjpvcGVuIHNlc2FtZQ==")
        );
        assert_eq!(
            Upstream::parse("https://proxy.corp").map(|_| ()),
            Err(UpstreamError::NotHttp)
        );
        assert_eq!(
            Upstream::parse("http://").map(|_| ()),
            Err(UpstreamError::NoHost)
        );
    }
}
