//! The instance's etcd lease: every registration it writes lives under it,
//! so a crashed or frozen instance's registration for the open round
//! disappears with the lease, before that round closes if the crash came
//! early enough (docs/design.md §2.2, crash detection).
//!
//! The keep-alives only keep the registrations' keys; they never make an
//! instance's standing (that comes from its own reads of closed rounds).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::task::JoinHandle;
use tracing::debug;

use super::endpoints::Endpoints;

/// A granted lease and the task that keeps it alive.
#[derive(Debug)]
pub(super) struct Lease {
    id: i64,
    /// Set when etcd says the lease is gone (its TTL passed without a
    /// keep-alive): the next registration needs a new one.
    lost: Arc<AtomicBool>,
    keeper: JoinHandle<()>,
}

impl Lease {
    /// Asks for a lease of `ttl` (etcd may raise it to its minimum, 1.5
    /// election timeouts) and starts keeping it alive on this runtime.
    pub(super) async fn grant(
        endpoints: &mut Endpoints,
        ttl: Duration,
    ) -> Result<Lease, etcd_client::Error> {
        let secs = ttl.as_secs().max(1) as i64;
        let granted = endpoints
            .run(|mut client| async move { client.lease_grant(secs, None).await })
            .await?;
        let id = granted.id();
        // A keep-alive every quarter of the TTL, each given a quarter on
        // one endpoint: after one that hangs, the next endpoint is asked
        // at once, and answers within three quarters of the TTL (etcd
        // itself finds an expiry up to ~0.5 s late, the safe side here).
        let ttl = Duration::from_secs(granted.ttl().max(1) as u64);
        let lost = Arc::new(AtomicBool::new(false));
        let keeper = keep(endpoints.fresh(ttl / 4), id, ttl / 4, lost.clone());
        let keeper = tokio::spawn(keeper);
        Ok(Lease { id, lost, keeper })
    }

    /// The lease's id, while etcd has not said it is gone.
    pub(super) fn id(&self) -> Option<i64> {
        (!self.lost.load(Ordering::Relaxed)).then_some(self.id)
    }

    /// Gives the lease back: its registrations disappear at once.
    pub(super) async fn revoke(self, endpoints: &mut Endpoints) {
        self.keeper.abort();
        let id = self.id;
        let revoked = endpoints
            .run(|mut client| async move { client.lease_revoke(id).await })
            .await;
        if let Err(e) = revoked {
            debug!(cause = %e, "etcd lease not revoked; it expires by itself");
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.keeper.abort();
    }
}

/// Sends a keep-alive every `every` (a quarter of the TTL), over one
/// stream opened again at once after any error (on the next endpoint),
/// until etcd answers that the lease is gone. `endpoints`' patience bounds
/// both the opening and each answer.
async fn keep(mut endpoints: Endpoints, id: i64, every: Duration, lost: Arc<AtomicBool>) {
    let mut stream = None;
    let mut failed = false;
    loop {
        if !failed {
            tokio::time::sleep(every).await;
        }
        failed = false;
        if stream.is_none() {
            let opened = endpoints
                .run(|mut client| async move { client.lease_keep_alive(id).await })
                .await;
            stream = opened.ok();
        }
        let Some((keeper, answers)) = stream.as_mut() else {
            continue;
        };
        let answer = async {
            keeper.keep_alive().await?;
            answers.message().await
        };
        match tokio::time::timeout(endpoints.patience(), answer).await {
            Ok(Ok(Some(answer))) if answer.ttl() > 0 => {}
            Ok(Ok(Some(_))) => {
                debug!(
                    lease = id,
                    "etcd lease expired; the next registration takes a new one"
                );
                lost.store(true, Ordering::Relaxed);
                return;
            }
            // No answer in time, or the stream broke: open it again on the
            // next endpoint; a lease that expired meanwhile is found at the
            // next answer.
            _ => {
                stream = None;
                endpoints.failed();
                failed = true;
            }
        }
    }
}
