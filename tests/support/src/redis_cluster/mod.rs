//! A private Redis Cluster per [`RedisCluster`]: `redis-server` nodes on
//! free ports, joined with `redis-cli --cluster create`, and the operations
//! cluster tests need: read the live topology, move a slot (all at once or
//! step by step), fail over, kill a master, flush, wait for replication.
//!
//! Every node is a [`RedisServer`] (its own dir, AOF with `appendfsync
//! always`, killed on drop), so a cluster is torn down like a single
//! server. A cluster may speak only TLS
//! ([`start_tls`](RedisCluster::start_tls)); the harness's own connections
//! then do too. It owns no client logic beyond a small
//! `MOVED`/`ASK`-following [`query`](RedisCluster::query) for checks;
//! peerq's own cluster client is what the tests test.
//!
//! Each operation waits until the cluster has settled — `cluster_state:ok`
//! on every live node, every live node reporting the same slot owners and
//! roles, every slot served, every replica's link up — and panics with the
//! nodes' log tails if it does not within its bound.

mod control;
mod failover;
mod migration;
mod routed;
mod slots;
mod topology;

use std::fs::{self, File};
use std::process::{Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use deadpool_redis::redis;

use super::{RedisServer, ServerTls};
use topology::{NodeLine, info_field, settled_view};

pub use migration::Migration;
pub use slots::{SLOTS, slot_of};

/// How long `redis-cli --cluster create` and the wait after it may take.
const FORM_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a slot move, a failover or a restart may take to settle.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(30);
/// How often the harness polls the nodes while waiting.
const POLL_INTERVAL: Duration = Duration::from_millis(50);
/// Timeout of the harness's control connections: long enough for a
/// `MIGRATE` (5 s of its own), short enough that a dead node never hangs
/// a test.
const CONTROL_TIMEOUT: Duration = Duration::from_secs(10);

/// A node as the cluster sees it now (read from `CLUSTER NODES`, so it
/// changes after a failover).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInfo {
    /// The node's 40-character cluster id; it survives restarts.
    pub id: String,
    /// Its client port on `127.0.0.1` (its TLS port on a TLS cluster).
    pub port: u16,
    /// `redis://127.0.0.1:<port>/` (`rediss://` on a TLS cluster).
    pub url: String,
    /// Pid of its `redis-server`, 0 while it is down.
    pub pid: u32,
}

/// A private Redis Cluster on `127.0.0.1`: `masters` masters with
/// `replicas_per_master` replicas each, all 16384 slots spread over the
/// masters.
///
/// Dropping it kills every node (SIGCONT, SIGKILL, wait) and removes their
/// dirs, also when the test panics. Operations that change the topology
/// (failover, killing and restarting nodes) take `&mut self`, so they
/// cannot be run on the [`shared`](Self::shared) cluster.
#[derive(Debug)]
pub struct RedisCluster {
    /// Every node started, in start order; their ports never change.
    nodes: Vec<RedisServer>,
    /// Held by the one open [`Migration`]. Two migrations at once can
    /// deadlock: `MIGRATE` blocks its node until the target answers, so
    /// two nodes migrating to each other wait on each other for the whole
    /// 5 s `MIGRATE` timeout, and meanwhile miss the 2 s node timeout and
    /// take the cluster down.
    migration_turn: Mutex<()>,
}

impl RedisCluster {
    /// Starts `masters * (1 + replicas_per_master)` nodes, creates the
    /// cluster with `redis-cli --cluster create … --cluster-replicas
    /// <replicas_per_master>` and waits until it has settled.
    ///
    /// Panics if `masters < 3` (Redis Cluster's minimum), or if the cluster
    /// does not form within 30 s; the message quotes `redis-cli`'s output
    /// and the end of every node's log.
    pub fn start(masters: usize, replicas_per_master: usize) -> RedisCluster {
        RedisCluster::start_with(masters, replicas_per_master, true)
    }

    /// [`start`](Self::start), with nodes that persist nothing unless
    /// `aof` (benchmarks compare with a single server that persists
    /// nothing).
    pub fn start_with(masters: usize, replicas_per_master: usize, aof: bool) -> RedisCluster {
        RedisCluster::start_nodes(masters, replicas_per_master, aof, None)
    }

    /// [`start`](Self::start) without persistence, every node speaking
    /// only TLS with `tls`'s certificates: no plain port at all
    /// (`--port 0`), and TLS between the nodes too (`--tls-cluster yes`,
    /// so `CLUSTER SLOTS` names their TLS ports; `--tls-replication yes`).
    /// The nodes present the test client certificate to each other, since
    /// a node that requires client certificates refuses a server
    /// certificate. Node URLs are `rediss://`; clients must trust the
    /// test CA (and present a client certificate, with
    /// `require_client_cert`).
    pub fn start_tls(masters: usize, replicas_per_master: usize, tls: ServerTls) -> RedisCluster {
        assert!(
            !tls.wrong_host,
            "cluster nodes are reached at 127.0.0.1, which a wrong-host certificate does not name"
        );
        RedisCluster::start_nodes(masters, replicas_per_master, false, Some(tls))
    }

    fn start_nodes(
        masters: usize,
        replicas_per_master: usize,
        aof: bool,
        tls: Option<ServerTls>,
    ) -> RedisCluster {
        assert!(
            masters >= 3,
            "a Redis Cluster needs at least 3 masters, not {masters}"
        );
        let count = masters * (1 + replicas_per_master);
        // If anything below panics, dropping `nodes` kills what was started.
        let nodes = (0..count)
            .map(|_| RedisServer::start_cluster_node(aof, tls))
            .collect();
        let cluster = RedisCluster {
            nodes,
            migration_turn: Mutex::new(()),
        };
        cluster.create(replicas_per_master);
        cluster.settle("form", FORM_TIMEOUT);
        cluster
    }

    /// One 3-master cluster without replicas for the whole test binary,
    /// started on first use.
    ///
    /// Starting a cluster costs about a second, so tests that only read
    /// and write keys share this one and keep apart by using
    /// [`unique_name`](super::unique_name)d keys; they must not call
    /// [`flush_all`](Self::flush_all), which would wipe the keys of tests
    /// running alongside. A test may move a slot of its own keys (one
    /// migration runs at a time), but any other test's keys in that slot
    /// move with them: their clients then follow `MOVED`, as they should,
    /// but a test that checks nodes directly needs its own cluster, as do
    /// tests that fail over or kill nodes.
    ///
    /// Rust never drops a `static`, so the nodes outlive the last test; the
    /// [`reaper`](super::reaper) kills them when the test process exits.
    pub fn shared() -> &'static RedisCluster {
        static SHARED: OnceLock<RedisCluster> = OnceLock::new();
        SHARED.get_or_init(|| RedisCluster::start(3, 0))
    }

    /// The URL of every node started, in start order, including a node
    /// that is down (as a client's seed list would).
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// The URLs of the current masters, sorted by port.
    pub fn seed_urls(&self) -> Vec<String> {
        self.masters().into_iter().map(|node| node.url).collect()
    }

    /// The masters that are not down, sorted by port.
    pub fn masters(&self) -> Vec<NodeInfo> {
        let mut masters: Vec<NodeInfo> = self
            .lines()
            .iter()
            .filter(|line| line.master && !line.failed)
            .map(|line| self.info(line))
            .collect();
        masters.sort_by_key(|node| node.port);
        masters
    }

    /// The replicas of `master` that are not down, sorted by port.
    pub fn replicas_of(&self, master: &NodeInfo) -> Vec<NodeInfo> {
        let mut replicas: Vec<NodeInfo> = self
            .lines()
            .iter()
            .filter(|line| line.master_id.as_deref() == Some(&master.id) && !line.failed)
            .map(|line| self.info(line))
            .collect();
        replicas.sort_by_key(|node| node.port);
        replicas
    }

    /// The master serving `slot` now. Panics if none does.
    pub fn master_of_slot(&self, slot: u16) -> NodeInfo {
        self.masters_of_slots(&[slot]).remove(0)
    }

    /// The master serving `key`'s slot now.
    pub fn master_of_key(&self, key: &str) -> NodeInfo {
        self.master_of_slot(slot_of(key))
    }

    /// The master serving each key's slot now, from one read of the
    /// topology (a connection per read costs a TLS handshake on a TLS
    /// cluster). Panics if no master serves one.
    pub fn masters_of_keys(&self, keys: &[String]) -> Vec<NodeInfo> {
        let slots: Vec<u16> = keys.iter().map(|key| slot_of(key)).collect();
        self.masters_of_slots(&slots)
    }

    fn masters_of_slots(&self, slots: &[u16]) -> Vec<NodeInfo> {
        let lines = self.lines();
        slots
            .iter()
            .map(|&slot| {
                let line = lines
                    .iter()
                    .find(|line| line.master && line.serves(slot))
                    .unwrap_or_else(|| panic!("no master serves slot {slot}: {lines:?}"));
                self.info(line)
            })
            .collect()
    }

    /// `FLUSHALL` on every master (replicas follow). Only for a cluster the
    /// test owns; see [`shared`](Self::shared).
    pub fn flush_all(&self) {
        for master in self.masters() {
            let () = self
                .node_query(master.port, &redis::cmd("FLUSHALL"))
                .unwrap_or_else(|err| self.fail(&err));
        }
    }

    /// Runs `redis-cli --cluster create` over every node, bounded by
    /// [`FORM_TIMEOUT`]; its output goes to a file so a full pipe can never
    /// stall it.
    fn create(&self, replicas_per_master: usize) {
        let log_path = self.nodes[0].dir().join("cluster-create.log");
        let log = File::create(&log_path).expect("create cluster-create.log");
        let mut cmd = Command::new("redis-cli");
        if let Some(tls) = self.nodes[0].tls() {
            cmd.args(tls.cli_args());
        }
        cmd.args(["--cluster", "create"]);
        for node in &self.nodes {
            cmd.arg(format!("127.0.0.1:{}", node.port()));
        }
        let mut child = cmd
            .args(["--cluster-replicas", &replicas_per_master.to_string()])
            .arg("--cluster-yes")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone log file"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|err| panic!("spawn redis-cli (it comes with redis-server): {err}"));
        let deadline = Instant::now() + FORM_TIMEOUT;
        let status = loop {
            if let Ok(Some(status)) = child.try_wait() {
                break Some(status);
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            thread::sleep(POLL_INTERVAL);
        };
        if !status.is_some_and(|status| status.success()) {
            let output = fs::read_to_string(&log_path).unwrap_or_default();
            self.fail(&format!(
                "redis-cli --cluster create failed ({status:?}):\n{output}"
            ));
        }
    }

    /// Waits until the cluster has settled; panics after `timeout` with the
    /// last reason it had not and the nodes' logs.
    fn settle(&self, what: &str, timeout: Duration) {
        if let Err(reason) = self.try_settle(timeout) {
            self.fail(&format!(
                "cluster did not settle after {what} within {timeout:?}: {reason}"
            ));
        }
    }

    /// Polls [`check_settled`](Self::check_settled) until it passes or
    /// `timeout` ends; never panics (a [`Migration`] finishes from `Drop`).
    fn try_settle(&self, timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        loop {
            match self.check_settled() {
                Ok(()) => return Ok(()),
                Err(reason) if Instant::now() >= deadline => return Err(reason),
                Err(_) => thread::sleep(POLL_INTERVAL),
            }
        }
    }

    /// Whether every live node says `cluster_state:ok`, reports the same
    /// settled [`View`](topology::View), and (for a replica) has its
    /// replication link up.
    fn check_settled(&self) -> Result<(), String> {
        let mut first = None;
        for node in self.live() {
            let port = node.port();
            let info: String = self.node_query(port, redis::cmd("CLUSTER").arg("INFO"))?;
            let state = info_field(&info, "cluster_state");
            if state != Some("ok") {
                return Err(format!("node {port}: cluster_state {state:?}"));
            }
            let lines = self.node_lines(port)?;
            let view = settled_view(&lines, self.nodes.len())
                .map_err(|reason| format!("node {port}: {reason}"))?;
            match &first {
                None => first = Some((port, view)),
                Some((first_port, first_view)) if *first_view != view => {
                    return Err(format!(
                        "nodes {first_port} and {port} disagree: {first_view:?} vs {view:?}"
                    ));
                }
                Some(_) => {}
            }
            let replication: String =
                self.node_query(port, redis::cmd("INFO").arg("replication"))?;
            if info_field(&replication, "role") == Some("slave") {
                let link = info_field(&replication, "master_link_status");
                if link != Some("up") {
                    return Err(format!("replica {port}: master_link_status {link:?}"));
                }
            }
        }
        first
            .map(|_| ())
            .ok_or_else(|| "no node is running".to_owned())
    }

    /// `CLUSTER NODES` of the first live node that answers.
    fn lines(&self) -> Vec<NodeLine> {
        self.try_lines().unwrap_or_else(|err| self.fail(&err))
    }

    /// [`lines`](Self::lines), without panicking.
    fn try_lines(&self) -> Result<Vec<NodeLine>, String> {
        let mut last_err = "no node is running".to_owned();
        for node in self.live() {
            match self.node_lines(node.port()) {
                Ok(lines) => return Ok(lines),
                Err(err) => last_err = err,
            }
        }
        Err(last_err)
    }

    /// The nodes whose process runs.
    fn live(&self) -> impl Iterator<Item = &RedisServer> {
        self.nodes.iter().filter(|node| node.pid() != 0)
    }

    /// The node the harness started on `port`.
    fn node(&self, port: u16) -> &RedisServer {
        self.nodes
            .iter()
            .find(|node| node.port() == port)
            .unwrap_or_else(|| panic!("no node of this cluster listens on port {port}"))
    }

    /// The node the harness started on `port`.
    fn node_mut(&mut self, port: u16) -> &mut RedisServer {
        self.nodes
            .iter_mut()
            .find(|node| node.port() == port)
            .unwrap_or_else(|| panic!("no node of this cluster listens on port {port}"))
    }

    /// `line` with its pid and URL filled in.
    fn info(&self, line: &NodeLine) -> NodeInfo {
        let node = self.nodes.iter().find(|node| node.port() == line.port);
        NodeInfo {
            id: line.id.clone(),
            port: line.port,
            url: node.map_or_else(|| control::plain_url(line.port), RedisServer::url),
            pid: node.map_or(0, RedisServer::pid),
        }
    }

    /// Panics with `message` and the end of every node's log.
    fn fail(&self, message: &str) -> ! {
        let mut logs = String::new();
        for node in &self.nodes {
            logs.push_str(&format!("--- node {} (pid {}):\n", node.port(), node.pid()));
            logs.push_str(&node.log_tail());
        }
        panic!("{message}\nnode logs:\n{logs}");
    }
}
