//! Semaphores on Postgres: what a permit holds on the server, a killed session giving its permit
//! back to a waiter of another client, refusals of another limit (or a lock) between clients
//! that leave nothing held, and the waiters' line: served in turn, woken by releases, and left
//! by a waiter that is dropped.

use crate::common;

use std::time::Duration;

use common::{
    advisory_locks, advisory_rows, client, eventually, name_key_holders, name_key_modes,
    names_both, sql, unique,
};
use dlock_api::{DistributedLock, LockName, LockOptions, LostReason};
use dlock_postgres::{AdvisoryKey, PostgresLock};
use sqlx::Row;
use tokio::time::timeout;

const BOUND: Duration = Duration::from_secs(30);

fn name(s: &str) -> LockName {
    LockName::new(unique(s)).unwrap()
}

fn wait() -> LockOptions {
    LockOptions::new().with_wait_timeout(BOUND)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_holds_a_slot_and_the_name_shared_on_its_own_session() {
    let app = unique("semlayout");
    let a = client(&app).await;
    let n = name("layout");
    let first = a
        .try_acquire_permit(&n, 3, &LockOptions::new())
        .await
        .unwrap()
        .unwrap();
    let second = a
        .try_acquire_permit(&n, 3, &LockOptions::new())
        .await
        .unwrap()
        .unwrap();
    // Each permit: its slot, the name's key and the limit key (both shared), on a session of
    // its own (a session never holds two permits of a name).
    assert_eq!(advisory_locks(&common::shared_url(), &app).await, (6, 0));
    assert_eq!(name_key_modes(&n).await, ["ShareLock", "ShareLock"]);
    assert_eq!(a.count_permits(&n).await.unwrap(), 2);
    assert!(first.fencing_token() < second.fencing_token());
    first.release().await.unwrap();
    assert_eq!(advisory_locks(&common::shared_url(), &app).await, (3, 0));
    second.release().await.unwrap();
    assert_eq!(advisory_locks(&common::shared_url(), &app).await, (0, 0));
    assert_eq!(a.count_permits(&n).await.unwrap(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_session_gives_its_permit_back_and_wakes_a_waiter_of_another_client() {
    let (a, b) = (
        client(&unique("semkill")).await,
        client(&unique("semwait")).await,
    );
    let n = name("killed");
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(
            a.try_acquire_permit(&n, 3, &LockOptions::new())
                .await
                .unwrap()
                .unwrap(),
        );
    }
    let waiter = {
        let (b, n) = (b.clone(), n.clone());
        tokio::spawn(async move { b.acquire_permit(&n, 3, &wait()).await })
    };
    // One of the three sessions holding the name (shared) ends.
    let (pid, _) = name_key_holders(&n).await[0].clone();
    let mut conn = sql(&common::shared_url()).await;
    let killed: bool = sqlx::query("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .fetch_one(&mut conn)
        .await
        .unwrap()
        .get(0);
    assert!(killed);
    let permit = timeout(BOUND, waiter)
        .await
        .expect("the waiter within the bound")
        .unwrap()
        .expect("the killed session's permit");
    // Exactly one of the holder's permits was lost, with its session.
    eventually("the killed permit's guard to learn it", || {
        let lost_now = held.iter().filter(|g| !g.is_held()).count();
        async move { lost_now == 1 }
    })
    .await;
    let gone = held.iter().position(|g| !g.is_held()).unwrap();
    assert_eq!(
        timeout(BOUND, held[gone].lost()).await.unwrap(),
        LostReason::SessionClosed
    );
    assert_eq!(a.count_permits(&n).await.unwrap(), 3);
    let beyond = b
        .try_acquire_permit(&n, 3, &LockOptions::new())
        .await
        .unwrap();
    assert!(beyond.is_none(), "a fourth permit of three");
    permit.release().await.unwrap();
    for guard in held {
        let _ = guard.release().await;
    }
    assert_eq!(a.count_permits(&n).await.unwrap(), 0);
}

/// Whether `error` is the refusal of `asked` permits of a name in use with `in_use`.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_limit_or_a_lock_is_refused_across_clients_and_leaves_nothing() {
    let app = unique("semrefused");
    let (a, b) = (client(&unique("semholder")).await, client(&app).await);
    let opts = LockOptions::new();
    let sem = name("assem");
    let held = a.try_acquire_permit(&sem, 3, &opts).await.unwrap().unwrap();

    // The holder's own client refuses another number at once, waiting or not.
    let own = a.acquire(&sem, &wait()).await;
    assert!(names_both(own.as_ref().unwrap_err(), 1, 3), "{own:?}");
    let own = a.acquire_permit(&sem, 4, &wait()).await;
    assert!(names_both(own.as_ref().unwrap_err(), 4, 3), "{own:?}");

    let other = b.try_acquire_permit(&sem, 4, &opts).await;
    assert!(names_both(other.as_ref().unwrap_err(), 4, 3), "{other:?}");
    let waited = b.acquire_permit(&sem, 2, &wait()).await;
    assert!(names_both(waited.as_ref().unwrap_err(), 2, 3), "{waited:?}");
    let as_lock = b.try_acquire(&sem, &opts).await;
    assert!(
        names_both(as_lock.as_ref().unwrap_err(), 1, 3),
        "{as_lock:?}"
    );
    let lock_waited = b.acquire(&sem, &wait()).await;
    assert!(
        names_both(lock_waited.as_ref().unwrap_err(), 1, 3),
        "{lock_waited:?}"
    );

    let lock = name("aslock");
    let guard = a.try_acquire(&lock, &opts).await.unwrap().unwrap();
    let on_lock = b.try_acquire_permit(&lock, 3, &opts).await;
    assert!(
        names_both(on_lock.as_ref().unwrap_err(), 3, 1),
        "{on_lock:?}"
    );
    let on_lock_waited = b.acquire_permit(&lock, 3, &wait()).await;
    assert!(
        names_both(on_lock_waited.as_ref().unwrap_err(), 3, 1),
        "{on_lock_waited:?}"
    );

    // Nothing of the refused client's is left on the server, and the holders' keys are as
    // they were.
    assert_eq!(advisory_locks(&common::shared_url(), &app).await, (0, 0));
    assert_eq!(name_key_modes(&sem).await, ["ShareLock"]);
    assert_eq!(name_key_modes(&lock).await, ["ExclusiveLock"]);
    assert_eq!(a.count_permits(&sem).await.unwrap(), 1);
    assert_eq!(
        b.count_permits(&lock).await.unwrap(),
        1,
        "a lock is one permit"
    );

    // Once the holders are gone, the names take any limit.
    held.release().await.unwrap();
    guard.release().await.unwrap();
    let four = b.try_acquire_permit(&sem, 4, &opts).await.unwrap().unwrap();
    let as_lock = a.try_acquire(&sem, &opts).await;
    assert!(
        names_both(as_lock.as_ref().unwrap_err(), 1, 4),
        "{as_lock:?}"
    );
    four.release().await.unwrap();
    let permit = b
        .try_acquire_permit(&lock, 2, &opts)
        .await
        .unwrap()
        .unwrap();
    permit.release().await.unwrap();
    let mut conn = sql(&common::shared_url()).await;
    for n in [&sem, &lock] {
        let rows = advisory_rows(&mut conn, &AdvisoryKey::Name(n.clone()))
            .await
            .unwrap();
        assert!(rows.is_empty(), "{n}: {rows:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_limits_racing_for_a_free_name_never_hold_together() {
    let (a, b) = (
        client(&unique("semrace")).await,
        client(&unique("semrace")).await,
    );
    let opts = LockOptions::new();
    for round in 0..40 {
        let n = name(&format!("race{round}"));
        let (x, y) = tokio::join!(
            a.try_acquire_permit(&n, 3, &opts),
            b.try_acquire_permit(&n, 4, &opts)
        );
        match (&x, &y) {
            (Ok(Some(_)), Err(e)) => assert!(names_both(e, 4, 3), "{e:?}"),
            (Err(e), Ok(Some(_))) => assert!(names_both(e, 3, 4), "{e:?}"),
            // Both refused or busy is allowed (each saw the other), both granted is not.
            (Ok(Some(_)), Ok(Some(_))) => panic!("limits 3 and 4 held {n} together"),
            _ => {}
        }
        for permit in [x, y].into_iter().flatten().flatten() {
            permit.release().await.unwrap();
        }
    }
}

/// The applications (`application_name`) of the sessions at the name's waiting room: the one
/// holding it (first in line), then those queued for it.
async fn room(name: &LockName) -> (Vec<String>, Vec<String>) {
    let k = dlock_api::KeyMapper::hash_i64(name);
    let room = LockName::new(format!("pg-advisory:{k}#room")).unwrap();
    let (classid, objid, objsubid) = AdvisoryKey::Name(room).pg_locks_ids();
    let mut conn = sql(&common::shared_url()).await;
    let rows = sqlx::query(
        "SELECT l.granted, a.application_name FROM pg_locks l JOIN pg_stat_activity a \
         USING (pid) WHERE l.locktype = 'advisory' AND l.classid = $1::bigint::oid \
         AND l.objid = $2::bigint::oid AND l.objsubid = $3",
    )
    .bind(i64::from(classid))
    .bind(i64::from(objid))
    .bind(objsubid)
    .fetch_all(&mut conn)
    .await
    .unwrap();
    let of = |granted: bool| {
        rows.iter()
            .filter(|r| r.get::<bool, _>(0) == granted)
            .map(|r| r.get::<String, _>(1))
            .collect()
    };
    (of(true), of(false))
}

/// Waits until `app`'s waiter holds the name's waiting room and `queued` wait for it.
async fn first_in_line(n: &LockName, app: &str, queued: &[&str]) {
    eventually("the waiters in line", || async move {
        let (first, mut behind) = room(n).await;
        behind.sort();
        first == [app] && behind == queued
    })
    .await;
}

fn permit_channel(n: &LockName) -> String {
    format!("dlock_permit_{:016x}", dlock_api::KeyMapper::hash_i64(n))
}

type Waiting = tokio::task::JoinHandle<dlock_api::Result<dlock_api::LockGuard>>;

/// `holder` takes both permits of `n`; then `first` and `second` wait for one, in that order,
/// and are in line (`apps`: their applications).
async fn both_taken_and_two_in_line(
    (holder, first, second): (&PostgresLock, &PostgresLock, &PostgresLock),
    n: &LockName,
    apps: [&str; 2],
) -> (dlock_api::LockGuard, dlock_api::LockGuard, Waiting, Waiting) {
    let now = LockOptions::new();
    let take = || holder.try_acquire_permit(n, 2, &now);
    let held = (
        take().await.unwrap().unwrap(),
        take().await.unwrap().unwrap(),
    );
    let waiting = |client: &PostgresLock| {
        let (client, n) = (client.clone(), n.clone());
        tokio::spawn(async move { client.acquire_permit(&n, 2, &wait()).await })
    };
    let first_waits = waiting(first);
    first_in_line(n, apps[0], &[]).await;
    let second_waits = waiting(second);
    first_in_line(n, apps[0], &[apps[1]]).await;
    (held.0, held.1, first_waits, second_waits)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_of_three_clients_are_served_in_line_each_woken_by_a_release() {
    let apps = [
        unique("semline-a"),
        unique("semline-b"),
        unique("semline-c"),
    ];
    let (a, b, c) = (
        client(&apps[0]).await,
        client(&apps[1]).await,
        client(&apps[2]).await,
    );
    let n = name("line");
    let mut heard = sqlx::postgres::PgListener::connect(&common::shared_url())
        .await
        .unwrap();
    heard.listen(&permit_channel(&n)).await.unwrap();
    let (first, second, b_waits, c_waits) =
        both_taken_and_two_in_line((&a, &b, &c), &n, [&apps[1], &apps[2]]).await;

    // A release while someone is first in line notifies; the first in line takes the permit,
    // and the next steps up.
    first.release().await.unwrap();
    timeout(BOUND, heard.recv())
        .await
        .expect("a notification")
        .unwrap();
    let for_b = timeout(BOUND, b_waits).await.unwrap().unwrap().unwrap();
    first_in_line(&n, &apps[2], &[]).await;
    second.release().await.unwrap();
    let for_c = timeout(BOUND, c_waits).await.unwrap().unwrap().unwrap();
    assert!(for_b.fencing_token() < for_c.fencing_token());
    assert_eq!(room(&n).await, (vec![], vec![]), "nobody is left in line");

    // With nobody in line, a release tells nobody.
    while timeout(Duration::from_millis(100), heard.recv())
        .await
        .is_ok()
    {}
    for_b.release().await.unwrap();
    for_c.release().await.unwrap();
    let quiet = timeout(Duration::from_millis(200), heard.recv()).await;
    assert!(quiet.is_err(), "{quiet:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_waiter_dropped_leaves_the_line_to_the_next() {
    let apps = [
        unique("semdrop-a"),
        unique("semdrop-b"),
        unique("semdrop-c"),
    ];
    // b's server-side waits last longer than `eventually` waits: only the interrupt can end
    // its turn in time.
    let patient = common::with_options(
        &common::shared_url(),
        &format!("application_name={}&wait_slice=120s", apps[1]),
    );
    let (a, b, c) = (
        client(&apps[0]).await,
        PostgresLock::connect_url(&patient).await.unwrap(),
        client(&apps[2]).await,
    );
    let n = name("dropped");
    let (held, other, b_waits, c_waits) =
        both_taken_and_two_in_line((&a, &b, &c), &n, [&apps[1], &apps[2]]).await;
    // The first waiter waits between statements, where no cancel reaches it: its client's
    // interrupt does, and it leaves the room.
    b_waits.abort();
    first_in_line(&n, &apps[2], &[]).await;
    held.release().await.unwrap();
    let permit = timeout(BOUND, c_waits).await.unwrap().unwrap().unwrap();
    assert_eq!(a.count_permits(&n).await.unwrap(), 2, "c's and a's other");
    permit.release().await.unwrap();
    other.release().await.unwrap();
    assert_eq!(b.count_permits(&n).await.unwrap(), 0);
}
