//! What a chaos run does: its length, rate, seed and fleet (from the
//! environment, so that `scripts/chaos` and the CI test run the same
//! program), the service's timing, and the task every producer sends.

use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// The service's round interval: a lease is 1.5 of it.
pub(crate) const INTERVAL: Duration = Duration::from_secs(1);
/// The drain timeout (below half the interval).
pub(crate) const DRAIN: Duration = Duration::from_millis(300);
/// The tolerated clock skew (one machine: one clock).
pub(crate) const SKEW: Duration = Duration::from_millis(100);
/// Partitions of the unordered service and of the ordered one.
pub(crate) const PARTITIONS: u32 = 16;
pub(crate) const ORDERED_PARTITIONS: u32 = 8;
/// Attempts before a task goes to the dead letters.
pub(crate) const MAX_ATTEMPTS: u32 = 3;
/// The periodic job's period: every second, aligned to the epoch.
pub(crate) const TICK: Duration = Duration::from_secs(1);
/// The longest delay a delayed task asks for.
pub(crate) const MAX_DELAY: Duration = Duration::from_secs(5);
/// Final task records each partition of the unordered service keeps:
/// 320,000 in all, the last 160 s at 2,000 tasks/s, well beyond the last
/// [`RECORDS`] handles of each producer (1 task in 50 has one).
pub(crate) const KEEP_RECORDS: u32 = 20_000;
/// Records read after the run, per producer: its last this many handles.
pub(crate) const RECORDS: usize = 300;
/// Keys per producer on the ordered service.
pub(crate) const ORDERED_KEYS: u32 = 32;
/// A workflow batch every this often, per producer, of this many members.
pub(crate) const BATCH_EVERY: Duration = Duration::from_secs(5);
pub(crate) const BATCH_MEMBERS: u64 = 5;

/// How long, how fast and how many: `PEERQ_CHAOS_*` variables, with the
/// CI version's defaults (`scripts/chaos` sets the hour's).
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    /// How long faults are injected while tasks flow.
    pub(crate) run_for: Duration,
    /// Tasks per second, both producers together.
    pub(crate) rate: u64,
    /// The seed of every random choice the run makes.
    pub(crate) seed: u64,
    /// Consumer processes: never fewer, never more.
    pub(crate) min_consumers: usize,
    pub(crate) max_consumers: usize,
    /// The mean time between two faults.
    pub(crate) fault_every: Duration,
    /// Where the history, the logs and the report go.
    pub(crate) dir: PathBuf,
}

impl Plan {
    /// The unordered service's rate limit (starts per second): half again
    /// the rate, so that it binds only while a backlog drains after a
    /// fault.
    pub(crate) fn limit(&self) -> u32 {
        (self.rate * 3 / 2).max(50) as u32
    }

    /// The plan the environment gives.
    pub(crate) fn from_env() -> Plan {
        let num = |name: &str, default: f64| -> f64 {
            match std::env::var(name) {
                Ok(v) => v
                    .parse()
                    .unwrap_or_else(|_| panic!("{name}=`{v}` is not a number")),
                Err(_) => default,
            }
        };
        let seed = match std::env::var("PEERQ_CHAOS_SEED") {
            Ok(v) => v
                .parse()
                .unwrap_or_else(|_| panic!("PEERQ_CHAOS_SEED=`{v}` is not a number")),
            Err(_) => now_us() as u64,
        };
        let dir = match std::env::var("PEERQ_CHAOS_DIR") {
            Ok(dir) => PathBuf::from(dir),
            Err(_) => std::env::temp_dir().join(format!("peerq-chaos-{seed}")),
        };
        let plan = Plan {
            run_for: Duration::from_secs_f64(num("PEERQ_CHAOS_MINUTES", 3.0) * 60.0),
            rate: num("PEERQ_CHAOS_RATE", 300.0) as u64,
            seed,
            min_consumers: num("PEERQ_CHAOS_MIN_CONSUMERS", 4.0) as usize,
            max_consumers: num("PEERQ_CHAOS_MAX_CONSUMERS", 6.0) as usize,
            fault_every: Duration::from_secs_f64(num("PEERQ_CHAOS_FAULT_EVERY_SECS", 4.0)),
            dir,
        };
        assert!(
            (2..=plan.max_consumers).contains(&plan.min_consumers),
            "PEERQ_CHAOS_MIN_CONSUMERS must be at least 2 (two are never stopped for good) \
             and at most PEERQ_CHAOS_MAX_CONSUMERS"
        );
        assert!(
            plan.rate >= 20,
            "PEERQ_CHAOS_RATE must be at least 20 tasks/s"
        );
        plan
    }
}

/// A task of the run: its number (the producer in the top bits, its
/// sequence below) and what its handler does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Job {
    pub(crate) n: u64,
    pub(crate) kind: Kind,
}

/// What a task's handler does, and what the checker expects of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Kind {
    /// Succeeds at once.
    Plain,
    /// Fails its first run, succeeds its second.
    RetryOnce,
    /// Enqueued with a delay: must not run before `due_ms`.
    Delayed { due_ms: u64 },
    /// Fails every run: ends in the dead letters.
    Poison,
    /// Enqueued with a delay of 1 to 3 s and cancelled 0.3 s later
    /// through its handle: it never runs once its cancel said so.
    Cancel,
    /// On the ordered service: `seq` of key `key`, in that key's order.
    Ordered { key: u32, seq: u64 },
    /// A member of workflow batch `batch`.
    Member { batch: u64 },
    /// The callback of workflow batch `batch`.
    Callback { batch: u64 },
    /// The periodic job's task.
    Tick,
}

/// Task number `seq` of producer `producer`.
pub(crate) fn number(producer: u64, seq: u64) -> u64 {
    (producer << 40) | seq
}

/// Microseconds since the Unix epoch.
pub(crate) fn now_us() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_micros()
}
