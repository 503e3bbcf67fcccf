//! What MariaDB does with named locks in the situations the backend must survive, and proof that
//! the backend never falls into them: a second `GET_LOCK` of a name on the same connection
//! stacks; `COM_RESET_CONNECTION` (what a pool may send when a connection comes back) frees
//! every named lock of the connection; an sqlx pool hands a connection's lock to its next
//! borrower; `KILL QUERY` on an idle connection does not hit its next statement.

use crate::common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::{MySqlHarness, raw};
use dlock_api::{DistributedLock, LockName, LockOptions};
use dlock_mysql::MySqlLock;
use sqlx::mysql::MySqlConnection;
use sqlx::{Executor, Row};

fn unique(what: &str) -> String {
    format!("behaviour/{what}/{:08x}", rand::random::<u32>())
}

async fn scalar(conn: &mut MySqlConnection, sql: &str, key: &str) -> Option<i64> {
    let row = conn
        .fetch_one(sqlx::query(sql).bind(key.to_owned()))
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    // The server types these results INT or, through a pool's connections, INT UNSIGNED.
    row.try_get::<Option<i64>, _>(0)
        .or_else(|_| row.try_get::<Option<u32>, _>(0).map(|v| v.map(i64::from)))
        .unwrap()
}

async fn is_free(url: &str, key: &str) -> bool {
    let mut conn = raw(url).await;
    scalar(&mut conn, "SELECT IS_FREE_LOCK(?)", key).await == Some(1)
}

#[tokio::test]
async fn second_get_lock_on_one_connection_stacks() {
    let h = MySqlHarness::shared();
    let key = unique("stack");
    let mut a = raw(h.url()).await;
    assert_eq!(scalar(&mut a, "SELECT GET_LOCK(?, 0)", &key).await, Some(1));
    // The same connection gets it again: no exclusion within a connection.
    assert_eq!(scalar(&mut a, "SELECT GET_LOCK(?, 0)", &key).await, Some(1));
    assert_eq!(
        scalar(&mut a, "SELECT RELEASE_LOCK(?)", &key).await,
        Some(1)
    );
    // One release leaves the lock held: a second guard's release would leave it behind.
    assert!(
        !is_free(h.url(), &key).await,
        "one RELEASE_LOCK freed a stacked lock"
    );
    assert_eq!(
        scalar(&mut a, "SELECT RELEASE_LOCK(?)", &key).await,
        Some(1)
    );
    assert_eq!(scalar(&mut a, "SELECT RELEASE_LOCK(?)", &key).await, None);
    assert!(is_free(h.url(), &key).await);
    // Another connection is refused: 0 from GET_LOCK, 0 from RELEASE_LOCK of a lock it lacks.
    let mut b = raw(h.url()).await;
    assert_eq!(scalar(&mut a, "SELECT GET_LOCK(?, 0)", &key).await, Some(1));
    assert_eq!(scalar(&mut b, "SELECT GET_LOCK(?, 0)", &key).await, Some(0));
    assert_eq!(
        scalar(&mut b, "SELECT RELEASE_LOCK(?)", &key).await,
        Some(0)
    );
    assert_eq!(
        scalar(&mut a, "SELECT RELEASE_LOCK(?)", &key).await,
        Some(1)
    );
}

#[tokio::test]
async fn the_client_never_stacks_a_name() {
    let h = MySqlHarness::shared();
    let locks = MySqlLock::connect_url(h.url()).await.unwrap();
    let name = LockName::new(unique("client-stack")).unwrap();
    let key = locks.key(&name);
    // 50 concurrent try_acquires of a free name from one client: exactly one guard.
    let mut tasks = Vec::new();
    for _ in 0..50 {
        let (locks, name) = (locks.clone(), name.clone());
        tasks.push(tokio::spawn(async move {
            locks.try_acquire(&name, &LockOptions::new()).await.unwrap()
        }));
    }
    let mut guards = Vec::new();
    for t in tasks {
        if let Some(g) = t.await.unwrap() {
            guards.push(g);
        }
    }
    assert_eq!(guards.len(), 1, "one client got {} guards", guards.len());
    // More attempts while held, then one release: the name must be free (nothing stacked).
    for _ in 0..5 {
        assert!(
            locks
                .try_acquire(&name, &LockOptions::new())
                .await
                .unwrap()
                .is_none()
        );
    }
    guards.pop().unwrap().release().await.unwrap();
    assert!(
        is_free(h.url(), &key).await,
        "a stacked lock was left behind"
    );
}

/// The pool hazard, raw: an sqlx pool of one connection shared by two logical clients. The first
/// takes a named lock and hands its connection back without releasing (a dropped guard in a
/// naive design); the second borrows the same connection and `GET_LOCK` answers 1, a stacked
/// re-grant: two logical holders, and the server sees one. sqlx does not reset connections on
/// return; a pool that did would instead free the first holder's lock under it
/// (`reset_connection_frees_named_locks`). Either way a lock must not live on a shared pooled
/// connection, which is why dlock keeps its own.
#[tokio::test]
async fn a_pooled_connection_hands_its_lock_to_the_next_borrower() {
    let h = MySqlHarness::shared();
    let pool = sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(1)
        .connect(h.url())
        .await
        .unwrap();
    let key = unique("pooled");
    let get_lock = "SELECT GET_LOCK(?, 0)";
    let mut first = pool.acquire().await.unwrap();
    assert_eq!(scalar(&mut first, get_lock, &key).await, Some(1));
    drop(first);
    let mut second = pool.acquire().await.unwrap();
    assert_eq!(
        scalar(&mut second, get_lock, &key).await,
        Some(1),
        "the second borrower was refused: the pool reset the connection"
    );
    assert_eq!(
        scalar(&mut second, "SELECT RELEASE_ALL_LOCKS()", &key).await,
        Some(2)
    );
}

/// dlock's side of the same situation: a guard dropped without release, and the same client
/// (at its smallest pool) asked for the name again at once. The new guard comes only after the
/// dropped one's unlock ran on the server, so one release frees the name: nothing stacked.
#[tokio::test]
async fn a_dropped_guard_is_unlocked_before_the_client_grants_the_name_again() {
    let h = MySqlHarness::shared();
    let url = format!(
        "{}{}max_connections=2",
        h.url(),
        if h.url().contains('?') { '&' } else { '?' }
    );
    let locks = MySqlLock::connect_url(&url).await.unwrap();
    let name = LockName::new(unique("dropped")).unwrap();
    let key = locks.key(&name);
    let wait = LockOptions::new().with_wait_timeout(Duration::from_secs(30));
    for _ in 0..20 {
        drop(locks.acquire(&name, &wait).await.unwrap());
    }
    locks
        .acquire(&name, &wait)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    assert!(
        is_free(h.url(), &key).await,
        "a dropped guard's lock stacked under a later one"
    );
}

/// A bare-bones MySQL protocol client: enough to log in as passwordless root, send a query and
/// `COM_RESET_CONNECTION` (which sqlx does not expose).
struct Wire {
    stream: TcpStream,
    seq: u8,
}

impl Wire {
    fn read_packet(&mut self) -> Vec<u8> {
        let mut header = [0u8; 4];
        self.stream.read_exact(&mut header).unwrap();
        let len = u32::from_le_bytes([header[0], header[1], header[2], 0]) as usize;
        self.seq = header[3].wrapping_add(1);
        let mut body = vec![0u8; len];
        self.stream.read_exact(&mut body).unwrap();
        body
    }

    fn write_packet(&mut self, body: &[u8]) {
        let len = (body.len() as u32).to_le_bytes();
        let mut packet = vec![len[0], len[1], len[2], self.seq];
        packet.extend_from_slice(body);
        self.stream.write_all(&packet).unwrap();
    }

    fn login(addr: std::net::SocketAddr) -> Self {
        let stream = TcpStream::connect(addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut wire = Wire { stream, seq: 0 };
        let _greeting = wire.read_packet();
        // PROTOCOL_41 | SECURE_CONNECTION | PLUGIN_AUTH | LONG_PASSWORD | TRANSACTIONS
        let flags: u32 = 0x200 | 0x8000 | 0x80000 | 0x1 | 0x2000;
        let mut body = Vec::new();
        body.extend_from_slice(&flags.to_le_bytes());
        body.extend_from_slice(&(1u32 << 24).to_le_bytes());
        body.push(45); // utf8mb4
        body.extend_from_slice(&[0u8; 23]);
        body.extend_from_slice(b"root\0");
        body.push(0); // empty auth response
        body.extend_from_slice(b"mysql_native_password\0");
        wire.write_packet(&body);
        let mut reply = wire.read_packet();
        if reply.first() == Some(&0xfe) {
            // Auth switch: answer with an empty password.
            wire.write_packet(&[]);
            reply = wire.read_packet();
        }
        assert_eq!(reply.first(), Some(&0x00), "login failed: {reply:?}");
        wire
    }

    /// Sends a command and expects an OK packet.
    fn command(&mut self, command: u8, arg: &[u8]) {
        self.seq = 0;
        let mut body = vec![command];
        body.extend_from_slice(arg);
        self.write_packet(&body);
        let reply = self.read_packet();
        assert_eq!(
            reply.first(),
            Some(&0x00),
            "command {command:#x} failed: {reply:?}"
        );
    }
}

#[tokio::test]
async fn reset_connection_frees_named_locks() {
    let h = MySqlHarness::shared();
    let config = dlock_mysql::MySqlConfig::from_url(h.url()).unwrap();
    let addr = tokio::net::lookup_host((config.host.as_str(), config.port))
        .await
        .unwrap()
        .next()
        .unwrap();
    let key = unique("reset");
    let mut wire = tokio::task::spawn_blocking(move || Wire::login(addr))
        .await
        .unwrap();
    let do_lock = format!("DO GET_LOCK('{key}', 0)");
    wire = tokio::task::spawn_blocking(move || {
        wire.command(0x03, do_lock.as_bytes()); // COM_QUERY
        wire
    })
    .await
    .unwrap();
    assert!(
        !is_free(h.url(), &key).await,
        "DO GET_LOCK did not take the lock"
    );
    let _wire = tokio::task::spawn_blocking(move || {
        wire.command(0x1f, &[]); // COM_RESET_CONNECTION
        wire
    })
    .await
    .unwrap();
    // Observed on MariaDB 10.11 (and documented for MySQL's mysql_reset_connection): the reset
    // releases every named lock of the connection. A pool that resets connections on return
    // would silently drop a guard's lock; dlock keeps its own connections and never resets them.
    assert!(
        is_free(h.url(), &key).await,
        "COM_RESET_CONNECTION kept the named lock"
    );
}

#[tokio::test]
async fn kill_query_on_an_idle_connection_spares_its_next_statement() {
    let h = MySqlHarness::shared();
    let mut a = raw(h.url()).await;
    let id: i64 = a
        .fetch_one("SELECT CAST(CONNECTION_ID() AS SIGNED)")
        .await
        .unwrap()
        .try_get(0)
        .unwrap();
    let mut b = raw(h.url()).await;
    b.execute(sqlx::raw_sql(&format!("KILL QUERY {id}")))
        .await
        .unwrap();
    // The backend relies on this only for speed: it never sends a statement while a KILL QUERY
    // of a cancelled wait may still be on its way, and closes the connection when unsure.
    let row = a.fetch_one("SELECT 1").await;
    assert!(
        row.is_ok(),
        "a late KILL QUERY hit the next statement: {row:?}"
    );
}

#[tokio::test]
async fn fencing_off_uses_plain_get_lock() {
    let h = MySqlHarness::shared();
    let url = format!("{}?fencing=false&table=no_such_db.no_such_table", h.url());
    let locks = MySqlLock::connect_url(&url).await.unwrap();
    assert_eq!(locks.capabilities().fencing, dlock_api::Fencing::None);
    let name = LockName::new(unique("plain")).unwrap();
    let guard = locks
        .try_acquire(&name, &LockOptions::new())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(guard.fencing_token().get(), 0);
    assert!(!is_free(h.url(), &locks.key(&name)).await);
    guard.release().await.unwrap();
    assert!(is_free(h.url(), &locks.key(&name)).await);
}

/// A server that refuses the connection itself (a user it does not know, a database that does
/// not exist) is a configuration to fix (exit 64 in the CLI), not an outage to wait out (69).
#[tokio::test]
async fn a_refused_login_or_database_is_a_config_error() {
    let h = MySqlHarness::shared();
    let url = url::Url::parse(h.url()).unwrap();
    let mut unknown_user = url.clone();
    unknown_user.set_username("dlock_no_such_user").unwrap();
    unknown_user.set_password(Some("wrong")).unwrap();
    let mut unknown_database = url.clone();
    unknown_database.set_path("/dlock_no_such_database");
    for bad in [unknown_user, unknown_database] {
        let Err(error) = MySqlLock::connect_url(bad.as_str()).await else {
            panic!("{bad}: connected");
        };
        assert!(
            matches!(&error, dlock_api::LockError::Config { reason, .. } if reason.contains("refused")),
            "{bad}: {error:?}"
        );
    }
}
