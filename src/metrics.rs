//! Metric names, as constants, and their descriptions.
//!
//! peerq records through the `metrics` facade; install any exporter
//! (Prometheus, StatsD, …) in the application to collect them.

/// Counter of indexer rounds, labelled `service` and `outcome`
/// (`assigned`, `joining`, `fenced`, `left`).
pub const ROUNDS_TOTAL: &str = "peerq_rounds_total";
/// Gauge: this instance's current index (0 while it holds none).
pub const INDEX: &str = "peerq_index";
/// Gauge: the current number of replicas (0 while this instance holds no index).
pub const REPLICAS: &str = "peerq_replicas";
/// Gauge: this instance's clock minus Redis's, in seconds.
pub const CLOCK_OFFSET_SECONDS: &str = "peerq_clock_offset_seconds";
/// Counter of partition changes on this instance, labelled `service` and
/// `change` (`started`, `stopped`, `drained`).
pub const PARTITION_CHANGES_TOTAL: &str = "peerq_partition_changes_total";
/// Gauge: the partitions this instance fetches.
pub const OWNED_PARTITIONS: &str = "peerq_owned_partitions";

/// Counter of task runs and what became of them, labelled `service` and
/// `outcome`: handler runs by how they ended (`ok`, `failed`: an error or
/// a panic, `interrupted`: cut off at a drain timeout, a lapsed lease or a
/// fence, Redis's or the handler's (`Disposition::Stale`); it runs again
/// and spends none of `max_attempts`; `cancelled`: stopped by a user's
/// cancel, tracked tasks only), and failed or unreadable tasks by
/// where they went (`retried`: enqueued for another attempt, `dead`: moved
/// to the dead letters).
pub const TASKS_TOTAL: &str = "peerq_tasks_total";
/// Counter of singleton job runs (docs/design.md §20), labelled
/// `service`, `name` and `outcome`: `ok` (it returned `Ok`), `failed` (an
/// error), `panicked`, `interrupted` (stopped by a handover, a fence or a
/// pause). A run that ends by itself is restarted with backoff while the
/// instance holds the singleton.
pub const SINGLETON_RUNS_TOTAL: &str = "peerq_singleton_runs_total";
/// Gauge, labelled `service` and `name`: 1 while this instance holds the
/// singleton (from its acquire to its job's end at a release), else 0
/// (from the start, on every instance that declares it).
pub const SINGLETON_HELD: &str = "peerq_singleton_held";
/// Histogram of handler run times, in seconds, labelled `service`.
pub const TASK_DURATION_SECONDS: &str = "peerq_task_duration_seconds";
/// Histogram of the time from a task's enqueue (`enqueued_at`) to the
/// start of its handler run, in seconds, labelled `service`. For a retry
/// it includes the earlier attempts and the backoff.
pub const TASK_WAIT_SECONDS: &str = "peerq_task_wait_seconds";
/// Gauge: handler runs in progress on this instance, labelled `service`.
pub const TASKS_IN_FLIGHT: &str = "peerq_tasks_in_flight";
/// Gauge: entries of the partitions this instance owns that are not yet
/// delivered or not yet acknowledged, labelled `service`.
pub const BACKLOG_ENTRIES: &str = "peerq_backlog_entries";
/// Gauge: dead letters of the partitions this instance owns, labelled
/// `service`.
pub const DEAD_LETTERS: &str = "peerq_dead_letters";
/// Gauge: delayed tasks (retries waiting for their backoff) of the
/// partitions this instance owns, labelled `service`.
pub const DELAYED_TASKS: &str = "peerq_delayed_tasks";
/// Histogram of handover pauses, in seconds, labelled `service`: from the
/// moment the previous owner's release mark was written to the new owner's
/// start of the partition; for an acquire that waited for its deadline
/// (no mark came), from the start of the acquire's epoch.
pub const HANDOVER_PAUSE_SECONDS: &str = "peerq_handover_pause_seconds";
/// Counter of tasks a producer enqueued, labelled `service`.
pub const ENQUEUED_TOTAL: &str = "peerq_enqueued_total";
/// Counter of a producer's failed enqueue calls, labelled `service`.
pub const ENQUEUE_ERRORS_TOTAL: &str = "peerq_enqueue_errors_total";

/// Gauge, labelled `service`: 1 while the service is paused (`{N}:paused`
/// exists, as this instance last read it), else 0.
pub const PAUSED: &str = "peerq_paused";

/// Gauge, labelled `service` and `limit` (`rate`): tasks read by this
/// instance that wait for a token of the service's limit now.
pub const LIMITED_TASKS: &str = "peerq_limited_tasks";

/// Counter, labelled `service` and `limit` (`rate`): tokens this instance
/// leased from the service's limit.
pub const LIMIT_TOKENS_TOTAL: &str = "peerq_limit_tokens_total";

/// Counter of [`MajorityIds`](crate::ids::MajorityIds) attempts, labelled
/// `key` (the sequence) and `outcome`: `issued` (a majority took the ID),
/// `lost` (another caller won the ID, or a higher one won first: then it is
/// a gap) or `unavailable` (too few servers could vote). Attempts per issued ID
/// is the cost of contention.
pub const IDS_ATTEMPTS_TOTAL: &str = "peerq_ids_attempts_total";

/// Registers the descriptions of every metric with the installed recorder.
pub fn describe() {
    metrics::describe_counter!(ROUNDS_TOTAL, "indexer rounds by outcome");
    metrics::describe_gauge!(INDEX, "this instance's index in its service (0: none)");
    metrics::describe_gauge!(
        REPLICAS,
        "instances in the service, as of the last assignment"
    );
    metrics::describe_gauge!(
        CLOCK_OFFSET_SECONDS,
        metrics::Unit::Seconds,
        "this instance's clock minus Redis TIME"
    );
    metrics::describe_counter!(
        PARTITION_CHANGES_TOTAL,
        "partitions started, stopped and drained by this instance"
    );
    metrics::describe_gauge!(OWNED_PARTITIONS, "partitions this instance fetches");
    metrics::describe_counter!(
        TASKS_TOTAL,
        "task runs by outcome: ok, failed, interrupted, cancelled; and retried or dead"
    );
    metrics::describe_histogram!(
        TASK_DURATION_SECONDS,
        metrics::Unit::Seconds,
        "handler run time"
    );
    metrics::describe_histogram!(
        TASK_WAIT_SECONDS,
        metrics::Unit::Seconds,
        "time from enqueue to the handler's start"
    );
    metrics::describe_gauge!(TASKS_IN_FLIGHT, "handler runs in progress");
    metrics::describe_gauge!(
        BACKLOG_ENTRIES,
        "entries not yet delivered or acknowledged, in the partitions this instance owns"
    );
    metrics::describe_gauge!(
        DEAD_LETTERS,
        "dead letters of the partitions this instance owns"
    );
    metrics::describe_gauge!(
        DELAYED_TASKS,
        "delayed retries of the partitions this instance owns"
    );
    metrics::describe_histogram!(
        HANDOVER_PAUSE_SECONDS,
        metrics::Unit::Seconds,
        "from a partition's release mark (or its epoch's start) to the new owner's start"
    );
    metrics::describe_gauge!(
        PAUSED,
        "1 while the service is paused, as this instance last read it"
    );
    metrics::describe_gauge!(
        LIMITED_TASKS,
        "tasks read by this instance that wait for a token of the service's limit"
    );
    metrics::describe_counter!(
        LIMIT_TOKENS_TOTAL,
        "tokens this instance leased from the service's limit"
    );
    metrics::describe_counter!(ENQUEUED_TOTAL, "tasks enqueued by producers");
    metrics::describe_counter!(ENQUEUE_ERRORS_TOTAL, "failed enqueue calls");
    metrics::describe_counter!(
        IDS_ATTEMPTS_TOTAL,
        "MajorityIds attempts by outcome: issued, lost, unavailable"
    );
}
