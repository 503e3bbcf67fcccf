//! dlock-cli's tests, other than the conformance suites, in one test binary: one build and one
//! link instead of one per file. Each file is a module; `cargo test -p dlock-cli --test integration
//! -- cli::` runs one of them.

#[path = "../common/mod.rs"]
mod common;

mod cli;
#[cfg(feature = "redis")]
mod cli_redis;
#[cfg(feature = "redlock")]
mod cli_redlock;
#[cfg(feature = "redis")]
mod elect;
#[cfg(feature = "etcd")]
mod floor_etcd;
#[cfg(feature = "mysql")]
mod floor_mysql;
#[cfg(feature = "postgres")]
mod floor_postgres;
#[cfg(feature = "redis")]
mod floor_redis;
#[cfg(feature = "redlock")]
mod floor_redlock;
#[cfg(feature = "zookeeper")]
mod floor_zookeeper;
#[cfg(feature = "etcd")]
mod rw;
mod scale;
mod status;
