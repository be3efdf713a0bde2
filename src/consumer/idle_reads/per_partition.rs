//! The idle read on a Redis Cluster: one command cannot read streams of
//! several slots, so each partition has a reader of its own
//! ([`super::IdleReader`] with its partition), started when it first joins.

use std::collections::BTreeMap;

use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tracing::Instrument;

use super::{IdleReader, Request, Setup};

/// The task behind [`IdleReads`] on a Cluster: it hands each request to
/// the reader of its partition, started on the partition's first join.
/// The readers end when it does (dropped with their `JoinSet`).
pub(super) async fn run(setup: Setup, mut requests: mpsc::UnboundedReceiver<Request>) {
    let mut readers: BTreeMap<u32, mpsc::UnboundedSender<Request>> = BTreeMap::new();
    let mut tasks = JoinSet::new();
    while let Some(request) = requests.recv().await {
        let partition = match &request {
            Request::Join { store, .. } => store.partition(),
            Request::Leave { partition, .. } => *partition,
        };
        let reader = readers.entry(partition).or_insert_with(|| {
            let (tx, rx) = mpsc::unbounded_channel();
            let reader = IdleReader::new(setup.clone(), Some(partition), rx);
            tasks.spawn(reader.run().in_current_span());
            tx
        });
        // A reader ends only with this task; a leave it cannot answer
        // answers itself (its sender is dropped).
        let _ = reader.send(request);
    }
}
