//! The MySQL conformance harness: a MariaDB started by dlock-test-servers (or named by
//! `DLOCK_TEST_MYSQL_URL`), fresh clients, and a fault hook that kills the holder's connection.
#![allow(dead_code, unreachable_pub)]

use std::sync::Arc;

use async_trait::async_trait;
use dlock_api::{DistributedLock, LockName, Result};
use dlock_conformance::{Fault, Faults, Harness, OwnServer};
use dlock_mysql::MySqlLock;
use dlock_test_servers::{MariaDb, shared_mariadb};
use sqlx::mysql::MySqlConnection;
use sqlx::{Connection, Executor, Row};

pub struct MySqlHarness {
    url: String,
    /// Whether the server is ours (fault hooks work).
    owned: bool,
    /// Keeps a server of this harness's own alive as long as the harness.
    _server: Option<MariaDb>,
}

impl MySqlHarness {
    /// `DLOCK_TEST_MYSQL_URL` if set, else the test binary's shared private MariaDB.
    pub fn shared() -> Self {
        if let Ok(url) = std::env::var("DLOCK_TEST_MYSQL_URL") {
            return Self::at(url);
        }
        Self {
            url: shared_mariadb().url(),
            owned: true,
            _server: None,
        }
    }

    /// A private MariaDB that takes connections only over TLS, reached with
    /// `ssl-mode=VERIFY_IDENTITY` trusting its private CA (MySQL's spelling of the options, which
    /// sqlx reads too); `DLOCK_TEST_MYSQL_URL` if set (a worker process of this harness).
    pub fn tls() -> Self {
        if let Ok(url) = std::env::var("DLOCK_TEST_MYSQL_URL") {
            return Self::at(url);
        }
        let server = MariaDb::start_tls()
            .unwrap_or_else(|e| panic!("cannot start MariaDB over TLS for the MySQL tests: {e}"));
        Self {
            url: format!(
                "{}?ssl-mode=VERIFY_IDENTITY&ssl-ca={}",
                server.url(),
                server.ca_cert().display()
            ),
            owned: true,
            _server: Some(server),
        }
    }

    /// A server this harness does not own, at `url`.
    fn at(url: String) -> Self {
        Self {
            url,
            owned: false,
            _server: None,
        }
    }

    pub fn url(&self) -> &str {
        &self.url
    }
}

/// A private MariaDB for a test that harms it.
pub fn own_server() -> MariaDb {
    MariaDb::start().unwrap_or_else(|e| panic!("cannot start MariaDB for the MySQL tests: {e}"))
}

/// A plain sqlx connection, for inspecting the server.
pub async fn raw(url: &str) -> MySqlConnection {
    MySqlConnection::connect(url)
        .await
        .unwrap_or_else(|e| panic!("cannot connect to {url}: {e}"))
}

/// `IS_USED_LOCK(key)`: the connection id holding the key, if any.
pub async fn holder(url: &str, key: &str) -> Option<u64> {
    let mut conn = raw(url).await;
    let query = sqlx::query("SELECT CAST(IS_USED_LOCK(?) AS SIGNED)").bind(key.to_owned());
    let row = conn.fetch_one(query).await.expect("IS_USED_LOCK");
    row.try_get::<Option<i64>, _>(0)
        .expect("an id or NULL")
        .map(|id| id as u64)
}

/// `KILL <id>` from another connection.
pub async fn kill_connection(url: &str, id: u64) -> std::result::Result<(), String> {
    let mut conn = MySqlConnection::connect(url)
        .await
        .map_err(|e| e.to_string())?;
    let sql = format!("KILL {id}");
    conn.execute(sqlx::raw_sql(&sql))
        .await
        .map_err(|e| e.to_string())?;
    Ok(())
}

#[async_trait]
impl Harness for MySqlHarness {
    fn label(&self) -> &str {
        if self.url.contains("ssl-mode=VERIFY_IDENTITY") {
            "mysql over TLS"
        } else {
            "mysql"
        }
    }

    async fn client(&self) -> Result<Arc<dyn DistributedLock>> {
        Ok(Arc::new(MySqlLock::connect_url(&self.url).await?))
    }

    fn faults(&self) -> Option<&dyn Faults> {
        self.owned.then_some(self as &dyn Faults)
    }

    fn child_env(&self) -> Option<Vec<(String, String)>> {
        Some(vec![("DLOCK_TEST_MYSQL_URL".to_owned(), self.url.clone())])
    }

    /// `IS_USED_LOCK` of each name's key: held by any connection.
    async fn residue(&self, names: &[LockName]) -> std::result::Result<Vec<String>, String> {
        let (url, names) = (self.url.clone(), names.to_vec());
        // Spawned: sqlx's futures trip async-trait's `Send` inference otherwise.
        tokio::spawn(async move {
            let probe = MySqlLock::connect_url(&url)
                .await
                .map_err(|e| e.to_string())?;
            let mut conn = MySqlConnection::connect(&url)
                .await
                .map_err(|e| e.to_string())?;
            let mut left = Vec::new();
            for name in &names {
                let key = probe.key(name);
                let query = sqlx::query("SELECT CAST(IS_USED_LOCK(?) AS SIGNED)").bind(&key);
                let row = conn.fetch_one(query).await.map_err(|e| e.to_string())?;
                if let Some(id) = row
                    .try_get::<Option<i64>, _>(0)
                    .map_err(|e| e.to_string())?
                {
                    left.push(format!("{key} held by connection {id}"));
                }
                // A server without performance_schema shows only holders.
                if let Ok(waiting) = lock_waiters(&mut conn, &key).await {
                    if !waiting.is_empty() {
                        left.push(format!("{key} waited for by connections {waiting:?}"));
                    }
                }
            }
            Ok(left)
        })
        .await
        .map_err(|e| e.to_string())?
    }
}

#[async_trait]
impl Faults for MySqlHarness {
    /// Finds the connection holding the name's key (`IS_USED_LOCK`) and `KILL`s it, as a DBA or
    /// a crashed network would.
    async fn kill_holder(&self, name: &LockName) -> std::result::Result<(), String> {
        let (url, name) = (self.url.clone(), name.clone());
        // Spawned: sqlx's futures trip async-trait's `Send` inference otherwise.
        tokio::spawn(async move {
            let probe = MySqlLock::connect_url(&url)
                .await
                .map_err(|e| e.to_string())?;
            let key = probe.key(&name);
            let id = holder(&url, &key)
                .await
                .ok_or_else(|| format!("nobody holds {key}"))?;
            kill_connection(&url, id).await
        })
        .await
        .map_err(|e| e.to_string())?
    }

    fn supports(&self, fault: Fault) -> bool {
        matches!(
            fault,
            Fault::KillHolder | Fault::KillWaiters | Fault::OwnServer
        )
    }

    async fn own_server(&self) -> std::result::Result<OwnServer, String> {
        OwnServer::start(MariaDb::start, |url| Arc::new(MySqlHarness::at(url))).await
    }

    /// `KILL`s the connections whose statement waits in `GET_LOCK` on the name's key (state
    /// `User lock`), once there is one.
    async fn kill_waiters(&self, name: &LockName) -> std::result::Result<usize, String> {
        let (url, name) = (self.url.clone(), name.clone());
        tokio::spawn(async move {
            let key = MySqlLock::connect_url(&url)
                .await
                .map_err(|e| e.to_string())?
                .key(&name);
            let mut conn = MySqlConnection::connect(&url)
                .await
                .map_err(|e| e.to_string())?;
            let give_up = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
            let waiting = loop {
                let waiting = lock_waiters(&mut conn, &key).await?;
                if !waiting.is_empty() {
                    break waiting;
                }
                if tokio::time::Instant::now() >= give_up {
                    return Err(format!("nobody waits for {key} after 30 s"));
                }
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            };
            for id in &waiting {
                kill_connection(&url, *id).await?;
            }
            Ok(waiting.len())
        })
        .await
        .map_err(|e| e.to_string())?
    }
}

/// The connections waiting in `GET_LOCK` for `key`, from performance_schema's metadata locks
/// (the test servers run with it on; PROCESSLIST shows placeholders, not the key).
pub async fn lock_waiters(
    conn: &mut MySqlConnection,
    key: &str,
) -> std::result::Result<Vec<u64>, String> {
    let rows = sqlx::query(
        "SELECT CAST(t.PROCESSLIST_ID AS SIGNED) FROM performance_schema.metadata_locks m \
         JOIN performance_schema.threads t ON t.THREAD_ID = m.OWNER_THREAD_ID \
         WHERE m.OBJECT_TYPE = 'USER LEVEL LOCK' AND m.LOCK_STATUS = 'PENDING' \
         AND m.OBJECT_NAME = ?",
    )
    .bind(key)
    .fetch_all(conn)
    .await
    .map_err(|e| e.to_string())?;
    rows.iter()
        .map(|row| row.try_get::<i64, _>(0).map(|id| id as u64))
        .collect::<std::result::Result<_, _>>()
        .map_err(|e| e.to_string())
}
