//! Where a harness's servers are: named by an environment variable, or started for the tests.

use std::any::Any;

/// The deployment a harness reaches: the one its environment variable names (a deployed server,
/// or the same servers seen from a child process), or else servers the tests start and keep
/// alive as long as the harness.
pub struct Deployment {
    label: &'static str,
    url: String,
    url_var: &'static str,
    started: bool,
    _servers: Box<dyn Any + Send + Sync>,
}

impl Deployment {
    /// The deployment `url_var` names, or else the one `start` starts: its URL and the servers
    /// to keep alive.
    ///
    /// # Panics
    /// When `start` fails; the message names `label` and says why (how to install a server that
    /// is missing).
    pub fn from_env_or_start<S: Send + Sync + 'static>(
        label: &'static str,
        url_var: &'static str,
        start: impl FnOnce() -> dlock_test_servers::Result<(String, S)>,
    ) -> Self {
        if let Ok(url) = std::env::var(url_var) {
            return Self::at(label, url_var, url);
        }
        let (url, servers) =
            start().unwrap_or_else(|e| panic!("cannot start the servers of {label}: {e}"));
        Self {
            label,
            url,
            url_var,
            started: true,
            _servers: Box::new(servers),
        }
    }

    /// A deployment at `url` that someone else keeps alive (a case's own server, or one
    /// deployed), reached from a child process through `url_var`.
    pub fn at(label: &'static str, url_var: &'static str, url: String) -> Self {
        Self {
            label,
            url,
            url_var,
            started: false,
            _servers: Box::new(()),
        }
    }

    /// The harness's label, e.g. `redis-sentinel`.
    pub fn label(&self) -> &'static str {
        self.label
    }

    /// The backend URL of the deployment.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The variable that names this deployment.
    pub fn url_var(&self) -> &'static str {
        self.url_var
    }

    /// Whether [`from_env_or_start`](Self::from_env_or_start) started these servers: they are
    /// the tests' own, which faults may harm.
    pub fn started(&self) -> bool {
        self.started
    }

    /// What [`Harness::child_env`](crate::Harness::child_env) returns: `url_var` set to the URL.
    pub fn child_env(&self) -> Option<Vec<(String, String)>> {
        Some(vec![(self.url_var.to_owned(), self.url.clone())])
    }
}

impl std::fmt::Debug for Deployment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Deployment")
            .field("label", &self.label)
            .field("url_var", &self.url_var)
            .field("started", &self.started)
            .finish_non_exhaustive()
    }
}
