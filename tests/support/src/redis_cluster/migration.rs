//! Moving a hash slot from one master to another with the protocol
//! `redis-cli --cluster reshard` uses (see "Redis Cluster live resharding"
//! in the cluster spec): mark the slot importing on the target and
//! migrating on the source, `MIGRATE` its keys in batches, then assign it
//! to the target everywhere.
//!
//! While a slot is open, the source still serves the keys it holds and
//! answers `-ASK` for keys already moved; the target serves a moved key
//! only after `ASKING`. [`Migration`] stops in that state so a test can act
//! in the middle.

use std::sync::{MutexGuard, PoisonError};

use deadpool_redis::redis;

use super::{NodeInfo, RedisCluster, SETTLE_TIMEOUT};

/// Keys moved per `MIGRATE` by [`Migration::finish`].
const BATCH: usize = 100;
/// `MIGRATE`'s own timeout, in milliseconds.
const MIGRATE_TIMEOUT_MS: u64 = 5000;

impl RedisCluster {
    /// Moves `slot`, with its keys and their data, to the master `to`,
    /// then waits until every node agrees on the new owner.
    pub fn migrate_slot(&self, slot: u16, to: &NodeInfo) {
        self.begin_migration(slot, to).finish();
    }

    /// Opens the migration of `slot` to the master `to` (`SETSLOT
    /// IMPORTING` on the target, `SETSLOT MIGRATING` on the source) and
    /// returns before moving any key.
    ///
    /// One migration runs at a time per cluster: this waits until another
    /// test's migration has finished, so a test must not open a second
    /// one (or wait for the cluster to settle) while it holds one.
    /// Panics if `to` already serves the slot.
    pub fn begin_migration(&self, slot: u16, to: &NodeInfo) -> Migration<'_> {
        let turn = self
            .migration_turn
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let source = self.master_of_slot(slot);
        assert_ne!(
            source.id, to.id,
            "slot {slot} is already on node {}",
            to.port
        );
        let importing = redis::cmd("CLUSTER")
            .arg("SETSLOT")
            .arg(slot)
            .arg("IMPORTING")
            .arg(&source.id)
            .clone();
        let migrating = redis::cmd("CLUSTER")
            .arg("SETSLOT")
            .arg(slot)
            .arg("MIGRATING")
            .arg(&to.id)
            .clone();
        // Target first: once the source answers -ASK, the target must
        // already accept ASKING for the slot.
        let opened = self
            .node_query::<()>(to.port, &importing)
            .and_then(|()| self.node_query::<()>(source.port, &migrating));
        if let Err(err) = opened {
            self.fail(&format!("open migration of slot {slot}: {err}"));
        }
        Migration {
            cluster: self,
            slot,
            source,
            target: to.clone(),
            finished: false,
            _turn: turn,
        }
    }
}

/// A slot migration in progress, from [`RedisCluster::begin_migration`].
///
/// Dropping it unfinished finishes it (moving the remaining keys), so a
/// failed test never leaves a slot open in a cluster other tests use.
#[derive(Debug)]
pub struct Migration<'a> {
    cluster: &'a RedisCluster,
    slot: u16,
    source: NodeInfo,
    target: NodeInfo,
    finished: bool,
    /// The cluster's one migration turn, released after `Drop` has
    /// finished the migration.
    _turn: MutexGuard<'a, ()>,
}

impl Migration<'_> {
    /// The slot being moved.
    pub fn slot(&self) -> u16 {
        self.slot
    }

    /// The master the slot leaves.
    pub fn source(&self) -> &NodeInfo {
        &self.source
    }

    /// The master the slot goes to.
    pub fn target(&self) -> &NodeInfo {
        &self.target
    }

    /// Moves up to `max_keys` of the slot's keys with one `MIGRATE`;
    /// returns whether keys remain on the source.
    pub fn step(&mut self, max_keys: usize) -> bool {
        self.try_step(max_keys)
            .unwrap_or_else(|err| self.cluster.fail(&err))
    }

    /// Moves the remaining keys, assigns the slot to the target on the
    /// target, the source and every other master, and waits until every
    /// node agrees.
    pub fn finish(mut self) {
        self.finished = true;
        if let Err(err) = self.try_finish() {
            self.cluster.fail(&err);
        }
    }

    fn try_step(&mut self, max_keys: usize) -> Result<bool, String> {
        let keys: Vec<Vec<u8>> = self.cluster.node_query(
            self.source.port,
            redis::cmd("CLUSTER")
                .arg("GETKEYSINSLOT")
                .arg(self.slot)
                .arg(max_keys),
        )?;
        if !keys.is_empty() {
            let () = self.cluster.node_query(
                self.source.port,
                redis::cmd("MIGRATE")
                    .arg("127.0.0.1")
                    .arg(self.target.port)
                    .arg("")
                    .arg(0)
                    .arg(MIGRATE_TIMEOUT_MS)
                    .arg("KEYS")
                    .arg(&keys),
            )?;
        }
        let left: usize = self.cluster.node_query(
            self.source.port,
            redis::cmd("CLUSTER").arg("COUNTKEYSINSLOT").arg(self.slot),
        )?;
        Ok(left > 0)
    }

    fn try_finish(&mut self) -> Result<(), String> {
        while self.try_step(BATCH)? {}
        let assign = redis::cmd("CLUSTER")
            .arg("SETSLOT")
            .arg(self.slot)
            .arg("NODE")
            .arg(&self.target.id)
            .clone();
        // The target first: it bumps its config epoch, so its claim wins
        // when gossip meets the source's old one.
        self.cluster.node_query::<()>(self.target.port, &assign)?;
        self.cluster.node_query::<()>(self.source.port, &assign)?;
        for line in self.cluster.try_lines()? {
            let other = line.id != self.target.id && line.id != self.source.id;
            if line.master && !line.failed && other {
                self.cluster.node_query::<()>(line.port, &assign)?;
            }
        }
        self.cluster.try_settle(SETTLE_TIMEOUT).map_err(|reason| {
            format!(
                "cluster did not settle after moving slot {}: {reason}",
                self.slot
            )
        })
    }
}

impl Drop for Migration<'_> {
    fn drop(&mut self) {
        if !self.finished {
            self.finished = true;
            // Never panic here: the test may be unwinding already.
            let _ = self.try_finish();
        }
    }
}
