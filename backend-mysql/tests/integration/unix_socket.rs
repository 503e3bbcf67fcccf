//! Connecting through the server's Unix socket (`?socket=PATH`).

use dlock_api::{DistributedLock, LockName, LockOptions};
use dlock_mysql::MySqlLock;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_through_the_unix_socket() {
    let db = dlock_test_servers::shared_mariadb();
    // Port 1: nothing listens there, so the lock can only come through the socket.
    let url = format!(
        "mysql://root@127.0.0.1:1/test?socket={}",
        db.socket_path().display()
    );
    // Without a host, the socket is the only way there is.
    let hostless = format!("mariadb://root@/test?socket={}", db.socket_path().display());
    let locks = MySqlLock::connect_url(&hostless).await.unwrap();
    let name = LockName::new("socket/lock").unwrap();
    let guard = locks.acquire(&name, &LockOptions::new()).await.unwrap();
    let other = MySqlLock::connect_url(&url).await.unwrap();
    assert!(
        other
            .try_acquire(&name, &LockOptions::new())
            .await
            .unwrap()
            .is_none(),
        "the name is held"
    );
    guard.release().await.unwrap();
}
