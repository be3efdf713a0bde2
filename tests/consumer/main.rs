//! The consumer against a real redis-server, instances in this process:
//! attempts and failures, interrupted runs, claims, handovers, frozen
//! instances, idle reads, bounded memory, ordered partitions, pause,
//! the producer's batches, release marks, scheduling and starting before
//! Redis.

// The harness crate, named `support` in every module of this binary.
extern crate peerq_test_support as support;

mod attempts;
mod batches;
mod cancellation;
mod claims;
mod consumer;
mod failures;
mod flows;
mod frozen;
mod handover;
mod headers;
mod idle;
mod key_rate;
mod limit_key;
mod limits;
mod memory;
mod ordered;
mod pause;
mod per_key;
mod priority;
mod producer;
mod release_marks;
mod rereads;
mod reshard;
mod scheduling;
mod singleton;
mod startup;
mod tracking;
mod unique;

/// A consumer running in this test's runtime until `stop` fires.
struct Instance {
    stop: tokio_util::sync::CancellationToken,
    task: tokio::task::JoinHandle<peerq::Result<()>>,
}

impl Instance {
    /// Leaves gracefully and waits until it has left.
    async fn leave(self) {
        self.stop.cancel();
        self.task.await.unwrap().unwrap();
    }
}

/// A producer of service `name` at `url` with `partitions`.
async fn producer(url: &str, name: &str, partitions: u32) -> peerq::Producer {
    peerq::Producer::builder()
        .name(name)
        .redis(url)
        .partitions(partitions)
        .connect()
        .await
        .unwrap()
}
