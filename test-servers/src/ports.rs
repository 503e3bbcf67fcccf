//! Free loopback ports.
//!
//! A port is drawn at random below the kernel's ephemeral range (32768 and up on Linux), checked by binding
//! it, and handed to a server. Below that range no outgoing connection takes it as its source port in the gap
//! between the check and the server's bind: a port the kernel chose for `127.0.0.1:0` is an ephemeral one,
//! and a parallel test's connection took such a port from a ZooKeeper about to bind it. Every port handed out
//! is remembered for the life of the process, so two servers started by parallel tests of one binary never
//! get the same number. (Another process could still bind the port in the gap; the server then fails to
//! bind, exits, and the start fails with its log.)

use std::collections::HashSet;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::io;
use std::net::{Ipv4Addr, TcpListener};
use std::sync::{Mutex, MutexGuard};

static HANDED_OUT: Mutex<Option<HashSet<u16>>> = Mutex::new(None);

fn handed_out() -> MutexGuard<'static, Option<HashSet<u16>>> {
    HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner())
}

fn can_bind(port: u16) -> bool {
    TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok()
}

/// Returns a loopback TCP port that is free now and that this process has not handed out before.
///
/// # Errors
/// When no fresh free port was found in many tries.
pub fn free_port() -> io::Result<u16> {
    let random = RandomState::new();
    for attempt in 0u64..500 {
        let port = FIRST_DRAWN.saturating_add((random.hash_one(attempt) % PORTS_DRAWN) as u16);
        let mut seen = handed_out();
        let seen = seen.get_or_insert_with(HashSet::new);
        if !seen.contains(&port) && can_bind(port) {
            seen.insert(port);
            return Ok(port);
        }
    }
    Err(io::Error::other("no fresh free loopback port found"))
}

/// Where [`free_port`] draws from: `PORTS_DRAWN` ports from `FIRST_DRAWN`, above the
/// well-known and commonly configured ports, below the kernel's ephemeral range.
const FIRST_DRAWN: u16 = 10_000;
const PORTS_DRAWN: u64 = 22_000;

/// Returns a port `p` such that both `p` and `p + offset` are free and not handed out before (Redis Cluster
/// needs its bus port at `p + 10000`). Both are reserved. `p` is drawn at random from 10000..22000, so that `p`
/// and `p + offset` (for offsets up to 10000) both stay below the kernel's ephemeral range (32768 and up on
/// Linux): there, any outgoing connection of a parallel test could take the port as its source port between
/// this check and the server's bind.
pub(crate) fn free_port_pair(offset: u16) -> io::Result<u16> {
    let random = RandomState::new();
    for attempt in 0u64..500 {
        let port = 10_000u16.saturating_add((random.hash_one(attempt) % 12_000) as u16);
        let Some(other) = port.checked_add(offset) else {
            continue;
        };
        let mut seen = handed_out();
        let seen = seen.get_or_insert_with(HashSet::new);
        if seen.contains(&port) || seen.contains(&other) || !can_bind(port) || !can_bind(other) {
            continue;
        }
        seen.insert(port);
        seen.insert(other);
        return Ok(port);
    }
    Err(io::Error::other("no free loopback port pair found"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_not_handed_out_twice() {
        let a: HashSet<u16> = (0..50).map(|_| free_port().unwrap()).collect();
        assert_eq!(a.len(), 50);
        let p = free_port_pair(10_000).unwrap();
        assert!(!a.contains(&p));
        // A test of this binary that forks a process at this moment briefly holds a copy of every open
        // socket, including the probe listeners above (until its exec closes them): allow for that.
        let bindable = (0..100).any(|_| {
            let both = can_bind(p) && can_bind(p + 10_000);
            if !both {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            both
        });
        assert!(bindable, "port pair {p}/{} not bindable", p + 10_000);
    }
}
