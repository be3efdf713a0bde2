//! Changing who serves a shard: a manual failover, a crashed master and its
//! replica's promotion, a node brought back, and waiting for replicas to
//! catch up so a test knows what a failover can lose.
//!
//! With `--cluster-node-timeout 2000`, a killed master is flagged `fail`
//! about 2 s after its death and a replica takes over about 1 s later;
//! a manual failover takes well under a second.

use std::thread;
use std::time::{Duration, Instant};

use deadpool_redis::redis;

use super::topology::info_field;
use super::{NodeInfo, POLL_INTERVAL, RedisCluster, SETTLE_TIMEOUT};

/// How often `failover` sends `CLUSTER FAILOVER` again while the replica
/// has not taken over: a manual failover that times out is not retried by
/// Redis itself.
const FAILOVER_RETRY: Duration = Duration::from_secs(5);
/// How long replicas may take to reach their master's offset.
const REPLICATION_TIMEOUT: Duration = Duration::from_secs(10);

impl RedisCluster {
    /// Promotes `replica` with `CLUSTER FAILOVER` (the safe, manual kind:
    /// the master stops writes until the replica has caught up, so nothing
    /// acknowledged is lost), then waits until it is a master and every
    /// node agrees. The old master becomes its replica.
    pub fn failover(&mut self, replica: &NodeInfo) {
        let deadline = Instant::now() + SETTLE_TIMEOUT;
        let mut last_sent: Option<Instant> = None;
        loop {
            if last_sent.is_none_or(|sent| sent.elapsed() >= FAILOVER_RETRY) {
                if let Err(err) =
                    self.node_query::<()>(replica.port, redis::cmd("CLUSTER").arg("FAILOVER"))
                {
                    self.fail(&format!("CLUSTER FAILOVER: {err}"));
                }
                last_sent = Some(Instant::now());
            }
            if self.role(replica.port).as_deref() == Ok("master") && self.check_settled().is_ok() {
                return;
            }
            if Instant::now() >= deadline {
                let reason = self.check_settled().err().unwrap_or_default();
                self.fail(&format!(
                    "replica {} did not take over within {SETTLE_TIMEOUT:?} (role {:?}; {reason})",
                    replica.port,
                    self.role(replica.port)
                ));
            }
            thread::sleep(POLL_INTERVAL);
        }
    }

    /// SIGKILLs `master` and waits until one of its replicas has been
    /// promoted and the surviving nodes agree; returns the new master.
    ///
    /// Writes the replicas had not received are lost, as in production;
    /// call [`wait_replicated`](Self::wait_replicated) first to keep them.
    /// The killed node stays down (listed as `fail`) until
    /// [`restart_node`](Self::restart_node). Panics if `master` has no
    /// replica, since the cluster would then stay down.
    pub fn kill_master(&mut self, master: &NodeInfo) -> NodeInfo {
        let replicas = self.replicas_of(master);
        assert!(
            !replicas.is_empty(),
            "master {} has no replica to promote: start the cluster with replicas_per_master >= 1",
            master.port
        );
        self.node_mut(master.port).kill();
        let deadline = Instant::now() + SETTLE_TIMEOUT;
        loop {
            let promoted = self.try_lines().ok().and_then(|lines| {
                lines
                    .into_iter()
                    .find(|line| line.master && replicas.iter().any(|r| r.id == line.id))
            });
            if let Some(line) = promoted
                && self.check_settled().is_ok()
            {
                return self.info(&line);
            }
            if Instant::now() >= deadline {
                let reason = self.check_settled().err().unwrap_or_default();
                self.fail(&format!(
                    "no replica of killed master {} took over within {SETTLE_TIMEOUT:?}: {reason}",
                    master.port
                ));
            }
            thread::sleep(POLL_INTERVAL);
        }
    }

    /// Starts a node killed by [`kill_master`](Self::kill_master) again on
    /// its port and dir, and waits until the cluster has settled. It keeps
    /// its id (from `nodes.conf`) and its AOF data, learns that its slots
    /// moved on, and rejoins as a replica of the master that replaced it.
    pub fn restart_node(&mut self, node: &NodeInfo) {
        let server = self.node_mut(node.port);
        assert_eq!(server.pid(), 0, "node {} is still running", node.port);
        server.relaunch();
        self.settle(&format!("restarting node {}", node.port), SETTLE_TIMEOUT);
    }

    /// Freezes `node` with SIGSTOP: it stops answering, its connections
    /// stay open. A frozen replica no longer acknowledges its master's
    /// writes, so `WAIT 1` on that master counts none of the writes made
    /// since. [`thaw`](Self::thaw) it before anything that waits for the
    /// cluster to settle (a frozen node never answers the checks).
    pub fn freeze(&self, node: &NodeInfo) {
        self.node(node.port).pause();
    }

    /// Thaws a node [`freeze`](Self::freeze) froze (SIGCONT) and waits
    /// until it answers, no live node flags it failing, and, for a
    /// replica, its link to its master is up. (Not for the whole cluster
    /// to settle: a test may thaw a node with a slot migration open.)
    pub fn thaw(&self, node: &NodeInfo) {
        self.node(node.port).resume();
        let deadline = Instant::now() + SETTLE_TIMEOUT;
        while let Err(reason) = self.check_thawed(node) {
            if Instant::now() >= deadline {
                self.fail(&format!(
                    "node {} not back within {SETTLE_TIMEOUT:?} after thawing: {reason}",
                    node.port
                ));
            }
            thread::sleep(POLL_INTERVAL);
        }
    }

    /// Whether a thawed `node` is back (see [`thaw`](Self::thaw)).
    fn check_thawed(&self, node: &NodeInfo) -> Result<(), String> {
        if self.role(node.port)? == "slave" {
            let info: String = self.node_query(node.port, redis::cmd("INFO").arg("replication"))?;
            let link = info_field(&info, "master_link_status");
            if link != Some("up") {
                return Err(format!("master_link_status {link:?}"));
            }
        }
        for other in self.live() {
            let lines = self.node_lines(other.port())?;
            if lines.iter().any(|line| line.id == node.id && line.failed) {
                return Err(format!("node {} flags it failing", other.port()));
            }
        }
        Ok(())
    }

    /// Waits until every live replica of `master` has processed everything
    /// `master` had written when this was called, comparing the master's
    /// `master_repl_offset` with each replica's own `slave_repl_offset`
    /// (which, unlike the master's view, does not lag by the 1 s ack).
    pub fn wait_replicated(&self, master: &NodeInfo) {
        let target = self
            .replication_offset(master.port, "master_repl_offset")
            .unwrap_or_else(|err| self.fail(&err));
        let deadline = Instant::now() + REPLICATION_TIMEOUT;
        for replica in self.replicas_of(master) {
            loop {
                let offset = self.replication_offset(replica.port, "slave_repl_offset");
                if offset.as_ref().is_ok_and(|&offset| offset >= target) {
                    break;
                }
                if Instant::now() >= deadline {
                    self.fail(&format!(
                        "replica {} did not reach offset {target} of master {} within \
                         {REPLICATION_TIMEOUT:?}: {offset:?}",
                        replica.port, master.port
                    ));
                }
                thread::sleep(POLL_INTERVAL);
            }
        }
    }

    /// [`wait_replicated`](Self::wait_replicated) for every master.
    pub fn wait_synced(&self) {
        for master in self.masters() {
            self.wait_replicated(&master);
        }
    }

    /// `role` from `INFO replication`: `master` or `slave`.
    fn role(&self, port: u16) -> Result<String, String> {
        let info: String = self.node_query(port, redis::cmd("INFO").arg("replication"))?;
        info_field(&info, "role")
            .map(str::to_owned)
            .ok_or_else(|| format!("node {port}: no role in INFO"))
    }

    /// A numeric `field` of `INFO replication`.
    fn replication_offset(&self, port: u16, field: &str) -> Result<u64, String> {
        let info: String = self.node_query(port, redis::cmd("INFO").arg("replication"))?;
        info_field(&info, field)
            .and_then(|value| value.parse().ok())
            .ok_or_else(|| format!("node {port}: no {field} in INFO replication"))
    }
}
