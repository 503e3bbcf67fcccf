//! The fence window: tokens drawn from an unlogged sequence, good below a durably reserved
//! limit, renewed when exhausted or after a crash resets the unlogged sequence.

use crate::common;

use dlock_api::{DistributedLock, LockName, LockOptions};
use dlock_postgres::{PostgresConfig, PostgresLock};
use sqlx::Row;

async fn token_of(locks: &PostgresLock, name: &LockName) -> u64 {
    let guard = locks
        .try_acquire(name, &LockOptions::new())
        .await
        .unwrap()
        .expect("the name is free");
    let token = guard.fencing_token().get();
    guard.release().await.unwrap();
    token
}

/// `n` tokens, each from a grant on alternating clients: the order every holder sees.
async fn tokens(clients: &[&PostgresLock], name: &LockName, n: usize) -> Vec<u64> {
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        out.push(token_of(clients[i % clients.len()], name).await);
    }
    out
}

/// The shared server's configuration, with tokens from the sequence `seq`.
fn config_for(url: &str, seq: &str) -> PostgresConfig {
    let mut config = PostgresConfig::from_url(url).unwrap();
    config.set_option("fence_sequence", seq).unwrap();
    config
}

fn rising(tokens: &[u64]) {
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens not strictly rising: {tokens:?}"
    );
}

async fn scalar(url: &str, sql: &str) -> i64 {
    let mut conn = common::sql(url).await;
    sqlx::query(sql)
        .fetch_one(&mut conn)
        .await
        .unwrap()
        .get::<i64, _>(0)
}

/// Small windows make renewals frequent: tokens from two clients keep rising across them, each
/// renewal reserving a window on the durable sequence; a reset of the unlogged sequence (what
/// a crash does) is caught by the next draw; and tokens taken from the durable sequence by
/// someone else are skipped at the next renewal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_rise_across_renewals_and_resets() {
    let url = common::shared_url();
    let seq = common::unique("fw");
    let mut config = config_for(&url, &seq);
    config.set_option("fence_window", "3").unwrap();
    let a = PostgresLock::connect(config.clone()).await.unwrap();
    let b = PostgresLock::connect(config.clone()).await.unwrap();
    let name = LockName::new(common::unique("fw")).unwrap();

    let mut seen = tokens(&[&a, &b], &name, 20).await;
    rising(&seen);
    // Every token lies below what the durable sequence reserved.
    let reserved = scalar(&url, &format!("SELECT last_value FROM {seq}")).await;
    assert!(
        seen.iter().all(|&t| (t as i64) <= reserved),
        "{seen:?} beyond the reservation {reserved}"
    );

    // A crash resets the unlogged sequence to its start: drawn tokens go negative.
    scalar(
        &url,
        &format!("SELECT setval('{seq}_fast', -9223372036854775808, false)"),
    )
    .await;
    seen.extend(tokens(&[&a, &b], &name, 6).await);
    rising(&seen);

    // A client of an older dlock took tokens from the durable sequence itself: once it is
    // gone, the next renewal moves the window above what it took.
    let taken = scalar(
        &url,
        &format!("SELECT setval('{seq}', last_value + 1000) FROM {seq}"),
    )
    .await;
    seen.extend(tokens(&[&a, &b], &name, 6).await);
    rising(&seen);
    assert!(
        *seen.last().unwrap() as i64 > taken,
        "{seen:?} stayed below the {taken} taken outside"
    );
}

/// `fence_window=0`: a `nextval` on the durable sequence per acquire, no window objects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fence_window_zero_takes_nextval_per_acquire() {
    let url = common::shared_url();
    let seq = common::unique("fw0");
    let locks = PostgresLock::connect_url(&common::with_options(
        &url,
        &format!("fence_sequence={seq}&fence_window=0"),
    ))
    .await
    .unwrap();
    let name = LockName::new(common::unique("fw0")).unwrap();
    let seen = tokens(&[&locks], &name, 5).await;
    assert_eq!(seen, vec![1, 2, 3, 4, 5]);
    let window = scalar(
        &url,
        &format!("SELECT count(*) FROM pg_class WHERE relname = '{seq}_window'"),
    )
    .await;
    assert_eq!(window, 0, "fence_window=0 created the window table");
}

/// A real crash (the server killed, restarted, recovering): the unlogged sequence comes back
/// reset, and the first acquire after it renews above every token handed out before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_resets_the_unlogged_sequence_and_tokens_still_rise() {
    let server = common::own_server();
    let url = server.url();
    let name = LockName::new("crash").unwrap();
    let before = {
        let locks = PostgresLock::connect_url(&url).await.unwrap();
        let a = PostgresLock::connect_url(&url).await.unwrap();
        tokens(&[&locks, &a], &name, 10).await
    };
    rising(&before);
    server.kill();
    tokio::task::block_in_place(|| server.restart()).expect("postgres restarts");
    let fast = scalar(&url, "SELECT last_value FROM dlock_fence_seq_fast").await;
    assert!(
        fast < 0,
        "the unlogged sequence survived the crash at {fast}"
    );
    let locks = PostgresLock::connect_url(&url).await.unwrap();
    let after = tokens(&[&locks], &name, 5).await;
    let mut all = before.clone();
    all.extend(&after);
    rising(&all);
}

/// A renewal function left by another version of dlock is replaced on connect (or, with
/// `create_fence=false`, refused until `migrate()` replaces it); a window table whose row is
/// missing is filled by the next renewal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outdated_window_is_replaced_or_refused() {
    let url = common::shared_url();
    let seq = common::unique("fwv");
    let config = config_for(&url, &seq);
    PostgresLock::connect(config.clone()).await.unwrap();
    let mut conn = common::sql(&url).await;
    sqlx::raw_sql(&format!(
        "CREATE OR REPLACE FUNCTION {seq}_renew(size bigint, OUT token bigint, OUT lim bigint) \
         LANGUAGE plpgsql AS $$ BEGIN token := 1; lim := 2; END $$; DELETE FROM {seq}_window"
    ))
    .execute(&mut conn)
    .await
    .unwrap();

    let mut strict = config.clone();
    strict.set_option("create_fence", "false").unwrap();
    let refused = PostgresLock::connect(strict.clone()).await;
    let Err(dlock_api::LockError::Config { reason, .. }) = refused else {
        panic!("expected a Config error, got {refused:?}");
    };
    assert!(reason.contains("migrate"), "{reason}");

    let locks = PostgresLock::connect(config).await.unwrap();
    let name = LockName::new(common::unique("fwv")).unwrap();
    let seen = tokens(&[&locks], &name, 5).await;
    // The outdated function answers 1 every time.
    rising(&seen);
    PostgresLock::connect(strict).await.unwrap();
}

/// With `create_fence=false`, a client connecting as a user with only the grants `migrate()`
/// documents takes tokens and renews windows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_grants_are_enough() {
    let url = common::shared_url();
    let seq = common::unique("fwg");
    let role = common::unique("fwg_user");
    let mut config = config_for(&url, &seq);
    config.set_option("fence_window", "2").unwrap();
    PostgresLock::connect(config.clone())
        .await
        .unwrap()
        .migrate()
        .await
        .unwrap();
    let mut conn = common::sql(&url).await;
    sqlx::raw_sql(&format!(
        "CREATE ROLE {role} LOGIN; \
         GRANT USAGE, UPDATE ON SEQUENCE {seq}_fast, {seq} TO {role}; \
         GRANT SELECT, INSERT, UPDATE ON {seq}_window TO {role}"
    ))
    .execute(&mut conn)
    .await
    .unwrap();
    config.set_option("create_fence", "false").unwrap();
    config.user = role.clone();
    let locks = PostgresLock::connect(config).await.unwrap();
    let name = LockName::new(common::unique("fwg")).unwrap();
    let seen = tokens(&[&locks], &name, 7).await;
    rising(&seen);
    drop(locks);
    sqlx::raw_sql(&format!("DROP OWNED BY {role}; DROP ROLE {role}"))
        .execute(&mut conn)
        .await
        .ok();
}

/// Clients that connect at the same moment to a fence nobody has created yet all get one: a
/// `CREATE … IF NOT EXISTS` racing another still fails on Postgres ("already exists"), and that
/// failure means the object is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_connecting_at_once_all_create_the_fence() {
    let url = common::shared_url();
    for _ in 0..5 {
        let config = config_for(&url, &common::unique("fwrace"));
        let connects: Vec<_> = (0..8)
            .map(|_| tokio::spawn(PostgresLock::connect(config.clone())))
            .collect();
        let mut clients = Vec::new();
        for connect in connects {
            clients.push(connect.await.unwrap().unwrap());
        }
        let name = LockName::new(common::unique("fwrace")).unwrap();
        let refs: Vec<&PostgresLock> = clients.iter().collect();
        rising(&tokens(&refs, &name, 8).await);
    }
}
