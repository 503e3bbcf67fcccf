//! A client's link to its deployment: one fault proxy per server it talks to (one for most
//! backends, N for Redlock's nodes), faulted as one, as a cable or a firewall between the client
//! and everything it reaches would be.

use std::net::SocketAddr;

use dlock_test_servers::{FaultProxy, ProxyMode};

use crate::Failure;

/// Fault proxies in front of each of a deployment's servers, in the order of its upstreams.
pub struct Link {
    proxies: Vec<FaultProxy>,
}

impl Link {
    /// Starts a proxy in front of each upstream, all passing traffic.
    ///
    /// # Errors
    /// When a proxy cannot listen.
    pub fn start(upstreams: &[SocketAddr]) -> Result<Self, Failure> {
        let proxies = upstreams
            .iter()
            .map(|&upstream| {
                FaultProxy::start(upstream)
                    .map_err(|e| Failure(format!("cannot start a fault proxy: {e}")))
            })
            .collect::<Result<_, _>>()?;
        Ok(Self { proxies })
    }

    /// Where clients connect instead of the upstreams, in the same order.
    pub fn addrs(&self) -> Vec<SocketAddr> {
        self.proxies.iter().map(FaultProxy::addr).collect()
    }

    /// Puts every proxy in `mode`.
    pub fn set_mode(&self, mode: ProxyMode) {
        for proxy in &self.proxies {
            proxy.set_mode(mode);
        }
    }

    /// Delivers the replies every proxy held back.
    pub fn release_held(&self) {
        for proxy in &self.proxies {
            proxy.release_held();
        }
    }

    /// Closes every connection through the link (held replies discarded), as a client's
    /// reconnect after a timeout would; the mode stays.
    pub fn reset(&self) {
        for proxy in &self.proxies {
            proxy.reset();
        }
    }

    /// Back to passing traffic, everything held delivered.
    pub fn heal(&self) {
        for proxy in &self.proxies {
            proxy.heal();
        }
    }
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link")
            .field("addrs", &self.addrs())
            .finish()
    }
}
