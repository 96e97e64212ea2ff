//! Which addresses a sandbox may reach: the internet, and what the node's configuration adds.
//!
//! [`RANGES`] is the one table of what is not the internet. It is read top to bottom and the
//! first row holding an address decides, so a narrower row sits above the wider one it carves
//! out of. A row either refuses, naming why, or says the address embeds an IPv4 address; that
//! address is then judged by the IPv4 rows, so `::ffff:127.0.0.1`, `64:ff9b::a00:1` and
//! `2002:a9fe:a9fe::` are refused like `127.0.0.1`, `10.0.0.1` and `169.254.169.254`. An address
//! no row holds is the internet. IPv6 is read as "only the global unicast block `2000::/3`, less
//! its special rows": the last rows refuse everything outside it.
//!
//! Cloud metadata services live inside refused rows: `169.254.169.254` (AWS, GCP, Azure,
//! OpenStack; link-local), `fd00:ec2::254` (AWS over IPv6; unique local), `100.100.100.200`
//! (Alibaba; shared), `192.0.0.192` (Oracle; IETF protocol assignments).
//!
//! The configuration adds to the table (see [`EgressPolicy`]): `allow` entries reach what the
//! table refuses (a private package mirror; a test server on loopback), `deny` entries refuse
//! what the table lets through (the node's own public addresses, where whatever listens on
//! `0.0.0.0` would answer).

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::str::FromStr;

/// Why an address is not the internet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// `0.0.0.0`, `::`: "any address", which a connect turns into loopback.
    Unspecified,
    /// `0.0.0.0/8`: "this network" (RFC 791).
    ThisNetwork,
    /// `127.0.0.0/8`, `::1`: the node itself.
    Loopback,
    /// `10/8`, `172.16/12`, `192.168/16` (RFC 1918): the node's private networks.
    Private,
    /// `100.64/10` (RFC 6598): a provider's shared address space (carrier-grade NAT).
    Shared,
    /// `169.254/16`, `fe80::/10`: the node's link.
    LinkLocal,
    /// `169.254.169.254`: where clouds serve an instance's credentials.
    Metadata,
    /// `192.0.0.0/24`, `2001::/23` (RFC 6890): protocol assignments, never a web server.
    ProtocolAssignment,
    /// TEST-NET-1/2/3, `2001:db8::/32`, `3fff::/20`: addresses for examples only.
    Documentation,
    /// `198.18/15`, `2001:2::/48` (RFC 2544, 5180): benchmarking networks.
    Benchmarking,
    /// `192.88.99.0/24` (RFC 7526): the retired 6to4 relay anycast.
    Relay6to4,
    /// `240/4`, and IPv6 outside `2000::/3`: reserved, not assigned.
    Reserved,
    /// `255.255.255.255`.
    Broadcast,
    /// `224/4`, `ff00::/8`.
    Multicast,
    /// `fc00::/7` (RFC 4193): unique local, IPv6's private networks.
    UniqueLocal,
    /// `fec0::/10` (RFC 3879): site-local, the retired private networks.
    SiteLocal,
    /// `100::/64` (RFC 6666): discard-only.
    Discard,
    /// `64:ff9b:1::/48` (RFC 8215): local-use NAT64; where the IPv4 address sits inside depends
    /// on the operator's prefix length, so the whole block is refused.
    LocalNat64,
    /// A `deny` entry of the configuration.
    Denied,
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Reason::Unspecified => "the unspecified address",
            Reason::ThisNetwork => "a \"this network\" address",
            Reason::Loopback => "a loopback address",
            Reason::Private => "a private address",
            Reason::Shared => "a shared (carrier-grade NAT) address",
            Reason::LinkLocal => "a link-local address",
            Reason::Metadata => "the cloud metadata address",
            Reason::ProtocolAssignment => "an IETF protocol assignment",
            Reason::Documentation => "a documentation address",
            Reason::Benchmarking => "a benchmarking address",
            Reason::Relay6to4 => "the retired 6to4 relay address",
            Reason::Reserved => "a reserved address",
            Reason::Broadcast => "the broadcast address",
            Reason::Multicast => "a multicast address",
            Reason::UniqueLocal => "a unique local address",
            Reason::SiteLocal => "a site-local address",
            Reason::Discard => "a discard-only address",
            Reason::LocalNat64 => "a local-use NAT64 address",
            Reason::Denied => "refused by this node's configuration",
        })
    }
}

/// How an IPv6 address carries an IPv4 address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Embedding {
    /// `::ffff:0:0/96`: a dual-stack socket connects to the IPv4 address itself.
    Mapped,
    /// `::ffff:0:0:0/96` (RFC 2765 SIIT): IPv4-translated.
    Translated,
    /// `::/96`: the deprecated IPv4-compatible form.
    Compatible,
    /// `64:ff9b::/96` (RFC 6052): the well-known NAT64 prefix, translated to the IPv4 address.
    Nat64,
    /// `2002::/16` (RFC 3056): 6to4, tunnelled to the IPv4 address in bits 16 to 47.
    SixToFour,
    /// `2001::/32` (RFC 4380): Teredo; both the server (bits 32 to 63) and the client (the last
    /// 32 bits, inverted) are reached, so both are judged.
    Teredo,
}

impl fmt::Display for Embedding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Embedding::Mapped => "IPv4-mapped",
            Embedding::Translated => "IPv4-translated",
            Embedding::Compatible => "IPv4-compatible",
            Embedding::Nat64 => "NAT64",
            Embedding::SixToFour => "6to4",
            Embedding::Teredo => "Teredo",
        })
    }
}

impl Embedding {
    /// The IPv4 addresses `ip` carries in this form.
    fn ipv4s(self, ip: Ipv6Addr) -> Vec<Ipv4Addr> {
        let bits = ip.to_bits();
        let last = Ipv4Addr::from_bits(bits as u32);
        match self {
            Embedding::Mapped
            | Embedding::Translated
            | Embedding::Compatible
            | Embedding::Nat64 => {
                vec![last]
            }
            Embedding::SixToFour => vec![Ipv4Addr::from_bits((bits >> 80) as u32)],
            Embedding::Teredo => vec![
                Ipv4Addr::from_bits((bits >> 64) as u32),
                Ipv4Addr::from_bits(!(bits as u32)),
            ],
        }
    }
}

/// What a row of [`RANGES`] says about the addresses it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Not the internet.
    Refuse(Reason),
    /// Judged by the IPv4 address inside.
    Embeds(Embedding),
}

/// A network: an address and a prefix length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cidr {
    addr: IpAddr,
    len: u8,
}

impl Cidr {
    /// The network `addr/len`; host bits of `addr` are cleared. `None` when `len` is longer
    /// than the address.
    pub const fn new(addr: IpAddr, len: u8) -> Option<Cidr> {
        match addr {
            IpAddr::V4(v4) if len <= 32 => Some(Cidr {
                addr: IpAddr::V4(Ipv4Addr::from_bits(v4.to_bits() & mask32(len))),
                len,
            }),
            IpAddr::V6(v6) if len <= 128 => Some(Cidr {
                addr: IpAddr::V6(Ipv6Addr::from_bits(v6.to_bits() & mask128(len))),
                len,
            }),
            _ => None,
        }
    }

    const fn v4(a: u8, b: u8, c: u8, d: u8, len: u8) -> Cidr {
        Cidr {
            addr: IpAddr::V4(Ipv4Addr::new(a, b, c, d)),
            len,
        }
    }

    const fn v6(bits: u128, len: u8) -> Cidr {
        Cidr {
            addr: IpAddr::V6(Ipv6Addr::from_bits(bits)),
            len,
        }
    }

    /// Whether `ip` is in this network (an IPv4 network holds no IPv6 address, whatever it
    /// embeds).
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => ip.to_bits() & mask32(self.len) == net.to_bits(),
            (IpAddr::V6(net), IpAddr::V6(ip)) => ip.to_bits() & mask128(self.len) == net.to_bits(),
            _ => false,
        }
    }

    /// The network's first address.
    pub fn first(&self) -> IpAddr {
        self.addr
    }

    /// The network's last address.
    pub fn last(&self) -> IpAddr {
        match self.addr {
            IpAddr::V4(net) => IpAddr::V4(Ipv4Addr::from_bits(net.to_bits() | !mask32(self.len))),
            IpAddr::V6(net) => IpAddr::V6(Ipv6Addr::from_bits(net.to_bits() | !mask128(self.len))),
        }
    }
}

const fn mask32(len: u8) -> u32 {
    if len == 0 { 0 } else { u32::MAX << (32 - len) }
}

const fn mask128(len: u8) -> u128 {
    if len == 0 {
        0
    } else {
        u128::MAX << (128 - len)
    }
}

impl From<IpAddr> for Cidr {
    fn from(addr: IpAddr) -> Cidr {
        let len = if addr.is_ipv4() { 32 } else { 128 };
        Cidr { addr, len }
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

impl FromStr for Cidr {
    type Err = PolicyError;

    /// `10.0.0.0/8`, `fd00::/8`, or a single address.
    fn from_str(text: &str) -> Result<Cidr, PolicyError> {
        let bad = || PolicyError::Network(text.to_owned());
        match text.split_once('/') {
            None => text.parse::<IpAddr>().map(Cidr::from).map_err(|_| bad()),
            Some((addr, len)) => {
                let addr = addr.parse::<IpAddr>().map_err(|_| bad())?;
                let len = len.parse::<u8>().map_err(|_| bad())?;
                Cidr::new(addr, len).ok_or_else(bad)
            }
        }
    }
}

/// A row of [`RANGES`].
#[derive(Debug, Clone, Copy)]
pub struct Range {
    /// The addresses it holds.
    pub net: Cidr,
    /// What it says about them.
    pub verdict: Verdict,
}

const fn refuse(net: Cidr, reason: Reason) -> Range {
    Range {
        net,
        verdict: Verdict::Refuse(reason),
    }
}

const fn embeds(net: Cidr, embedding: Embedding) -> Range {
    Range {
        net,
        verdict: Verdict::Embeds(embedding),
    }
}

/// What is not the internet, first match decides (IANA's special-purpose address registries,
/// keeping every row whose "globally reachable" is false, and a few retired blocks).
pub const RANGES: &[Range] = &[
    // IPv4.
    refuse(Cidr::v4(0, 0, 0, 0, 32), Reason::Unspecified),
    refuse(Cidr::v4(0, 0, 0, 0, 8), Reason::ThisNetwork),
    refuse(Cidr::v4(10, 0, 0, 0, 8), Reason::Private),
    refuse(Cidr::v4(100, 64, 0, 0, 10), Reason::Shared),
    refuse(Cidr::v4(127, 0, 0, 0, 8), Reason::Loopback),
    refuse(Cidr::v4(169, 254, 169, 254, 32), Reason::Metadata),
    refuse(Cidr::v4(169, 254, 0, 0, 16), Reason::LinkLocal),
    refuse(Cidr::v4(172, 16, 0, 0, 12), Reason::Private),
    refuse(Cidr::v4(192, 0, 0, 0, 24), Reason::ProtocolAssignment),
    refuse(Cidr::v4(192, 0, 2, 0, 24), Reason::Documentation),
    refuse(Cidr::v4(192, 88, 99, 0, 24), Reason::Relay6to4),
    refuse(Cidr::v4(192, 168, 0, 0, 16), Reason::Private),
    refuse(Cidr::v4(198, 18, 0, 0, 15), Reason::Benchmarking),
    refuse(Cidr::v4(198, 51, 100, 0, 24), Reason::Documentation),
    refuse(Cidr::v4(203, 0, 113, 0, 24), Reason::Documentation),
    refuse(Cidr::v4(224, 0, 0, 0, 4), Reason::Multicast),
    refuse(Cidr::v4(255, 255, 255, 255, 32), Reason::Broadcast),
    refuse(Cidr::v4(240, 0, 0, 0, 4), Reason::Reserved),
    // IPv6: the addresses carrying an IPv4 address, then the special blocks.
    refuse(Cidr::v6(0, 128), Reason::Unspecified),
    refuse(Cidr::v6(1, 128), Reason::Loopback),
    embeds(Cidr::v6(0xffff << 32, 96), Embedding::Mapped),
    embeds(Cidr::v6(0xffff << 48, 96), Embedding::Translated),
    embeds(Cidr::v6(0, 96), Embedding::Compatible),
    embeds(Cidr::v6(0x64_ff9b << 96, 96), Embedding::Nat64),
    refuse(Cidr::v6(0x64_ff9b_0001 << 80, 48), Reason::LocalNat64),
    refuse(Cidr::v6(0x0100 << 112, 64), Reason::Discard),
    embeds(Cidr::v6(0x2001 << 112, 32), Embedding::Teredo),
    refuse(Cidr::v6(0x2001_0002 << 96, 48), Reason::Benchmarking),
    refuse(Cidr::v6(0x2001_0db8 << 96, 32), Reason::Documentation),
    refuse(Cidr::v6(0x2001 << 112, 23), Reason::ProtocolAssignment),
    embeds(Cidr::v6(0x2002 << 112, 16), Embedding::SixToFour),
    refuse(Cidr::v6(0x3fff << 112, 20), Reason::Documentation),
    refuse(Cidr::v6(0xfc00 << 112, 7), Reason::UniqueLocal),
    refuse(Cidr::v6(0xfe80 << 112, 10), Reason::LinkLocal),
    refuse(Cidr::v6(0xfec0 << 112, 10), Reason::SiteLocal),
    refuse(Cidr::v6(0xff00 << 112, 8), Reason::Multicast),
    // Everything outside 2000::/3, global unicast.
    refuse(Cidr::v6(0, 3), Reason::Reserved),
    refuse(Cidr::v6(0x4000 << 112, 2), Reason::Reserved),
    refuse(Cidr::v6(0x8000 << 112, 1), Reason::Reserved),
];

/// The row of [`RANGES`] holding `ip`, if any.
pub fn range_of(ip: IpAddr) -> Option<&'static Range> {
    RANGES.iter().find(|range| range.net.contains(ip))
}

/// Why the table refuses `ip`; `None` when `ip` is the internet.
pub fn refusal(ip: IpAddr) -> Option<Refusal> {
    let range = range_of(ip)?;
    match (range.verdict, ip) {
        (Verdict::Refuse(reason), _) => Some(Refusal {
            addr: ip,
            reason,
            embedded: None,
        }),
        (Verdict::Embeds(embedding), IpAddr::V6(v6)) => {
            embedding.ipv4s(v6).into_iter().find_map(|ipv4| {
                let inner = refusal(IpAddr::V4(ipv4))?;
                Some(Refusal {
                    addr: ip,
                    reason: inner.reason,
                    embedded: Some((embedding, ipv4)),
                })
            })
        }
        // No IPv4 row embeds anything.
        (Verdict::Embeds(_), IpAddr::V4(_)) => None,
    }
}

/// An address the sandbox may not reach, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct Refusal {
    /// The address asked for.
    pub addr: IpAddr,
    /// Why it is refused.
    pub reason: Reason,
    /// The IPv4 address it was judged by, and how it is carried.
    pub embedded: Option<(Embedding, Ipv4Addr)>,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.embedded {
            None => write!(f, "{} is {}", self.addr, self.reason),
            Some((embedding, ipv4)) => write!(
                f,
                "{} is the {embedding} form of {ipv4}, {}",
                self.addr, self.reason
            ),
        }
    }
}

/// A destination as the sandbox named it: an address, or a host name (lower case, without a
/// trailing dot).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Host {
    /// An address literal.
    Ip(IpAddr),
    /// A name, to be resolved.
    Name(String),
}

impl Host {
    /// A host from a request: an IPv4 literal, a bracketed IPv6 literal, or a DNS name
    /// (letters, digits, `-`, `_` and `.`; at most 253 bytes). `None` for anything else.
    pub fn parse(text: &str) -> Option<Host> {
        if let Some(inner) = text.strip_prefix('[') {
            let inner = inner.strip_suffix(']')?;
            return inner.parse::<Ipv6Addr>().ok().map(|ip| Host::Ip(ip.into()));
        }
        if let Ok(ip) = text.parse::<Ipv4Addr>() {
            return Some(Host::Ip(ip.into()));
        }
        let name = text.strip_suffix('.').unwrap_or(text);
        let valid = !name.is_empty()
            && name.len() <= 253
            && name
                .split('.')
                .all(|label| !label.is_empty() && label.len() <= 63)
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
        valid.then(|| Host::Name(name.to_ascii_lowercase()))
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

/// An entry of the configuration's `allow` list: what the sandbox may reach although the
/// table refuses it.
///
/// Written as an address (`10.0.0.5`), a network (`10.8.0.0/16`, `fd00::/8`) or a host name
/// (`mirror.internal`), optionally with a port (`10.0.0.5:3141`, `[fd00::5]:443`,
/// `[fd00::/8]:443`, `mirror.internal:3141`). An address or a network matches the address
/// connected to, literally: allowing `127.0.0.1` does not allow `::ffff:127.0.0.1`. A name
/// matches the host the sandbox asked for, and then every address the node's resolver gives
/// for it is allowed: the node's DNS, not the sandbox, decides where the name leads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allow {
    target: AllowTarget,
    port: Option<u16>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum AllowTarget {
    Net(Cidr),
    Name(String),
}

impl Allow {
    /// Allows an address or network, on any port or on one.
    pub fn net(net: Cidr, port: Option<u16>) -> Allow {
        Allow {
            target: AllowTarget::Net(net),
            port,
        }
    }

    fn matches(&self, host: Option<&Host>, addr: SocketAddr) -> bool {
        if self.port.is_some_and(|port| port != addr.port()) {
            return false;
        }
        match &self.target {
            AllowTarget::Net(net) => net.contains(addr.ip()),
            AllowTarget::Name(name) => matches!(host, Some(Host::Name(asked)) if asked == name),
        }
    }
}

impl FromStr for Allow {
    type Err = PolicyError;

    fn from_str(text: &str) -> Result<Allow, PolicyError> {
        let bad = || PolicyError::Allow(text.to_owned());
        let port = |port: &str| port.parse::<u16>().ok().filter(|&port| port != 0);
        // Split off a port: after `]` for bracketed IPv6, after the only `:` otherwise (two or
        // more colons without brackets is an IPv6 address, which carries no port).
        let (target, port) = if let Some(rest) = text.strip_prefix('[') {
            let (inner, after) = rest.split_once(']').ok_or_else(bad)?;
            let port = match after {
                "" => None,
                after => Some(after.strip_prefix(':').and_then(port).ok_or_else(bad)?),
            };
            (inner, port)
        } else if text.matches(':').count() == 1 {
            let (target, after) = text.split_once(':').ok_or_else(bad)?;
            (target, Some(port(after).ok_or_else(bad)?))
        } else {
            (text, None)
        };
        let bracketed = text.starts_with('[');
        if let Ok(net) = target.parse::<Cidr>() {
            if bracketed && net.first().is_ipv4() {
                return Err(bad());
            }
            return Ok(Allow::net(net, port));
        }
        match Host::parse(target) {
            Some(Host::Name(name)) if !bracketed && !target.contains('/') => Ok(Allow {
                target: AllowTarget::Name(name),
                port,
            }),
            _ => Err(bad()),
        }
    }
}

impl fmt::Display for Allow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let target = match &self.target {
            AllowTarget::Net(net) if net.first().is_ipv6() && self.port.is_some() => {
                format!("[{net}]")
            }
            AllowTarget::Net(net) => net.to_string(),
            AllowTarget::Name(name) => name.clone(),
        };
        match self.port {
            Some(port) => write!(f, "{target}:{port}"),
            None => f.write_str(&target),
        }
    }
}

/// A configuration entry that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// Not an address, network or host name, with an optional port.
    #[error(
        "egress allow entry {0:?} is not an address, a network (a.b.c.d/n) or a host name, optionally with :port"
    )]
    Allow(String),
    /// Not an address or a network.
    #[error("{0:?} is not an address or a network (a.b.c.d/n, x::/n)")]
    Network(String),
}

/// A destination the policy let through. Only [`EgressPolicy::permit`] makes one, so whatever
/// connects on a sandbox's behalf connects to an address that was checked, and to no other.
#[derive(Debug, PartialEq, Eq)]
pub struct Permitted(SocketAddr);

impl Permitted {
    /// The address checked.
    pub fn addr(&self) -> SocketAddr {
        self.0
    }
}

/// The network policy of sandboxes given `egress`: the internet, less [`RANGES`], plus the
/// configuration's `allow` entries, less its `deny` entries (a `deny` wins over an `allow`).
/// The default is the table alone.
#[derive(Debug, Clone, Default)]
pub struct EgressPolicy {
    allow: Vec<Allow>,
    deny: Vec<Cidr>,
}

impl EgressPolicy {
    /// A policy from configuration text: `allow` and `deny` entries as written in the config.
    pub fn from_config(allow: &[String], deny: &[String]) -> Result<EgressPolicy, PolicyError> {
        Ok(EgressPolicy {
            allow: allow.iter().map(|e| e.parse()).collect::<Result<_, _>>()?,
            deny: deny.iter().map(|e| e.parse()).collect::<Result<_, _>>()?,
        })
    }

    /// Adds an `allow` entry.
    pub fn allow(mut self, entry: Allow) -> EgressPolicy {
        self.allow.push(entry);
        self
    }

    /// Adds a `deny` entry.
    pub fn deny(mut self, net: Cidr) -> EgressPolicy {
        self.deny.push(net);
        self
    }

    /// Whether the sandbox may reach `ip` on every port: the table, `deny` entries, and the
    /// `allow` entries that are an address or network without a port.
    pub fn check(&self, ip: IpAddr) -> Result<(), Refusal> {
        if self.denied(ip) {
            return Err(Refusal {
                addr: ip,
                reason: Reason::Denied,
                embedded: None,
            });
        }
        let allowed = self.allow.iter().any(|entry| {
            entry.port.is_none()
                && matches!(entry.target, AllowTarget::Net(net) if net.contains(ip))
        });
        match refusal(ip) {
            Some(refusal) if !allowed => Err(refusal),
            _ => Ok(()),
        }
    }

    /// Whether the sandbox, having asked for `host`, may connect to `addr` (one of the
    /// addresses `host` resolved to, or the address it is). The only way to a [`Permitted`].
    pub fn permit(&self, host: &Host, addr: SocketAddr) -> Result<Permitted, Refusal> {
        let ip = addr.ip();
        if self.denied(ip) {
            return Err(Refusal {
                addr: ip,
                reason: Reason::Denied,
                embedded: None,
            });
        }
        if self
            .allow
            .iter()
            .any(|entry| entry.matches(Some(host), addr))
        {
            return Ok(Permitted(addr));
        }
        match refusal(ip) {
            Some(refusal) => Err(refusal),
            None => Ok(Permitted(addr)),
        }
    }

    fn denied(&self, ip: IpAddr) -> bool {
        self.deny.iter().any(|net| net.contains(ip))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// What the table should say about an address.
    #[derive(Debug, Clone, Copy, PartialEq)]
    enum Expect {
        Internet,
        Refused(Reason),
        /// Refused for the IPv4 address inside.
        Inside(Embedding, &'static str, Reason),
    }
    use Expect::*;

    /// Every row, at its edges where a neighbour could leak, and the first address beyond.
    const CASES: &[(&str, Expect)] = &[
        // 0.0.0.0/8 and the unspecified address.
        ("0.0.0.0", Refused(Reason::Unspecified)),
        ("0.0.0.1", Refused(Reason::ThisNetwork)),
        ("0.255.255.255", Refused(Reason::ThisNetwork)),
        ("1.0.0.0", Internet),
        // Private.
        ("9.255.255.255", Internet),
        ("10.0.0.0", Refused(Reason::Private)),
        ("10.1.2.3", Refused(Reason::Private)),
        ("10.255.255.255", Refused(Reason::Private)),
        ("11.0.0.0", Internet),
        ("172.15.255.255", Internet),
        ("172.16.0.0", Refused(Reason::Private)),
        ("172.31.255.255", Refused(Reason::Private)),
        ("172.32.0.0", Internet),
        ("192.167.255.255", Internet),
        ("192.168.0.0", Refused(Reason::Private)),
        ("192.168.255.255", Refused(Reason::Private)),
        ("192.169.0.0", Internet),
        // Shared (CGNAT), with Alibaba's metadata address.
        ("100.63.255.255", Internet),
        ("100.64.0.0", Refused(Reason::Shared)),
        ("100.100.100.200", Refused(Reason::Shared)),
        ("100.127.255.255", Refused(Reason::Shared)),
        ("100.128.0.0", Internet),
        // Loopback.
        ("126.255.255.255", Internet),
        ("127.0.0.1", Refused(Reason::Loopback)),
        ("127.0.0.0", Refused(Reason::Loopback)),
        ("127.255.255.255", Refused(Reason::Loopback)),
        ("128.0.0.0", Internet),
        // Link-local and metadata.
        ("169.253.255.255", Internet),
        ("169.254.0.0", Refused(Reason::LinkLocal)),
        ("169.254.169.253", Refused(Reason::LinkLocal)),
        ("169.254.169.254", Refused(Reason::Metadata)),
        ("169.254.169.255", Refused(Reason::LinkLocal)),
        ("169.254.255.255", Refused(Reason::LinkLocal)),
        ("169.255.0.0", Internet),
        // IETF protocol assignments, with Oracle's metadata address.
        ("191.255.255.255", Internet),
        ("192.0.0.0", Refused(Reason::ProtocolAssignment)),
        ("192.0.0.192", Refused(Reason::ProtocolAssignment)),
        ("192.0.0.255", Refused(Reason::ProtocolAssignment)),
        ("192.0.1.0", Internet),
        // Documentation.
        ("192.0.2.0", Refused(Reason::Documentation)),
        ("192.0.2.255", Refused(Reason::Documentation)),
        ("192.0.3.0", Internet),
        ("198.51.99.255", Internet),
        ("198.51.100.7", Refused(Reason::Documentation)),
        ("198.51.101.0", Internet),
        ("203.0.112.255", Internet),
        ("203.0.113.255", Refused(Reason::Documentation)),
        ("203.0.114.0", Internet),
        // Retired 6to4 relay anycast.
        ("192.88.98.255", Internet),
        ("192.88.99.1", Refused(Reason::Relay6to4)),
        ("192.88.100.0", Internet),
        // Benchmarking.
        ("198.17.255.255", Internet),
        ("198.18.0.0", Refused(Reason::Benchmarking)),
        ("198.19.255.255", Refused(Reason::Benchmarking)),
        ("198.20.0.0", Internet),
        // Multicast, reserved, broadcast.
        ("223.255.255.255", Internet),
        ("224.0.0.0", Refused(Reason::Multicast)),
        ("239.255.255.255", Refused(Reason::Multicast)),
        ("240.0.0.0", Refused(Reason::Reserved)),
        ("255.255.255.254", Refused(Reason::Reserved)),
        ("255.255.255.255", Refused(Reason::Broadcast)),
        // A few of the internet.
        ("1.1.1.1", Internet),
        ("8.8.8.8", Internet),
        ("93.184.215.14", Internet),
        // IPv6: unspecified, loopback.
        ("::", Refused(Reason::Unspecified)),
        ("::1", Refused(Reason::Loopback)),
        // IPv4-mapped: judged by the IPv4 address inside.
        (
            "::ffff:127.0.0.1",
            Inside(Embedding::Mapped, "127.0.0.1", Reason::Loopback),
        ),
        (
            "::ffff:10.0.0.1",
            Inside(Embedding::Mapped, "10.0.0.1", Reason::Private),
        ),
        (
            "::ffff:169.254.169.254",
            Inside(Embedding::Mapped, "169.254.169.254", Reason::Metadata),
        ),
        (
            "::ffff:0.0.0.0",
            Inside(Embedding::Mapped, "0.0.0.0", Reason::Unspecified),
        ),
        ("::ffff:8.8.8.8", Internet),
        // IPv4-translated.
        (
            "::ffff:0:7f00:1",
            Inside(Embedding::Translated, "127.0.0.1", Reason::Loopback),
        ),
        ("::ffff:0:808:808", Internet),
        // IPv4-compatible.
        (
            "::127.0.0.1",
            Inside(Embedding::Compatible, "127.0.0.1", Reason::Loopback),
        ),
        (
            "::2",
            Inside(Embedding::Compatible, "0.0.0.2", Reason::ThisNetwork),
        ),
        ("::8.8.8.8", Internet),
        // NAT64.
        (
            "64:ff9b::7f00:1",
            Inside(Embedding::Nat64, "127.0.0.1", Reason::Loopback),
        ),
        (
            "64:ff9b::a9fe:a9fe",
            Inside(Embedding::Nat64, "169.254.169.254", Reason::Metadata),
        ),
        ("64:ff9b::808:808", Internet),
        ("64:ff9b:1::", Refused(Reason::LocalNat64)),
        (
            "64:ff9b:1:ffff:ffff:ffff:ffff:ffff",
            Refused(Reason::LocalNat64),
        ),
        ("64:ff9b:2::", Refused(Reason::Reserved)),
        // Discard.
        ("100::", Refused(Reason::Discard)),
        ("100::ffff:ffff:ffff:ffff", Refused(Reason::Discard)),
        ("100:0:0:1::", Refused(Reason::Reserved)),
        // Teredo: server in bits 32..63, client inverted in the last 32.
        (
            "2001:0:7f00:1:0:0:f7f7:f7f7",
            Inside(Embedding::Teredo, "127.0.0.1", Reason::Loopback),
        ),
        (
            "2001:0:808:808:0:0:f5fe:fffe",
            Inside(Embedding::Teredo, "10.1.0.1", Reason::Private),
        ),
        ("2001:0:808:808:0:0:f7f7:f7f7", Internet),
        // Benchmarking, documentation, protocol assignments.
        ("2001:2::", Refused(Reason::Benchmarking)),
        (
            "2001:2:0:ffff:ffff:ffff:ffff:ffff",
            Refused(Reason::Benchmarking),
        ),
        ("2001:db8::1", Refused(Reason::Documentation)),
        (
            "2001:db8:ffff:ffff:ffff:ffff:ffff:ffff",
            Refused(Reason::Documentation),
        ),
        ("2001:1::1", Refused(Reason::ProtocolAssignment)),
        (
            "2001:1ff:ffff:ffff:ffff:ffff:ffff:ffff",
            Refused(Reason::ProtocolAssignment),
        ),
        ("2001:200::1", Internet),
        ("3fff::1", Refused(Reason::Documentation)),
        (
            "3fff:fff:ffff:ffff:ffff:ffff:ffff:ffff",
            Refused(Reason::Documentation),
        ),
        ("3fff:1000::", Internet),
        // 6to4: IPv4 in bits 16..47.
        (
            "2002:7f00:1::",
            Inside(Embedding::SixToFour, "127.0.0.1", Reason::Loopback),
        ),
        (
            "2002:a00:1::1",
            Inside(Embedding::SixToFour, "10.0.0.1", Reason::Private),
        ),
        (
            "2002:a9fe:a9fe:ffff:ffff:ffff:ffff:ffff",
            Inside(Embedding::SixToFour, "169.254.169.254", Reason::Metadata),
        ),
        ("2002:808:808::", Internet),
        // Unique local (with AWS's IPv6 metadata address), link-local, site-local, multicast.
        ("fc00::", Refused(Reason::UniqueLocal)),
        ("fd00:ec2::254", Refused(Reason::UniqueLocal)),
        (
            "fdff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
            Refused(Reason::UniqueLocal),
        ),
        ("fe80::1", Refused(Reason::LinkLocal)),
        (
            "febf:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
            Refused(Reason::LinkLocal),
        ),
        ("fec0::1", Refused(Reason::SiteLocal)),
        (
            "feff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
            Refused(Reason::SiteLocal),
        ),
        ("ff02::1", Refused(Reason::Multicast)),
        (
            "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
            Refused(Reason::Multicast),
        ),
        // Outside 2000::/3.
        ("1::", Refused(Reason::Reserved)),
        (
            "1fff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
            Refused(Reason::Reserved),
        ),
        ("4000::", Refused(Reason::Reserved)),
        ("8000::", Refused(Reason::Reserved)),
        ("fb00::", Refused(Reason::Reserved)),
        // The internet over IPv6.
        ("2000::", Internet),
        ("2606:4700:4700::1111", Internet),
        ("2a00:1450:4001:80b::200e", Internet),
        ("3ffe:ffff:ffff:ffff:ffff:ffff:ffff:ffff", Internet),
    ];

    fn ip(text: &str) -> IpAddr {
        text.parse().expect("test addresses are literals")
    }

    #[test]
    fn every_address_of_the_table_is_judged_as_written() {
        for &(text, expect) in CASES {
            let got = refusal(ip(text));
            let want = match expect {
                Internet => None,
                Refused(reason) => Some(Refusal {
                    addr: ip(text),
                    reason,
                    embedded: None,
                }),
                Inside(embedding, ipv4, reason) => Some(Refusal {
                    addr: ip(text),
                    reason,
                    embedded: Some((embedding, ipv4.parse().expect("a literal"))),
                }),
            };
            assert_eq!(got, want, "{text}");
        }
    }

    #[test]
    fn every_row_of_the_table_is_exercised_by_a_case() {
        let hit: BTreeSet<usize> = CASES
            .iter()
            .filter_map(|(text, _)| RANGES.iter().position(|range| range.net.contains(ip(text))))
            .collect();
        let missed: Vec<String> = (0..RANGES.len())
            .filter(|row| !hit.contains(row))
            .map(|row| RANGES[row].net.to_string())
            .collect();
        assert!(missed.is_empty(), "rows without a case: {missed:?}");
    }

    #[test]
    fn no_row_is_hidden_entirely_behind_an_earlier_one() {
        for (row, range) in RANGES.iter().enumerate() {
            let earlier = &RANGES[..row];
            let hidden = earlier.iter().any(|above| {
                above.net.contains(range.net.first()) && above.net.contains(range.net.last())
            });
            assert!(!hidden, "{} is shadowed", range.net);
        }
    }

    #[test]
    fn the_same_table_answers_through_the_policy() {
        let policy = EgressPolicy::default();
        let host = Host::Name("example.org".to_owned());
        for &(text, expect) in CASES {
            let addr = SocketAddr::new(ip(text), 443);
            assert_eq!(policy.check(ip(text)).is_ok(), expect == Internet, "{text}");
            assert_eq!(
                policy.permit(&host, addr).is_ok(),
                expect == Internet,
                "{text}"
            );
        }
    }

    #[test]
    fn a_refusal_names_the_address_and_why() {
        let refusal = |text| refusal(ip(text)).expect("refused").to_string();
        assert_eq!(refusal("10.0.0.1"), "10.0.0.1 is a private address");
        assert_eq!(
            refusal("169.254.169.254"),
            "169.254.169.254 is the cloud metadata address"
        );
        assert_eq!(
            refusal("::ffff:127.0.0.1"),
            "::ffff:127.0.0.1 is the IPv4-mapped form of 127.0.0.1, a loopback address"
        );
    }

    fn policy(allow: &[&str], deny: &[&str]) -> EgressPolicy {
        let owned = |list: &[&str]| list.iter().map(|e| e.to_string()).collect::<Vec<_>>();
        EgressPolicy::from_config(&owned(allow), &owned(deny)).expect("valid entries")
    }

    fn permitted(policy: &EgressPolicy, host: &str, addr: &str) -> bool {
        let host = Host::parse(host).expect("a host");
        let addr: SocketAddr = addr.parse().expect("a socket address");
        policy.permit(&host, addr).is_ok()
    }

    #[test]
    fn an_allowed_address_is_reached_on_its_port_only_when_a_port_is_given() {
        let policy = policy(&["127.0.0.1:8080", "10.0.0.5", "[fd00::5]:443"], &[]);
        assert!(permitted(&policy, "127.0.0.1", "127.0.0.1:8080"));
        assert!(!permitted(&policy, "127.0.0.1", "127.0.0.1:8081"));
        assert!(!permitted(&policy, "127.0.0.2", "127.0.0.2:8080"));
        assert!(permitted(&policy, "10.0.0.5", "10.0.0.5:1"));
        assert!(!permitted(&policy, "10.0.0.6", "10.0.0.6:1"));
        assert!(permitted(&policy, "[fd00::5]", "[fd00::5]:443"));
        assert!(!permitted(&policy, "[fd00::5]", "[fd00::5]:80"));
        assert!(policy.check(ip("10.0.0.5")).is_ok());
        // `check` answers for every port: a port-bound entry does not make it pass.
        assert!(policy.check(ip("127.0.0.1")).is_err());
    }

    #[test]
    fn an_allowed_address_does_not_allow_its_other_spellings() {
        let policy = policy(&["127.0.0.1"], &[]);
        assert!(!permitted(
            &policy,
            "[::ffff:127.0.0.1]",
            "[::ffff:127.0.0.1]:80"
        ));
        assert!(!permitted(&policy, "[::1]", "[::1]:80"));
    }

    #[test]
    fn an_allowed_network_covers_its_addresses_and_no_more() {
        let policy = policy(&["10.8.0.0/16", "[fd00::/8]:443"], &[]);
        assert!(permitted(&policy, "10.8.255.1", "10.8.255.1:80"));
        assert!(!permitted(&policy, "10.9.0.1", "10.9.0.1:80"));
        assert!(permitted(&policy, "[fd12::1]", "[fd12::1]:443"));
        assert!(!permitted(&policy, "[fd12::1]", "[fd12::1]:80"));
        assert!(!permitted(&policy, "[fe80::1]", "[fe80::1]:443"));
    }

    #[test]
    fn an_allowed_name_reaches_what_it_resolves_to_and_other_names_do_not() {
        let policy = policy(&["Mirror.Internal:3141"], &[]);
        assert!(permitted(&policy, "mirror.internal", "10.0.0.9:3141"));
        assert!(permitted(&policy, "MIRROR.internal.", "10.0.0.9:3141"));
        assert!(!permitted(&policy, "mirror.internal", "10.0.0.9:80"));
        assert!(!permitted(&policy, "other.internal", "10.0.0.9:3141"));
        assert!(!permitted(&policy, "10.0.0.9", "10.0.0.9:3141"));
        assert!(policy.check(ip("10.0.0.9")).is_err());
    }

    #[test]
    fn a_denied_address_is_refused_even_when_allowed() {
        let policy = policy(
            &["203.0.113.0/24", "mirror.internal"],
            &["203.0.113.7", "8.8.8.0/24"],
        );
        assert!(permitted(&policy, "203.0.113.6", "203.0.113.6:80"));
        assert!(!permitted(&policy, "203.0.113.7", "203.0.113.7:80"));
        assert!(!permitted(&policy, "mirror.internal", "203.0.113.7:80"));
        let refusal = policy.check(ip("8.8.8.8")).expect_err("denied");
        assert_eq!(refusal.reason, Reason::Denied);
        assert_eq!(
            refusal.to_string(),
            "8.8.8.8 is refused by this node's configuration"
        );
    }

    #[test]
    fn allow_entries_read_back_as_written() {
        for text in [
            "10.0.0.5",
            "10.0.0.5:3141",
            "10.8.0.0/16",
            "10.8.0.0/16:443",
            "fd00::/8",
            "[fd00::/8]:443",
            "[fd00::5]:443",
            "fd00::5/128",
            "mirror.internal",
            "mirror.internal:3141",
        ] {
            let entry: Allow = text.parse().expect(text);
            let shown = entry.to_string();
            assert_eq!(shown.parse::<Allow>().expect(&shown), entry, "{text}");
        }
    }

    #[test]
    fn malformed_allow_entries_are_refused() {
        for text in [
            "",
            ":80",
            "host:",
            "host:0",
            "host:65536",
            "10.0.0.0/33",
            "[10.0.0.1]:80",
            "[fd00::1",
            "[fd00::1]80",
            "[mirror.internal]:80",
            "a b",
            "mirror/16",
            "http://mirror.internal",
            "user@mirror.internal",
        ] {
            assert!(text.parse::<Allow>().is_err(), "{text:?} was accepted");
        }
        assert!("10.0.0.0/8x".parse::<Cidr>().is_err());
    }

    #[test]
    fn a_network_clears_its_host_bits() {
        let net: Cidr = "10.1.2.3/8".parse().expect("a network");
        assert_eq!(net.to_string(), "10.0.0.0/8");
        assert_eq!(net.last(), ip("10.255.255.255"));
        let all: Cidr = "::/0".parse().expect("a network");
        assert!(all.contains(ip("2001:db8::1")));
        assert!(!all.contains(ip("1.2.3.4")));
    }

    #[test]
    fn hosts_are_literals_or_plain_names() {
        assert_eq!(Host::parse("10.0.0.1"), Some(Host::Ip(ip("10.0.0.1"))));
        assert_eq!(Host::parse("[::1]"), Some(Host::Ip(ip("::1"))));
        assert_eq!(
            Host::parse("Files.PythonHosted.org."),
            Some(Host::Name("files.pythonhosted.org".to_owned()))
        );
        for bad in [
            "",
            ".",
            "a..b",
            "::1",
            "[::1",
            "[10.0.0.1]",
            "a b",
            "a/b",
            "a@b",
            "é.org",
        ] {
            assert_eq!(Host::parse(bad), None, "{bad:?}");
        }
        assert_eq!(Host::parse(&"a".repeat(64)), None);
    }
}
