//! Any URL, for every scheme a backend declares, is parsed or refused with a `Config` error;
//! nothing panics (property tests over random tails, options and values).
#![cfg(all(feature = "redis", feature = "mysql", feature = "postgres"))]

use dlock_api::LockError;
use proptest::prelude::*;

fn refused_cleanly<T>(result: Result<T, LockError>) -> bool {
    matches!(
        result,
        Ok(_) | Err(LockError::Config { .. } | LockError::InvalidArgument { .. })
    )
}

fn option_values() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("0s".to_owned()),
        Just("1ns".to_owned()),
        Just("999999999999s".to_owned()),
        Just("18446744073709551615ms".to_owned()),
        Just("-1".to_owned()),
        Just("0".to_owned()),
        Just("1".to_owned()),
        Just("18446744073709551616".to_owned()),
        Just("x".repeat(100)),
        "[ -~]{0,12}",
    ]
}

fn option_keys() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("connect_timeout"),
        Just("command_timeout"),
        Just("max_connections"),
        Just("keepalive"),
        Just("session_timeout"),
        Just("wait_slice"),
        Just("prefix"),
        Just("table"),
        Just("sequence"),
        Just("fencing"),
        Just("wait_replicas"),
        Just("wait_replicas_timeout"),
        Just("ca_cert"),
        Just("db"),
    ]
    .prop_map(str::to_owned)
}

fn urls() -> impl Strategy<Value = String> {
    let schemes = prop_oneof![
        Just("redis"),
        Just("rediss"),
        Just("redis+sentinel"),
        Just("redis+cluster"),
        Just("mysql"),
        Just("mariadb"),
        Just("postgres"),
        Just("postgresql"),
        Just("memory"),
        Just("nope"),
    ];
    let hosts = prop_oneof![
        Just("127.0.0.1".to_owned()),
        Just("[::1]:6379".to_owned()),
        Just("u:p%40@h:99999".to_owned()),
        Just("a,b,,c/m".to_owned()),
        Just(String::new()),
        "[ -~]{0,30}",
    ];
    let query = prop::collection::vec((option_keys(), option_values()), 0..4).prop_map(|kv| {
        kv.into_iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join("&")
    });
    (schemes, hosts, "[ -~]{0,10}", query)
        .prop_map(|(scheme, host, path, query)| format!("{scheme}://{host}/{path}?{query}"))
}

#[test]
fn every_scheme_a_backend_declares_reaches_it() {
    use dlock::BackendScheme;
    for (schemes, backend) in [
        (dlock_redis::SCHEMES, "redis"),
        (dlock_mysql::SCHEMES, "mysql"),
        (dlock_postgres::SCHEMES, "postgres"),
    ] {
        for scheme in schemes {
            let url = format!("{scheme}://127.0.0.1");
            assert_eq!(BackendScheme::parse(&url).unwrap().name(), backend, "{url}");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn urls_parse_or_are_refused(url in urls()) {
        prop_assert!(refused_cleanly(dlock_redis::RedisConfig::from_url(&url)), "{}", url);
        prop_assert!(refused_cleanly(dlock_mysql::MySqlConfig::from_url(&url)), "{}", url);
        prop_assert!(refused_cleanly(dlock_postgres::PostgresConfig::from_url(&url)), "{}", url);
        let toml = format!("url = {url:?}\n[lock]\nttl = \"1ns\"\nwait_timeout = \"999999999999s\"\n");
        prop_assert!(refused_cleanly(dlock::Config::from_toml(&toml)), "{}", url);
    }

    #[test]
    fn any_text_as_url_is_refused_or_parsed(url in any::<String>()) {
        prop_assert!(refused_cleanly(dlock_redis::RedisConfig::from_url(&url)));
        prop_assert!(refused_cleanly(dlock_mysql::MySqlConfig::from_url(&url)));
        prop_assert!(refused_cleanly(dlock_postgres::PostgresConfig::from_url(&url)));
    }
}
