//! The instance's watch of the service's due index ([`crate::due`]): once a
//! second, one read of the notices due within the next two seconds,
//! whatever the number of partitions the instance owns. Those of its own
//! partitions are removed, and then each partition's housekeeping is told
//! to look at its delayed set (in that order: see [`crate::due`]).
//!
//! Reading two seconds ahead lets a housekeeping learn of a producer's
//! delayed task before it is due and move it when due to the millisecond
//! (the look tells the set's next due time); only a delay shorter than the
//! watch's period can be up to that period late. The instance's clock is
//! within `skew` of Redis's while it owns partitions (the indexer fences it
//! otherwise), well inside the two seconds.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::MissedTickBehavior;
use tokio_util::task::AbortOnDropHandle;
use tracing::{Instrument, debug, warn};

use crate::clock::Clock;
use crate::config::ServiceName;
use crate::connection::SharedConnection;
use crate::due;

/// How often the notices are read.
const WATCH_EVERY: Duration = Duration::from_secs(1);
/// How far ahead of the instance's clock a notice is taken: the period and
/// room for clock skew, so a notice is seen before it is due.
const AHEAD: Duration = Duration::from_secs(2);

/// The partitions watched: partition -> the watching worker's token and
/// its bell.
type Watched = BTreeMap<u32, (u64, Arc<Notify>)>;

/// An instance's watch of the due index; cheap to clone.
#[derive(Debug, Clone, Default)]
pub(crate) struct DueWatch {
    watched: Arc<Mutex<Watched>>,
}

/// One partition's place in the watch, until dropped.
#[derive(Debug)]
pub(crate) struct Watching {
    watch: DueWatch,
    partition: u32,
    token: u64,
    bell: Arc<Notify>,
}

impl DueWatch {
    /// Starts watching service `name`'s due index on `conn`, by `clock`,
    /// until the returned handle is dropped.
    pub(crate) fn spawn(
        name: ServiceName,
        conn: Arc<SharedConnection>,
        clock: Arc<dyn Clock>,
    ) -> (DueWatch, AbortOnDropHandle<()>) {
        let watch = DueWatch::default();
        let task = tokio::spawn(watch.clone().run(name, conn, clock).in_current_span());
        (watch, AbortOnDropHandle::new(task))
    }

    fn lock(&self) -> MutexGuard<'_, Watched> {
        self.watched.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Watches partition `p` for its owner with `token`; a newer owner on
    /// this instance takes the place over.
    pub(crate) fn watch(&self, p: u32, token: u64) -> Watching {
        let bell = Arc::new(Notify::new());
        self.lock().insert(p, (token, bell.clone()));
        Watching {
            watch: self.clone(),
            partition: p,
            token,
            bell,
        }
    }

    async fn run(self, name: ServiceName, conn: Arc<SharedConnection>, clock: Arc<dyn Clock>) {
        let mut tick = tokio::time::interval(WATCH_EVERY);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut failing = false;
        loop {
            tick.tick().await;
            if self.lock().is_empty() {
                continue;
            }
            let until = (clock.now() + AHEAD).as_millis() as u64;
            let noticed = match due::noticed(&conn, &name, until).await {
                Ok(noticed) => {
                    failing = false;
                    noticed
                }
                Err(e) => {
                    if !failing {
                        warn!(service = %name, cause = %e, "cannot read the due index; delayed tasks of producers wait for the slow check");
                    }
                    failing = true;
                    continue;
                }
            };
            let bells: Vec<(u32, Arc<Notify>)> = {
                let watched = self.lock();
                noticed
                    .into_iter()
                    .filter_map(|p| watched.get(&p).map(|(_, bell)| (p, bell.clone())))
                    .collect()
            };
            let partitions: Vec<u32> = bells.iter().map(|(p, _)| *p).collect();
            // A notice left in place is read again next time: one more look.
            if let Err(e) = due::clear(&conn, &name, &partitions).await {
                debug!(service = %name, cause = %e, "cannot remove notices from the due index");
            }
            for (_, bell) in bells {
                bell.notify_one();
            }
        }
    }
}

impl Watching {
    /// Resolves when a notice of the partition was taken (at once if one
    /// was taken since the last call).
    pub(crate) async fn noticed(&self) {
        self.bell.notified().await;
    }
}

impl Drop for Watching {
    fn drop(&mut self) {
        let mut watched = self.watch.lock();
        if watched
            .get(&self.partition)
            .is_some_and(|(token, _)| *token == self.token)
        {
            watched.remove(&self.partition);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_newer_owner_keeps_its_place_when_an_older_one_leaves() {
        let watch = DueWatch::default();
        let old = watch.watch(3, 7);
        let new = watch.watch(3, 8);
        drop(old);
        assert_eq!(watch.lock().get(&3).map(|(t, _)| *t), Some(8));
        drop(new);
        assert!(watch.lock().is_empty());
    }
}
