//! Sentinel and Cluster deployments behind a fault proxy per member, for the link cases.
//!
//! A client of a Sentinel or a Cluster connects to the servers the deployment names (the primary
//! a Sentinel reports, the nodes of a Cluster's slot map), not to the ones its URL lists, so a
//! proxy in front of the listed servers alone would not carry its lock's traffic. A proxied
//! client lists the proxies of the entry points and maps every announced data node to its own
//! proxy with the `nat_map` option: each of its connections then crosses a proxy of its own,
//! while clients of the plain URL connect directly, as a link fault between one client and
//! everything it reaches needs.

use std::net::SocketAddr;
use std::sync::Arc;

use dlock_conformance::{Harness, ProxyTarget};
use dlock_redis::RedisConfig;

use super::{RedisHarness, text};

/// The deployment at `url` as a [`ProxyTarget`]: one upstream per member (the servers the URL
/// lists, then the data nodes they announce), and clients that reach each member through the
/// proxy at the same position.
pub async fn proxy_target(
    label: &'static str,
    url: String,
    url_var: &'static str,
    direct: Arc<dyn Harness>,
) -> Result<ProxyTarget, String> {
    let config = RedisConfig::from_url(&url).map_err(text)?;
    let members = dlock_redis::driver::members(&config).await.map_err(text)?;
    let (entry, data) = (members.listed, members.announced);
    let upstreams = entry
        .iter()
        .chain(&data)
        .map(|member| resolve(member))
        .collect::<Result<Vec<_>, _>>()?;
    let reach_at = move |proxies: &[SocketAddr]| -> Arc<dyn Harness> {
        let (entry_proxies, data_proxies) = proxies.split_at(entry.len());
        let nat_map = data
            .iter()
            .zip(data_proxies)
            .map(|(announced, proxy)| format!("{announced}={proxy}"))
            .collect::<Vec<_>>()
            .join(",");
        let proxied = with_servers(&url, entry_proxies, &nat_map);
        Arc::new(RedisHarness::at(label, proxied, url_var))
    };
    Ok(ProxyTarget::owned(upstreams, direct, reach_at, ()))
}

fn resolve(member: &str) -> Result<SocketAddr, String> {
    use std::net::ToSocketAddrs;
    member
        .to_socket_addrs()
        .map_err(text)?
        .next()
        .ok_or_else(|| format!("{member} resolves to nothing"))
}

/// `url` with its servers replaced by `servers` and `nat_map` added to its options.
fn with_servers(url: &str, servers: &[SocketAddr], nat_map: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("redis", url));
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let credentials = authority.rfind('@').map_or("", |at| &authority[..=at]);
    let hosts = servers
        .iter()
        .map(SocketAddr::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let joiner = if tail.contains('?') { '&' } else { '?' };
    format!("{scheme}://{credentials}{hosts}{tail}{joiner}nat_map={nat_map}")
}

#[test]
fn a_proxied_url_lists_the_proxies_and_maps_the_rest() {
    let at: Vec<SocketAddr> = vec!["127.0.0.1:9001".parse().unwrap()];
    assert_eq!(
        with_servers("redis+sentinel://a:1,b:2/m?wait_replicas=1", &at, "x:1=y:2"),
        "redis+sentinel://127.0.0.1:9001/m?wait_replicas=1&nat_map=x:1=y:2"
    );
    assert_eq!(
        with_servers("redis+cluster://u:p@a:1", &at, "a:1=127.0.0.1:9001"),
        "redis+cluster://u:p@127.0.0.1:9001?nat_map=a:1=127.0.0.1:9001"
    );
}
