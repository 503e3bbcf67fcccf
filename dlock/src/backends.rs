//! The backends dlock can be built with. Adding one takes its crate (which exports a
//! [`Registration`] as `REGISTRATION`), its cargo feature in this crate's `Cargo.toml`, and one
//! line in the list at the end of this file; `connect`, the errors that name a missing feature,
//! the re-exported types and the CLI all read the list.

use dlock_api::raw::Registration;

/// A backend this build knows of, compiled in or not.
#[derive(Debug)]
pub(crate) struct Known {
    /// As errors and logs name it.
    pub(crate) name: &'static str,
    /// The cargo feature of the dlock-rs package that compiles it in (`None`: always in).
    pub(crate) feature: Option<&'static str>,
    /// Its URL schemes: when it is left out of the build, the ones the error that names its
    /// feature recognises (a test checks them against the backend's own).
    pub(crate) schemes: &'static [&'static str],
    /// How to connect, when compiled in.
    pub(crate) registration: Option<Registration>,
}

/// One line per backend: `"feature" => crate [schemes] { types re-exported at the root }`.
macro_rules! backends {
    ($($feature:literal => $krate:ident [$($scheme:literal),+] { $($public:ident),* };)+) => {
        /// Every backend, the always-present memory backend first.
        pub(crate) const KNOWN: &[Known] = &[
            Known {
                name: crate::connect::MEMORY.name(),
                feature: None,
                schemes: crate::connect::MEMORY.schemes(),
                registration: Some(crate::connect::MEMORY),
            },
            $(Known {
                name: $feature,
                feature: Some($feature),
                schemes: &[$($scheme),+],
                #[cfg(feature = $feature)]
                registration: Some($krate::REGISTRATION),
                #[cfg(not(feature = $feature))]
                registration: None,
            },)+
        ];

        $(
            #[cfg(feature = $feature)]
            #[cfg_attr(docsrs, doc(cfg(feature = $feature)))]
            #[doc(inline)]
            pub use $krate::{$($public),*};
        )+
    };
}

backends! {
    "redis" => dlock_redis ["redis", "rediss", "redis+sentinel", "rediss+sentinel", "redis+cluster", "rediss+cluster"] { RedisConfig, RedisLock };
    "redlock" => dlock_redlock ["redlock", "redlocks"] { Redlock, RedlockConfig };
    "mysql" => dlock_mysql ["mysql", "mariadb"] { MySqlConfig, MySqlLock };
    "postgres" => dlock_postgres ["postgres", "postgresql"] { AdvisoryKey, PostgresConfig, PostgresLock, RowLock };
    "etcd" => dlock_etcd ["etcd", "etcds"] { EtcdConfig, EtcdLock };
    "zookeeper" => dlock_zookeeper ["zk", "zks"] { NodeAcl, ZkConfig, ZkLock };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_compiled_in_backend_is_listed_under_its_own_name_and_schemes() {
        for known in KNOWN {
            if let Some(registration) = &known.registration {
                assert_eq!(known.name, registration.name());
                assert_eq!(known.schemes, registration.schemes(), "{}", known.name);
            }
        }
        let mut schemes: Vec<&str> = KNOWN
            .iter()
            .flat_map(|k| k.schemes.iter().copied())
            .collect();
        let all = schemes.len();
        schemes.sort_unstable();
        schemes.dedup();
        assert_eq!(schemes.len(), all, "a scheme served by two backends");
    }
}
