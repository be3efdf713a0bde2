//! The consumer: `Consumer::builder().name("mail-sender")…run()`.
//!
//! It wires the parts: the peer indexer gives the instance its assignment,
//! the assignment gives the owned partitions (`p % replicas == index - 1`),
//! a worker per owned partition fetches and runs its tasks through the
//! handler service, and the acker acks what succeeded, in batches.
//!
//! When the assignment changes, each partition moves by drain-then-switch
//! (docs/design.md §4, driven by the `handover` module): the old owner stops fetching,
//! lets running tasks finish until the drain timeout (then cancels them),
//! and marks the partition released; the new owner waits for that mark or
//! the handover deadline, records itself as owner with its fencing token,
//! and starts. Partitions kept by the instance never pause.

mod acker;
mod builder;
mod event;
mod fetcher;
mod handover;
mod held;
mod housekeeping;
mod lease;
mod ownership;
mod run_task;
mod runtime;
mod scheduler;
mod startup;
mod worker;

use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use serde::de::DeserializeOwned;
use tower::Service;

use tokio::sync::{Semaphore, mpsc};

pub use self::builder::{
    ConsumerBuilder, DEFAULT_BATCH, DEFAULT_BLOCK, DEFAULT_CLAIM_IDLE, DEFAULT_CONCURRENCY,
    DEFAULT_DRAIN_TIMEOUT, DEFAULT_MAX_ATTEMPTS, DEFAULT_MAX_ENTRY_BYTES,
};
pub use self::event::{PartitionChange, PartitionEvent};
use crate::codec::Bincode;
use crate::config::ServiceName;
use crate::connection::SharedConnection;
use crate::handler::{BoxError, Task};
use crate::instance::InstanceId;
use crate::periodic::Registered;
use crate::retry::Backoff;

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

/// The consumer's settings, validated.
#[derive(Debug, Clone)]
pub(crate) struct ConsumerSettings {
    pub(crate) partitions: u32,
    pub(crate) concurrency: usize,
    pub(crate) batch: usize,
    pub(crate) block: Duration,
    pub(crate) drain_timeout: Duration,
    pub(crate) max_attempts: u32,
    pub(crate) backoff: Backoff,
    /// One task at a time per partition, in stream order (service-wide).
    pub(crate) ordered: bool,
    /// Periodic jobs with their tasks' payloads.
    pub(crate) periodic: Vec<Registered>,
    pub(crate) claim_idle: Duration,
    /// `None`: `3 * interval + drain_timeout`.
    pub(crate) leave_timeout: Option<Duration>,
    pub(crate) allow_eviction: bool,
    /// Larger entries are dead-lettered (`too_large`) undecoded.
    pub(crate) max_entry_bytes: usize,
}

/// A handler service the runtime can drive: a tower service of `Task<T>`
/// that can be cloned per task and sent across threads.
pub(crate) trait TaskService<T>:
    Service<Task<T>, Response = (), Error: Into<BoxError>, Future: Send> + Clone + Send + Sync + 'static
{
}

impl<T, S> TaskService<T> for S
where
    S: Service<Task<T>, Response = ()> + Clone + Send + Sync + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send,
{
}

/// A task payload type the runtime can decode and move across threads.
pub(crate) trait Payload: DeserializeOwned + Send + 'static {}
impl<T: DeserializeOwned + Send + 'static> Payload for T {}

/// What the workers of one instance share.
pub(crate) struct Shared<T, S, C> {
    pub(crate) name: ServiceName,
    pub(crate) id: InstanceId,
    /// For everything that does not block.
    pub(crate) conn: Arc<SharedConnection>,
    pub(crate) service: S,
    pub(crate) codec: C,
    /// Tasks in flight on this instance.
    pub(crate) permits: Arc<Semaphore>,
    pub(crate) acks: mpsc::UnboundedSender<acker::Ack>,
    /// Where workers tell the runtime they were fenced.
    pub(crate) reports: mpsc::UnboundedSender<ownership::Report>,
    pub(crate) settings: ConsumerSettings,
    pub(crate) task: PhantomData<fn() -> T>,
}
