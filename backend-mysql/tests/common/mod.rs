//! The MySQL conformance harness: a MariaDB started by dlock-test-servers (or named by
//! `DLOCK_TEST_MYSQL_URL`), fresh clients, and a fault hook that kills the holder's connection.
#![allow(dead_code, unreachable_pub)]

use std::sync::Arc;

use async_trait::async_trait;
use dlock_api::{DistributedLock, LockName, Result};
use dlock_conformance::{Faults, Harness};
use dlock_mysql::MySqlLock;
use dlock_test_servers::{MariaDb, shared_mariadb};
use sqlx::mysql::MySqlConnection;
use sqlx::{Connection, Executor, Row};

pub struct MySqlHarness {
    url: String,
    /// Whether the server is ours (fault hooks work).
    owned: bool,
}

impl MySqlHarness {
    /// `DLOCK_TEST_MYSQL_URL` if set, else the test binary's shared private MariaDB.
    pub fn shared() -> Self {
        if let Ok(url) = std::env::var("DLOCK_TEST_MYSQL_URL") {
            return Self { url, owned: false };
        }
        Self {
            url: shared_mariadb().url(),
            owned: true,
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
        "mysql"
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
}
