//! Self-tests: Postgres and MariaDB.

use dlock_test_servers::{MariaDb, Postgres};

#[test]
fn postgres_starts_answers_is_killed_and_restarts() {
    let pg = Postgres::start().unwrap();
    assert!(pg.url().starts_with("postgres://postgres@127.0.0.1:"));
    assert_eq!(pg.query("select 1").unwrap().trim(), "1");
    pg.query("create table t (x int); insert into t values (42)")
        .unwrap();

    // A clean stop keeps committed data.
    pg.stop();
    assert!(pg.query("select 1").is_err());
    pg.restart().unwrap();
    assert_eq!(pg.query("select x from t").unwrap().trim(), "42");

    // A kill is a crash: the server recovers (commits of the last moment may be lost: synchronous_commit=off).
    pg.kill();
    assert!(pg.query("select 1").is_err());
    pg.restart().unwrap();
    assert_eq!(pg.query("select 1").unwrap().trim(), "1");

    pg.pause();
    assert!(pg.is_paused());
    assert!(
        pg.query("select 1").is_err(),
        "a paused server must not answer"
    );
    pg.resume();
    assert_eq!(pg.query("select 1").unwrap().trim(), "1");
}

#[test]
fn mariadb_starts_answers_is_killed_and_restarts() {
    let db = MariaDb::start().unwrap();
    assert!(db.url().starts_with("mysql://root@127.0.0.1:"));
    assert_eq!(db.query("select 1").unwrap().trim(), "1");
    db.query("create table test.t (x int); insert into test.t values (42)")
        .unwrap();

    // A clean stop keeps committed data.
    db.stop();
    assert!(db.query("select 1").is_err());
    db.restart().unwrap();
    assert_eq!(db.query("select x from test.t").unwrap().trim(), "42");

    // A kill is a crash: InnoDB recovers (the last second of commits may be lost: flush-log-at-trx-commit=0).
    db.kill();
    assert!(db.query("select 1").is_err());
    db.restart().unwrap();
    assert_eq!(db.query("select get_lock('a', 0)").unwrap().trim(), "1");

    db.pause();
    assert!(
        db.query("select 1").is_err(),
        "a paused server must not answer"
    );
    db.resume();
    assert_eq!(db.query("select 1").unwrap().trim(), "1");
}
