//! Self-tests of the test harness in `tests/support`: the servers, restarts,
//! pauses and proxy behave as the other integration tests assume.

use std::time::{Duration, Instant};

use deadpool_redis::redis::{self, Commands as _};
use support::{
    Proxy, RedisServer, ServerOptions, connect, is_interrupted, process_exists, retry_interrupted,
    unique_name, unused_port,
};

/// Response timeout of probe connections: short, so a hang shows up fast.
const PROBE: Duration = Duration::from_millis(300);

// Sync calls with a timeout can fail with EINTR when another test's child
// process exits; see `support::retry_interrupted`.

fn set(url: &str, key: &str, value: &str) {
    let mut con = connect(url, Duration::from_secs(2)).expect("connect");
    let () = retry_interrupted(|| con.set(key, value)).expect("SET");
}

fn get(url: &str, key: &str) -> Option<String> {
    let mut con = connect(url, Duration::from_secs(2)).expect("connect");
    retry_interrupted(|| con.get(key)).expect("GET")
}

fn ping(con: &mut redis::Connection) -> redis::RedisResult<String> {
    retry_interrupted(|| redis::cmd("PING").query(con))
}

#[test]
fn server_starts_and_answers_ping() {
    support::init_tracing();
    let server = RedisServer::start();
    assert!(server.url().starts_with("redis://127.0.0.1:"));
    assert!(server.url().ends_with(&format!(":{}/", server.port())));
    let mut con = server.client().get_connection().expect("connect");
    assert_eq!(ping(&mut con).expect("PING"), "PONG");
    let save: Vec<String> =
        retry_interrupted(|| redis::cmd("CONFIG").arg("GET").arg("save").query(&mut con))
            .expect("CONFIG GET save");
    assert_eq!(save, ["save", ""], "snapshots are off by default");
}

#[test]
fn two_servers_get_different_ports_and_data() {
    let a = RedisServer::start();
    let b = RedisServer::start();
    assert_ne!(a.port(), b.port());
    assert_ne!(a.dir(), b.dir());
    set(&a.url(), "k", "a");
    assert_eq!(get(&b.url(), "k"), None);
}

#[test]
fn a_server_starts_later_on_a_port_chosen_in_advance_with_a_password() {
    let port = unused_port();
    let anonymous = format!("redis://127.0.0.1:{port}/");
    assert!(connect(&anonymous, PROBE).is_err(), "nothing listens yet");
    let server = RedisServer::start_on(
        port,
        ServerOptions {
            requirepass: Some("pw-of-the-test"),
            ..ServerOptions::default()
        },
    );
    assert_eq!(server.port(), port);
    assert_eq!(
        server.url(),
        format!("redis://:pw-of-the-test@127.0.0.1:{port}/")
    );
    let mut con = connect(&server.url(), PROBE).expect("connect with the password");
    assert_eq!(ping(&mut con).expect("PING"), "PONG");
    let mut con = connect(&anonymous, PROBE).expect("connect without it");
    let refused = ping(&mut con).expect_err("PING without the password");
    assert_eq!(refused.code(), Some("NOAUTH"), "{refused}");
}

#[test]
fn data_survives_restart() {
    let mut server = RedisServer::start();
    let port = server.port();
    let pid = server.pid();
    set(&server.url(), "k", "v");
    server.restart();
    assert_eq!(server.port(), port);
    assert_ne!(server.pid(), pid, "a new process");
    assert_eq!(get(&server.url(), "k").as_deref(), Some("v"));
    // And again: the second restart must not fail on the dump the first left.
    set(&server.url(), "k2", "v2");
    server.restart();
    assert_eq!(get(&server.url(), "k").as_deref(), Some("v"));
    assert_eq!(get(&server.url(), "k2").as_deref(), Some("v2"));
}

#[test]
fn data_survives_restart_with_aof() {
    let mut server = RedisServer::start_with(ServerOptions {
        aof: true,
        ..ServerOptions::default()
    });
    set(&server.url(), "k", "v");
    server.restart();
    assert_eq!(get(&server.url(), "k").as_deref(), Some("v"));
}

#[test]
fn kill_and_restart_keeps_aof_data() {
    let mut server = RedisServer::start_with(ServerOptions {
        aof: true,
        ..ServerOptions::default()
    });
    let pid = server.pid();
    set(&server.url(), "k", "v");
    server.kill_and_restart();
    assert!(!process_exists(pid), "the old process was killed");
    assert_eq!(get(&server.url(), "k").as_deref(), Some("v"));
}

#[test]
fn kill_and_restart_without_aof_loses_data() {
    let mut server = RedisServer::start();
    set(&server.url(), "before-restart", "v");
    // restart() leaves a dump.rdb behind; a crash must not bring it back.
    server.restart();
    set(&server.url(), "after-restart", "v");
    server.kill_and_restart();
    assert_eq!(get(&server.url(), "before-restart"), None);
    assert_eq!(get(&server.url(), "after-restart"), None);
}

#[test]
fn pause_hangs_commands_and_resume_recovers() {
    let server = RedisServer::start();
    let mut con = connect(&server.url(), PROBE).expect("connect");
    assert_eq!(ping(&mut con).expect("PING"), "PONG");

    server.pause();
    let started = Instant::now();
    let err = ping(&mut con).expect_err("a paused server does not answer");
    assert!(err.is_timeout(), "expected a timeout, got {err}");
    assert!(started.elapsed() >= PROBE / 2);

    server.resume();
    // The same connection stayed open; redis-rs skips the late reply.
    assert_eq!(ping(&mut con).expect("PING after resume"), "PONG");
}

#[test]
fn pause_for_resumes_by_itself() {
    let server = RedisServer::start();
    let mut con = connect(&server.url(), Duration::from_secs(5)).expect("connect");
    let started = Instant::now();
    server.pause_for(Duration::from_millis(500));
    assert!(
        started.elapsed() < Duration::from_millis(400),
        "returns at once"
    );
    assert_eq!(ping(&mut con).expect("PING"), "PONG");
    assert!(
        started.elapsed() >= Duration::from_millis(450),
        "answered only after the pause, at {:?}",
        started.elapsed()
    );
}

#[test]
fn proxy_forwards_commands() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    assert_ne!(proxy.port(), server.port());
    set(&proxy.url(), "k", "through proxy");
    assert_eq!(get(&server.url(), "k").as_deref(), Some("through proxy"));
    // A larger value crosses several reads of the pump.
    let big = "x".repeat(1 << 20);
    set(&proxy.url(), "big", &big);
    assert_eq!(get(&proxy.url(), "big").as_deref(), Some(big.as_str()));
}

/// Round trips of `n` PINGs on `con`, sorted.
fn ping_times(con: &mut redis::Connection, n: usize) -> Vec<Duration> {
    let mut times: Vec<Duration> = (0..n)
        .map(|_| {
            let started = Instant::now();
            retry_interrupted(|| ping(con)).expect("PING");
            started.elapsed()
        })
        .collect();
    times.sort();
    times
}

#[test]
fn proxy_jitter_delays_each_chunk_up_to_its_bound_in_order() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let max = Duration::from_millis(30);
    proxy.jitter(max);
    let mut con = connect(&proxy.url(), Duration::from_secs(5)).expect("connect");
    // A PING and its reply cross the proxy once each: 0 to 60 ms, 30 on
    // average.
    let times = ping_times(&mut con, 40);
    let mean = times.iter().sum::<Duration>() / times.len() as u32;
    let (min, max_seen) = (times[0], times[times.len() - 1]);
    println!("with jitter up to {max:?}: min {min:?} mean {mean:?} max {max_seen:?}");
    assert!(mean >= Duration::from_millis(10), "mean {mean:?}");
    assert!(max_seen - min >= Duration::from_millis(10), "{times:?}");
    // Generous for a loaded machine: two waits of at most 30 ms each.
    assert!(max_seen < 2 * max + Duration::from_millis(250), "{times:?}");

    // Pipelined requests stay in order on their connection.
    let mut pipe = redis::pipe();
    for _ in 0..200 {
        pipe.incr("n", 1);
    }
    let replies: Vec<u64> = retry_interrupted(|| pipe.query(&mut con)).expect("INCRs");
    assert_eq!(replies, (1..=200).collect::<Vec<u64>>());

    proxy.jitter(Duration::ZERO);
    let times = ping_times(&mut con, 40);
    let median = times[times.len() / 2];
    println!("without jitter: median {median:?}");
    assert!(median < Duration::from_millis(5), "{times:?}");
}

#[test]
fn proxy_cut_fails_fast_and_restore_allows_reconnect() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let long = Duration::from_secs(5);
    let mut con = connect(&proxy.url(), long).expect("connect");
    assert_eq!(ping(&mut con).expect("PING"), "PONG");

    proxy.cut();
    let started = Instant::now();
    let err = ping(&mut con).expect_err("the connection was closed");
    assert!(!err.is_timeout(), "expected a connection error, got {err}");
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "took {:?}",
        started.elapsed()
    );

    // New connections are refused while cut.
    let started = Instant::now();
    let result = connect(&proxy.url(), long).and_then(|mut con| ping(&mut con));
    assert!(result.is_err(), "connected through a cut proxy");
    assert!(started.elapsed() < Duration::from_secs(1));

    // Others keep Redis.
    assert_eq!(get(&server.url(), "k"), None);

    proxy.restore();
    let mut con = connect(&proxy.url(), long).expect("reconnect after restore");
    assert_eq!(ping(&mut con).expect("PING"), "PONG");
}

#[test]
fn proxy_blackhole_hangs_while_direct_connection_works() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let mut through = connect(&proxy.url(), PROBE).expect("connect through proxy");
    let mut idle = connect(&proxy.url(), PROBE).expect("connect through proxy");
    let mut direct = connect(&server.url(), PROBE).expect("connect directly");
    assert_eq!(ping(&mut through).expect("PING"), "PONG");

    proxy.blackhole();
    let err = ping(&mut through).expect_err("a blackholed connection hangs");
    assert!(err.is_timeout(), "expected a timeout, got {err}");
    let err = connect(&proxy.url(), PROBE)
        .and_then(|mut con| ping(&mut con))
        .expect_err("a new connection hangs too");
    assert!(err.is_timeout(), "expected a timeout, got {err}");
    assert_eq!(ping(&mut direct).expect("direct PING"), "PONG");

    proxy.restore();
    // A connection that was idle during the blackhole lost nothing and works.
    assert_eq!(ping(&mut idle).expect("PING on idle connection"), "PONG");
    // One that lost a request is closed (an error, not a hang), so the
    // client reconnects instead of reading replies out of step.
    let err = ping(&mut through).expect_err("a connection that lost bytes is closed");
    assert!(!err.is_timeout(), "expected a connection error, got {err}");
    let mut con = connect(&proxy.url(), PROBE).expect("reconnect after restore");
    assert_eq!(ping(&mut con).expect("PING"), "PONG");
}

#[test]
fn proxy_hold_delivers_requests_late_on_restore() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let mut through = connect(&proxy.url(), PROBE).expect("connect through proxy");
    assert_eq!(ping(&mut through).expect("PING"), "PONG");

    proxy.hold();
    let err = retry_interrupted(|| through.set::<_, _, ()>("held", "late"))
        .expect_err("a held request gets no reply");
    assert!(err.is_timeout(), "expected a timeout, got {err}");
    // The request has not reached the server yet.
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(get(&server.url(), "held"), None);

    proxy.restore();
    // Delivered late, in order, as TCP does when a partition heals.
    let deadline = Instant::now() + Duration::from_secs(2);
    while get(&server.url(), "held").is_none() {
        assert!(Instant::now() < deadline, "the held request never arrived");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(get(&server.url(), "held").as_deref(), Some("late"));
}

#[test]
fn proxy_hold_on_holds_only_the_connections_that_send_the_pattern() {
    // Longer than a probe's: the connections must not time out for the
    // load of a busy machine, only for the hold.
    const WAIT: Duration = Duration::from_secs(1);
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let mut naming = connect(&proxy.url(), WAIT).expect("connect through proxy");
    let mut other = connect(&proxy.url(), WAIT).expect("connect through proxy");
    proxy.hold_on(b"held-");
    assert_eq!(proxy.held(), 0);
    assert_eq!(ping(&mut naming).expect("PING before the pattern"), "PONG");

    let err = retry_interrupted(|| naming.set::<_, _, ()>("held-a", "late"))
        .expect_err("the request that names it gets no reply");
    assert!(err.is_timeout(), "expected a timeout, got {err}");
    assert_eq!(proxy.held(), 1);
    // Not sent on: and the other connection goes on.
    assert_eq!(
        ping(&mut other).expect("PING on the other connection"),
        "PONG"
    );
    assert_eq!(get(&server.url(), "held-a"), None);
    // A new connection that sends it is held too.
    let mut again = connect(&proxy.url(), WAIT).expect("connect through proxy");
    let err =
        retry_interrupted(|| again.set::<_, _, ()>("held-b", "again")).expect_err("held again");
    assert!(err.is_timeout(), "expected a timeout, got {err}");
    assert_eq!(proxy.held(), 2);

    proxy.restore();
    let deadline = Instant::now() + Duration::from_secs(2);
    while get(&server.url(), "held-a").is_none() || get(&server.url(), "held-b").is_none() {
        assert!(Instant::now() < deadline, "the held requests never arrived");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Whether the server has a client with id `id`.
fn has_client(url: &str, id: u64) -> bool {
    let mut con = connect(url, PROBE).expect("connect directly");
    let list: String = retry_interrupted(|| redis::cmd("CLIENT").arg("LIST").query(&mut con))
        .expect("CLIENT LIST");
    list.lines()
        .any(|line| line.starts_with(&format!("id={id} ")))
}

#[test]
fn proxy_hold_keeps_a_closed_connection_open_toward_the_server_until_restore() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let mut through = connect(&proxy.url(), PROBE).expect("connect through proxy");
    let id: u64 = retry_interrupted(|| redis::cmd("CLIENT").arg("ID").query(&mut through))
        .expect("CLIENT ID");

    proxy.hold();
    drop(through);
    // The client's close does not cross the held link: the server still
    // has the connection (a blocking read on it would stay blocked).
    std::thread::sleep(Duration::from_millis(200));
    assert!(has_client(&server.url(), id), "closed during the hold");

    proxy.restore();
    let deadline = Instant::now() + Duration::from_secs(2);
    while has_client(&server.url(), id) {
        assert!(Instant::now() < deadline, "still open after restore");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn proxy_follows_server_restart() {
    let mut server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    set(&proxy.url(), "k", "v");
    server.restart();
    assert_eq!(get(&proxy.url(), "k").as_deref(), Some("v"));
}

#[test]
fn proxy_drop_closes_connections() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let url = proxy.url();
    let mut con = connect(&url, Duration::from_secs(5)).expect("connect");
    assert_eq!(ping(&mut con).expect("PING"), "PONG");
    let started = Instant::now();
    drop(proxy);
    assert!(started.elapsed() < Duration::from_secs(1), "drop is quick");
    assert!(ping(&mut con).is_err(), "connection closed");
    assert!(connect(&url, PROBE).is_err(), "no longer listening");
}

#[test]
fn drop_kills_the_server_and_removes_its_dir() {
    let server = RedisServer::start();
    let pid = server.pid();
    let dir = server.dir().to_path_buf();
    assert!(process_exists(pid));
    assert!(dir.is_dir());
    server.pause(); // Drop must also handle a stopped process.
    drop(server);
    assert!(!process_exists(pid), "redis-server {pid} still runs");
    assert!(!dir.exists(), "{} still exists", dir.display());
}

#[test]
fn drop_kills_the_server_when_the_test_panics() {
    let (tx, rx) = std::sync::mpsc::channel();
    let result = std::panic::catch_unwind(move || {
        let server = RedisServer::start();
        tx.send(server.pid()).expect("send pid");
        panic!("test failure");
    });
    assert!(result.is_err());
    let pid = rx.recv().expect("pid");
    assert!(!process_exists(pid), "redis-server {pid} still runs");
}

#[tokio::test(flavor = "multi_thread")]
async fn pool_works_from_a_tokio_test_across_restart() {
    let mut server = RedisServer::start();
    let pool = server.pool();
    {
        let mut con = pool.get().await.expect("pool connection");
        let () = redis::cmd("SET")
            .arg("k")
            .arg("v")
            .query_async(&mut con)
            .await
            .expect("SET");
    }
    server.restart();
    let mut con = pool.get().await.expect("pool connection after restart");
    let value: Option<String> = redis::cmd("GET")
        .arg("k")
        .query_async(&mut con)
        .await
        .expect("GET");
    assert_eq!(value.as_deref(), Some("v"));
}

#[test]
fn unique_names_are_unique_and_safe() {
    let a = unique_name("My_Test:{x}/y");
    let b = unique_name("My_Test:{x}/y");
    assert_ne!(a, b);
    for name in [&a, &b] {
        assert!(name.starts_with("t-my-test--x--y-"), "{name}");
        assert!(
            name.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'),
            "{name}"
        );
    }
}

#[test]
fn init_tracing_is_idempotent() {
    support::init_tracing();
    support::init_tracing();
    tracing::warn!("harness tracing works");
}

#[test]
fn interrupted_io_errors_are_recognised() {
    let eintr = redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::Interrupted));
    assert!(is_interrupted(&eintr));
    let timeout = redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut));
    assert!(!is_interrupted(&timeout));

    let mut calls = 0;
    let result: redis::RedisResult<u32> = retry_interrupted(|| {
        calls += 1;
        if calls < 3 {
            Err(std::io::Error::from(std::io::ErrorKind::Interrupted).into())
        } else {
            Ok(7)
        }
    });
    assert_eq!(result.expect("third call succeeds"), 7);
    assert_eq!(calls, 3);
}
