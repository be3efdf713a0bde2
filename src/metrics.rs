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
}
