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

use tokio::sync::watch;

use super::key_wakes::KeyWakes;
use super::task_keys::TaskKeys;
use crate::config::ServiceName;
use crate::limits::Limits;
use crate::metrics as m;
use crate::presence::Presence;

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
    /// Where each key whose slot is given back (or, from [`KeyRates`] and
    /// [`TaskKeys`], whose tokens come back) is told: the batches holding
    /// entries of that key aside look again.
    ///
    /// [`KeyRates`]: super::key_rates::KeyRates
    wakes: Arc<KeyWakes>,
    waiting: metrics::Gauge,
    /// Where the tasks held aside are counted for the members record.
    presence: Arc<Presence>,
    /// With a function of the task as the key: the units and tokens this
    /// instance holds of each key, counted across the service in Redis
    /// instead of `running` (and of [`KeyRates`]).
    ///
    /// [`KeyRates`]: super::key_rates::KeyRates
    task_keys: OnceLock<Arc<TaskKeys>>,
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
            wakes: Arc::default(),
            waiting: metrics::gauge!(m::LIMITED_TASKS, &labels),
            task_keys: OnceLock::new(),
            presence,
        }
    }

    /// Counts the keys' runs and starts across the service with
    /// `task_keys` from now on (a function of the task gives the keys).
    pub(crate) fn count_in_redis(&self, task_keys: Arc<TaskKeys>) {
        let _ = self.task_keys.set(task_keys);
    }

    /// A slot for a task of `key` to start: `Ok(None)` when nothing limits
    /// it (no limit, or no key), `Err(Full)` when the key is at its limit
    /// (with keys from the task: or out of tokens of its rate).
    pub(crate) fn take(self: &Arc<Self>, key: Option<&str>) -> Result<Option<KeySlot>, Full> {
        if let (Some(task_keys), Some(key)) = (self.task_keys.get(), key) {
            if !self.keys_limited() {
                return Ok(None);
            }
            return match task_keys.take(key) {
                None => Err(Full),
                Some(None) => Ok(None),
                Some(Some(key)) => Ok(Some(KeySlot {
                    slots: self.clone(),
                    key,
                })),
            };
        }
        let (Some(key), Some(most)) = (key, self.limits.borrow().per_key()) else {
            return Ok(None);
        };
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

    /// Whether a task of `key` could take a slot now (with keys from the
    /// task: and a token).
    pub(crate) fn has_room(&self, key: Option<&str>) -> bool {
        if let (Some(task_keys), Some(key)) = (self.task_keys.get(), key) {
            return !self.keys_limited() || task_keys.has_room(key);
        }
        let (Some(key), Some(most)) = (key, self.limits.borrow().per_key()) else {
            return true;
        };
        let running = self.running.lock().expect("not poisoned");
        running.get(key).is_none_or(|n| *n < most)
    }

    /// Where the keys given a slot or tokens back are told.
    pub(crate) fn wakes(&self) -> &Arc<KeyWakes> {
        &self.wakes
    }

    /// Counts `n` more (or fewer) entries held aside, `key`'s (for the
    /// units and tokens sent for while they wait).
    pub(crate) fn held_aside(&self, key: Option<&str>, n: isize) {
        self.waiting.increment(n as f64);
        self.presence.held_aside(n);
        if let (Some(task_keys), Some(key)) = (self.task_keys.get(), key) {
            task_keys.waiting(key, n);
        }
    }

    fn give_back(&self, key: &Arc<str>) {
        if let Some(task_keys) = self.task_keys.get() {
            if task_keys.end(key) {
                self.wakes.tell(key);
            }
            return;
        }
        let mut running = self.running.lock().expect("not poisoned");
        if let Some(n) = running.get_mut(key) {
            *n = n.saturating_sub(1);
        }
        drop(running);
        self.wakes.tell(key);
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
