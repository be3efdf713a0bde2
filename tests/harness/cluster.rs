//! Self-tests of the Redis Cluster harness in `tests/support`: clusters
//! form, keys spread over the masters, slots move with their data, replicas
//! take over, nodes die with their owner — and what a client blocked in
//! `XREADGROUP` sees when its slot or its master changes, which peerq's
//! cluster support must handle.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::thread;
use std::time::{Duration, Instant};

use deadpool_redis::redis::{self, Value};
use support::{NodeInfo, RedisCluster, connect, retry_interrupted, slot_of};

/// Timeout of probe connections.
const PROBE: Duration = Duration::from_secs(5);

fn on_node<T: redis::FromRedisValue>(node: &NodeInfo, cmd: &redis::Cmd) -> redis::RedisResult<T> {
    let mut con = connect(&node.url, PROBE)?;
    retry_interrupted(|| cmd.query(&mut con))
}

fn get(node: &NodeInfo, key: &str) -> redis::RedisResult<Option<String>> {
    on_node(node, redis::cmd("GET").arg(key))
}

fn set(cluster: &RedisCluster, key: &str, value: &str) {
    let () = cluster
        .query(redis::cmd("SET").arg(key).arg(value))
        .expect("SET through redirects");
}

/// A unique name whose slot is `class` modulo 3. The tests that move slots
/// of the shared cluster each take their own class, so none moves a slot
/// another one is looking at.
fn name_in_slot_class(prefix: &str, class: u16) -> String {
    loop {
        let name = support::unique_name(prefix);
        if slot_of(&name) % 3 == class {
            return name;
        }
    }
}

/// The port a `MOVED` or `ASK` error points to, and its kind.
fn redirect(err: &redis::RedisError) -> (String, u16) {
    let (addr, _slot) = err
        .redirect_node()
        .unwrap_or_else(|| panic!("expected a redirect, got {err}"));
    let port = addr.rsplit_once(':').unwrap().1.parse().unwrap();
    (err.code().unwrap_or_default().to_owned(), port)
}

#[test]
fn slot_of_matches_redis() {
    // Vectors from the cluster spec and redis-rs's tests.
    assert_eq!(slot_of("123456789"), 12739);
    assert_eq!(slot_of("foo"), 12182);
    assert_eq!(slot_of("bar"), 5061);
    assert_eq!(slot_of("{user1000}.following"), slot_of("user1000"));
    assert_eq!(
        slot_of("foo{{bar}}zap"),
        slot_of("{bar"),
        "the tag ends at the first }}"
    );

    let cluster = RedisCluster::shared();
    let master = &cluster.masters()[0];
    let keys = [
        "",
        "a",
        "{}",
        "{a}b",
        "x{y}{z}",
        "foo{}{bar}",
        "{svc/0}",
        "{svc/63}:s",
        "ünï{cödé}",
    ];
    for key in keys {
        let slot: u16 = on_node(master, redis::cmd("CLUSTER").arg("KEYSLOT").arg(key)).unwrap();
        assert_eq!(slot_of(key), slot, "slot of {key:?}");
    }
}

#[test]
fn a_three_master_cluster_spreads_keys_over_every_master() {
    // Its own cluster: the checks below assume no slot moves meanwhile,
    // and the other tests move slots of the shared one.
    let cluster = &RedisCluster::start(3, 0);
    let masters = cluster.masters();
    assert_eq!(masters.len(), 3);
    assert_eq!(cluster.urls().len(), 3);
    assert_eq!(
        cluster.seed_urls(),
        masters.iter().map(|m| m.url.clone()).collect::<Vec<_>>()
    );
    assert!(masters.iter().all(|m| m.pid != 0 && m.id.len() == 40));
    assert!(cluster.replicas_of(&masters[0]).is_empty());

    // peerq's partition keys of a 64-partition service.
    let keys: Vec<String> = (0..64).map(|i| format!("{{svc/{i}}}")).collect();
    let mut holders = std::collections::BTreeSet::new();
    for (i, key) in keys.iter().enumerate() {
        let slot: u16 =
            on_node(&masters[0], redis::cmd("CLUSTER").arg("KEYSLOT").arg(key)).unwrap();
        assert_eq!(slot, slot_of(key));
        // Sent to the first node whatever the slot: most keys need a MOVED.
        set(cluster, key, &i.to_string());
        let owner = cluster.master_of_slot(slot);
        assert_eq!(
            get(&owner, key).unwrap(),
            Some(i.to_string()),
            "{key} on its master"
        );
        for other in masters.iter().filter(|m| m.id != owner.id) {
            let err = get(other, key).expect_err("a master that does not serve the slot");
            assert_eq!(redirect(&err), ("MOVED".to_owned(), owner.port));
        }
        holders.insert(owner.port);
    }
    assert_eq!(holders.len(), 3, "64 keys land on all three masters");
}

#[test]
fn migrate_slot_moves_the_keys_with_their_data() {
    let cluster = RedisCluster::shared();
    let name = name_in_slot_class("migrate", 0);
    let key = format!("{{{name}}}:value");
    let stream = format!("{{{name}}}:stream");
    set(cluster, &key, "v1");
    let id: String = cluster
        .query(redis::cmd("XADD").arg(&stream).arg("*").arg("f").arg("x"))
        .unwrap();
    let () = cluster
        .query(
            redis::cmd("XGROUP")
                .arg("CREATE")
                .arg(&stream)
                .arg("g")
                .arg("0"),
        )
        .unwrap();
    let _: Value = cluster
        .query(
            redis::cmd("XREADGROUP")
                .arg("GROUP")
                .arg("g")
                .arg("c")
                .arg("STREAMS")
                .arg(&stream)
                .arg(">"),
        )
        .unwrap();
    let slot = slot_of(&key);
    let source = cluster.master_of_slot(slot);
    let target = cluster
        .masters()
        .into_iter()
        .find(|m| m.id != source.id)
        .unwrap();

    cluster.migrate_slot(slot, &target);

    assert_eq!(cluster.master_of_slot(slot).id, target.id);
    assert_eq!(get(&target, &key).unwrap().as_deref(), Some("v1"));
    let entries: Value =
        on_node(&target, redis::cmd("XRANGE").arg(&stream).arg("-").arg("+")).unwrap();
    assert!(
        format!("{entries:?}").contains(&id),
        "stream entries moved: {entries:?}"
    );
    // The consumer group and its pending entry travel with the stream.
    let (pending, ..): (u64, Value, Value, Value) =
        on_node(&target, redis::cmd("XPENDING").arg(&stream).arg("g")).unwrap();
    assert_eq!(pending, 1);
    let err = get(&source, &key).expect_err("the source no longer serves the slot");
    assert_eq!(redirect(&err), ("MOVED".to_owned(), target.port));
    let left: u64 = on_node(
        &source,
        redis::cmd("CLUSTER").arg("COUNTKEYSINSLOT").arg(slot),
    )
    .unwrap();
    assert_eq!(left, 0);
    let value: Option<String> = cluster.query(redis::cmd("GET").arg(&key)).unwrap();
    assert_eq!(value.as_deref(), Some("v1"));
}

#[test]
fn a_migration_in_progress_answers_ask_for_moved_keys() {
    let cluster = RedisCluster::shared();
    let name = name_in_slot_class("ask", 1);
    let keys = [format!("{{{name}}}:a"), format!("{{{name}}}:b")];
    for key in &keys {
        set(cluster, key, key);
    }
    let slot = slot_of(&keys[0]);
    let source = cluster.master_of_slot(slot);
    let target = cluster
        .masters()
        .into_iter()
        .find(|m| m.id != source.id)
        .unwrap();

    let mut migration = cluster.begin_migration(slot, &target);
    assert_eq!(
        (migration.slot(), migration.source(), migration.target()),
        (slot, &source, &target)
    );
    assert!(migration.step(1), "one of two keys moved, one left");

    let (moved, kept): (Vec<&String>, Vec<&String>) =
        keys.iter().partition(|key| get(&source, key).is_err());
    assert_eq!((moved.len(), kept.len()), (1, 1));
    assert_eq!(
        get(&source, kept[0]).unwrap().as_deref(),
        Some(kept[0].as_str())
    );
    let err = get(&source, moved[0]).unwrap_err();
    assert_eq!(redirect(&err), ("ASK".to_owned(), target.port));
    // The target still says the slot is the source's, unless asked.
    let err = get(&target, moved[0]).unwrap_err();
    assert_eq!(redirect(&err), ("MOVED".to_owned(), source.port));
    for key in &keys {
        let value: Option<String> = cluster.query(redis::cmd("GET").arg(key)).unwrap();
        assert_eq!(value.as_deref(), Some(key.as_str()), "{key} through ASK");
    }

    migration.finish();
    assert_eq!(cluster.master_of_slot(slot).id, target.id);
    for key in &keys {
        assert_eq!(get(&target, key).unwrap().as_deref(), Some(key.as_str()));
    }
}

/// A client blocked in `XREADGROUP … BLOCK 0` on `node`, on its own
/// thread; joins to the first line of the reply it finally got.
///
/// It speaks RESP over a plain socket: std's `read_line` retries a read
/// interrupted by a signal, while redis-rs's sync client would give up on
/// the reply (it skips the reply of an interrupted read).
struct BlockedRead {
    thread: thread::JoinHandle<String>,
}

impl BlockedRead {
    /// Sends the read and returns once `node` lists the client as blocked.
    fn start(node: &NodeInfo, stream: &str) -> BlockedRead {
        let name = support::unique_name("blocked");
        let socket = TcpStream::connect(("127.0.0.1", node.port)).unwrap();
        socket
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let mut reader = BufReader::new(socket.try_clone().unwrap());
        let mut writer = socket;
        let setname = redis::cmd("CLIENT")
            .arg("SETNAME")
            .arg(&name)
            .get_packed_command();
        let read = redis::cmd("XREADGROUP")
            .arg("GROUP")
            .arg("g")
            .arg("c")
            .arg("BLOCK")
            .arg(0)
            .arg("STREAMS")
            .arg(stream)
            .arg(">")
            .get_packed_command();
        writer.write_all(&setname).unwrap();
        let mut ok = String::new();
        reader.read_line(&mut ok).unwrap();
        assert_eq!(ok, "+OK\r\n");
        writer.write_all(&read).unwrap();
        let thread = thread::spawn(move || {
            let mut reply = String::new();
            reader
                .read_line(&mut reply)
                .expect("a reply before the 30 s timeout");
            drop(writer);
            reply
        });
        let deadline = Instant::now() + PROBE;
        loop {
            let clients: String = on_node(node, redis::cmd("CLIENT").arg("LIST")).unwrap();
            let blocked = clients
                .lines()
                .any(|line| line.contains(&format!(" name={name} ")) && line.contains(" flags=b "));
            if blocked {
                return BlockedRead { thread };
            }
            assert!(
                Instant::now() < deadline,
                "the read did not block: {clients}"
            );
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// The error code of the reply (`UNBLOCKED`, `MOVED`, …); panics if the
    /// reply is not an error.
    fn error_code(self) -> String {
        let reply = self.thread.join().unwrap();
        let error = reply
            .strip_prefix('-')
            .unwrap_or_else(|| panic!("expected an error reply, got {reply:?}"));
        error
            .split_whitespace()
            .next()
            .unwrap_or_default()
            .to_owned()
    }
}

#[test]
fn a_blocked_xreadgroup_is_unblocked_when_its_stream_migrates() {
    let cluster = RedisCluster::shared();
    let stream = format!("{{{}}}:stream", name_in_slot_class("blocked-migrate", 2));
    let () = cluster
        .query(
            redis::cmd("XGROUP")
                .arg("CREATE")
                .arg(&stream)
                .arg("g")
                .arg("$")
                .arg("MKSTREAM"),
        )
        .unwrap();
    let slot = slot_of(&stream);
    let source = cluster.master_of_slot(slot);
    let target = cluster
        .masters()
        .into_iter()
        .find(|m| m.id != source.id)
        .unwrap();
    let read = BlockedRead::start(&source, &stream);

    // MIGRATE deletes the key on the source, which wakes its readers
    // (redis 7.0: "-UNBLOCKED the stream key no longer exists").
    cluster.migrate_slot(slot, &target);

    assert_eq!(read.error_code(), "UNBLOCKED");
}

#[test]
fn failover_promotes_the_replica_with_the_data() {
    let mut cluster = RedisCluster::start(3, 1);
    assert_eq!(cluster.urls().len(), 6);
    let masters = cluster.masters();
    assert_eq!(masters.len(), 3);
    for master in &masters {
        assert_eq!(cluster.replicas_of(master).len(), 1, "{master:?}");
    }
    let name = support::unique_name("failover");
    let key = format!("{{{name}}}:value");
    let stream = format!("{{{name}}}:stream");
    set(&cluster, &key, "kept");
    let () = cluster
        .query(
            redis::cmd("XGROUP")
                .arg("CREATE")
                .arg(&stream)
                .arg("g")
                .arg("$")
                .arg("MKSTREAM"),
        )
        .unwrap();
    let old_master = cluster.master_of_key(&key);
    let replica = cluster.replicas_of(&old_master).remove(0);
    let read = BlockedRead::start(&old_master, &stream);

    cluster.failover(&replica);

    assert_eq!(cluster.master_of_key(&key).id, replica.id);
    assert_eq!(get(&replica, &key).unwrap().as_deref(), Some("kept"));
    let demoted: Vec<String> = cluster
        .replicas_of(&replica)
        .into_iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(demoted, [old_master.id.as_str()]);
    assert!(cluster.masters().iter().all(|m| m.id != old_master.id));
    // A master turning replica drops its blocked clients (redis 7.0:
    // "-UNBLOCKED force unblock from blocking operation, instance state
    // changed (master -> replica?)").
    assert_eq!(read.error_code(), "UNBLOCKED");
}

#[test]
fn kill_master_promotes_a_replica_and_the_old_master_rejoins_as_replica() {
    let mut cluster = RedisCluster::start(3, 1);
    let key = format!("{{{}}}:value", support::unique_name("kill"));
    set(&cluster, &key, "kept");
    let master = cluster.master_of_key(&key);
    let replica = cluster.replicas_of(&master).remove(0);
    cluster.wait_replicated(&master);

    let promoted = cluster.kill_master(&master);

    assert_eq!(promoted.id, replica.id);
    assert!(!running(master.pid), "the killed master's process is gone");
    assert_eq!(cluster.master_of_key(&key).id, promoted.id);
    assert_eq!(get(&promoted, &key).unwrap().as_deref(), Some("kept"));
    assert_eq!(cluster.masters().len(), 3);
    assert!(cluster.masters().iter().all(|m| m.id != master.id));

    cluster.restart_node(&master);

    let replicas = cluster.replicas_of(&promoted);
    assert_eq!(replicas.len(), 1);
    assert_eq!(
        (replicas[0].id.as_str(), replicas[0].port),
        (master.id.as_str(), master.port)
    );
    assert_ne!(replicas[0].pid, 0);
    cluster.wait_synced();
    let mut con = connect(&replicas[0].url, PROBE).unwrap();
    let () = retry_interrupted(|| redis::cmd("READONLY").query(&mut con)).unwrap();
    let value: Option<String> =
        retry_interrupted(|| redis::cmd("GET").arg(&key).query(&mut con)).unwrap();
    assert_eq!(
        value.as_deref(),
        Some("kept"),
        "the old master resynced from the new one"
    );
}

#[test]
fn flush_all_empties_every_master() {
    let cluster = RedisCluster::start(3, 0);
    for i in 0..30 {
        set(&cluster, &format!("{{flush/{i}}}"), "x");
    }
    cluster.flush_all();
    for master in cluster.masters() {
        let size: u64 = on_node(&master, &redis::cmd("DBSIZE")).unwrap();
        assert_eq!(size, 0, "{master:?}");
    }
    let pids: Vec<u32> = cluster.masters().iter().map(|m| m.pid).collect();

    drop(cluster);

    for pid in pids {
        assert!(!running(pid), "node {pid} killed on drop");
    }
}

/// Environment variable that turns [`child_holding_the_shared_cluster`]
/// into the child process of
/// [`shared_cluster_dies_with_a_killed_test_process`].
const CHILD_ENV: &str = "PEERQ_CLUSTER_HARNESS_CHILD";

#[test]
fn shared_cluster_dies_with_a_killed_test_process() {
    let (mut child, line) = support::child_test(
        "cluster::child_holding_the_shared_cluster",
        (CHILD_ENV, "1"),
        "pids ",
    );
    let pids: Vec<u32> = line.split(',').map(|p| p.parse().unwrap()).collect();
    assert_eq!(pids.len(), 3);
    assert!(pids.iter().all(|&pid| running(pid)));

    // Nothing in the child runs after SIGKILL: only the reaper can clean up.
    child.0.kill().unwrap();
    child.0.wait().unwrap();

    let deadline = Instant::now() + Duration::from_secs(10);
    while pids.iter().any(|&pid| running(pid)) {
        assert!(
            Instant::now() < deadline,
            "nodes {pids:?} outlived their test process"
        );
        thread::sleep(Duration::from_millis(50));
    }
}

/// Not a test of its own: the child process of
/// [`shared_cluster_dies_with_a_killed_test_process`], which holds the
/// shared cluster until it is killed. Without [`CHILD_ENV`] it returns at
/// once.
#[test]
fn child_holding_the_shared_cluster() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    let pids: Vec<String> = RedisCluster::shared()
        .masters()
        .iter()
        .map(|m| m.pid.to_string())
        .collect();
    println!("pids {}", pids.join(","));
    thread::sleep(Duration::from_secs(60));
}

/// Whether `pid` is a live process: it exists and is not a zombie (an
/// orphan the container's init may never reap).
fn running(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesised command name.
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with('Z') && !rest.starts_with('X')),
        Err(_) => false,
    }
}
