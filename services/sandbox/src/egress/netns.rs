//! A sandbox's network namespace, the proxy's listening socket inside it, and the node's own
//! addresses.
//!
//! A session's namespace is its keeper's; a build's is made by the builder before the build
//! starts ([`new_namespace`]) and entered by the build's first process. A socket belongs to the network namespace it was created in, whoever holds it later. So
//! the node makes the sandbox's end of the proxy on a short-lived thread of its own that
//! enters the sandbox's namespace (`setns` changes only the calling thread), brings its
//! loopback up, binds and listens, and ends; the listener it returns is then accepted on by
//! the node's runtime like any other, while the sandbox sees it on its own `127.0.0.1`.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use rustix::net::{AddressFamily, SocketType};
use rustix::thread::LinkNameSpaceType;

/// A new network namespace, holding nothing but a loopback that is down, kept alive by the
/// descriptor returned (and by any socket made in it, such as [`listen_in`]'s). Made on a
/// short-lived thread of its own, so the caller's namespace never changes. The descriptor is
/// close-on-exec: a process enters the namespace with `setns` on it, never inherits it.
pub fn new_namespace() -> io::Result<OwnedFd> {
    std::thread::Builder::new()
        .name("plinth-egress-netns".to_owned())
        .spawn(|| -> io::Result<OwnedFd> {
            // SAFETY: a new network namespace for this thread alone, which ends right after
            // (`unshare` of CLONE_NEWNET changes no state shared with the other threads: not
            // the descriptor table, not the file system context).
            #[allow(unsafe_code)]
            unsafe { rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::NEWNET) }
                .map_err(|errno| context("making a network namespace", errno.into()))?;
            rustix::fs::open(
                "/proc/thread-self/ns/net",
                rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
                rustix::fs::Mode::empty(),
            )
            .map_err(|errno| context("opening the new network namespace", errno.into()))
        })?
        .join()
        .unwrap_or_else(|_| {
            Err(io::Error::other(
                "the thread making a network namespace panicked",
            ))
        })
}

/// A listening TCP socket bound to `addr` inside the network namespace `netns` (a descriptor
/// of `/proc/<pid>/ns/net` or a bind mount of one), with the namespace's loopback brought up
/// first. The listener is in blocking mode, as std makes it; set it non-blocking before
/// handing it to tokio. Its descriptor is close-on-exec, so no sandboxed process inherits it.
pub fn listen_in(netns: BorrowedFd<'_>, addr: SocketAddr) -> io::Result<std::net::TcpListener> {
    std::thread::scope(|scope| {
        std::thread::Builder::new()
            .name("plinth-egress-netns".to_owned())
            .spawn_scoped(scope, move || {
                // The thread ends here, so it never needs to return to the node's namespace.
                rustix::thread::move_into_link_name_space(netns, Some(LinkNameSpaceType::Network))
                    .map_err(|errno| {
                        context("entering the sandbox's network namespace", errno.into())
                    })?;
                loopback_up()?;
                std::net::TcpListener::bind(addr)
                    .map_err(|error| context("listening in the sandbox's network namespace", error))
            })?
            .join()
            .unwrap_or_else(|_| {
                Err(io::Error::other(
                    "the thread listening in a network namespace panicked",
                ))
            })
    })
}

/// Brings up `lo` in the calling thread's network namespace: a new namespace's loopback is
/// down, so not even `127.0.0.1` answers until this has run. Doing it twice is harmless.
pub fn loopback_up() -> io::Result<()> {
    bring_loopback_up().map_err(|errno| context("bringing lo up", errno.into()))
}

/// [`loopback_up`] with raw system calls only (nothing allocated, no lock taken), for a
/// process between `fork` and `exec` or one sharing the node's memory (a sandbox's keeper,
/// a build's first process).
pub fn bring_loopback_up() -> Result<(), rustix::io::Errno> {
    let socket = rustix::net::socket(AddressFamily::INET, SocketType::DGRAM, None)?;
    let mut request = ifreq_for(c"lo");
    // SAFETY: SIOCGIFFLAGS reads `ifr_name` and writes `ifr_ifru.ifru_flags` of the ifreq it
    // is given, which lives on this stack frame for the whole call.
    #[allow(unsafe_code)]
    let got = unsafe { libc::ioctl(socket.as_raw_fd(), libc::SIOCGIFFLAGS, &mut request) };
    if got < 0 {
        return Err(
            rustix::io::Errno::from_io_error(&io::Error::last_os_error())
                .unwrap_or(rustix::io::Errno::IO),
        );
    }
    // SAFETY: SIOCGIFFLAGS has just written the flags member of the union.
    #[allow(unsafe_code)]
    let flags = unsafe { request.ifr_ifru.ifru_flags };
    if flags & libc::IFF_UP as libc::c_short != 0 {
        return Ok(());
    }
    request.ifr_ifru.ifru_flags = flags | libc::IFF_UP as libc::c_short;
    // SAFETY: SIOCSIFFLAGS only reads the ifreq, which names `lo` and holds its flags.
    #[allow(unsafe_code)]
    let set = unsafe { libc::ioctl(socket.as_raw_fd(), libc::SIOCSIFFLAGS, &request) };
    if set < 0 {
        return Err(
            rustix::io::Errno::from_io_error(&io::Error::last_os_error())
                .unwrap_or(rustix::io::Errno::IO),
        );
    }
    Ok(())
}

/// An ifreq naming `name`, the rest zero.
fn ifreq_for(name: &std::ffi::CStr) -> libc::ifreq {
    // SAFETY: ifreq is plain C data (a name and a union of integers, addresses and a
    // pointer), for which all zero bytes is a valid value.
    #[allow(unsafe_code)]
    let mut request: libc::ifreq = unsafe { std::mem::zeroed() };
    for (slot, &byte) in request.ifr_name.iter_mut().zip(name.to_bytes()) {
        *slot = byte as libc::c_char;
    }
    request
}

/// Every address of the node's interfaces, in the calling thread's network namespace. A node
/// with a public address serves on it whatever listens on `0.0.0.0`, which the table (that
/// knows only special-purpose ranges) would let a sandbox reach: give the ones the table
/// permits to [`super::EgressPolicy::deny`].
pub fn node_addresses() -> io::Result<Vec<IpAddr>> {
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs stores into `list` a list it allocated; it is freed below, once.
    #[allow(unsafe_code)]
    if unsafe { libc::getifaddrs(&mut list) } != 0 {
        return Err(context(
            "listing the node's addresses",
            io::Error::last_os_error(),
        ));
    }
    let mut addresses = Vec::new();
    let mut cursor = list;
    while !cursor.is_null() {
        // SAFETY: `cursor` is an entry of the list getifaddrs made, not freed yet.
        #[allow(unsafe_code)]
        let entry = unsafe { &*cursor };
        if !entry.ifa_addr.is_null() {
            // SAFETY: `ifa_addr` points to a socket address whose family field says which
            // structure it is; only those two are read, as what they are.
            #[allow(unsafe_code)]
            let ip = unsafe {
                match i32::from((*entry.ifa_addr).sa_family) {
                    libc::AF_INET => {
                        let v4 = &*entry.ifa_addr.cast::<libc::sockaddr_in>();
                        Some(IpAddr::V4(Ipv4Addr::from(u32::from_be(v4.sin_addr.s_addr))))
                    }
                    libc::AF_INET6 => {
                        let v6 = &*entry.ifa_addr.cast::<libc::sockaddr_in6>();
                        Some(IpAddr::V6(Ipv6Addr::from(v6.sin6_addr.s6_addr)))
                    }
                    _ => None,
                }
            };
            addresses.extend(ip);
        }
        cursor = entry.ifa_next;
    }
    // SAFETY: the list getifaddrs made, freed once; no reference into it outlives this.
    #[allow(unsafe_code)]
    unsafe {
        libc::freeifaddrs(list)
    };
    Ok(addresses)
}

fn context(what: &str, error: io::Error) -> io::Error {
    io::Error::new(error.kind(), format!("{what}: {error}"))
}

/// A network namespace made ahead of need, with the egress proxy's listener already bound in
/// it when sandboxes get one. Making a namespace costs ~1 ms, and far more while the kernel
/// is tearing down others (sessions ending): made in the background, it costs an attach
/// nothing.
#[derive(Debug)]
pub struct SpareNetwork {
    /// The namespace (the sandbox's keeper enters it).
    pub namespace: OwnedFd,
    /// The proxy's listener inside it, when sandboxes reach the network through the proxy.
    pub listener: Option<std::net::TcpListener>,
}

/// Spare network namespaces, kept at a count by [`SpareNetworks::refill`].
#[derive(Debug)]
pub struct SpareNetworks {
    spares: std::sync::Mutex<Vec<SpareNetwork>>,
    keep: usize,
    listen: Option<SocketAddr>,
}

impl SpareNetworks {
    /// Keeps `keep` spares, each with a listener at `listen` when given.
    pub fn new(keep: usize, listen: Option<SocketAddr>) -> Self {
        SpareNetworks {
            spares: std::sync::Mutex::new(Vec::with_capacity(keep)),
            keep,
            listen,
        }
    }

    fn make(&self) -> io::Result<SpareNetwork> {
        let namespace = new_namespace()?;
        let listener = match self.listen {
            Some(addr) => Some(listen_in(namespace.as_fd(), addr)?),
            None => None,
        };
        Ok(SpareNetwork {
            namespace,
            listener,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<SpareNetwork>> {
        self.spares
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A spare, or one made now when none is ready. Blocking.
    pub fn take(&self) -> io::Result<SpareNetwork> {
        let spare = self.lock().pop();
        match spare {
            Some(spare) => Ok(spare),
            None => self.make(),
        }
    }

    /// Makes spares until there are enough. Blocking.
    pub fn refill(&self) -> io::Result<()> {
        while self.lock().len() < self.keep {
            let spare = self.make()?;
            self.lock().push(spare);
        }
        Ok(())
    }

    /// Whether fewer than the count are ready.
    pub fn wanting(&self) -> bool {
        self.lock().len() < self.keep
    }
}
