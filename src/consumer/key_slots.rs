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
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

use crate::config::ServiceName;
use crate::limits::Limits;
use crate::metrics as m;

/// The most entries a partition holds aside for keys at their limit;
/// beyond, it reads nothing new until some start.
pub(crate) const MOST_THROTTLED: usize = 1_000;

/// The running tasks of each limited key on this instance.
pub(crate) struct KeySlots {
    limits: watch::Receiver<Limits>,
    running: Mutex<HashMap<String, u32>>,
    /// Bumped when a slot is given back: the entries held aside look again.
    freed: watch::Sender<u64>,
    waiting: metrics::Gauge,
}

impl KeySlots {
    /// The slots of service `name`, following `limits`.
    pub(crate) fn new(name: &ServiceName, limits: watch::Receiver<Limits>) -> Self {
        let labels = [
            ("service", name.to_string()),
            ("limit", "per_key".to_owned()),
        ];
        KeySlots {
            limits,
            running: Mutex::new(HashMap::new()),
            freed: watch::channel(0).0,
            waiting: metrics::gauge!(m::LIMITED_TASKS, &labels),
        }
    }

    /// A slot for a task of `key` to start: `Ok(None)` when nothing limits
    /// it (no limit, or no key), `Err(())` when the key is at its limit.
    pub(crate) fn take(self: &Arc<Self>, key: Option<&str>) -> Result<Option<KeySlot>, Full> {
        let (Some(key), Some(most)) = (key, self.limits.borrow().per_key()) else {
            return Ok(None);
        };
        let mut running = self.running.lock().expect("not poisoned");
        let n = running.entry(key.to_owned()).or_default();
        if *n >= most {
            return Err(Full);
        }
        *n += 1;
        Ok(Some(KeySlot {
            slots: self.clone(),
            key: key.to_owned(),
        }))
    }

    /// Whether a task of `key` could take a slot now.
    pub(crate) fn has_room(&self, key: Option<&str>) -> bool {
        let (Some(key), Some(most)) = (key, self.limits.borrow().per_key()) else {
            return true;
        };
        let running = self.running.lock().expect("not poisoned");
        running.get(key).is_none_or(|n| *n < most)
    }

    /// Told each time a slot is given back.
    pub(crate) fn watch_freed(&self) -> watch::Receiver<u64> {
        self.freed.subscribe()
    }

    /// Counts `n` more (or fewer) entries held aside.
    pub(crate) fn held_aside(&self, n: f64) {
        self.waiting.increment(n);
    }

    fn give_back(&self, key: &str) {
        let mut running = self.running.lock().expect("not poisoned");
        if let Some(n) = running.get_mut(key) {
            *n -= 1;
            if *n == 0 {
                running.remove(key);
            }
        }
        drop(running);
        self.freed.send_modify(|n| *n = n.wrapping_add(1));
    }
}

/// A key at its limit.
#[derive(Debug)]
pub(crate) struct Full;

/// One running task's slot of its key, given back when dropped.
pub(crate) struct KeySlot {
    slots: Arc<KeySlots>,
    key: String,
}

impl Drop for KeySlot {
    fn drop(&mut self) {
        self.slots.give_back(&self.key);
    }
}
