//! Connecting through the server's Unix socket: a host that is a path is the socket's directory,
//! as libpq reads it, whether percent-encoded in the authority or given as the `host` option of a
//! URL without a host.

use dlock_api::{DistributedLock, LockName, LockOptions};
use dlock_postgres::PostgresLock;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_through_the_unix_socket() {
    let pg = dlock_test_servers::shared_postgres();
    let dir = pg.socket_dir().display().to_string();
    let encoded: String = url::form_urlencoded::byte_serialize(dir.as_bytes()).collect();
    let port = pg.port();
    for url in [
        format!("postgres://postgres@{encoded}:{port}/postgres"),
        format!("postgresql:///postgres?host={encoded}&port={port}&user=postgres"),
    ] {
        let locks = PostgresLock::connect_url(&url).await.unwrap();
        assert_eq!(locks.config().host, dir, "{url}");
        let guard = locks
            .acquire(&LockName::new("socket/lock").unwrap(), &LockOptions::new())
            .await
            .unwrap();
        // The server sees dlock's sessions on the socket (no client address), none over TCP.
        let seen = pg
            .query(
                "SELECT count(*) FILTER (WHERE client_addr IS NULL) > 0 \
                 AND count(*) FILTER (WHERE client_addr IS NOT NULL) = 0 \
                 FROM pg_stat_activity WHERE application_name = 'dlock'",
            )
            .unwrap();
        assert_eq!(
            seen.trim(),
            "t",
            "dlock did not connect through the socket: {url}"
        );
        guard.release().await.unwrap();
    }
}
