//! Reader-writer locks on Postgres: what a reader holds on the server, readers of one client
//! on sessions of their own, a client's own line of readers and writers, and refusals between
//! readers and a semaphore's permits across clients.

use crate::common;

use std::time::Duration;

use common::{
    advisory_locks, client, eventually, name_key_holders, name_key_modes, names_both, unique,
};
use dlock_api::{DistributedLock, DistributedLockExt, LockGuard, LockName, LockOptions};
use dlock_postgres::PostgresLock;
use tokio::task::JoinHandle;
use tokio::time::timeout;

const BOUND: Duration = Duration::from_secs(30);

fn name(s: &str) -> LockName {
    LockName::new(unique(s)).unwrap()
}

fn wait() -> LockOptions {
    LockOptions::new().with_wait_timeout(BOUND)
}

fn spawn_read(client: &PostgresLock, name: &LockName) -> JoinHandle<dlock_api::Result<LockGuard>> {
    let (client, name) = (client.clone(), name.clone());
    tokio::spawn(async move { client.read(&name, &wait()).await })
}

fn spawn_write(client: &PostgresLock, name: &LockName) -> JoinHandle<dlock_api::Result<LockGuard>> {
    let (client, name) = (client.clone(), name.clone());
    tokio::spawn(async move { client.write(&name, &wait()).await })
}

async fn granted(what: &str, task: JoinHandle<dlock_api::Result<LockGuard>>) -> LockGuard {
    timeout(BOUND, task)
        .await
        .unwrap_or_else(|_| panic!("{what}: not granted within {BOUND:?}"))
        .unwrap()
        .unwrap_or_else(|e| panic!("{what}: {e}"))
}

/// Waits until the sessions of `app` wait for `waiting` advisory locks at the server.
async fn until_waiting(app: &str, waiting: i64) {
    eventually(
        &format!("{waiting} waits of {app} at the server"),
        || async { advisory_locks(&common::shared_url(), app).await.1 == waiting },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_holds_the_name_key_in_share_mode_with_the_readers_mark() {
    let app = unique("rwlayout");
    let a = client(&app).await;
    let n = name("layout");
    let reader = a.try_read(&n, &LockOptions::new()).await.unwrap().unwrap();
    // The name's key shared (what a writer's exclusive lock waits for), and the limit key of
    // one shared beside it: the mark that keeps a semaphore's permits out.
    assert_eq!(name_key_modes(&n).await, ["ShareLock"]);
    assert_eq!(advisory_locks(&common::shared_url(), &app).await, (2, 0));
    reader.release().await.unwrap();
    assert_eq!(advisory_locks(&common::shared_url(), &app).await, (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_readers_of_one_client_hold_on_two_sessions_and_a_writer_waits_for_both() {
    let (app, writer_app) = (unique("rwtwo"), unique("rwtwo_w"));
    let (a, b) = (client(&app).await, client(&writer_app).await);
    let n = name("two");
    let first = a.try_read(&n, &LockOptions::new()).await.unwrap().unwrap();
    let second = a.try_read(&n, &LockOptions::new()).await.unwrap().unwrap();
    let holders = name_key_holders(&n).await;
    assert_eq!(holders.len(), 2, "two shares of one client: {holders:?}");
    assert!(holders.iter().all(|(_, mode)| mode == "ShareLock"));
    assert_ne!(
        holders[0].0, holders[1].0,
        "two shares stacked on one session"
    );
    assert!(first.fencing_token() < second.fencing_token());

    let writer = spawn_write(&b, &n);
    until_waiting(&writer_app, 1).await;
    first.release().await.unwrap();
    // The other share still holds: the writer is still in the server's queue.
    assert_eq!(name_key_modes(&n).await, ["ShareLock"]);
    assert_eq!(
        advisory_locks(&common::shared_url(), &writer_app).await,
        (0, 1)
    );
    assert!(!writer.is_finished());
    let token = second.fencing_token();
    second.release().await.unwrap();
    let writer = granted("the writer after both readers left", writer).await;
    assert!(writer.fencing_token() > token);
    assert_eq!(name_key_modes(&n).await, ["ExclusiveLock"]);
    writer.release().await.unwrap();
    assert_eq!(advisory_locks(&common::shared_url(), &app).await, (0, 0));
}

/// A reader of a client whose own writer waits queues behind that writer (in the client as at
/// the server), and gets in once it has left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_waits_behind_its_own_clients_waiting_writer() {
    let app = unique("rwown");
    let (a, other) = (client(&app).await, client(&unique("rwown_o")).await);
    let n = name("own");
    let held = other
        .try_read(&n, &LockOptions::new())
        .await
        .unwrap()
        .unwrap();
    let writer = spawn_write(&a, &n);
    until_waiting(&app, 1).await;
    // Refused at once: a writer waits (the server refuses a share behind it).
    assert!(a.try_read(&n, &LockOptions::new()).await.unwrap().is_none());
    let reader = spawn_read(&a, &n);
    held.release().await.unwrap();
    let writer = granted("the waiting writer", writer).await;
    assert_eq!(name_key_modes(&n).await, ["ExclusiveLock"]);
    assert!(
        !reader.is_finished(),
        "a reader got in beside its client's writer"
    );
    writer.release().await.unwrap();
    let reader = granted("the reader after its client's writer", reader).await;
    reader.release().await.unwrap();
}

/// Readers of one client waiting behind another client's writer all get in when it leaves,
/// before a writer that started waiting after them: they wait at the server together.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_of_one_client_waiting_together_enter_together() {
    let (app, next_app) = (unique("rwtogether"), unique("rwtogether_n"));
    let (a, holder, next) = (
        client(&app).await,
        client(&unique("rwtogether_h")).await,
        client(&next_app).await,
    );
    let n = name("together");
    let first = holder
        .try_write(&n, &LockOptions::new())
        .await
        .unwrap()
        .unwrap();
    let readers = [spawn_read(&a, &n), spawn_read(&a, &n)];
    until_waiting(&app, 2).await;
    let next_writer = spawn_write(&next, &n);
    until_waiting(&next_app, 1).await;
    first.release().await.unwrap();
    let mut shares = Vec::new();
    for reader in readers {
        shares.push(granted("a waiting reader of the client", reader).await);
    }
    assert!(
        !next_writer.is_finished(),
        "the next writer got in beside the readers"
    );
    for share in shares {
        share.release().await.unwrap();
    }
    granted("the next writer", next_writer)
        .await
        .release()
        .await
        .unwrap();
}

/// Readers keep a semaphore's permits out of their name, and permits keep readers out, across
/// clients (where only the server knows), as an `InvalidArgument` that leaves nothing held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_and_permits_refuse_each_other_across_clients() {
    let (app_a, app_b) = (unique("rwsem_a"), unique("rwsem_b"));
    let (a, b) = (client(&app_a).await, client(&app_b).await);
    let (read_name, sem_name) = (name("read"), name("sem"));
    let reader = a
        .try_read(&read_name, &LockOptions::new())
        .await
        .unwrap()
        .unwrap();
    let refused = b
        .try_acquire_permit(&read_name, 2, &LockOptions::new())
        .await;
    assert!(
        refused.as_ref().is_err_and(|e| names_both(e, 2, 1)),
        "a permit beside a reader answered {refused:?}"
    );
    let permit = b
        .try_acquire_permit(&sem_name, 3, &LockOptions::new())
        .await
        .unwrap()
        .unwrap();
    let refused = a.try_read(&sem_name, &LockOptions::new()).await;
    assert!(
        refused.as_ref().is_err_and(|e| names_both(e, 1, 3)),
        "a reader beside permits answered {refused:?}"
    );
    let refused = a.read(&sem_name, &wait()).await;
    assert!(
        refused.as_ref().is_err_and(|e| names_both(e, 1, 3)),
        "a waiting reader beside permits answered {refused:?}"
    );
    assert_eq!(name_key_modes(&read_name).await, ["ShareLock"]);
    assert_eq!(a.count_permits(&sem_name).await.unwrap(), 1);
    reader.release().await.unwrap();
    permit.release().await.unwrap();
    assert_eq!(advisory_locks(&common::shared_url(), &app_a).await, (0, 0));
    assert_eq!(advisory_locks(&common::shared_url(), &app_b).await, (0, 0));
}
