//! The idle read's one blocking read, and the unblocks that cut it short
//! when a partition joins or leaves meanwhile.

use std::sync::Arc;
use std::time::Duration;

use super::{IdleReader, Request, UNBLOCK_AGAIN};
use crate::consumer::store::{self, BlockingReads, Fetched, PartitionStore};

impl IdleReader {
    /// Reads the members' streams, blocking up to `wait`. Requests that
    /// arrive meanwhile unblock the read and are returned, to be applied
    /// after its answer is delivered (`None`: every handle is gone).
    pub(super) async fn read(
        &mut self,
        reader: &mut BlockingReads,
        count: usize,
        wait: Duration,
    ) -> (
        crate::error::Result<Vec<(u32, Vec<Fetched>)>>,
        Option<Vec<Request>>,
    ) {
        let client_id = reader.client_id();
        let node = reader.node().map(|(host, port)| (host.to_owned(), port));
        let stores: Vec<Arc<PartitionStore>> =
            self.members.values().map(|m| m.store.clone()).collect();
        let refs: Vec<&PartitionStore> = stores.iter().map(|s| &**s).collect();
        let read = reader.read(&refs, count, wait);
        tokio::pin!(read);
        let mut later = Some(Vec::new());
        let mut unblocking = false;
        let result = loop {
            tokio::select! {
                biased;
                result = &mut read => break result,
                request = self.requests.recv(), if later.is_some() => match request {
                    Some(request) => {
                        later.as_mut().expect("checked").push(request);
                        unblocking = true;
                    }
                    None => {
                        later = None;
                        unblocking = true;
                    }
                },
                // Until it returns: an unblock that overtook the read
                // found nothing blocked.
                _ = tokio::time::sleep(UNBLOCK_AGAIN), if unblocking => {}
            }
            if unblocking {
                let node = node.as_ref().map(|(host, port)| (host.as_str(), *port));
                let _ = store::unblock(&self.setup.conn, client_id, node).await;
            }
        };
        let result = result.map(|read| {
            read.into_iter()
                .map(|(at, fetched)| (stores[at].partition(), fetched))
                .collect()
        });
        (result, later)
    }
}
