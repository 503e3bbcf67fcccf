//! What a user reads when a connect fails: an unreachable server, a wrong or missing password
//! each read as one sentence that names the cause (printed, so `--nocapture` shows them; the
//! untrusted certificate is checked in `tls.rs`).

use dlock_api::LockError;
use dlock_conformance::errors::one_sentence;
use dlock_redis::RedisLock;
use dlock_test_servers::RedisServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_errors_read_as_one_sentence() {
    let closed = dlock_test_servers::free_port().unwrap();
    let unreachable =
        RedisLock::connect_url(&format!("redis://127.0.0.1:{closed}?connect_timeout=2s"))
            .await
            .expect_err("nothing listens there");
    println!("unreachable: {}", one_sentence("unreachable", &unreachable));

    let redis = RedisServer::start().unwrap_or_else(|e| panic!("{e}"));
    let client = redis::Client::open(redis.url()).unwrap();
    let mut admin = client.get_multiplexed_async_connection().await.unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("requirepass")
        .arg("right")
        .query_async(&mut admin)
        .await
        .unwrap();
    for (what, url) in [
        ("wrong password", format!("redis://:wrong@{}", redis.addr())),
        ("no password", format!("redis://{}", redis.addr())),
    ] {
        let error = RedisLock::connect_url(&url).await.expect_err(what);
        let said = one_sentence(what, &error);
        assert!(
            matches!(
                error,
                LockError::Config { .. } | LockError::Unavailable { .. }
            ),
            "{what}: {error:?}"
        );
        println!("{what}: {said}");
    }
}
