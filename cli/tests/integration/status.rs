//! `dlock status` against a real server of every backend: a name held by another client shows
//! held, with its holder's fencing token where the server can tell it, and a free name free.
//! (Redis's own status tests, with its lease left and owner value, are in `cli_redis.rs`.)

use crate::common;

use serde_json::Value;

/// Holds `held` through the library, runs `dlock status --json` on it and on `free`, and checks
/// what it says. `token_known`: the server keeps the holder's token per name (not where one
/// sequence serves every name: MariaDB, Postgres).
#[allow(dead_code)]
fn status_reports_a_held_and_a_free_name(url: &str, token_known: bool) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (held, free) = ("cli-status/held", "cli-status/free");
    let (locks, guard) = runtime.block_on(async {
        use dlock_api::DistributedLockExt;
        let locks = dlock::connect(url).await.unwrap();
        let guard = locks
            .try_acquire_str(held, &dlock_api::LockOptions::new())
            .await
            .unwrap()
            .expect("the name is free");
        (locks, guard)
    });
    let stdout = common::succeeds(["status", "--json", "--backend", url, held, free]);
    let json: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    let (held_line, free_line) = (&json["locks"][0], &json["locks"][1]);
    assert_eq!(held_line["name"], held, "{json}");
    assert_eq!(held_line["held"], true, "{json}");
    match token_known {
        true => assert_eq!(held_line["token"], guard.fencing_token().get(), "{json}"),
        false => assert!(held_line["token"].is_null(), "{json}"),
    }
    assert_eq!(free_line["name"], free, "{json}");
    assert_eq!(free_line["held"], false, "{json}");

    runtime.block_on(guard.release()).unwrap();
    let after = common::succeeds(["status", "--json", "--backend", url, held]);
    let json: Value = serde_json::from_str(&after).unwrap();
    assert_eq!(json["locks"][0]["held"], false, "released: {json}");
    runtime.block_on(async move { drop(locks) });
}

#[cfg(feature = "redlock")]
#[test]
fn status_on_redlock() {
    let nodes = dlock_test_servers::RedisNodes::start(3).unwrap_or_else(|e| panic!("{e}"));
    let hosts: Vec<String> = nodes.nodes().iter().map(|n| n.addr().to_string()).collect();
    status_reports_a_held_and_a_free_name(&format!("redlock://{}", hosts.join(",")), true);
}

#[cfg(feature = "mysql")]
#[test]
fn status_on_mariadb() {
    let server = dlock_test_servers::MariaDb::start().unwrap_or_else(|e| panic!("{e}"));
    status_reports_a_held_and_a_free_name(&server.url(), false);
}

#[cfg(feature = "postgres")]
#[test]
fn status_on_postgres() {
    let server = dlock_test_servers::Postgres::start().unwrap_or_else(|e| panic!("{e}"));
    status_reports_a_held_and_a_free_name(&server.url(), false);
}

#[cfg(feature = "etcd")]
#[test]
fn status_on_etcd() {
    let server = dlock_test_servers::Etcd::start().unwrap_or_else(|e| panic!("{e}"));
    status_reports_a_held_and_a_free_name(&format!("etcd://{}", server.addr()), true);
}

#[cfg(feature = "zookeeper")]
#[test]
fn status_on_zookeeper() {
    let server = dlock_test_servers::ZooKeeper::start().unwrap_or_else(|e| panic!("{e}"));
    status_reports_a_held_and_a_free_name(&server.url(), true);
}
