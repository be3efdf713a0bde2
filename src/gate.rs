//! The pause gate (docs/design.md §7): while the service's `{N}:paused`
//! key exists, no handler starts on this instance, and no singleton's job
//! runs (§20).
//!
//! It is a gate in front of the handler call and nothing else: the lease,
//! the workers' stops and the transition machine never hear of it, so
//! rounds, handovers, acks of running tasks, promotion of retries and
//! periodic triggers go on while paused. Entries already read wait behind
//! it, pending in Redis (a handover moves them as usual), and the fetch
//! loops read nothing new meanwhile.
//!
//! One watcher per instance reads the key every interval or every second,
//! whichever is shorter, on the instance's shared connection: a `GET`,
//! never blocking.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::task::AbortOnDropHandle;
use tracing::{Instrument, info, warn};

use crate::config::ServiceName;
use crate::connection::SharedConnection;
use crate::metrics as m;
use crate::pause::{self, Pause};

/// Whether handlers may start; cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct Gate {
    open: watch::Receiver<bool>,
}

impl Gate {
    /// Whether a handler may start now.
    pub(crate) fn is_open(&self) -> bool {
        *self.open.borrow()
    }

    /// Resolves once handlers may start (at once if they may now).
    pub(crate) async fn opened(&self) {
        let mut open = self.open.clone();
        // The watcher outlives every task that waits here; if it were gone,
        // the gate would stay as it was.
        if open.wait_for(|open| *open).await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// Resolves once the service is paused (at once if it is now): a
    /// singleton's run stops then (docs/design.md §20).
    pub(crate) async fn closed(&self) {
        let mut open = self.open.clone();
        if open.wait_for(|open| !*open).await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// Resolves once handlers may start, or at `until`, whichever is first.
    pub(crate) async fn opened_or(&self, until: Instant) {
        tokio::select! {
            _ = self.opened() => {}
            _ = tokio::time::sleep_until(until) => {}
        }
    }
}

/// Starts the watcher of service `name`'s pause key, reading it every
/// `period`, until the returned handle is dropped (also when the
/// consumer's future is dropped rather than run to its end). The gate stays
/// closed until the first read answers: an instance started while the
/// service is paused runs nothing.
pub(crate) fn watch(
    name: ServiceName,
    conn: Arc<SharedConnection>,
    period: Duration,
) -> (Gate, AbortOnDropHandle<()>) {
    let (tx, rx) = watch::channel(false);
    let watcher = Watcher {
        paused: metrics::gauge!(m::PAUSED, "service" => name.to_string()),
        name,
        conn,
        period,
        tx,
    };
    let handle = tokio::spawn(watcher.run().in_current_span());
    (Gate { open: rx }, AbortOnDropHandle::new(handle))
}

struct Watcher {
    name: ServiceName,
    conn: Arc<SharedConnection>,
    period: Duration,
    tx: watch::Sender<bool>,
    paused: metrics::Gauge,
}

impl Watcher {
    async fn run(self) {
        // `None` until the first answer; then the last one.
        let mut known: Option<Option<Pause>> = None;
        let mut failing = false;
        loop {
            match pause::read(&self.conn, &self.name).await {
                Ok(now) => {
                    failing = false;
                    if known.as_ref() != Some(&now) {
                        self.changed(known.is_none(), &now);
                    }
                    known = Some(now);
                }
                // Kept as it was: a Redis that cannot be read neither
                // pauses nor resumes the service.
                Err(e) if !failing => {
                    failing = true;
                    warn!(service = %self.name, cause = %e, "cannot read whether the service is paused; keeping the last answer");
                }
                Err(_) => {}
            }
            tokio::time::sleep(self.period).await;
        }
    }

    fn changed(&self, first: bool, now: &Option<Pause>) {
        match now {
            Some(pause) => {
                info!(service = %self.name, by = %pause.by, at_ms = pause.at_ms, "service paused: no handler starts until it is resumed");
            }
            None if !first => info!(service = %self.name, "service resumed"),
            None => {}
        }
        self.paused.set(if now.is_some() { 1.0 } else { 0.0 });
        self.tx.send_replace(now.is_none());
    }
}
