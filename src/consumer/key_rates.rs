//! The rate limit per key (docs/design.md §15): each partition key's starts
//! follow a GCRA of their own, kept by the key's partition's owner in
//! memory.
//!
//! Why in memory, not in Redis as the service's limit is: a key chooses
//! its partition and a partition has one owner, so the owner sees every
//! start of its keys. A state in Redis cost a lease per key every 50 ms of
//! activity: with a thousand busy keys, twenty thousand script calls a
//! second, and the bench's consume fell to 0.01×. What memory gives up: a
//! new owner starts from an empty state, so right after a handover a key
//! may start one burst (30 ms of its rate, at least one task) early.
//!
//! An entry whose key has no token now steps aside like one whose key runs
//! as many tasks as it may ([`run::aside`](super::run)); a timer tells the
//! key when its next token is due, and the batches holding entries of that
//! key look again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::key_wakes::KeyWakes;
use crate::limits::{Limits, RateLimit};

/// The most credit a key accrues: an idle key starts at most this much of
/// its rate at once (at least one task), as the service's limit.
const BURST: Duration = Duration::from_millis(30);
/// Keys past this many are forgotten once their state says nothing.
const KEPT: usize = 10_000;

/// One key's GCRA: the theoretical arrival time of its next start, and
/// whether a timer will tell the key when it is due.
struct Key {
    tat: Instant,
    timed: bool,
}

/// One instance's GCRA of each limited key.
pub(crate) struct KeyRates {
    limits: watch::Receiver<Limits>,
    keys: Mutex<HashMap<Arc<str>, Key>>,
    /// Where a key whose next token is due is told (the batches of
    /// [`KeySlots`](super::key_slots::KeySlots) waiting on it).
    due: Arc<KeyWakes>,
}

impl KeyRates {
    /// The rates following `limits`, telling due keys on `due`.
    pub(crate) fn new(limits: watch::Receiver<Limits>, due: Arc<KeyWakes>) -> Self {
        KeyRates {
            limits,
            keys: Mutex::new(HashMap::new()),
            due,
        }
    }

    /// Whether a task of `key` may start now as far as its key's rate
    /// says (always without a limit per key or without a key); if not, a
    /// timer will tell the key when it may.
    pub(crate) fn ready(self: &Arc<Self>, key: Option<&str>) -> bool {
        let (Some(key), Some(rate)) = (key, self.limits.borrow().rate_limit_per_key()) else {
            return true;
        };
        let now = Instant::now();
        let tolerance = tolerance(rate);
        let mut keys = self.keys.lock().expect("not poisoned");
        let Some(state) = keys.get_mut(key) else {
            return true;
        };
        // Conforming while the next start's time is within the burst.
        let at = state.tat.checked_sub(tolerance).unwrap_or(state.tat);
        if at <= now {
            return true;
        }
        if !state.timed {
            state.timed = true;
            let (key, rates) = (Arc::<str>::from(key), self.clone());
            tokio::spawn(async move {
                tokio::time::sleep_until(at).await;
                // Timed no more: a start that does not come (its entries
                // handed back) must not leave the key without a timer.
                if let Some(state) = rates.keys.lock().expect("not poisoned").get_mut(&key) {
                    state.timed = false;
                }
                rates.due.tell(&key);
            });
        }
        false
    }

    /// Counts a start of `key` (one [`ready`](Self::ready) allowed).
    pub(crate) fn take(&self, key: Option<&str>) {
        let (Some(key), Some(rate)) = (key, self.limits.borrow().rate_limit_per_key()) else {
            return;
        };
        let now = Instant::now();
        let interval = Duration::from_secs_f64(rate.interval_us() / 1e6);
        let mut keys = self.keys.lock().expect("not poisoned");
        if keys.len() >= KEPT {
            // A key whose next start's time has passed says nothing more
            // than a key never seen.
            keys.retain(|_, k| k.timed || k.tat > now);
        }
        match keys.get_mut(key) {
            Some(state) => {
                state.tat = state.tat.max(now) + interval;
                state.timed = false;
            }
            None => {
                let state = Key {
                    tat: now + interval,
                    timed: false,
                };
                keys.insert(Arc::from(key), state);
            }
        }
    }
}

/// How far ahead of its time a key's start may come: a burst of 30 ms of
/// the rate, less one start's interval (0 for a rate slower than one start
/// in 30 ms: starts then come one interval apart).
fn tolerance(rate: RateLimit) -> Duration {
    let interval = Duration::from_secs_f64(rate.interval_us() / 1e6);
    BURST.saturating_sub(interval)
}
