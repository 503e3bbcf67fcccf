//! Elections against a real Redis, where the shared cases do not reach: the leader record's
//! owner check on the server (a proclaim after the key expired, a record left beside another
//! holder's lock), a leader that vanishes without a word seen by an observer, and an observer's
//! subscription through a lost connection and after it is dropped.

use std::time::Duration;

use dlock_api::{
    DistributedLock, LeaderEvent, LeaderStream, LockError, LockName, LockOptions, Renewal,
};
use dlock_redis::RedisLock;
use dlock_test_servers::subscribed_client_ids;
use futures::StreamExt;

use crate::fence::{raw, server};

const BOUND: Duration = Duration::from_secs(60);

/// Waits (within the bound) until `check` says yes, asking every 20 ms.
async fn until<F: Future<Output = bool>>(what: &str, mut check: impl FnMut() -> F) {
    dlock_conformance::wait_for::within(BOUND, what, async {
        while !check().await {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
}

async fn exists(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> bool {
    let found: i64 = redis::cmd("EXISTS")
        .arg(key)
        .query_async(conn)
        .await
        .unwrap();
    found == 1
}

/// Waits until the holder of `keys` watches its lock (its fence carries the watch mark): after
/// that first look its watch looks again only minutes later, so a key deleted now is found by
/// the server's scripts, not by the watch.
async fn until_watched(conn: &redis::aio::MultiplexedConnection, keys: &dlock_redis::LockKeys) {
    until("the holder's watch", || {
        let mut conn = conn.clone();
        let fence = keys.fence.clone();
        async move {
            let value: Option<String> = redis::cmd("GET")
                .arg(&fence)
                .query_async(&mut conn)
                .await
                .unwrap();
            value.is_some_and(|v| v.contains('!'))
        }
    })
    .await;
}

/// The next event of `stream` that `wanted` accepts, within the bound: every item up to it, it
/// last.
async fn next_matching(
    what: &str,
    stream: &mut LeaderStream,
    wanted: impl Fn(&LeaderEvent) -> bool + Send + Sync,
) -> Vec<Result<LeaderEvent, String>> {
    let (event, mut seen) =
        dlock_conformance::wait_for::next_leader_event(BOUND, what, stream, wanted).await;
    seen.push(Ok(event));
    seen
}

fn leads(event: &LeaderEvent, value: &[u8]) -> bool {
    matches!(event, LeaderEvent::Leads(leader) if leader.value() == value)
}

/// A leader whose key expired on the server (its guard not yet aware) is refused by the
/// proclaim script itself: `NotHeld`, nothing written, the leadership lost; and a successor's
/// record is never replaced by the deposed leader's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proclaim_after_the_key_expired_is_refused() {
    let server = server();
    let mut conn = raw(&server).await;
    let (a, b) = (
        RedisLock::connect_url(&server.url()).await.unwrap(),
        RedisLock::connect_url(&server.url()).await.unwrap(),
    );
    let name = LockName::new("election/expired").unwrap();
    let keys = a.keys(&name);
    let no_renewal = LockOptions::new().with_renewal(Renewal::Off);
    let first = a.campaign(&name, b"first", &no_renewal).await.unwrap();
    until_watched(&conn, &keys).await;
    // The key expires on the server long before the lease the guard counts on.
    let _: () = redis::cmd("PEXPIRE")
        .arg(&keys.lock)
        .arg(1)
        .query_async(&mut conn)
        .await
        .unwrap();
    until("the key to expire", || {
        let mut conn = conn.clone();
        let key = keys.lock.clone();
        async move { !exists(&mut conn, &key).await }
    })
    .await;
    assert!(first.is_held(), "the guard already knew");
    let refused = first.proclaim(b"late").await;
    assert!(
        matches!(refused, Err(LockError::NotHeld { .. })),
        "a proclaim after the key expired returned {refused:?}"
    );
    assert!(
        !first.is_held(),
        "a refused proclaim left the leadership held"
    );
    assert_eq!(
        a.leader(&name).await.unwrap(),
        None,
        "leader() with nobody holding"
    );

    let second = b
        .campaign(&name, b"second", &LockOptions::new())
        .await
        .unwrap();
    assert!(second.term() > first.term());
    let refused = first.proclaim(b"later").await;
    assert!(
        refused.is_err(),
        "a deposed leader's proclaim returned {refused:?}"
    );
    let said = a.leader(&name).await.unwrap().expect("a leader");
    assert_eq!((said.term(), said.value()), (second.term(), &b"second"[..]));
    // The deposed leader's resignation leaves the successor's record alone.
    let _ = first.resign().await;
    let said = a.leader(&name).await.unwrap().expect("a leader");
    assert_eq!((said.term(), said.value()), (second.term(), &b"second"[..]));
    second.resign().await.unwrap();
    assert!(
        !exists(&mut conn, &keys.leader()).await,
        "a resigned leader's record stayed"
    );
}

/// A leader record whose owner no longer holds the lock is not reported, whoever holds it now;
/// the old leader's own release deletes it; a resignation leaves no record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_left_by_an_earlier_leader_is_not_reported() {
    let server = server();
    let mut conn = raw(&server).await;
    let (a, b) = (
        RedisLock::connect_url(&server.url()).await.unwrap(),
        RedisLock::connect_url(&server.url()).await.unwrap(),
    );
    let name = LockName::new("election/left").unwrap();
    let keys = a.keys(&name);
    let leadership = a
        .campaign(&name, b"old", &LockOptions::new())
        .await
        .unwrap();
    until_watched(&conn, &keys).await;
    // The lock key goes without a release (a failover that lost it, an operator): its record
    // stays, and a plain lock takes the name.
    let _: () = redis::cmd("DEL")
        .arg(&keys.lock)
        .query_async(&mut conn)
        .await
        .unwrap();
    let plain = b.acquire(&name, &LockOptions::new()).await.unwrap();
    assert!(
        exists(&mut conn, &keys.leader()).await,
        "the record is left"
    );
    assert_eq!(
        b.leader(&name).await.unwrap(),
        None,
        "a left record reported"
    );
    assert!(
        leadership.resign().await.is_err(),
        "the old leader's resignation"
    );
    assert!(
        !exists(&mut conn, &keys.leader()).await,
        "the old leader's release left its record"
    );
    plain.release().await.unwrap();

    let leadership = a
        .campaign(&name, b"new", &LockOptions::new())
        .await
        .unwrap();
    let said = b.leader(&name).await.unwrap().expect("a leader");
    assert_eq!(said.value(), b"new");
    leadership.resign().await.unwrap();
    assert_eq!(
        b.leader(&name).await.unwrap(),
        None,
        "leader() after resigning"
    );
    assert!(
        !exists(&mut conn, &keys.leader()).await,
        "a resignation left the record"
    );
}

/// A leader that stops without a word (no release, no renewal: a crash) is seen by an observer
/// to go when its key expires, with nobody calling anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_sees_a_forgotten_leader_expire() {
    let server = server();
    let (a, b) = (
        RedisLock::connect_url(&server.url()).await.unwrap(),
        RedisLock::connect_url(&server.url()).await.unwrap(),
    );
    let name = LockName::new("election/forgotten").unwrap();
    let short = LockOptions::new()
        .with_ttl(Duration::from_secs(2))
        .with_renewal(Renewal::Off);
    let leadership = a.campaign(&name, b"doomed", &short).await.unwrap();
    let mut changes = b.observe(&name).await.unwrap();
    next_matching("the leader", &mut changes, |e| leads(e, b"doomed")).await;
    // Neither released nor renewed: the key ends with its TTL, and nobody announces it.
    leadership.into_guard().forget();
    let seen = next_matching("the name vacant after the lease", &mut changes, |e| {
        *e == LeaderEvent::Vacant
    })
    .await;
    assert_eq!(seen, [Ok(LeaderEvent::Vacant)], "what the observer saw");
}

/// An observer whose connection is killed says `Missed` (after at most one error), subscribes
/// again by itself and sees the next leader; dropped, it leaves no subscription on the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_goes_on_after_its_connection_is_killed_and_leaves_nothing() {
    let server = server();
    let mut conn = raw(&server).await;
    let (a, b) = (
        RedisLock::connect_url(&server.url()).await.unwrap(),
        RedisLock::connect_url(&server.url()).await.unwrap(),
    );
    let name = LockName::new("election/killed").unwrap();
    let channel = b.keys(&name).channel;
    let mut changes = b.observe(&name).await.unwrap();
    next_matching("the first state", &mut changes, |e| {
        *e == LeaderEvent::Vacant
    })
    .await;

    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(&mut conn)
        .await
        .unwrap();
    let ids = subscribed_client_ids(&list);
    assert_eq!(ids.len(), 1, "one subscribed connection: {list}");
    let _: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("ID")
        .arg(ids[0])
        .query_async(&mut conn)
        .await
        .unwrap();
    let seen = next_matching("Missed after the kill", &mut changes, |e| {
        *e == LeaderEvent::Missed
    })
    .await;
    assert!(
        seen.iter().filter(|item| item.is_err()).count() <= 1,
        "more than one error for one failure: {seen:?}"
    );
    let leadership = a
        .campaign(&name, b"after", &LockOptions::new())
        .await
        .unwrap();
    next_matching("the leader after the reconnect", &mut changes, |e| {
        leads(e, b"after")
    })
    .await;
    leadership.resign().await.unwrap();
    next_matching("vacant after the resignation", &mut changes, |e| {
        *e == LeaderEvent::Vacant
    })
    .await;

    drop(changes);
    until("the observer's subscription to go", || {
        let mut conn = conn.clone();
        let channel = channel.clone();
        async move {
            let numsub: (String, i64) = redis::cmd("PUBSUB")
                .arg("NUMSUB")
                .arg(&channel)
                .query_async(&mut conn)
                .await
                .unwrap();
            numsub.1 == 0
        }
    })
    .await;
}

/// A leader whose key is deleted under it while its process lives (a failover that lost the
/// write, an operator) is seen vacant by an observer long before the lease it last read ends:
/// its own watch or renewal, finding the key gone, deletes its record and tells observers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_sees_a_living_leader_whose_key_went_go_before_its_lease_ends() {
    let server = server();
    let mut conn = raw(&server).await;
    let (a, b) = (
        RedisLock::connect_url(&server.url()).await.unwrap(),
        RedisLock::connect_url(&server.url()).await.unwrap(),
    );
    let name = LockName::new("election/deleted").unwrap();
    let keys = a.keys(&name);
    let lease = Duration::from_secs(90);
    let leadership = a
        .campaign(&name, b"deleted", &LockOptions::new().with_ttl(lease))
        .await
        .unwrap();
    let mut changes = b.observe(&name).await.unwrap();
    next_matching("the leader", &mut changes, |e| leads(e, b"deleted")).await;
    let _: () = redis::cmd("DEL")
        .arg(&keys.lock)
        .query_async(&mut conn)
        .await
        .unwrap();
    // Within half the lease: past the first renewal (a third of it), long before its end.
    let vacant = tokio::time::timeout(lease / 2, async {
        while let Some(item) = changes.next().await {
            if matches!(item, Ok(LeaderEvent::Vacant)) {
                return;
            }
        }
    })
    .await;
    assert!(vacant.is_ok(), "the observer waited for the lease's end");
    assert!(
        !exists(&mut conn, &keys.leader()).await,
        "the lost leader's record stayed"
    );
    drop(leadership);
}

/// The commands the server ran, as `MONITOR` shows them (one line each, arguments quoted), up to
/// the marker `ECHO` the test sends when it has seen what it wants.
struct Monitor {
    lines: tokio::io::Lines<tokio::io::BufReader<tokio::net::TcpStream>>,
}

impl Monitor {
    async fn start(server: &dlock_test_servers::RedisServer) -> Self {
        use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
        let mut stream = tokio::net::TcpStream::connect(server.addr()).await.unwrap();
        stream.write_all(b"MONITOR\r\n").await.unwrap();
        let mut lines = tokio::io::BufReader::new(stream).lines();
        assert_eq!(lines.next_line().await.unwrap().as_deref(), Some("+OK"));
        Self { lines }
    }

    /// Every line up to the `ECHO marker` sent now on `conn`.
    async fn until_now(
        &mut self,
        conn: &mut redis::aio::MultiplexedConnection,
        marker: &str,
    ) -> Vec<String> {
        let _: String = redis::cmd("ECHO")
            .arg(marker)
            .query_async(conn)
            .await
            .unwrap();
        let quoted = format!("\"ECHO\" \"{marker}\"");
        let mut seen = Vec::new();
        dlock_conformance::wait_for::within(BOUND, "the marker in the monitor", async {
            while let Some(line) = self.lines.next_line().await.unwrap() {
                if line.contains(&quoted) {
                    return;
                }
                seen.push(line);
            }
            panic!("the monitor's connection closed");
        })
        .await;
        seen
    }
}

/// A candidate's grant writes its leader record in the same script (the full acquire when the
/// name is free, the release that hands it the lock when it waited), so a campaign sends its
/// value with no script of the leader record's own (`PROCLAIM` passes the record's key): the
/// record is there, with the grant's token as its term, as the campaign returns. A later
/// proclaim still writes, and the resignation still ends the record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_candidate_leads_with_the_record_its_grant_wrote() {
    let server = server();
    let mut conn = raw(&server).await;
    let mut monitor = Monitor::start(&server).await;
    let (a, b) = (
        RedisLock::connect_url(&server.url()).await.unwrap(),
        RedisLock::connect_url(&server.url()).await.unwrap(),
    );
    let name = LockName::new("election/written-at-grant").unwrap();
    let keys = a.keys(&name);
    let proclaims_of = |lines: &[String], value: &str| {
        lines
            .iter()
            // A script's own commands show as sent by `lua`: only what a client sent counts.
            .filter(|line| !line.contains(" lua] "))
            .filter(|line| line.contains(value) && line.contains(&format!("\"{}\"", keys.leader())))
            .cloned()
            .collect::<Vec<_>>()
    };

    let first = a
        .campaign(&name, b"first-candidate", &LockOptions::new())
        .await
        .unwrap();
    let said = b.leader(&name).await.unwrap().expect("a leader");
    assert_eq!(
        (said.term(), said.value()),
        (first.term(), &b"first-candidate"[..])
    );
    let lines = monitor.until_now(&mut conn, "first-granted").await;
    assert!(
        lines.iter().any(|line| line.contains("first-candidate")),
        "the value went with no script: {lines:#?}"
    );
    let written_by_script = |lines: &[String], value: &str| {
        lines.iter().any(|line| {
            line.contains(" lua] \"SET\"") && line.contains(&keys.leader()) && line.contains(value)
        })
    };
    assert!(written_by_script(&lines, "first-candidate"), "{lines:#?}");
    let proclaims = proclaims_of(&lines, "first-candidate");
    assert!(
        proclaims.is_empty(),
        "a free name's campaign proclaimed apart: {proclaims:#?}"
    );

    let waiting = tokio::spawn(async move {
        let leadership = b
            .campaign(&name, b"second-candidate", &LockOptions::new())
            .await
            .unwrap();
        (b, name, leadership)
    });
    until("the second candidate to queue", || {
        let mut conn = conn.clone();
        let waiters = keys.waiters.clone();
        async move {
            let queued: i64 = redis::cmd("HLEN")
                .arg(&waiters)
                .query_async(&mut conn)
                .await
                .unwrap();
            queued == 1
        }
    })
    .await;
    let first_term = first.term();
    first.resign().await.unwrap();
    let (b, name, second) = dlock_conformance::wait_for::within(BOUND, "the hand-over", waiting)
        .await
        .unwrap();
    assert!(second.term() > first_term);
    let said = a.leader(&name).await.unwrap().expect("a leader");
    assert_eq!(
        (said.term(), said.value()),
        (second.term(), &b"second-candidate"[..])
    );
    let lines = monitor.until_now(&mut conn, "second-granted").await;
    assert!(written_by_script(&lines, "second-candidate"), "{lines:#?}");
    let proclaims = proclaims_of(&lines, "second-candidate");
    assert!(
        proclaims.is_empty(),
        "the waiting candidate proclaimed apart: {proclaims:#?}"
    );

    // A later value is written by its own proclaim, and the resignation ends the record.
    second.proclaim(b"second-later").await.unwrap();
    let said = a.leader(&name).await.unwrap().expect("a leader");
    assert_eq!(
        (said.term(), said.value()),
        (second.term(), &b"second-later"[..])
    );
    second.resign().await.unwrap();
    assert_eq!(b.leader(&name).await.unwrap(), None);
    assert!(
        !exists(&mut conn, &keys.leader()).await,
        "a resigned leader's record stayed"
    );
}
