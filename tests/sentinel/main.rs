//! peerq on a master that Redis Sentinel watches ([`SentinelSet`]: a
//! master, two replicas, three sentinels, each test a set of its own):
//! consumers and a producer given `Redis::sentinel` follow a failover with
//! no restart, `SENTINEL FAILOVER` and a SIGKILL of the master alike
//! (here), a network cut of the master from the others (`cut`), and over
//! TLS with passwords and an ACL user (`secure`).
//!
//! A Sentinel failover is asynchronous: the promoted replica may lack the
//! master's last writes, and the old master takes writes until the
//! sentinels demote it. Waiting for every replica (`wait_for_replicas(2,
//! …)`) is the condition under which no enqueue that returned success is
//! lost (docs/design.md §8); without it the losses are counted and printed.

// The harness crate, named `support` in every module of this binary.
extern crate peerq_test_support as support;

mod cut;
mod flow;
mod secure;

use std::time::Duration;

use peerq::Redis;
use support::{MASTER_NAME, SentinelSet, unique_name};

use flow::{Flow, MS, dedup_records, wait_ran};

/// Every replica of the set: the promoted one holds every write.
const EVERY_REPLICA: u32 = 2;
/// How long a run waits for a task to run once none has for that long:
/// what it then counts as never run. Generous, as the instances find the
/// new master again in a few seconds, but in a few more on two cores
/// loaded by other work (once over 10 s, over TLS).
const STALL: Duration = Duration::from_secs(20);

/// The set's master through its sentinels, waiting for `wait` replicas.
fn redis(set: &SentinelSet, wait: Option<u32>) -> Redis {
    let redis = Redis::sentinel(MASTER_NAME, set.sentinel_urls());
    match wait {
        Some(n) => redis.wait_for_replicas(n, 100 * MS),
        None => redis,
    }
}

/// What a run through a failover counted.
#[derive(Debug)]
struct Counted {
    enqueued: u64,
    /// Enqueues that returned success but whose task never ran.
    lost: usize,
    /// Enqueues that returned success of which the final master has no
    /// record: confirmed by the old master, then dropped.
    discarded: usize,
    /// Tasks that ran more than once.
    twice: usize,
}

/// [`flow_through`] a fresh default set, every part waiting for `wait`
/// replicas.
async fn through_a_failover(
    prefix: &str,
    wait: Option<u32>,
    fail: impl FnOnce(&mut SentinelSet) -> u16,
) -> Counted {
    let mut set = SentinelSet::start();
    let label = format!("{prefix}, wait_for_replicas {wait:?}");
    let name = unique_name(prefix);
    flow_through(&mut set, &name, &label, |set| redis(set, wait), fail).await
}

/// Two consumers and a producer of service `name` on `set`, each given
/// `connect(set)`, tasks flowing at a steady rate while `fail` fails the
/// master over. Waits until every task ran, or nothing changed for [`STALL`],
/// and shuts the instances down (gracefully: they must never have
/// stopped). Prints the counts after `label`.
async fn flow_through(
    set: &mut SentinelSet,
    name: &str,
    label: &str,
    connect: impl Fn(&SentinelSet) -> Redis,
    fail: impl FnOnce(&mut SentinelSet) -> u16,
) -> Counted {
    let Flow {
        record,
        instances,
        stop,
        enqueues: flowing,
    } = Flow::start(|| connect(set), name).await;

    let old = set.master_port();
    let new = tokio::task::block_in_place(|| fail(set));
    assert_ne!(old, new, "the master did not change");
    tracing::warn!(old, new, "test: failed over");
    // Tasks enqueued after the failover run too: both instances followed.
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.cancel();
    let enqueued = flowing.await.unwrap().len() as u64;
    wait_ran(&record, &instances, enqueued, STALL).await;
    for instance in instances {
        instance.shutdown().await;
    }
    let (lost, twice) = record.tally(enqueued);
    let recorded = tokio::task::block_in_place(|| dedup_records(set, set.master_port(), name));
    let counted = Counted {
        enqueued,
        lost: lost.len(),
        discarded: (0..enqueued).filter(|seq| !recorded.contains(seq)).count(),
        twice: twice.len(),
    };
    eprintln!(
        "{label}: {} enqueued, {} lost ({lost:?}), {} discarded, {} ran twice",
        counted.enqueued, counted.lost, counted.discarded, counted.twice
    );
    counted
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_failover_while_tasks_flow_loses_no_task_when_writes_wait_for_every_replica() {
    let counted = through_a_failover(
        "sentinel-failover",
        Some(EVERY_REPLICA),
        |set: &mut SentinelSet| set.failover(),
    )
    .await;
    assert_eq!((counted.lost, counted.discarded), (0, 0), "{counted:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_sentinel_master_loses_no_task_when_writes_wait_for_every_replica() {
    let counted = through_a_failover(
        "sentinel-kill",
        Some(EVERY_REPLICA),
        SentinelSet::kill_master,
    )
    .await;
    assert_eq!((counted.lost, counted.discarded), (0, 0), "{counted:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_sentinel_master_without_waiting_for_replicas_is_measured() {
    // What an asynchronous failover costs without WAIT: printed, as the
    // Cluster's is. The run must still end with both instances running.
    let counted = through_a_failover("sentinel-kill-nowait", None, SentinelSet::kill_master).await;
    assert!(counted.enqueued >= 1000, "{counted:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_failover_without_waiting_for_replicas_is_measured() {
    let counted = through_a_failover("sentinel-failover-nowait", None, |set: &mut SentinelSet| {
        set.failover()
    })
    .await;
    assert!(counted.enqueued >= 1000, "{counted:?}");
}
