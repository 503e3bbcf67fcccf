//! Self-tests of the fault proxy against a real Redis, with raw TCP (RESP) clients.

use std::io::{BufReader, ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use dlock_test_servers::{FaultProxy, ProxyMode, RedisServer, Resp, encode_command, read_reply};

/// A raw RESP connection through the proxy.
struct Client {
    stream: TcpStream,
    reader: BufReader<TcpStream>,
}

impl Client {
    fn connect(proxy: &FaultProxy) -> Client {
        let stream = TcpStream::connect(proxy.addr()).unwrap();
        let reader = BufReader::new(stream.try_clone().unwrap());
        Client { stream, reader }
    }

    fn send(&mut self, args: &[&str]) {
        self.stream.write_all(&encode_command(args)).unwrap();
    }

    /// The next reply, or `None` when none arrives within `wait`.
    fn reply_within(&mut self, wait: Duration) -> Option<Resp> {
        self.stream.set_read_timeout(Some(wait)).unwrap();
        match read_reply(&mut self.reader) {
            Ok(reply) => Some(reply),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => None,
            Err(e) => panic!("connection failed: {e}"),
        }
    }

    fn reply(&mut self) -> Resp {
        self.reply_within(Duration::from_secs(5))
            .expect("a reply within 5 s")
    }

    fn ping(&mut self) -> Resp {
        self.send(&["PING"]);
        self.reply()
    }
}

fn pong() -> Resp {
    Resp::Simple("PONG".into())
}

#[test]
fn blackhole_partitions_an_open_connection_and_heal_restores_it() {
    let redis = RedisServer::start().unwrap();
    let proxy = FaultProxy::start(redis.addr()).unwrap();
    let mut client = Client::connect(&proxy);
    assert_eq!(client.ping(), pong());

    proxy.set_mode(ProxyMode::Blackhole);
    client.send(&["SET", "k", "during-partition"]);
    assert_eq!(
        client.reply_within(Duration::from_millis(300)),
        None,
        "no answer while partitioned"
    );
    assert_eq!(
        redis.command(&["GET", "k"]).unwrap(),
        Resp::Bulk(None),
        "the request did not reach the server"
    );

    // A new connection during the partition is accepted but goes nowhere.
    let mut late = Client::connect(&proxy);
    late.send(&["PING"]);
    assert_eq!(late.reply_within(Duration::from_millis(200)), None);

    proxy.heal();
    // Like TCP after a partition heals, what was sent meanwhile is delivered now.
    assert_eq!(client.reply(), Resp::Simple("OK".into()));
    assert_eq!(late.reply(), pong());
    assert_eq!(client.ping(), pong());
}

#[test]
fn hold_replies_keeps_answers_until_released() {
    let redis = RedisServer::start().unwrap();
    let proxy = FaultProxy::start(redis.addr()).unwrap();
    let mut client = Client::connect(&proxy);
    assert_eq!(client.ping(), pong());

    proxy.set_mode(ProxyMode::HoldReplies);
    client.send(&["SET", "k", "v"]);
    assert_eq!(client.reply_within(Duration::from_millis(300)), None);
    // The request reached the server: only the answer is late.
    assert_eq!(
        redis.command(&["GET", "k"]).unwrap(),
        Resp::Bulk(Some(b"v".to_vec()))
    );

    proxy.release_held();
    assert_eq!(client.reply(), Resp::Simple("OK".into()));
    // Still holding: the next answer waits again, until heal.
    client.send(&["PING"]);
    assert_eq!(client.reply_within(Duration::from_millis(200)), None);
    proxy.heal();
    assert_eq!(client.reply(), pong());
    assert_eq!(client.ping(), pong());
}

#[test]
fn drop_replies_executes_requests_but_loses_answers() {
    let redis = RedisServer::start().unwrap();
    let proxy = FaultProxy::start(redis.addr()).unwrap();
    let mut client = Client::connect(&proxy);

    proxy.set_mode(ProxyMode::DropReplies);
    client.send(&["INCR", "n"]);
    assert_eq!(client.reply_within(Duration::from_millis(300)), None);
    assert_eq!(
        redis.command(&["GET", "n"]).unwrap(),
        Resp::Bulk(Some(b"1".to_vec()))
    );

    proxy.heal();
    // The lost answer never comes: the next reply is the next request's.
    client.send(&["INCR", "n"]);
    assert_eq!(client.reply(), Resp::Integer(2));
}

#[test]
fn latency_delays_answers() {
    let redis = RedisServer::start().unwrap();
    let proxy = FaultProxy::start(redis.addr()).unwrap();
    let mut client = Client::connect(&proxy);
    assert_eq!(client.ping(), pong());

    proxy.set_mode(ProxyMode::Latency(Duration::from_millis(150)));
    let begun = Instant::now();
    assert_eq!(client.ping(), pong());
    assert!(
        begun.elapsed() >= Duration::from_millis(300),
        "{:?}",
        begun.elapsed()
    );
    proxy.heal();
    let begun = Instant::now();
    assert_eq!(client.ping(), pong());
    assert!(
        begun.elapsed() < Duration::from_millis(250),
        "{:?}",
        begun.elapsed()
    );
}

/// Each chunk waits between `min` and `max` each way; replies still come back in order.
#[test]
fn jitter_delays_each_chunk_within_its_bounds_in_order() {
    let redis = RedisServer::start().unwrap();
    let proxy = FaultProxy::start(redis.addr()).unwrap();
    let mut client = Client::connect(&proxy);
    assert_eq!(client.ping(), pong());
    proxy.set_mode(ProxyMode::Jitter {
        min: Duration::from_millis(20),
        max: Duration::from_millis(60),
    });
    for _ in 0..5 {
        let begun = Instant::now();
        assert_eq!(client.ping(), pong());
        // One chunk each way: at least 2 × min; the upper bound is only the test's patience.
        assert!(
            begun.elapsed() >= Duration::from_millis(40),
            "{:?}",
            begun.elapsed()
        );
    }
    // Pipelined requests: their replies keep their order whatever each chunk waited.
    for _ in 0..5 {
        client.send(&["INCR", "jitter"]);
    }
    for n in 1..=5 {
        assert_eq!(client.reply(), Resp::Integer(n));
    }
}

#[test]
fn reset_closes_every_connection_and_new_ones_work() {
    let redis = RedisServer::start().unwrap();
    let proxy = FaultProxy::start(redis.addr()).unwrap();
    let mut a = Client::connect(&proxy);
    let mut b = Client::connect(&proxy);
    assert_eq!(a.ping(), pong());
    assert_eq!(b.ping(), pong());
    assert_eq!(proxy.connections(), 2);
    let before = redis
        .command(&["CLIENT", "LIST"])
        .unwrap()
        .as_text()
        .unwrap()
        .lines()
        .count();

    proxy.reset();
    for client in [&mut a, &mut b] {
        client
            .stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let mut buf = [0; 1];
        let n = client.stream.read(&mut buf).unwrap_or(0);
        assert_eq!(n, 0, "the client side is closed");
    }
    // The server side is closed too.
    let deadline = Instant::now() + Duration::from_secs(5);
    while redis
        .command(&["CLIENT", "LIST"])
        .unwrap()
        .as_text()
        .unwrap()
        .lines()
        .count()
        > before - 2
    {
        assert!(
            Instant::now() < deadline,
            "server-side connections still open"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut c = Client::connect(&proxy);
    assert_eq!(c.ping(), pong());
}

#[test]
fn a_proxy_to_a_paused_or_killed_server() {
    let redis = RedisServer::start().unwrap();
    let proxy = FaultProxy::start(redis.addr()).unwrap();
    let mut client = Client::connect(&proxy);
    assert_eq!(client.ping(), pong());
    redis.kill();
    client.send(&["PING"]);
    let mut buf = [0; 1];
    client
        .stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    assert_eq!(
        client.stream.read(&mut buf).unwrap_or(0),
        0,
        "the proxy passes the server's death on"
    );
    redis.restart().unwrap();
    let mut client = Client::connect(&proxy);
    assert_eq!(client.ping(), pong());
}
