//! The vNodes' loopbacks (`loopback = "vnode"`): one network namespace per vNode on this
//! host, with only its loopback interface, where a skeleton's socket goes when its address is
//! loopback (or all of the host's, for its loopback part). A vNode's loopback servers are then
//! not on the host's loopback at all: no process of this host reaches them (a program of
//! another vNode that got around its socket stub, a program not run under splitos), only the
//! vNode's own skeletons, which the proxy makes there. A socket keeps the namespace it was made
//! in, so only its making switches namespace, on the thread that makes it.
use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Arc, Mutex};

use socket2::{Domain, Protocol, Socket, Type};

/// Where a skeleton's socket is: the host's namespace (its interfaces), or its vNode's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Realm {
    Host,
    Vnode,
}

impl Realm {
    /// Where an address is: loopback and the unspecified address (which Linux routes to
    /// loopback) are the vNode's.
    pub fn of(ip: std::net::IpAddr) -> Realm {
        let ip = ip.to_canonical();
        if ip.is_loopback() || ip.is_unspecified() {
            Realm::Vnode
        } else {
            Realm::Host
        }
    }
}

pub struct Namespaces {
    /// The namespace the nComponent started in.
    host: OwnedFd,
    vnodes: Mutex<HashMap<String, Arc<OwnedFd>>>,
}

fn open_own() -> io::Result<OwnedFd> {
    // SAFETY: open(2) of a constant path; the result is checked before it is owned.
    let fd = unsafe { libc::open(c"/proc/thread-self/ns/net".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor just opened that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn enter(ns: &OwnedFd) -> io::Result<()> {
    // SAFETY: setns(2) on a namespace descriptor; it changes only this thread's namespace.
    if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Brings the thread's namespace back to the host's when dropped.
struct Back<'a>(&'a OwnedFd);

impl Drop for Back<'_> {
    fn drop(&mut self) {
        if let Err(e) = enter(self.0) {
            // Every later socket of this thread would be made in a vNode's namespace.
            tracing::error!(error = %e, "cannot return to the host's network namespace");
            std::process::abort();
        }
    }
}

/// Brings up the loopback interface of the thread's namespace (a new one has it down).
fn loopback_up() -> io::Result<()> {
    let s = Socket::new(Domain::IPV4, Type::DGRAM, None)?;
    // SAFETY: ifreq is plain data, valid when zeroed.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, b) in ifr.ifr_name.iter_mut().zip(b"lo") {
        *d = *b as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS and SIOCSIFFLAGS read and write the live ifreq.
    unsafe {
        if libc::ioctl(s.as_raw_fd(), libc::SIOCGIFFLAGS, &mut ifr) != 0 {
            return Err(io::Error::last_os_error());
        }
        ifr.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
        if libc::ioctl(s.as_raw_fd(), libc::SIOCSIFFLAGS, &ifr) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

impl Namespaces {
    /// The host's namespace, and proof that this process may make vNodes' (it must be root).
    pub fn new() -> io::Result<Namespaces> {
        let ns = Namespaces {
            host: open_own()?,
            vnodes: Mutex::new(HashMap::new()),
        };
        ns.make()?;
        Ok(ns)
    }

    /// A new namespace with its loopback up.
    fn make(&self) -> io::Result<OwnedFd> {
        let _back = Back(&self.host);
        // SAFETY: unshare(2) with no pointers; it moves only this thread to a new namespace.
        if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let fd = open_own()?;
        loopback_up()?;
        Ok(fd)
    }

    fn of(&self, vnode: &str) -> io::Result<Arc<OwnedFd>> {
        let mut all = self.vnodes.lock().unwrap();
        if let Some(ns) = all.get(vnode) {
            return Ok(ns.clone());
        }
        let ns = Arc::new(self.make()?);
        all.insert(vnode.to_string(), ns.clone());
        tracing::info!(vnode, "made the vNode's loopback");
        Ok(ns)
    }

    /// How many vNodes have a loopback here.
    pub fn count(&self) -> usize {
        self.vnodes.lock().unwrap().len()
    }

    /// A non-blocking socket in `realm` of `vnode`.
    pub fn socket(
        &self,
        realm: Realm,
        vnode: &str,
        domain: Domain,
        ty: Type,
        protocol: Option<Protocol>,
    ) -> io::Result<Socket> {
        let s = match realm {
            Realm::Host => Socket::new(domain, ty, protocol)?,
            Realm::Vnode => {
                let ns = self.of(vnode)?;
                enter(&ns)?;
                let _back = Back(&self.host);
                Socket::new(domain, ty, protocol)?
            }
        };
        s.set_nonblocking(true)?;
        Ok(s)
    }
}
