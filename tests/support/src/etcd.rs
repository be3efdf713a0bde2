//! A private 3-node etcd cluster per [`EtcdCluster`]: three `etcd`
//! processes on free loopback ports (never etcd's 2379/2380, which a
//! system etcd may hold), each with its data dir under `/dev/shm`, and the
//! operations the membership backend's tests need: kill a node, restart
//! it on the same ports and data, wait until the cluster is healthy, ask
//! whether it has a quorum, run `etcdctl` against it.
//!
//! The processes are children of the test process, killed on drop, and by
//! the [`reaper`](super::reaper) if the test process dies first. The
//! harness probes the nodes over plain HTTP (`/health` on a metrics port of
//! each node's own), so it needs no etcd client; `etcdctl` only sets up
//! auth and serves [`EtcdCluster::etcdctl`].
//!
//! It owns no peerq type and no etcd client for the tests: peerq's own
//! `etcd-client` is what they test.

mod etcdctl;
mod layout;
mod node;

use std::fs;
use std::path::PathBuf;
use std::thread;
use std::time::{Duration, Instant};

use node::Node;

use super::reaper;
use super::tls::ServerTls;

/// Nodes in a cluster.
const NODES: usize = 3;
/// Nodes that make a majority of [`NODES`].
const QUORUM: usize = NODES / 2 + 1;
/// How long the cluster may take to become healthy, at start and after a
/// restart. Three nodes took 0.2 to 1.3 s here (2 s once), also with two
/// to eight `yes` and a cargo build on the two cores; the bound is for a
/// machine far worse off than that.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(30);
/// How often the harness polls the nodes while it waits.
const POLL_INTERVAL: Duration = Duration::from_millis(20);
/// Fresh ports to try when another process takes one of ours between the
/// probe bind and etcd's bind.
const FRESH_PORT_ATTEMPTS: usize = 5;
/// Tries to bind the same ports again on restart.
const SAME_PORT_ATTEMPTS: usize = 20;

/// How an [`EtcdCluster`] is made. The default: plain HTTP, no auth.
#[derive(Debug, Clone, Copy, Default)]
pub struct EtcdOptions {
    /// `Some((user, password))`: before [`EtcdCluster::start_with`]
    /// returns, the harness creates `root` (with the root role, as etcd
    /// requires before `auth enable`) and `user` with read and write on
    /// every key, then enables auth. A `user` named `root` is that root
    /// user.
    pub auth: Option<(&'static str, &'static str)>,
    /// `Some`: the client port speaks TLS only (`https://` endpoints) with
    /// a certificate of the test PKI (`wrong_host` as for Redis), and with
    /// `require_client_cert` asks for a client certificate from the test
    /// CA (`--client-cert-auth`). Between the nodes, and on the harness's
    /// `/health` port, plain HTTP.
    pub tls: Option<ServerTls>,
}

/// A private etcd cluster of three nodes, `n0` to `n2`, each on its own
/// loopback ports with its own data dir under `/dev/shm`.
///
/// # Timing
///
/// Raft runs with a [`HEARTBEAT_INTERVAL`](Self::HEARTBEAT_INTERVAL) of
/// 50 ms and an [`ELECTION_TIMEOUT`](Self::ELECTION_TIMEOUT) of 500 ms
/// (etcd's defaults: 100 ms and 1 s), with pre-vote on (off by default in
/// 3.4). The election timeout sets how fast the survivors elect a leader
/// after the leader is killed, and etcd's minimum lease TTL: 1.5 × the
/// election timeout rounded up to whole seconds, so 1 s here, 2 s with
/// the defaults — a test can grant 1 s leases. Shorter would not lower
/// that minimum any further, and would leave less room for a late
/// heartbeat. Measured here on two cores busy with eight `yes` and a cargo
/// build, the leader stayed the same over a minute (term 2 throughout)
/// and etcd never warned of a late heartbeat. Pre-vote keeps a restarted
/// node from deposing a healthy leader by campaigning at a higher term.
///
/// # Memory
///
/// etcd 3.4 preallocates its write-ahead log in 64 MB segments, the one in
/// use and the next: ~125 MB of `/dev/shm` (RAM) per node, ~375 MB per
/// cluster while it lives. In exchange its fsyncs cost nothing (3.4 has no
/// `--unsafe-no-fsync`).
///
/// Dropping it SIGKILLs every node and removes the dir.
///
/// ```no_run
/// # use peerq_test_support::EtcdCluster;
/// let mut etcd = EtcdCluster::start();
/// let endpoints = etcd.endpoints(); // for the client under test
/// etcd.kill(0);
/// assert!(etcd.has_quorum()); // two of three
/// etcd.restart(0);
/// ```
#[derive(Debug)]
pub struct EtcdCluster {
    /// `peerq-etcd-…` under `/dev/shm`, one dir per node in it.
    dir: PathBuf,
    nodes: Vec<Node>,
    opts: EtcdOptions,
}

/// Why a launch failed in a way the harness retries.
enum LaunchError {
    /// Another process holds one of a node's ports.
    AddrInUse,
}

impl EtcdCluster {
    /// Raft's heartbeat interval (`--heartbeat-interval`).
    pub const HEARTBEAT_INTERVAL: Duration = Duration::from_millis(50);
    /// Raft's election timeout (`--election-timeout`): the survivors elect
    /// a new leader within about twice this after the leader dies, and
    /// etcd's minimum lease TTL is 1.5 × this rounded up to seconds (1 s).
    pub const ELECTION_TIMEOUT: Duration = Duration::from_millis(500);

    /// Starts three nodes with the default options and waits until the
    /// cluster is healthy.
    pub fn start() -> EtcdCluster {
        EtcdCluster::start_with(EtcdOptions::default())
    }

    /// Starts the three nodes at once, waits until the cluster is healthy
    /// and, with [`EtcdOptions::auth`], sets up the users and enables
    /// auth.
    ///
    /// Panics if `etcd` or `etcdctl` is not on PATH or the cluster is not
    /// healthy within 30 s; the message quotes the nodes' logs.
    pub fn start_with(opts: EtcdOptions) -> EtcdCluster {
        layout::ensure_etcd();
        let mut cluster = EtcdCluster {
            dir: layout::fresh_dir(),
            nodes: Vec::new(),
            opts,
        };
        let mut launched = false;
        for attempt in 0..FRESH_PORT_ATTEMPTS {
            // Dropping a node kills it; its data dir belongs to the ports
            // and token of its attempt, so it goes too.
            cluster.nodes.clear();
            for entry in fs::read_dir(&cluster.dir).into_iter().flatten().flatten() {
                let _ = fs::remove_dir_all(entry.path());
            }
            cluster.nodes = layout::nodes(&cluster.dir, attempt, opts.tls.as_ref());
            for node in &mut cluster.nodes {
                node.spawn();
            }
            if cluster.await_launch(EtcdCluster::all_healthy).is_ok() {
                launched = true;
                break;
            }
        }
        assert!(
            launched,
            "etcd found no free ports in {FRESH_PORT_ATTEMPTS} attempts:\n{}",
            cluster.state()
        );
        if let Some((user, password)) = opts.auth {
            etcdctl::enable_auth(user, password, |args| cluster.etcdctl_as(None, args));
        }
        cluster
    }

    /// The client URLs of all three nodes, running or not:
    /// `http://127.0.0.1:<port>` (`https://` with [`EtcdOptions::tls`]).
    pub fn endpoints(&self) -> Vec<String> {
        (0..NODES).map(|node| self.endpoint(node)).collect()
    }

    /// The client URL of node `node` (0, 1 or 2); it stays the same across
    /// restarts.
    pub fn endpoint(&self, node: usize) -> String {
        self.endpoint_on(node, "127.0.0.1")
    }

    fn endpoint_on(&self, node: usize, host: &str) -> String {
        let scheme = layout::scheme(self.opts.tls.as_ref());
        format!("{scheme}://{host}:{}", self.node(node).ports.client)
    }

    /// SIGKILLs node `node` (0, 1 or 2); it stays down until
    /// [`restart`](Self::restart). Nothing if it is down already.
    ///
    /// Returns at once. If it was the leader, the others elect a new one
    /// within about one to two [`ELECTION_TIMEOUT`](Self::ELECTION_TIMEOUT)s;
    /// meanwhile a follower still forwards writes to the dead leader, and
    /// such a write is lost: its client sees a timeout (etcdctl's 5 s,
    /// "request timed out, possibly due to previous leader failure"). Call
    /// [`wait_healthy`](Self::wait_healthy) to wait for the new leader.
    pub fn kill(&mut self, node: usize) {
        self.node_mut(node).kill();
    }

    /// Starts node `node` again on the same ports and data dir (killing it
    /// first if it runs: a crash and restart), and waits until the cluster
    /// is healthy with it ([`wait_healthy`](Self::wait_healthy)).
    ///
    /// With fewer than two nodes running there is no quorum to wait for:
    /// it returns once the node answers `/health` at all (saying `false`),
    /// so a test can bring a fully stopped cluster back one node at a time.
    pub fn restart(&mut self, node: usize) {
        self.node_mut(node).kill();
        let ready = |cluster: &EtcdCluster| {
            if cluster.running() >= QUORUM {
                cluster.all_healthy()
            } else {
                cluster.nodes[node].health().is_some()
            }
        };
        for _ in 0..SAME_PORT_ATTEMPTS {
            self.nodes[node].spawn();
            match self.await_launch(ready) {
                Ok(()) => return,
                Err(LaunchError::AddrInUse) => thread::sleep(Duration::from_millis(100)),
            }
        }
        panic!(
            "etcd {} could not bind its ports again:\n{}",
            self.nodes[node].name,
            self.state()
        );
    }

    /// Waits until the cluster is healthy: every running node answers
    /// `/health` with `true`, which etcd says only with a leader and after
    /// a quorum read through raft. Panics after 30 s, or at once if fewer
    /// than two nodes run (no quorum could ever form), with what each node
    /// says and the end of its log.
    pub fn wait_healthy(&self) {
        let running = self.running();
        assert!(
            running >= QUORUM,
            "wait_healthy with {running} of {NODES} etcd nodes running: no quorum can form"
        );
        let deadline = Instant::now() + SETTLE_TIMEOUT;
        while !self.all_healthy() {
            assert!(
                Instant::now() < deadline,
                "the etcd cluster was not healthy within {SETTLE_TIMEOUT:?}:\n{}",
                self.state()
            );
            thread::sleep(POLL_INTERVAL);
        }
    }

    /// Whether the cluster has a leader and a quorum now: some running node
    /// answers `/health` with `true`. Saying no may take a second per
    /// running node (etcd's own timeout for the quorum read).
    pub fn has_quorum(&self) -> bool {
        self.nodes
            .iter()
            .filter(|node| node.is_running())
            .any(|node| node.health() == Some(true))
    }

    /// The node (0, 1 or 2) that says it leads now
    /// (`etcd_server_is_leader` on its metrics port), if one does: for a
    /// test that kills the leader, or spares it.
    pub fn leader(&self) -> Option<usize> {
        (0..NODES).find(|&node| {
            self.nodes[node].is_running() && self.nodes[node].is_leader() == Some(true)
        })
    }

    /// Freezes node `node` (SIGSTOP): its ports still accept connections
    /// (the kernel's backlog) and nothing answers, as a hung host does.
    pub fn freeze(&self, node: usize) {
        self.nodes[node].signal("STOP");
    }

    /// Lets a frozen node `node` run again (SIGCONT).
    pub fn thaw(&self, node: usize) {
        self.nodes[node].signal("CONT");
    }

    /// Node `node`'s Prometheus metrics (its `/metrics`), `None` while it
    /// does not answer: for a bench that counts the requests it served.
    pub fn metrics(&self, node: usize) -> Option<String> {
        self.nodes[node].metrics()
    }

    /// What each node says, with the end of its log, for a panic message.
    pub fn state(&self) -> String {
        let mut out = String::new();
        for (index, node) in self.nodes.iter().enumerate() {
            let state = match (node.is_running(), node.health()) {
                (false, _) => "down".to_owned(),
                (true, None) => "running, not answering".to_owned(),
                (true, Some(healthy)) => format!("running, healthy: {healthy}"),
            };
            out += &format!(
                "etcd {} ({}): {state}; log:\n{}\n",
                node.name,
                self.endpoint(index),
                node.log_tail()
            );
        }
        out
    }

    /// Waits until `ready` holds, or a node exits by itself: `Err` if it
    /// could not bind a port, a panic with its log otherwise.
    fn await_launch(&mut self, ready: impl Fn(&EtcdCluster) -> bool) -> Result<(), LaunchError> {
        let deadline = Instant::now() + SETTLE_TIMEOUT;
        loop {
            for node in &mut self.nodes {
                if let Some(status) = node.reap() {
                    if node.bind_failed() {
                        return Err(LaunchError::AddrInUse);
                    }
                    panic!(
                        "etcd {} exited ({status}); log:\n{}",
                        node.name,
                        node.log_tail()
                    );
                }
            }
            if ready(self) {
                return Ok(());
            }
            assert!(
                Instant::now() < deadline,
                "the etcd cluster was not ready within {SETTLE_TIMEOUT:?}:\n{}",
                self.state()
            );
            thread::sleep(POLL_INTERVAL);
        }
    }

    /// Whether a quorum runs and every running node says it is healthy.
    fn all_healthy(&self) -> bool {
        self.running() >= QUORUM
            && self
                .nodes
                .iter()
                .filter(|node| node.is_running())
                .all(|node| node.health() == Some(true))
    }

    fn running(&self) -> usize {
        self.nodes.iter().filter(|node| node.is_running()).count()
    }

    fn node(&self, node: usize) -> &Node {
        self.nodes
            .get(node)
            .unwrap_or_else(|| panic!("no etcd node {node}: a cluster has nodes 0 to 2"))
    }

    fn node_mut(&mut self, node: usize) -> &mut Node {
        self.nodes
            .get_mut(node)
            .unwrap_or_else(|| panic!("no etcd node {node}: a cluster has nodes 0 to 2"))
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        // The processes first: a live etcd would write on in the dir.
        for node in &mut self.nodes {
            node.kill();
        }
        let _ = fs::remove_dir_all(&self.dir);
        reaper::release_dir(&self.dir);
    }
}
