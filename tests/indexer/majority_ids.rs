//! `MajorityIds` (docs/design.md §13) against three private redis-servers
//! with AOF and `appendfsync always`: a server killed with SIGKILL and
//! restarted with its AOF while eight tasks draw IDs; a server restarted
//! empty, which votes only after a repair; two servers down; servers that
//! may lose writes, refused at build; bad settings, refused by name.
//!
//! Every test checks what a user of the IDs relies on: no ID twice, each
//! caller's IDs increasing, and no ID at all rather than a doubtful one.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use peerq::ids::{IdsError, MajorityIds, MajorityIdsBuilder, ServerState};
use support::{RedisServer, ServerOptions, unique_name, unused_port};

const MS: Duration = Duration::from_millis(1);
/// Tasks drawing IDs at once in the crash test.
const CALLERS: usize = 8;

fn durable() -> ServerOptions {
    ServerOptions {
        aof: true,
        ..ServerOptions::default()
    }
}

fn three() -> Vec<RedisServer> {
    (0..3).map(|_| RedisServer::start_with(durable())).collect()
}

fn urls(servers: &[RedisServer]) -> Vec<String> {
    servers.iter().map(RedisServer::url).collect()
}

/// A builder for a fresh sequence on `servers`, giving up after `timeout`.
fn builder(servers: &[RedisServer], timeout: Duration) -> MajorityIdsBuilder {
    MajorityIds::builder()
        .servers(urls(servers))
        .key(unique_name("ids"))
        .timeout(timeout)
}

/// A fresh sequence on `servers` whose first ID is 1.
async fn sequence(servers: &[RedisServer], timeout: Duration) -> MajorityIds {
    let ids = builder(servers, timeout).build().await.unwrap();
    ids.init(1).await.unwrap();
    ids
}

/// `ids` from one caller, in order: strictly increasing.
fn assert_increasing(ids: &[u64], who: &str) {
    for pair in ids.windows(2) {
        assert!(pair[0] < pair[1], "{who} got {} then {}", pair[0], pair[1]);
    }
}

/// No ID in `ids` twice.
fn assert_unique<'a>(ids: impl IntoIterator<Item = &'a u64>) -> usize {
    let mut seen = HashSet::new();
    for id in ids {
        assert!(seen.insert(*id), "ID {id} was issued twice");
    }
    seen.len()
}

/// The error of a call that must fail, as `IdsError`.
fn ids_error<T: std::fmt::Debug>(result: Result<T, IdsError>) -> IdsError {
    match result {
        Err(e) => e,
        other => panic!("expected an ids error, got {other:?}"),
    }
}

fn state_of(ids: &[peerq::ids::ServerStatus], server: &RedisServer) -> ServerState {
    ids.iter()
        .find(|s| s.server == server.url())
        .map(|s| s.state.clone())
        .expect("every server has a status")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_server_killed_and_restarted_with_its_aof_never_gives_an_id_twice() {
    let mut servers = three();
    let ids = sequence(&servers, Duration::from_secs(10)).await;
    let stop = Arc::new(AtomicBool::new(false));
    let issued = Arc::new(AtomicU64::new(0));
    let callers: Vec<_> = (0..CALLERS)
        .map(|_| {
            let (ids, stop, issued) = (ids.clone(), stop.clone(), issued.clone());
            tokio::spawn(async move {
                let mut mine = Vec::new();
                while !stop.load(Ordering::SeqCst) {
                    mine.push(ids.next().await.expect("a majority is up throughout"));
                    issued.fetch_add(1, Ordering::SeqCst);
                }
                mine
            })
        })
        .collect();
    tokio::time::sleep(300 * MS).await;
    // SIGKILL while IDs are drawn: writes are in flight on the server.
    let crashed = servers.remove(0);
    let (crashed, while_down) = tokio::task::spawn_blocking({
        let issued = issued.clone();
        move || {
            let mut crashed = crashed;
            crashed.stop();
            let before = issued.load(Ordering::SeqCst);
            std::thread::sleep(500 * MS);
            let while_down = issued.load(Ordering::SeqCst) - before;
            crashed.start_again();
            (crashed, while_down)
        }
    })
    .await
    .unwrap();
    servers.insert(0, crashed);
    tokio::time::sleep(300 * MS).await;
    // The restarted server kept its copy (AOF, appendfsync always), so it
    // votes at once: with another server down, it makes the majority.
    let after_restart = issued.load(Ordering::SeqCst);
    let other = servers.remove(1);
    let other = tokio::task::spawn_blocking(move || {
        let mut other = other;
        other.stop();
        other
    })
    .await
    .unwrap();
    let last_before = issued.load(Ordering::SeqCst);
    tokio::time::sleep(300 * MS).await;
    let with_the_restarted_one = issued.load(Ordering::SeqCst) - last_before;
    stop.store(true, Ordering::SeqCst);
    let mut all = Vec::new();
    for (i, caller) in callers.into_iter().enumerate() {
        let mine = caller.await.unwrap();
        assert_increasing(&mine, &format!("caller {i}"));
        all.extend(mine);
    }
    let unique = assert_unique(&all);
    println!(
        "{unique} IDs by {CALLERS} callers, {while_down} while a server was down, \
         {with_the_restarted_one} with the restarted one in the majority \
         ({after_restart} before the second stop)"
    );
    assert!(while_down > 0, "no ID while one server of three was down");
    assert!(
        with_the_restarted_one > 0,
        "no ID with the restarted server and one other"
    );
    drop(other);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_restarted_empty_votes_only_after_a_repair() {
    let mut servers = three();
    let ids = sequence(&servers, Duration::from_secs(1)).await;
    let mut drawn = Vec::new();
    for _ in 0..20 {
        drawn.push(ids.next().await.unwrap());
    }
    servers[0].kill_and_restart_empty();
    assert_eq!(
        state_of(&ids.status().await, &servers[0]),
        ServerState::NeedsRepair
    );
    // Two servers still hold the sequence: the IDs go on.
    for _ in 0..10 {
        drawn.push(ids.next().await.unwrap());
    }
    // With a second server down, only the empty one and the third answer.
    // Were the empty one a vote, they would make a majority and an ID
    // would come; it is not, so none comes.
    servers[1].stop();
    let started = Instant::now();
    let err = ids_error(ids.next().await);
    let msg = err.to_string();
    assert!(matches!(err, IdsError::NoMajority { .. }), "{msg}");
    assert!(started.elapsed() >= 900 * MS, "gave up before its timeout");
    assert!(
        msg.contains(&format!("{} needs repair", servers[0].url())),
        "{msg}"
    );
    assert!(
        msg.contains(&format!("{} unreachable", servers[1].url())),
        "{msg}"
    );
    // A repair needs a majority of holders: one is not enough.
    let err = ids_error(ids.repair().await);
    assert!(matches!(err, IdsError::CannotRepair { .. }), "{err}");
    assert_eq!(
        state_of(&ids.status().await, &servers[0]),
        ServerState::NeedsRepair,
        "a refused repair changes nothing"
    );
    servers[1].start_again();
    let repaired = ids.repair().await.unwrap();
    let last = *drawn.last().unwrap();
    assert!(repaired.value >= last, "{repaired:?} below {last}");
    assert_eq!(repaired.servers, [servers[0].url()]);
    // Repaired, it votes again: with the second server down once more, it
    // and the third make the majority.
    servers[1].stop();
    for _ in 0..10 {
        drawn.push(ids.next().await.unwrap());
    }
    assert_increasing(&drawn, "the caller");
    assert_unique(&drawn);
    assert!(matches!(
        state_of(&ids.status().await, &servers[0]),
        ServerState::Holds(v) if v == *drawn.last().unwrap()
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_majority_that_lost_the_sequence_does_not_start_it_again() {
    let mut servers = three();
    let ids = sequence(&servers, Duration::from_secs(5)).await;
    for _ in 0..5 {
        ids.next().await.unwrap();
    }
    // A majority took 5; the third copy may hold 4 (the write to it is
    // dropped once a majority has decided).
    let third = state_of(&ids.status().await, &servers[2]);
    assert!(matches!(third, ServerState::Holds(4 | 5)), "{third:?}");
    servers[0].kill_and_restart_empty();
    servers[1].kill_and_restart_empty();
    // No retry can help: refused at once, saying what to do.
    let started = Instant::now();
    let err = ids_error(ids.next().await);
    assert!(matches!(err, IdsError::NeedsRepair { .. }), "{err}");
    assert!(started.elapsed() < Duration::from_secs(2), "it waited");
    assert!(err.to_string().contains("MajorityIds::repair"), "{err}");
    let err = ids_error(ids.repair().await);
    assert!(matches!(err, IdsError::CannotRepair { .. }), "{err}");
    let err = ids_error(ids.init(1).await);
    assert!(matches!(err, IdsError::NotNew { .. }), "{err}");
    let ServerState::Holds(held) = third else {
        unreachable!()
    };
    assert!(err.to_string().contains(&format!("holds {held}")), "{err}");
    // And the servers are left as they were.
    let status = ids.status().await;
    assert_eq!(state_of(&status, &servers[0]), ServerState::NeedsRepair);
    assert_eq!(state_of(&status, &servers[2]), third);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_servers_down_give_a_clear_error_and_no_id() {
    let mut servers = three();
    let ids = sequence(&servers, Duration::from_secs(1)).await;
    let drawn = ids.next().await.unwrap();
    // What the third holds: the new ID, or the one before if its write
    // was dropped once the other two had decided.
    let before = state_of(&ids.status().await, &servers[2]);
    servers[0].stop();
    servers[1].stop();
    let err = ids_error(ids.next().await);
    let msg = err.to_string();
    assert!(matches!(err, IdsError::NoMajority { .. }), "{msg}");
    for down in &servers[..2] {
        assert!(
            msg.contains(&format!("{} unreachable", down.url())),
            "{msg}"
        );
    }
    assert!(msg.contains("2 of the servers must hold it"), "{msg}");
    assert_eq!(
        state_of(&ids.status().await, &servers[2]),
        before,
        "nothing was written"
    );
    servers[0].start_again();
    servers[1].start_again();
    assert_eq!(ids.next().await.unwrap(), drawn + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_may_lose_writes_is_refused_at_build_naming_it() {
    let loose = RedisServer::start_with(ServerOptions {
        requirepass: Some("s3cret"),
        ..ServerOptions::default()
    });
    let servers = [
        RedisServer::start_with(durable()),
        RedisServer::start_with(durable()),
    ];
    let all = || {
        MajorityIds::builder()
            .servers(urls(&servers).into_iter().chain([loose.url()]))
            .key(unique_name("ids"))
    };
    let refused = |builder: MajorityIdsBuilder| async {
        let err = ids_error(builder.build().await);
        assert!(matches!(err, IdsError::Unsafe { .. }), "{err}");
        let msg = err.to_string();
        assert!(
            msg.contains(&format!(
                "redis at redis://:***@127.0.0.1:{}/",
                loose.port()
            )),
            "{msg}"
        );
        assert!(!msg.contains("s3cret"), "{msg}");
        msg
    };
    let msg = refused(all()).await;
    assert!(msg.contains("appendonly no"), "{msg}");
    // A wrong password is no durability question: refused as such.
    let wrong = MajorityIds::builder()
        .servers(
            urls(&servers)
                .into_iter()
                .chain([loose.url().replace("s3cret", "wrong")]),
        )
        .key(unique_name("ids"))
        .build()
        .await
        .unwrap_err()
        .to_string();
    assert!(
        wrong.starts_with(&format!(
            "cannot use redis at redis://:***@127.0.0.1:{}/",
            loose.port()
        )),
        "{wrong}"
    );
    assert!(wrong.contains("check the user and password"), "{wrong}");
    // Accepted when the caller says so.
    let ids = all().allow_unsafe_durability().build().await.unwrap();
    ids.init(1).await.unwrap();
    assert_eq!(ids.next().await.unwrap(), 1);
    // AOF on, but fsync'd once a second: a crash loses the last second.
    let mut admin = loose.client().get_connection().unwrap();
    let set = |con: &mut deadpool_redis::redis::Connection, name: &str, value: &str| {
        let () = deadpool_redis::redis::cmd("CONFIG")
            .arg("SET")
            .arg(name)
            .arg(value)
            .query(con)
            .unwrap();
    };
    set(&mut admin, "appendonly", "yes");
    let msg = refused(all()).await;
    assert!(msg.contains("appendfsync everysec"), "{msg}");
    set(&mut admin, "appendfsync", "always");
    all().build().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_whose_settings_cannot_be_read_is_refused_unless_allowed() {
    let servers = three();
    servers[2].acl_setuser("ids on >pw ~* +@all -config");
    let all = || {
        MajorityIds::builder()
            .servers([
                servers[0].url(),
                servers[1].url(),
                servers[2].url_as("ids", "pw"),
            ])
            .key(unique_name("ids"))
    };
    let err = ids_error(all().build().await);
    let msg = err.to_string();
    assert!(matches!(err, IdsError::Unsafe { .. }), "{msg}");
    assert!(msg.contains("may not run CONFIG GET (ACL)"), "{msg}");
    assert!(msg.contains("ids:***@"), "{msg}");
    let ids = all().allow_unsafe_durability().build().await.unwrap();
    ids.init(1).await.unwrap();
    assert_eq!(ids.next().await.unwrap(), 1);
}

/// The README's rule for a least-privilege user.
const ACL_RULE: &str = "~peerq:ids:* +get +set +evalsha +script|load +config|get";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readmes_least_privilege_acl_user_is_enough() {
    let servers = three();
    for server in &servers {
        server.acl_setuser(&format!("ids on >pw {ACL_RULE}"));
    }
    let ids = MajorityIds::builder()
        .servers(servers.iter().map(|s| s.url_as("ids", "pw")))
        .key(unique_name("ids"))
        .build()
        .await
        .unwrap();
    ids.init(1).await.unwrap();
    assert_eq!(ids.next().await.unwrap(), 1);
    assert!(ids.repair().await.unwrap().servers.is_empty());
    assert_eq!(ids.next().await.unwrap(), 2);
}

#[tokio::test]
async fn bad_settings_are_refused_by_name() {
    let port = unused_port();
    let url = format!("redis://127.0.0.1:{port}/");
    let other = |n: u16| format!("redis://127.0.0.1:{}/", port.wrapping_add(n));
    let refused = |builder: MajorityIdsBuilder, setting: &str| {
        let setting = format!("invalid setting `{setting}`");
        async move {
            let msg = builder.build().await.unwrap_err().to_string();
            assert!(msg.starts_with(&setting), "{msg}");
            assert!(!msg.contains("s3cret"), "{msg}");
            msg
        }
    };
    let three = [url.clone(), other(1), other(2)];
    let ok = || {
        MajorityIds::builder()
            .servers(three.clone())
            .key("invoices")
    };
    refused(MajorityIds::builder().key("invoices"), "servers").await;
    let msg = refused(
        MajorityIds::builder().servers([&url, &other(1)]).key("k"),
        "servers",
    )
    .await;
    assert!(msg.contains("allow_fewer_servers"), "{msg}");
    let msg = refused(
        MajorityIds::builder()
            .servers([url.clone(), other(1), format!("redis://127.0.0.1:{port}")])
            .key("k"),
        "servers",
    )
    .await;
    assert!(msg.contains("are the same server"), "{msg}");
    let msg = refused(
        MajorityIds::builder()
            .servers([url.clone(), other(1), "redis//:s3cret@db".to_owned()])
            .key("k"),
        "servers",
    )
    .await;
    assert!(msg.contains("redis//:***@db"), "{msg}");
    refused(MajorityIds::builder().servers(three.clone()), "key").await;
    refused(ok().key("in voices"), "key").await;
    refused(ok().timeout(Duration::ZERO), "timeout").await;
    refused(
        ok().backoff(peerq::Backoff::exponential(10 * MS, MS)),
        "backoff",
    )
    .await;
    // Servers that are down are no reason to refuse a build: they are
    // checked when they come back. Two, with the opt-out.
    let ids = ok().build().await.unwrap();
    MajorityIds::builder()
        .servers([url.clone(), other(1)])
        .key("k")
        .allow_fewer_servers()
        .build()
        .await
        .unwrap();
    let msg = ids.init(0).await.unwrap_err().to_string();
    assert!(msg.starts_with("invalid setting `init`"), "{msg}");
    let debug = format!(
        "{:?}",
        MajorityIds::builder().servers(["redis://:s3cret@db/"])
    );
    assert!(!debug.contains("s3cret"), "{debug}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_compare_exactly_at_every_size() {
    let servers = three();
    let draw = |first: u64| {
        let servers = &servers;
        async move {
            let ids = builder(servers, Duration::from_secs(1))
                .build()
                .await
                .unwrap();
            ids.init(first).await.unwrap();
            let a = ids.next().await;
            let b = ids.next().await;
            (a, b)
        }
    };
    // More digits: "10" is below "9" as text.
    let (a, b) = draw(9).await;
    assert_eq!((a.unwrap(), b.unwrap()), (9, 10));
    // Beyond 2^53, where a double cannot tell n from n + 1.
    let first = (1 << 53) + 1;
    let (a, b) = draw(first).await;
    assert_eq!((a.unwrap(), b.unwrap()), (first, first + 1));
    // The last ID, then no more.
    let (a, b) = draw(u64::MAX).await;
    assert_eq!(a.unwrap(), u64::MAX);
    let err = ids_error(b);
    assert!(matches!(err, IdsError::Exhausted { .. }), "{err}");
}
