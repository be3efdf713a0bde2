//! The consumer: `Consumer::builder().name("mail-sender")…run()`.
//!
//! It wires the parts: the peer indexer gives the instance its assignment,
//! the assignment gives the owned partitions (`p % replicas == index - 1`),
//! a worker per owned partition fetches and runs its tasks through the
//! handler service, and the acker acks what succeeded, in batches.
//!
//! When the assignment changes, each partition moves by drain-then-switch
//! (docs/design.md §4, driven by the `handover` module): the old owner stops fetching,
//! lets running tasks finish until the drain timeout (then interrupts them),
//! and marks the partition released; the new owner waits for that mark or
//! the handover deadline, records itself as owner with its fencing token,
//! and starts. Partitions kept by the instance never pause.
//!
//! ## Layout
//!
//! The builder erases the handler's types; everything after it follows a
//! task's path, fetch → run → settle, under a partition's ownership.
//!
//! | module | owns |
//! |---|---|
//! | `builder` | the public builder: settings, the handler service, its layers |
//! | `settings` | the consumer's settings: defaults, ranges, what `{N}:meta` records |
//! | `runner` | the handler, its layers and the codec, erased into one `Runner` |
//! | `shared` | what an instance's parts share (connection, runner, room, channels) |
//! | `startup` | what happens in Redis before serving, retried until Redis is there |
//! | `runtime` | the run loop: start the parts, follow the standing, leave |
//! | `handover` | the drain-then-switch driver: carries out the transition machine's effects |
//! | `lease` | the instance's lease (rule 6) |
//! | `worker` | one owned partition: start its fetch loop and housekeeping, release it |
//! | `ownership` | a partition as a worker owns it: its store, stop and cancel tokens, fences |
//! | `fetch` | step 1: acquire, claim, read, hand each entry to a task |
//! | `idle_reads` | the one blocking read of the partitions read out |
//! | `lanes` | the connections non-blocking reads go out on: two shared, two more while a backlog is read |
//! | `run` | step 2: a read's entries in one task: wait for room, the pause gate and the lease, decode, call the handler, collect the acks |
//! | `room` | room for tasks: running handlers (`concurrency`), and finished ones waiting for their acks; with priority levels, higher levels' turn first |
//! | `limiter` | the service-wide rate limit's tokens, leased from `{N}:rate` |
//! | `key_slots` | concurrency per key: each key's running tasks |
//! | `key_wakes` | which batches hold entries aside for which key, woken when it is given room |
//! | `key_rates` | the rate limit per partition key, each key's GCRA in memory |
//! | `task_keys` | limits per key from a function of the task: the units (`{N}:units:<key>`) and tokens (`{N}:rate:<key>`) each instance holds |
//! | `gate` | the pause gate: no handler starts while `{N}:paused` exists |
//! | `settle` | step 3: ack, retry, hand back, take over, dead-letter (fenced) |
//! | `policy` | how ordered and concurrent partitions differ, asked by the steps |
//! | `held` | the entries a worker holds, so none runs twice on it |
//! | `acker` | batched, fenced acks, one round trip per batch |
//! | `housekeeping` | keep held entries fresh, look at the group, trim, promote due delayed entries, the queue gauges |
//! | `due_watch` | the instance's watch of the due index: producers' delayed tasks, one read a second |
//! | `store` | every Redis command on a partition's keys, the marks, and the start's |
//! | `scheduler` | periodic jobs: trigger each due time once across the service |
//! | `event` | partition events for status displays |
//! | `endpoint` | feature `http`: `/metrics` from the process's Prometheus recorder, `/health/live`, `/health/ready` |
//! | `meters` | the instance's metric handles (tasks, queue sizes), registered once |

mod acker;
mod builder;
mod cancels;
mod completions;
mod due_watch;
#[cfg(feature = "http")]
mod endpoint;
mod erased;
mod event;
mod fetch;
mod handover;
mod held;
mod housekeeping;
mod idle_reads;
mod key_rates;
mod key_slots;
mod key_wakes;
mod lanes;
mod lifecycle;
mod limiter;
mod meters;
mod ownership;
mod parked;
mod policy;
mod retire;
mod room;
mod run;
mod running;
mod scheduler;
mod settings;
mod settle;
mod shared;
mod startup;
pub(crate) mod store;
mod task_keys;
mod worker;

pub use self::builder::ConsumerBuilder;
pub use self::event::{PartitionChange, PartitionEvent};
pub use self::settings::{
    DEFAULT_BATCH, DEFAULT_BLOCK, DEFAULT_CLAIM_IDLE, DEFAULT_CONCURRENCY, DEFAULT_DRAIN_TIMEOUT,
    DEFAULT_MAX_ATTEMPTS, DEFAULT_MAX_ENTRY_BYTES,
};
use crate::codec::Bincode;

/// Runs a service's handler on the partitions this instance owns.
///
/// ```no_run
/// use std::time::Duration;
/// use peerq::{Consumer, Handler, HandlerError, TaskContext};
///
/// #[derive(serde::Deserialize)]
/// struct Mail { to: String }
///
/// struct SendMail;
/// impl Handler for SendMail {
///     type Task = Mail;
///     async fn handle(&self, mail: Mail, _cx: TaskContext) -> Result<(), HandlerError> {
///         println!("to {}", mail.to);
///         Ok(())
///     }
/// }
///
/// # async fn demo() -> peerq::Result<()> {
/// Consumer::builder()
///     .name("mail-sender")
///     .redis("redis://127.0.0.1/")
///     .handler(SendMail)
///     .layer(tower::limit::ConcurrencyLimitLayer::new(16))
///     .run() // until SIGTERM or ctrl-c
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Consumer;

impl Consumer {
    /// A builder with the defaults.
    pub fn builder() -> ConsumerBuilder<(), (), Bincode> {
        ConsumerBuilder::new()
    }
}
