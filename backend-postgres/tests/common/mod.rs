//! The Postgres test harness: a private server started by dlock-test-servers (or named by
//! `DLOCK_TEST_POSTGRES_URL`), fresh clients, a fault hook that terminates a holder's backend,
//! and small SQL helpers to look at `pg_locks`.
#![allow(dead_code, unreachable_pub)]

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock_api::{DistributedLock, LockError, LockName, Result};
use dlock_conformance::{Fault, Faults, Harness, OwnServer};
use dlock_postgres::{AdvisoryKey, PostgresLock};
use dlock_test_servers::{PgBouncer, PoolMode, Postgres};
use sqlx::{Connection, PgConnection, Row};

pub struct PgHarness {
    url: String,
    /// Keeps a private server alive as long as the harness.
    _server: Option<Postgres>,
    /// Keeps a pooler in front of it alive, when the URL is the pooler's.
    pooler: Option<PgBouncer>,
}

/// A private server for a test that harms it; panics with the install hint if missing.
pub fn own_server() -> Postgres {
    Postgres::start().unwrap_or_else(|e| panic!("cannot start Postgres for the tests: {e}"))
}

/// The URL of a server harmless tests may share: `DLOCK_TEST_POSTGRES_URL` or the shared one.
pub fn shared_url() -> String {
    std::env::var("DLOCK_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| dlock_test_servers::shared_postgres().url())
}

/// `url` with query options appended.
pub fn with_options(url: &str, options: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{options}")
}

/// A unique tag for names, tables and application names of one test.
pub fn unique(prefix: &str) -> String {
    format!(
        "{prefix}_{}_{:08x}",
        std::process::id(),
        rand::random::<u32>()
    )
}

impl PgHarness {
    /// `DLOCK_TEST_POSTGRES_URL` if set, else a private postgres.
    pub fn start() -> Self {
        if let Some(harness) = Self::from_env() {
            return harness;
        }
        let server = own_server();
        Self {
            url: server.url(),
            _server: Some(server),
            pooler: None,
        }
    }

    /// A private postgres behind a private PgBouncer in session mode, reached
    /// through the pooler; `DLOCK_TEST_POSTGRES_URL` if set (a worker process of this harness).
    /// Its fault hooks are the ones that go through SQL; a case that needs a server of its own
    /// is the direct harness's.
    pub fn start_pooled() -> Self {
        if let Some(harness) = Self::from_env() {
            return harness;
        }
        let server = own_server();
        // Session mode takes a server connection per client connection, for the client's life.
        let pooler = PgBouncer::start(server.addr(), PoolMode::Session, 150)
            .unwrap_or_else(|e| panic!("cannot start PgBouncer for the tests: {e}"));
        Self {
            url: pooler.url(),
            _server: Some(server),
            pooler: Some(pooler),
        }
    }

    /// A private Postgres that takes TCP connections only over TLS, reached with
    /// `sslmode=verify-full` trusting its private CA; `DLOCK_TEST_POSTGRES_URL` if set (a worker
    /// process of this harness).
    pub fn start_tls() -> Self {
        if let Some(harness) = Self::from_env() {
            return harness;
        }
        let server = Postgres::start_tls()
            .unwrap_or_else(|e| panic!("cannot start Postgres over TLS for the tests: {e}"));
        let url = with_options(
            &server.url(),
            &format!(
                "sslmode=verify-full&sslrootcert={}",
                server.ca_cert().display()
            ),
        );
        Self {
            url,
            _server: Some(server),
            pooler: None,
        }
    }

    fn from_env() -> Option<Self> {
        let url = std::env::var("DLOCK_TEST_POSTGRES_URL").ok()?;
        Some(Self {
            url,
            _server: None,
            pooler: None,
        })
    }

    pub fn url(&self) -> &str {
        &self.url
    }
}

#[async_trait]
impl Harness for PgHarness {
    fn label(&self) -> &str {
        if self.pooler.is_some() {
            "postgres through pgbouncer (session mode)"
        } else if self.url.contains("sslmode=verify-full") {
            "postgres over TLS"
        } else {
            "postgres"
        }
    }

    async fn client(&self) -> Result<Arc<dyn DistributedLock>> {
        Ok(Arc::new(PostgresLock::connect_url(&self.url).await?))
    }

    fn faults(&self) -> Option<&dyn Faults> {
        Some(self)
    }

    fn child_env(&self) -> Option<Vec<(String, String)>> {
        Some(vec![(
            "DLOCK_TEST_POSTGRES_URL".to_owned(),
            self.url.clone(),
        )])
    }

    /// `pg_locks` rows (held or awaited) of each name's advisory key.
    async fn residue(&self, names: &[LockName]) -> std::result::Result<Vec<String>, String> {
        let mut conn = PgConnection::connect(&self.url)
            .await
            .map_err(|e| e.to_string())?;
        let mut left = Vec::new();
        for name in names {
            let rows = advisory_rows(&mut conn, &AdvisoryKey::Name(name.clone())).await?;
            if !rows.is_empty() {
                left.push(format!("{name}: {}", rows.join(", ")));
            }
        }
        Ok(left)
    }
}

/// The `pg_locks` rows of `key`, each as `held|waiting by pid N (state, last statement)`.
pub async fn advisory_rows(
    conn: &mut PgConnection,
    key: &AdvisoryKey,
) -> std::result::Result<Vec<String>, String> {
    let (classid, objid, objsubid) = key.pg_locks_ids();
    let rows = sqlx::query(
        "SELECT l.granted, l.pid, a.state, left(a.query, 60) FROM pg_locks l \
         LEFT JOIN pg_stat_activity a ON a.pid = l.pid WHERE l.locktype = 'advisory' \
         AND l.classid = $1::bigint::oid AND l.objid = $2::bigint::oid AND l.objsubid = $3",
    )
    .bind(classid as i64)
    .bind(objid as i64)
    .bind(objsubid)
    .fetch_all(conn)
    .await
    .map_err(|e| e.to_string())?;
    Ok(rows
        .iter()
        .map(|r| {
            let (granted, pid, state, query): (bool, i32, Option<String>, Option<String>) =
                (r.get(0), r.get(1), r.get(2), r.get(3));
            let how = if granted { "held" } else { "waiting" };
            format!("{how} by pid {pid} ({state:?}, last {query:?})")
        })
        .collect())
}

#[async_trait]
impl Faults for PgHarness {
    /// `pg_terminate_backend` on the session holding the name's advisory lock.
    async fn kill_holder(&self, name: &LockName) -> std::result::Result<(), String> {
        let killed = terminate_holder(&self.url, &AdvisoryKey::Name(name.clone())).await?;
        if killed == 0 {
            return Err(format!("nobody holds {name}"));
        }
        Ok(())
    }

    fn supports(&self, fault: Fault) -> bool {
        match fault {
            Fault::KillHolder | Fault::KillWaiters => true,
            Fault::OwnServer => self.pooler.is_none(),
            _ => false,
        }
    }

    async fn own_server(&self) -> std::result::Result<OwnServer, String> {
        OwnServer::start(Postgres::start, |url| {
            Arc::new(PgHarness {
                url,
                _server: None,
                pooler: None,
            })
        })
        .await
    }

    /// `pg_terminate_backend` on the sessions waiting for the name's advisory lock, once there
    /// is one.
    async fn kill_waiters(&self, name: &LockName) -> std::result::Result<usize, String> {
        let key = AdvisoryKey::Name(name.clone());
        let give_up = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let killed = terminate(&self.url, &key, false).await?;
            if killed > 0 {
                return Ok(killed as usize);
            }
            if tokio::time::Instant::now() >= give_up {
                return Err(format!("nobody waits for {name} after 30 s"));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// A plain sqlx connection for inspecting the server.
pub async fn sql(url: &str) -> PgConnection {
    PgConnection::connect(url)
        .await
        .unwrap_or_else(|e| panic!("cannot connect to {url}: {e}"))
}

/// The pid holding `key`, from `pg_locks`.
pub async fn holder_pid(url: &str, key: &AdvisoryKey) -> Option<i32> {
    pids_at(url, key, true).await.first().copied()
}

/// The pids holding (`granted`) or waiting for `key`, from `pg_locks`.
pub async fn pids_at(url: &str, key: &AdvisoryKey, granted: bool) -> Vec<i32> {
    let (classid, objid, objsubid) = key.pg_locks_ids();
    let mut conn = sql(url).await;
    sqlx::query(
        "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted = $4 \
         AND classid = $1::bigint::oid AND objid = $2::bigint::oid AND objsubid = $3",
    )
    .bind(i64::from(classid))
    .bind(i64::from(objid))
    .bind(objsubid)
    .bind(granted)
    .fetch_all(&mut conn)
    .await
    .expect("pg_locks query")
    .iter()
    .map(|r| r.get(0))
    .collect()
}

/// Terminates every backend waiting for `key`; returns how many.
pub async fn terminate_waiters(url: &str, key: &AdvisoryKey) -> std::result::Result<i64, String> {
    terminate(url, key, false).await
}

/// Terminates every backend holding `key`; returns how many.
pub async fn terminate_holder(url: &str, key: &AdvisoryKey) -> std::result::Result<i64, String> {
    terminate(url, key, true).await
}

/// Terminates every backend holding (`granted`) or waiting for `key`; returns how many.
async fn terminate(
    url: &str,
    key: &AdvisoryKey,
    granted: bool,
) -> std::result::Result<i64, String> {
    let (classid, objid, objsubid) = key.pg_locks_ids();
    let mut conn = PgConnection::connect(url)
        .await
        .map_err(|e| e.to_string())?;
    let row = sqlx::query(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_locks WHERE locktype = 'advisory' \
         AND granted = $4 AND classid = $1::bigint::oid AND objid = $2::bigint::oid \
         AND objsubid = $3",
    )
    .bind(classid as i64)
    .bind(objid as i64)
    .bind(objsubid)
    .bind(granted)
    .fetch_one(&mut conn)
    .await
    .map_err(|e| e.to_string())?;
    row.try_get::<i64, _>(0).map_err(|e| e.to_string())
}

/// (granted, waiting) advisory locks held by connections with `application_name`.
pub async fn advisory_locks(url: &str, application_name: &str) -> (i64, i64) {
    let mut conn = sql(url).await;
    let row = sqlx::query(
        "SELECT count(*) FILTER (WHERE l.granted), count(*) FILTER (WHERE NOT l.granted) \
         FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid \
         WHERE l.locktype = 'advisory' AND a.application_name = $1",
    )
    .bind(application_name)
    .fetch_one(&mut conn)
    .await
    .expect("pg_locks query");
    (row.get(0), row.get(1))
}

/// Waits (up to 30 s) until `check` holds, polling the server state every 20 ms.
pub async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !check().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: not true after 30 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A client whose sessions carry their own `application_name`, to find them in `pg_locks`.
pub async fn client(app: &str) -> PostgresLock {
    let url = with_options(&shared_url(), &format!("application_name={app}"));
    PostgresLock::connect_url(&url).await.unwrap()
}

/// The sessions holding the name's own advisory key and the mode of each, as `pg_locks` shows
/// them (by pid).
pub async fn name_key_holders(name: &LockName) -> Vec<(i32, String)> {
    let (classid, objid, objsubid) = AdvisoryKey::Name(name.clone()).pg_locks_ids();
    let mut conn = sql(&shared_url()).await;
    sqlx::query(
        "SELECT pid, mode FROM pg_locks WHERE locktype = 'advisory' AND granted \
         AND classid = $1::bigint::oid AND objid = $2::bigint::oid AND objsubid = $3 ORDER BY pid",
    )
    .bind(i64::from(classid))
    .bind(i64::from(objid))
    .bind(objsubid)
    .fetch_all(&mut conn)
    .await
    .unwrap()
    .iter()
    .map(|r| (r.get(0), r.get(1)))
    .collect()
}

pub async fn name_key_modes(name: &LockName) -> Vec<String> {
    name_key_holders(name)
        .await
        .into_iter()
        .map(|(_, mode)| mode)
        .collect()
}

/// Whether `error` is the refusal of a name asked with `asked` permits while in use with
/// `in_use` (a lock, and a reader's share, count as one).
pub fn names_both(error: &LockError, asked: u32, in_use: u32) -> bool {
    let as_what = |n: u32| {
        if n == 1 {
            "as a lock (one permit)".to_owned()
        } else {
            format!("as a semaphore of {n} permits")
        }
    };
    matches!(error, LockError::InvalidArgument { reason, .. }
        if reason.contains(&format!("in use {}", as_what(in_use)))
            && reason.contains(&format!("asked {}", as_what(asked))))
}
