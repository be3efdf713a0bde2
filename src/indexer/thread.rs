//! The rounds run on a thread of their own, on a single-threaded tokio
//! runtime, with a connection made on that runtime.
//!
//! Why: every owned partition's lease is renewed only by the next round's
//! assignment, and for an instance whose offset lies near `I/2` that
//! assignment has little more than the lease margin (20 ms by default) to
//! arrive in (docs/design.md §2.1). On the instance's shared runtime a
//! handler that computes without yielding, or a burst of tasks in a debug
//! build, delays the round's timer or its reply past that: the lease lapses,
//! every partition is fenced, and the tasks in flight run again elsewhere
//! (seen in 1 of 6 runs of the three-instance test once acks were batched
//! more). A thread is scheduled by the operating system whatever the
//! runtime's tasks do, as a Kafka consumer heartbeats from a thread of its
//! own for the same reason.

use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::round::RoundLoop;
use crate::error::{Error, Result};

/// The rounds' thread; [`wait`](RoundThread::wait) resolves once it has
/// ended.
#[derive(Debug)]
pub(super) struct RoundThread {
    ended: Option<oneshot::Receiver<()>>,
}

impl RoundThread {
    /// Checks the clock against Redis on the new thread (a bad clock is
    /// reported before the first round, which would then write nothing)
    /// and the membership's settings (a wrong etcd password is refused),
    /// then runs the rounds there until `stop`, or until a graceful leave
    /// (`leave`) has ended.
    pub(super) async fn start(
        mut rounds: RoundLoop,
        stop: CancellationToken,
        leave: CancellationToken,
    ) -> Result<RoundThread> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| Error::Runtime(format!("cannot build the indexer's runtime: {e}")))?;
        let (checked_tx, checked) = oneshot::channel();
        let (ended_tx, ended) = oneshot::channel();
        // The caller's subscriber (a scoped one too) and span.
        let dispatch = tracing::dispatcher::get_default(|d| d.clone());
        let span = tracing::Span::current();
        let body = async move {
            let clock = match rounds.check_clock().await {
                Ok(()) => rounds.check_membership().await,
                failed => failed,
            };
            let ok = clock.is_ok();
            if checked_tx.send(clock).is_ok() && ok {
                rounds.run(stop, leave).await;
            }
        };
        std::thread::Builder::new()
            .name("peerq-rounds".to_owned())
            .spawn(move || {
                tracing::dispatcher::with_default(&dispatch, || {
                    runtime.block_on(body.instrument(span));
                });
                // The runtime, its timers and its connection go with the
                // thread.
                drop(runtime);
                let _ = ended_tx.send(());
            })
            .map_err(|e| Error::Runtime(format!("cannot start the indexer's thread: {e}")))?;
        let clock = checked.await.unwrap_or_else(|_| {
            Err(Error::Runtime(
                "the indexer's thread ended before its first check".to_owned(),
            ))
        });
        clock?;
        Ok(RoundThread { ended: Some(ended) })
    }

    /// Waits until the thread has ended.
    pub(super) async fn wait(&mut self) {
        if let Some(ended) = self.ended.take() {
            let _ = ended.await;
        }
    }
}
