//! A fetch loop's side of the instance's idle read ([`crate::consumer::idle_reads`]):
//! waiting in it for a delivery, and leaving it with whatever it
//! delivered meanwhile.

use std::time::Duration;

use tracing::error;

use super::{Fetcher, Idle, Position};
use crate::consumer::idle_reads::Delivery;
use crate::consumer::limiter::Reserved;
use crate::consumer::run::Source;

impl Fetcher {
    /// In the idle read: waits for its delivery, a stop or the next claim;
    /// false when stopped.
    pub(super) async fn wait_idle(&self, idle: &mut Idle, at: &mut Position) -> bool {
        let delivery = tokio::select! {
            biased;
            _ = self.ownership.stop.cancelled() => return false,
            delivery = idle.delivered.recv() => delivery,
            // Concurrent partitions claim while they stay in the idle read.
            _ = tokio::time::sleep_until(at.next_claim) => return true,
        };
        match delivery {
            Some(Delivery::Entries { fetched, out }) => {
                idle.joined &= !out;
                self.dispatch(fetched, Source::New, at, Reserved::none())
                    .await
            }
            Some(Delivery::Failed) => {
                idle.joined = false;
                self.reread(at);
                true
            }
            // Never: `idle` holds a sender.
            None => false,
        }
    }

    /// Leaves the idle read, if in it, and dispatches what it delivered
    /// until then (after a stop, those are handed back); false when
    /// stopped.
    pub(super) async fn leave_idle(&self, idle: &mut Idle, at: &mut Position) -> bool {
        if !idle.joined {
            return !self.ownership.stop.is_cancelled();
        }
        idle.joined = false;
        let store = &self.ownership.store;
        let leave = self.shared.idle.leave(store.partition(), store.token());
        // The read ends by its block time at the latest.
        let wait = self.shared.settings.block + Duration::from_secs(2);
        if tokio::time::timeout(wait, leave).await.is_err() {
            error!(
                partition = self.partition,
                "the idle read did not let the partition go; its entries stay pending until claimed"
            );
        }
        while let Ok(delivery) = idle.delivered.try_recv() {
            match delivery {
                Delivery::Entries { fetched, .. } => {
                    if !self
                        .dispatch(fetched, Source::New, at, Reserved::none())
                        .await
                    {
                        return false;
                    }
                }
                Delivery::Failed => self.reread(at),
            }
        }
        !self.ownership.stop.is_cancelled()
    }
}
