//! A private Redis Sentinel setup ([`SentinelSet`]): a master, two replicas
//! and three sentinels (`redis-server --sentinel`, quorum 2) on loopback,
//! with ways to fail the master over: `SENTINEL FAILOVER`, or a SIGKILL.
//! Every process is killed on drop.

use std::fs;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use deadpool_redis::redis;

use super::redis_server::{fresh_dir, unused_port};
use super::{RedisServer, reaper};

/// The name the sentinels monitor the master by.
pub const MASTER_NAME: &str = "peerq-master";
/// How long the sentinels wait before they find the master down.
const DOWN_AFTER_MS: u64 = 1000;
/// How long a failover may take before it is tried again.
const FAILOVER_TIMEOUT_MS: u64 = 5000;
/// How long the harness waits for the sentinels to agree on a state: up
/// to a minute, since after a kill the sentinels find the restarted old
/// master only at their next `INFO` to it (every 10 s while it is down),
/// then make it a replica of the new one, which syncs it in full; on the
/// two cores, beside the suite's heavy tests, that once took over 30 s.
const SETTLE: Duration = Duration::from_secs(60);

/// One sentinel process.
#[derive(Debug)]
struct SentinelProcess {
    port: u16,
    child: Child,
    dir: PathBuf,
}

/// A master, two replicas and three sentinels, all on `127.0.0.1`.
#[derive(Debug)]
pub struct SentinelSet {
    /// The data servers, the first the master at start.
    servers: Vec<RedisServer>,
    sentinels: Vec<SentinelProcess>,
}

impl SentinelSet {
    /// Starts the servers and the sentinels, and waits until every sentinel
    /// knows both replicas and the two other sentinels.
    pub fn start() -> SentinelSet {
        let master = RedisServer::start();
        let servers = vec![master.replica(), master.replica()];
        let servers: Vec<RedisServer> = std::iter::once(master).chain(servers).collect();
        let master_port = servers[0].port();
        let sentinels = (0..3)
            .map(|_| SentinelProcess::spawn(master_port))
            .collect();
        let set = SentinelSet { servers, sentinels };
        set.wait_known(master_port, 2);
        set
    }

    /// The sentinels' URLs, for `Redis::sentinel`.
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels
            .iter()
            .map(|s| format!("redis://127.0.0.1:{}/", s.port))
            .collect()
    }

    /// The sentinels' URLs joined by commas, for `--redis`.
    pub fn sentinel_arg(&self) -> String {
        self.sentinel_urls().join(",")
    }

    /// The master's port as the first sentinel that answers names it.
    pub fn master_port(&self) -> u16 {
        let mut last = None;
        for sentinel in &self.sentinels {
            match sentinel.query::<(String, u16)>(
                redis::cmd("SENTINEL")
                    .arg("get-master-addr-by-name")
                    .arg(MASTER_NAME),
            ) {
                Ok((_, port)) => return port,
                Err(e) => last = Some(e),
            }
        }
        panic!("no sentinel names the master: {last:?}")
    }

    /// The data server listening on `port`.
    pub fn server(&self, port: u16) -> &RedisServer {
        self.servers
            .iter()
            .find(|s| s.port() == port)
            .unwrap_or_else(|| panic!("no server on port {port}"))
    }

    fn server_mut(&mut self, port: u16) -> &mut RedisServer {
        self.servers
            .iter_mut()
            .find(|s| s.port() == port)
            .unwrap_or_else(|| panic!("no server on port {port}"))
    }

    /// `SENTINEL FAILOVER`: a replica is promoted and the old master made
    /// its replica. Returns once every sentinel names the new master, it
    /// says it is one, and both replicas follow it.
    pub fn failover(&self) -> u16 {
        let old = self.master_port();
        self.sentinels[0]
            .query::<()>(redis::cmd("SENTINEL").arg("FAILOVER").arg(MASTER_NAME))
            .expect("SENTINEL FAILOVER");
        let new = self.wait_new_master(old);
        self.wait_known(new, 2);
        new
    }

    /// SIGKILLs the master, waits until the sentinels promote a replica,
    /// then starts the old one again (empty, as it had no persistence), as
    /// the sentinels then make it a replica of the new master. Returns the
    /// new master's port.
    pub fn kill_master(&mut self) -> u16 {
        let old = self.master_port();
        self.server_mut(old).stop();
        let new = self.wait_new_master(old);
        self.server_mut(old).start_again();
        self.wait_known(new, 2);
        new
    }

    /// Waits until every sentinel names a master other than `old`, and it
    /// answers `ROLE` as a master; returns its port.
    fn wait_new_master(&self, old: u16) -> u16 {
        let deadline = Instant::now() + SETTLE;
        loop {
            let named: Vec<Option<u16>> = self
                .sentinels
                .iter()
                .map(|s| {
                    s.query::<(String, u16)>(
                        redis::cmd("SENTINEL")
                            .arg("get-master-addr-by-name")
                            .arg(MASTER_NAME),
                    )
                    .ok()
                    .map(|(_, port)| port)
                })
                .collect();
            if let Some(Some(new)) = named.first()
                && *new != old
                && named.iter().all(|n| *n == Some(*new))
                && role(self.server(*new)).as_deref() == Some("master")
            {
                return *new;
            }
            assert!(
                Instant::now() < deadline,
                "no new master within {SETTLE:?}: the sentinels name {named:?}"
            );
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits until every sentinel names `master` and knows `replicas`
    /// replicas of it that are up, and the two other sentinels, and those
    /// replicas have synced with it.
    fn wait_known(&self, master: u16, replicas: usize) {
        let deadline = Instant::now() + SETTLE;
        loop {
            let ok = self.sentinels.iter().all(|s| s.knows(master, replicas))
                && synced_replicas(self.server(master)) >= replicas;
            if ok {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the sentinels never saw master {master} with {replicas} synced replicas"
            );
            thread::sleep(Duration::from_millis(50));
        }
    }
}

impl SentinelProcess {
    /// Spawns a sentinel that monitors the master at `master_port`.
    fn spawn(master_port: u16) -> SentinelProcess {
        let dir = fresh_dir("sentinel");
        let port = unused_port();
        // Sentinel rewrites its config file (the replicas and sentinels it
        // finds), so it must be a file of its own, writable.
        let config = dir.join("sentinel.conf");
        let text = format!(
            "port {port}\nbind 127.0.0.1\ndaemonize no\ndir {dir}\nlogfile {dir}/sentinel.log\n\
             sentinel monitor {MASTER_NAME} 127.0.0.1 {master_port} 2\n\
             sentinel down-after-milliseconds {MASTER_NAME} {DOWN_AFTER_MS}\n\
             sentinel failover-timeout {MASTER_NAME} {FAILOVER_TIMEOUT_MS}\n\
             sentinel parallel-syncs {MASTER_NAME} 2\n",
            dir = dir.display()
        );
        fs::write(&config, text).expect("write sentinel.conf");
        let child = Command::new("redis-server")
            .arg(&config)
            .arg("--sentinel")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|err| panic!("spawn redis-server --sentinel: {err}"));
        reaper::adopt_pid(child.id());
        let sentinel = SentinelProcess { port, child, dir };
        let deadline = Instant::now() + SETTLE;
        while sentinel.query::<String>(&redis::cmd("PING")).is_err() {
            assert!(
                Instant::now() < deadline,
                "sentinel on port {port} never answered; log:\n{}",
                fs::read_to_string(sentinel.dir.join("sentinel.log")).unwrap_or_default()
            );
            thread::sleep(Duration::from_millis(20));
        }
        sentinel
    }

    fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> redis::RedisResult<T> {
        let client = redis::Client::open(format!("redis://127.0.0.1:{}/", self.port))?;
        let mut con = client.get_connection_with_timeout(Duration::from_millis(500))?;
        con.set_read_timeout(Some(Duration::from_millis(500)))?;
        cmd.query(&mut con)
    }

    /// Whether it names `master` and knows `replicas` replicas up and two
    /// other sentinels.
    fn knows(&self, master: u16, replicas: usize) -> bool {
        let info: redis::RedisResult<Vec<String>> =
            self.query(redis::cmd("SENTINEL").arg("MASTER").arg(MASTER_NAME));
        let Ok(info) = info else { return false };
        let field = |name: &str| {
            info.chunks(2)
                .find(|kv| kv[0] == name)
                .map(|kv| kv[1].clone())
        };
        let slaves: redis::RedisResult<Vec<Vec<String>>> =
            self.query(redis::cmd("SENTINEL").arg("REPLICAS").arg(MASTER_NAME));
        let up = slaves.map_or(0, |slaves| {
            slaves
                .iter()
                .filter(|s| s.chunks(2).any(|kv| kv[0] == "flags" && kv[1] == "slave"))
                .count()
        });
        field("port").as_deref() == Some(&master.to_string())
            && field("flags").as_deref() == Some("master")
            && field("num-other-sentinels").as_deref() == Some("2")
            && up >= replicas
    }
}

impl Drop for SentinelProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        reaper::release_pid(self.child.id());
        let _ = fs::remove_dir_all(&self.dir);
        reaper::release_dir(&self.dir);
    }
}

/// The server's role (`master`, `slave`), if it answers.
fn role(server: &RedisServer) -> Option<String> {
    let mut con = server.client().get_connection().ok()?;
    let role: Vec<redis::Value> = redis::cmd("ROLE").query(&mut con).ok()?;
    match role.first()? {
        redis::Value::BulkString(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
        redis::Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

/// How many replicas are connected to `master` and online.
fn synced_replicas(master: &RedisServer) -> usize {
    let Ok(mut con) = master.client().get_connection() else {
        return 0;
    };
    let info: String = redis::cmd("INFO")
        .arg("replication")
        .query(&mut con)
        .unwrap_or_default();
    info.lines()
        .filter(|line| line.starts_with("slave") && line.contains("state=online"))
        .count()
}
