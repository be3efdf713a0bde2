//! What the parts of one running instance share: its name and id, its
//! connection, the erased handler, the room for tasks (running and
//! waiting for their acks), the channels to the acker and the runtime, and
//! the settings.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use super::acker::Ack;
use super::completions::Completions;
use super::due_watch::DueWatch;
use super::erased::Runner;
use super::idle_reads::IdleReads;
use super::key_rates::KeyRates;
use super::key_slots::KeySlots;
use super::lanes::Lanes;
use super::limiter::Limiter;
use super::meters::{QueueGauges, TaskMetrics};
use super::ownership::Report;
use super::policy::Order;
use super::room::Room;
use super::running::Running;
use super::settings::ConsumerSettings;
use crate::config::ServiceName;
use crate::connection::SharedConnection;
use crate::gate::Gate;
use crate::instance::InstanceId;
use crate::priority::Levels;
use crate::tracking::watch::Watched;

/// What the workers of one instance share.
pub(crate) struct Shared {
    pub(crate) name: ServiceName,
    pub(crate) id: InstanceId,
    /// For everything that does not block.
    pub(crate) conn: Arc<SharedConnection>,
    /// The connections the partitions' non-blocking reads go out on:
    /// `conn`, a second shared one and, while a backlog is read, two more.
    pub(crate) lanes: Arc<Lanes>,
    /// The one blocking read of the partitions read out.
    pub(crate) idle: IdleReads,
    /// The handler service with its layers and the codec.
    pub(crate) runner: Runner,
    /// Closed while the service is paused: no handler starts.
    pub(crate) gate: Gate,
    /// Room for tasks: running handlers, and finished tasks waiting for
    /// their acks.
    pub(crate) room: Arc<Room>,
    pub(crate) acks: mpsc::UnboundedSender<Ack>,
    /// Where workers tell the runtime they were fenced.
    pub(crate) reports: mpsc::UnboundedSender<Report>,
    pub(crate) settings: ConsumerSettings,
    /// Ordered or concurrent partitions, from the settings.
    pub(crate) order: Order,
    /// The task metrics' handles.
    pub(crate) metrics: TaskMetrics,
    /// The sizes of the partitions this instance owns, as gauges.
    pub(crate) queue: QueueGauges,
    /// The watch of the due index: producers' delayed tasks.
    pub(crate) due: DueWatch,
    /// The indexer's round interval: the queue gauges are refreshed at
    /// least this often.
    pub(crate) interval: Duration,
    /// Whether tasks are tracked (docs/design.md §14), as last read.
    pub(crate) tracking: Watched,
    /// The tracked tasks running here, for their users' cancels.
    pub(crate) running: Arc<Running>,
    /// The instance's tokens of the service's rate limit.
    pub(crate) limiter: Arc<Limiter>,
    /// The running tasks of each key, under a limit per key.
    pub(crate) key_slots: Arc<KeySlots>,
    /// The tokens of each key, under a rate limit per key.
    pub(crate) key_rates: Arc<KeyRates>,
    /// The priority levels, from the settings (docs/design.md §17).
    pub(crate) levels: Levels,
    /// The partitions whose batch members' ends wait to be forwarded
    /// (docs/design.md §19).
    pub(crate) completions: Arc<Completions>,
}
