//! The instances' and producers' view of `{N}:tracking`: read every
//! second, so a change an operator makes reaches every part within about
//! a second; between reads, what they last read holds (and, if Redis cannot
//! be read, what they last read stays).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::task::AbortOnDropHandle;
use tracing::{Instrument, info, warn};

use super::Tracking;
use crate::config::ServiceName;
use crate::connection::SharedConnection;

/// How often the key is read.
pub(crate) const PERIOD: Duration = Duration::from_secs(1);

/// A consumer's view: the settings as last read; cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct Watched(watch::Receiver<Tracking>);

impl Watched {
    /// The settings if tracking is on now.
    pub(crate) fn on(&self) -> Option<Tracking> {
        let now = *self.0.borrow();
        now.is_on().then_some(now)
    }

    /// The settings as last read, on or off: an owner keeps the records
    /// of its partitions by their retention either way.
    pub(crate) fn settings(&self) -> Tracking {
        *self.0.borrow()
    }

    /// Resolves when the settings change (never, once the watcher is
    /// gone).
    pub(crate) async fn changed(&mut self) {
        if self.0.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// Watches service `name`'s tracking from `first` (what the consumer's
/// start found), until the handle is dropped.
pub(crate) fn watch(
    name: ServiceName,
    conn: Arc<SharedConnection>,
    first: Tracking,
) -> (Watched, AbortOnDropHandle<()>) {
    let (tx, rx) = watch::channel(first);
    let task = async move {
        let mut failing = false;
        loop {
            tokio::time::sleep(PERIOD).await;
            match super::read(&conn, &name).await {
                Ok(now) => {
                    failing = false;
                    let now = now.unwrap_or_default();
                    let was = *tx.borrow();
                    if was.is_on() != now.is_on() {
                        info!(service = %name, on = now.is_on(), "task tracking switched");
                    }
                    tx.send_if_modified(|t| std::mem::replace(t, now) != now);
                }
                Err(e) if !failing => {
                    failing = true;
                    warn!(service = %name, cause = %e, "cannot read whether tasks are tracked; keeping the last answer");
                }
                Err(_) => {}
            }
        }
    };
    let handle = tokio::spawn(task.in_current_span());
    (Watched(rx), AbortOnDropHandle::new(handle))
}

/// A producer's view: read on an enqueue once the last read is a second
/// old, not by a task of its own (a producer may live on no runtime
/// between calls).
#[derive(Debug, Default)]
pub(crate) struct Cached {
    last: Mutex<Option<(Instant, Tracking)>>,
}

impl Cached {
    /// Tracking if on, read again when the last read is a second old; on
    /// an error, the last answer (off if none).
    pub(crate) async fn on(&self, conn: &SharedConnection, name: &ServiceName) -> Option<Tracking> {
        let known = *self.last.lock().expect("not poisoned");
        if let Some((at, tracking)) = known
            && at.elapsed() < PERIOD
        {
            return tracking.is_on().then_some(tracking);
        }
        let tracking = match super::read(conn, name).await {
            Ok(now) => now.unwrap_or_default(),
            Err(e) => {
                warn!(service = %name, cause = %e, "cannot read whether tasks are tracked; keeping the last answer");
                known.map(|(_, t)| t).unwrap_or_default()
            }
        };
        *self.last.lock().expect("not poisoned") = Some((Instant::now(), tracking));
        tracking.is_on().then_some(tracking)
    }
}
