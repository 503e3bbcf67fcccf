//! How a backend crate presents itself to the `dlock` facade and CLI, so that adding a backend
//! is its own crate plus one line in the facade's list (`dlock/src/backends.rs`).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::{DistributedLock, Result};

/// A connect in progress, as a [`Registration`] starts it.
pub type Connecting<'a> =
    Pin<Box<dyn Future<Output = Result<Arc<dyn DistributedLock>>> + Send + 'a>>;

/// Parses a URL of one of the backend's schemes, applies the options (key/value pairs that
/// override the URL's query parameters), and connects.
pub type ConnectFn = for<'a> fn(&'a str, &'a [(String, String)]) -> Connecting<'a>;

/// What a backend tells `dlock::connect` and the CLI about itself: its name, the URL schemes it
/// serves, and how to connect from a URL and options. Each backend crate exports one as
/// `REGISTRATION`; the facade keeps the list of the ones compiled in.
///
/// ```
/// use std::sync::Arc;
/// use dlock_api::raw::{Connecting, Registration, with_options};
/// use dlock_api::{DistributedLock, LockError, MemoryLock};
///
/// /// A backend whose configuration is a store name.
/// struct Config(String);
/// impl Config {
///     fn from_url(url: &str) -> dlock_api::Result<Self> {
///         Ok(Self(url.trim_start_matches("mine://").to_owned()))
///     }
///     fn set_option(&mut self, key: &str, _value: &str) -> dlock_api::Result<()> {
///         Err(LockError::Config { backend: "mine", reason: format!("unknown option `{key}`") })
///     }
/// }
///
/// fn connect<'a>(url: &'a str, options: &'a [(String, String)]) -> Connecting<'a> {
///     Box::pin(async move {
///         let config = with_options(Config::from_url(url)?, options, Config::set_option)?;
///         Ok(Arc::new(MemoryLock::shared(&config.0)) as Arc<dyn DistributedLock>)
///     })
/// }
///
/// pub const REGISTRATION: Registration = Registration::new("mine", &["mine"], connect);
/// # assert_eq!(REGISTRATION.schemes(), ["mine"]);
/// ```
#[derive(Clone, Copy)]
pub struct Registration {
    name: &'static str,
    schemes: &'static [&'static str],
    connect: ConnectFn,
}

impl Registration {
    /// A backend called `name` (as errors and logs name it), serving `schemes` (lower case,
    /// without `://`), connected by `connect`.
    pub const fn new(
        name: &'static str,
        schemes: &'static [&'static str],
        connect: ConnectFn,
    ) -> Self {
        Self {
            name,
            schemes,
            connect,
        }
    }

    /// The backend's name.
    pub const fn name(&self) -> &'static str {
        self.name
    }

    /// The URL schemes it serves.
    pub const fn schemes(&self) -> &'static [&'static str] {
        self.schemes
    }

    /// Parses `url`, applies `options` and connects.
    ///
    /// # Errors
    /// The backend's: [`LockError::Config`](crate::LockError::Config) for a URL or option it
    /// refuses (before any network call), [`LockError::Unavailable`](crate::LockError::Unavailable)
    /// when its server cannot be reached.
    ///
    /// # Cancel safety
    /// Cancel safe: nothing is locked by connecting.
    pub fn connect<'a>(&self, url: &'a str, options: &'a [(String, String)]) -> Connecting<'a> {
        (self.connect)(url, options)
    }
}

impl fmt::Debug for Registration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registration")
            .field("name", &self.name)
            .field("schemes", &self.schemes)
            .finish_non_exhaustive()
    }
}

/// `config` with each of `options` applied by `set` in turn: the options of a config file or a
/// command line, which override the URL's query parameters.
///
/// # Errors
/// The first error `set` returns.
pub fn with_options<C>(
    mut config: C,
    options: &[(String, String)],
    set: impl Fn(&mut C, &str, &str) -> Result<()>,
) -> Result<C> {
    for (key, value) in options {
        set(&mut config, key, value)?;
    }
    Ok(config)
}

/// A backend's [`Registration`], for the common shape: a config type with
/// `from_url(&str) -> Result<Config>` and `set_option(&mut self, &str, &str) -> Result<()>`, and
/// a lock type with `async fn connect(Config) -> Result<Lock>` that implements
/// [`DistributedLock`].
///
/// ```ignore
/// pub const REGISTRATION: dlock_api::raw::Registration =
///     dlock_api::registration!("redis", SCHEMES, RedisConfig, RedisLock);
/// ```
#[macro_export]
macro_rules! registration {
    ($name:expr, $schemes:expr, $config:ty, $lock:ty) => {{
        fn connect<'a>(
            url: &'a str,
            options: &'a [(::std::string::String, ::std::string::String)],
        ) -> $crate::raw::Connecting<'a> {
            ::std::boxed::Box::pin(async move {
                let config = $crate::raw::with_options(
                    <$config>::from_url(url)?,
                    options,
                    <$config>::set_option,
                )?;
                let lock: ::std::sync::Arc<dyn $crate::DistributedLock> =
                    ::std::sync::Arc::new(<$lock>::connect(config).await?);
                ::std::result::Result::Ok(lock)
            })
        }
        $crate::raw::Registration::new($name, $schemes, connect)
    }};
}
