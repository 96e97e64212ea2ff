//! Where a git fetch may connect, and what the `git` program is told so that it connects
//! there and nowhere else.
//!
//! A URL's host is resolved once, here, and every address it gives is judged; `git` is then
//! handed those addresses (`http.curloptResolve`), so a name that answers a public address to
//! the check and loopback to the fetch (DNS rebinding) still only reaches the public one.
//!
//! Which addresses are public is the sandbox's table of what is not the internet
//! ([`plinth_sandbox::egress::policy::refusal`]: loopback, RFC 1918, link-local, shared,
//! benchmarking, documentation, reserved, multicast, broadcast, unique-local, and IPv4-mapped,
//! -translated and -compatible forms judged by the IPv4 address inside), with one rule more:
//! an address that hands the connection on to another network (NAT64, 6to4, Teredo) is
//! refused whatever it leads to. A fetch is made by this service itself, beside its own
//! network, so where a translator would take it is not something to guess at.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use plinth_sandbox::egress::policy::{Embedding, Verdict, range_of};

pub use plinth_sandbox::egress::{Resolve, SystemResolver};

/// Says why an address may not be fetched from, or `None` when it is public. The service
/// uses [`refusal`]; a test may declare the address of a network it made public.
pub type Classify = Arc<dyn Fn(IpAddr) -> Option<String> + Send + Sync>;

/// Why `ip` is not a public address, or `None` when it is.
pub fn refusal(ip: IpAddr) -> Option<String> {
    if let (IpAddr::V6(v6), Some(range)) = (ip, range_of(ip))
        && let Verdict::Embeds(
            embedding @ (Embedding::Nat64 | Embedding::SixToFour | Embedding::Teredo),
        ) = range.verdict
    {
        return Some(format!(
            "{v6} is a {embedding} address, which hands the connection on to another network"
        ));
    }
    plinth_sandbox::egress::policy::refusal(ip).map(|refusal| refusal.to_string())
}

/// A URL host as `git` (and curl under it) will look it up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Host {
    /// An address literal: nothing is resolved.
    Ip(IpAddr),
    /// A DNS name, lower case, without a trailing dot.
    Name(String),
}

/// Why a URL's host is not one `git` may be given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostError {
    /// `[…]` that is not an IPv6 address (a zone index, an IPv4 address in brackets).
    #[error("{0:?} is not an IPv6 address in brackets")]
    NotIpv6(String),
    /// Nothing between the scheme and the path.
    #[error("the URL has no host")]
    Empty,
    /// A name with characters outside ASCII.
    #[error("host {0:?} is not ASCII; write its xn-- (punycode) form")]
    NotAscii(String),
    /// A name ending in `.`.
    #[error("host {0:?} ends with a dot; write it without the dot")]
    TrailingDot(String),
    /// Characters or labels no host name has.
    #[error("{0:?} is not a host name")]
    NotAName(String),
    /// A name whose last label starts with a digit, which curl reads as an address.
    #[error("host {0:?} reads as a number; write an address as a.b.c.d")]
    Numeric(String),
}

impl Host {
    /// Reads a URL's host: an IPv4 address in dotted form, a bracketed IPv6 address, or a DNS
    /// name of letters, digits, `-`, `_` and `.`. Anything another parser could read another
    /// way is refused, with what to write instead: a name ending in a dot, a last label that
    /// is a number (`127.1`, `0x7f.1`, `2130706433` are addresses to curl), a zone index, a
    /// non-ASCII name (give its `xn--` form).
    pub fn parse(text: &str) -> Result<Host, HostError> {
        if let Some(inner) = text.strip_prefix('[') {
            return inner
                .strip_suffix(']')
                .and_then(|inner| inner.parse::<Ipv6Addr>().ok())
                .map(|ip| Host::Ip(ip.into()))
                .ok_or_else(|| HostError::NotIpv6(text.to_owned()));
        }
        if let Ok(ip) = text.parse::<Ipv4Addr>() {
            return Ok(Host::Ip(ip.into()));
        }
        if text.is_empty() {
            return Err(HostError::Empty);
        }
        if !text.is_ascii() {
            return Err(HostError::NotAscii(text.to_owned()));
        }
        if text.ends_with('.') {
            return Err(HostError::TrailingDot(text.to_owned()));
        }
        let valid = text.len() <= 253
            && text
                .split('.')
                .all(|label| !label.is_empty() && label.len() <= 63)
            && text
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
        if !valid {
            return Err(HostError::NotAName(text.to_owned()));
        }
        let last = text.rsplit('.').next().unwrap_or(text);
        if last.starts_with(|c: char| c.is_ascii_digit()) {
            return Err(HostError::Numeric(text.to_owned()));
        }
        Ok(Host::Name(text.to_ascii_lowercase()))
    }
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]"),
            Host::Ip(ip) => write!(f, "{ip}"),
            Host::Name(name) => f.write_str(name),
        }
    }
}

/// A name resolved and checked: `git` connects to these addresses and to no other.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pin {
    /// The name, as in the URL (lower case).
    pub name: String,
    /// The port the URL connects to.
    pub port: u16,
    /// Every address the name resolved to, each checked.
    pub addresses: Vec<IpAddr>,
}

impl Pin {
    /// The value of `http.curloptResolve`: `name:port:addr[,addr…]`, IPv6 in brackets. curl
    /// keeps such an entry for the whole transfer and never asks a resolver for the name.
    pub fn curl_resolve(&self) -> String {
        let addresses: Vec<String> = self
            .addresses
            .iter()
            .map(|ip| match ip {
                IpAddr::V6(v6) => format!("[{v6}]"),
                IpAddr::V4(v4) => v4.to_string(),
            })
            .collect();
        format!("{}:{}:{}", self.name, self.port, addresses.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().expect("an address")
    }

    /// Every range the fetch refuses, both families, with the words its refusal uses.
    const REFUSED: &[(&str, &str)] = &[
        // IPv4.
        ("0.0.0.0", "unspecified"),
        ("0.1.2.3", "this network"),
        ("127.0.0.1", "loopback"),
        ("127.255.255.254", "loopback"),
        ("10.0.0.1", "private"),
        ("10.255.255.255", "private"),
        ("172.16.0.1", "private"),
        ("172.31.255.255", "private"),
        ("192.168.1.1", "private"),
        ("169.254.1.1", "link-local"),
        ("169.254.169.254", "metadata"),
        ("100.64.0.1", "carrier-grade NAT"),
        ("100.127.255.255", "carrier-grade NAT"),
        ("198.18.0.1", "benchmarking"),
        ("198.19.255.255", "benchmarking"),
        ("192.0.0.8", "protocol assignment"),
        ("192.0.2.1", "documentation"),
        ("198.51.100.7", "documentation"),
        ("203.0.113.9", "documentation"),
        ("240.0.0.1", "reserved"),
        ("255.255.255.254", "reserved"),
        ("255.255.255.255", "broadcast"),
        ("224.0.0.1", "multicast"),
        ("239.255.255.250", "multicast"),
        // IPv6.
        ("::", "unspecified"),
        ("::1", "loopback"),
        ("fc00::1", "unique local"),
        ("fd12:3456::1", "unique local"),
        ("fe80::1", "link-local"),
        ("febf::1", "link-local"),
        ("ff02::1", "multicast"),
        ("2001:db8::1", "documentation"),
        ("2001:2::1", "benchmarking"),
        ("2001:2:0:ffff::1", "benchmarking"),
        ("64:ff9b::808:808", "NAT64"),
        ("64:ff9b::a00:1", "NAT64"),
        ("64:ff9b:1::1", "local-use NAT64"),
        ("2002:808:808::1", "6to4"),
        ("2002:a00:1::1", "6to4"),
        ("2001:0:4136:e378::1", "Teredo"),
        ("4000::1", "reserved"),
        // IPv4 inside IPv6: mapped (::ffff:0:0/96), translated and compatible forms are
        // judged by the IPv4 address they carry.
        ("::ffff:127.0.0.1", "loopback"),
        ("::ffff:10.1.2.3", "private"),
        ("::ffff:169.254.169.254", "metadata"),
        ("::ffff:100.64.0.1", "carrier-grade NAT"),
        ("::ffff:198.18.0.1", "benchmarking"),
        ("::ffff:192.0.2.1", "documentation"),
        ("::ffff:0.0.0.0", "unspecified"),
        ("::ffff:240.0.0.1", "reserved"),
        ("::ffff:255.255.255.255", "broadcast"),
        ("::ffff:224.0.0.1", "multicast"),
        ("::ffff:0:7f00:1", "loopback"),
        ("::127.0.0.1", "loopback"),
        ("::10.0.0.1", "private"),
        ("::0.0.0.2", "this network"),
    ];

    #[test]
    fn every_non_public_range_is_refused_and_says_why() {
        for (address, why) in REFUSED {
            let refusal = refusal(ip(address));
            let Some(message) = refusal else {
                panic!("{address} must be refused ({why})");
            };
            assert!(
                message.contains(why),
                "{address}: {message:?} should say {why:?}"
            );
        }
    }

    #[test]
    fn public_addresses_of_both_families_and_their_mapped_forms_pass() {
        for address in [
            "1.1.1.1",
            "8.8.8.8",
            "140.82.112.3",
            "100.63.255.255",
            "100.128.0.0",
            "172.15.255.255",
            "172.32.0.0",
            "192.169.0.1",
            "198.17.255.255",
            "198.20.0.0",
            "223.255.255.255",
            "2606:4700::1111",
            "2a00:1450:4001::200e",
            "2001:4860:4860::8888",
            "::ffff:8.8.8.8",
            "::ffff:140.82.112.3",
        ] {
            assert_eq!(refusal(ip(address)), None, "{address} is public");
        }
    }

    #[test]
    fn hosts_are_read_one_way_only() {
        for (text, host) in [
            ("example.com", Host::Name("example.com".into())),
            ("Git.Example.COM", Host::Name("git.example.com".into())),
            ("my_host-1.example", Host::Name("my_host-1.example".into())),
            ("localhost", Host::Name("localhost".into())),
            ("93.184.216.34", Host::Ip(ip("93.184.216.34"))),
            ("[2606:4700::1111]", Host::Ip(ip("2606:4700::1111"))),
            ("[::ffff:127.0.0.1]", Host::Ip(ip("::ffff:127.0.0.1"))),
        ] {
            assert_eq!(Host::parse(text), Ok(host), "{text}");
        }
        for (text, why) in [
            ("", "no host"),
            ("example.com.", "ends with a dot"),
            ("127.1", "number"),
            ("0x7f.1", "number"),
            ("2130706433", "number"),
            ("010.0.0.1", "number"),
            ("a..b", "not a host name"),
            ("exa mple.com", "not a host name"),
            ("evil.com\\@127.0.0.1", "not a host name"),
            ("bücher.example", "xn--"),
            ("[fe80::1%25eth0]", "IPv6"),
            ("[::1", "IPv6"),
            ("[127.0.0.1]", "IPv6"),
        ] {
            let error = Host::parse(text).expect_err(text).to_string();
            assert!(error.contains(why), "{text}: {error:?} should say {why:?}");
        }
    }

    #[test]
    fn the_pin_names_every_checked_address_for_curl() {
        let pin = Pin {
            name: "git.example.com".into(),
            port: 443,
            addresses: vec![ip("140.82.112.3"), ip("2606:4700::1111")],
        };
        assert_eq!(
            pin.curl_resolve(),
            "git.example.com:443:140.82.112.3,[2606:4700::1111]"
        );
    }
}
