//! Concurrency per key (docs/design.md §15): at most `n` tasks of one
//! partition key run at once, counted by the partition's owner in memory.
//!
//! Why in memory: a key chooses the partition, and a partition has one
//! owner at a time, so the owner sees every run of its keys. A graceful
//! handover drains the old owner's runs before the next owner starts
//! (drain-then-switch), so the count moves with the partition; after a
//! crash or a freeze, a frozen holder may still be running (rule 9), and
//! its runs can then exceed the bound until they end.
//!
//! Entries whose key is full step aside ([`Batch`](super::run::Batch)
//! keeps them, held and kept fresh) so that other keys' entries behind
//! them still start; a partition holds at most [`MOST_THROTTLED`] of them,
//! and reads nothing more while it does.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use tokio::sync::{broadcast, watch};

use super::key_units::KeyUnits;
use crate::config::ServiceName;
use crate::limits::Limits;
use crate::metrics as m;
use crate::presence::Presence;

/// How many freed keys a batch may fall behind by before it looks at all
/// its entries aside again.
const FREED_BACKLOG: usize = 4_096;

/// Keys past this many are forgotten once none of their tasks runs.
const KEPT: usize = 10_000;

/// The most entries a partition holds aside for keys at their limit;
/// beyond, it reads nothing new until some start.
pub(crate) const MOST_THROTTLED: usize = 1_000;

/// The running tasks of each limited key on this instance.
pub(crate) struct KeySlots {
    limits: watch::Receiver<Limits>,
    /// Keys stay at 0 (a start after an end allocates nothing) until
    /// [`KEPT`] of them are known.
    running: Mutex<HashMap<Arc<str>, u32>>,
    /// Each key whose slot is given back (or, from [`KeyRates`], whose
    /// tokens come back): the entries of that key held aside look again.
    ///
    /// [`KeyRates`]: super::key_rates::KeyRates
    freed: broadcast::Sender<Arc<str>>,
    waiting: metrics::Gauge,
    /// Where the tasks held aside are counted for the members record.
    presence: Arc<Presence>,
    /// With a function of the task as the key: the units each key's
    /// running tasks hold, counted across the service in Redis instead of
    /// `running`.
    units: OnceLock<Arc<KeyUnits>>,
}

impl KeySlots {
    /// The slots of service `name`, following `limits`; the tasks held
    /// aside are counted in `presence` too.
    pub(crate) fn new(
        name: &ServiceName,
        limits: watch::Receiver<Limits>,
        presence: Arc<Presence>,
    ) -> Self {
        let labels = [
            ("service", name.to_string()),
            ("limit", "per_key".to_owned()),
        ];
        KeySlots {
            limits,
            running: Mutex::new(HashMap::new()),
            freed: broadcast::channel(FREED_BACKLOG).0,
            waiting: metrics::gauge!(m::LIMITED_TASKS, &labels),
            units: OnceLock::new(),
            presence,
        }
    }

    /// Counts the keys' runs across the service with `units` from now on
    /// (a function of the task gives the keys).
    pub(crate) fn count_in_redis(&self, units: Arc<KeyUnits>) {
        let _ = self.units.set(units);
    }

    /// A slot for a task of `key` to start: `Ok(None)` when nothing limits
    /// it (no limit, or no key), `Err(())` when the key is at its limit.
    pub(crate) fn take(self: &Arc<Self>, key: Option<&str>) -> Result<Option<KeySlot>, Full> {
        let (Some(key), Some(most)) = (key, self.limits.borrow().per_key()) else {
            return Ok(None);
        };
        if let Some(units) = self.units.get() {
            if !units.take(key) {
                return Err(Full);
            }
            let key = Arc::from(key);
            return Ok(Some(KeySlot {
                slots: self.clone(),
                key,
            }));
        }
        let mut running = self.running.lock().expect("not poisoned");
        if running.len() >= KEPT {
            running.retain(|_, n| *n > 0);
        }
        let key = match running.get_key_value(key) {
            Some((known, _)) => known.clone(),
            None => {
                let new: Arc<str> = Arc::from(key);
                running.insert(new.clone(), 0);
                new
            }
        };
        let n = running.get_mut(&key).expect("just found or added");
        if *n >= most {
            return Err(Full);
        }
        *n += 1;
        Ok(Some(KeySlot {
            slots: self.clone(),
            key,
        }))
    }

    /// Whether a limit per key (a concurrency or a rate) is in force.
    pub(crate) fn keys_limited(&self) -> bool {
        let limits = self.limits.borrow();
        limits.per_key().is_some() || limits.rate_limit_per_key().is_some()
    }

    /// Whether a task of `key` could take a slot now.
    pub(crate) fn has_room(&self, key: Option<&str>) -> bool {
        let (Some(key), Some(most)) = (key, self.limits.borrow().per_key()) else {
            return true;
        };
        if let Some(units) = self.units.get() {
            return units.has_room(key);
        }
        let running = self.running.lock().expect("not poisoned");
        running.get(key).is_none_or(|n| *n < most)
    }

    /// Told each key whose slot is given back or whose tokens came back.
    pub(crate) fn watch_freed(&self) -> broadcast::Receiver<Arc<str>> {
        self.freed.subscribe()
    }

    /// Where the keys whose tokens came back are told.
    pub(crate) fn freed(&self) -> broadcast::Sender<Arc<str>> {
        self.freed.clone()
    }

    /// Counts `n` more (or fewer) entries held aside, `key`'s (for the
    /// units sent for while they wait).
    pub(crate) fn held_aside(&self, key: Option<&str>, n: isize) {
        self.waiting.increment(n as f64);
        self.presence.held_aside(n);
        if let (Some(units), Some(key)) = (self.units.get(), key) {
            units.waiting(key, n);
        }
    }

    fn give_back(&self, key: &Arc<str>) {
        if let Some(units) = self.units.get() {
            if units.give_back(key) {
                let _ = self.freed.send(key.clone());
            }
            return;
        }
        let mut running = self.running.lock().expect("not poisoned");
        if let Some(n) = running.get_mut(key) {
            *n = n.saturating_sub(1);
        }
        drop(running);
        // None listening (nothing held aside) is no error.
        let _ = self.freed.send(key.clone());
    }
}

/// A key at its limit.
#[derive(Debug)]
pub(crate) struct Full;

/// One running task's slot of its key, given back when dropped.
pub(crate) struct KeySlot {
    slots: Arc<KeySlots>,
    key: Arc<str>,
}

impl Drop for KeySlot {
    fn drop(&mut self) {
        self.slots.give_back(&self.key);
    }
}
