//! The entries of a [`Batch`](super::Batch) held aside because their key
//! runs as many tasks as its limit allows, or has no token of its rate
//! limit now (docs/design.md §15, limits per key): other keys' entries behind them start meanwhile,
//! and they go back in front, in their order, when a slot of their key is
//! given back. While held aside they hold no running permit and no token;
//! they stay in the worker's [`Held`], which keeps them fresh.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use tokio::sync::broadcast::{self, error::RecvError};

use crate::consumer::erased::LimitKey;
use crate::consumer::held::Held;
use crate::consumer::key_rates::KeyRates;
use crate::consumer::key_slots::{KeySlot, KeySlots};
use crate::consumer::store::Fetched;

/// One batch's entries held aside.
pub(super) struct Aside {
    slots: Arc<KeySlots>,
    rates: Arc<KeyRates>,
    held: Held,
    entries: VecDeque<Fetched>,
    /// How many of `entries` each key has: a later entry of a key with
    /// entries aside goes aside too, so a key's tasks start in order.
    keys: HashMap<String, usize>,
    /// The keys given a slot or tokens back, from the first entry aside.
    freed: Option<broadcast::Receiver<Arc<str>>>,
    /// With a function of the task as the concurrency's key: it, and each
    /// entry's key it gave (by stream id; computed once per entry).
    by_task: Option<(LimitKey, HashMap<String, Option<String>>)>,
    /// With keys from the task: how many entries of each partition key are
    /// here (their rate per key's tokens wake them).
    rate_keys: HashMap<String, usize>,
}

impl Aside {
    /// `limit_key`: the function of the task the concurrency per key counts
    /// by, if one was given.
    pub(super) fn new(
        slots: Arc<KeySlots>,
        rates: Arc<KeyRates>,
        held: Held,
        limit_key: Option<LimitKey>,
    ) -> Self {
        Aside {
            slots,
            rates,
            held,
            entries: VecDeque::new(),
            keys: HashMap::new(),
            freed: None,
            by_task: limit_key.map(|f| (f, HashMap::new())),
            rate_keys: HashMap::new(),
        }
    }

    /// The key `fetched`'s concurrency counts by: its partition key, or
    /// what the function of its task gives.
    fn limit_key(&mut self, fetched: &Fetched) -> Option<String> {
        let Some((key_of_task, known)) = &mut self.by_task else {
            return key_of(fetched).map(str::to_owned);
        };
        let entry = fetched.entry.as_ref().ok()?;
        known
            .entry(fetched.id.clone())
            .or_insert_with(|| key_of_task(entry))
            .clone()
    }

    /// Forgets the key the function gave `fetched` (it starts or goes).
    fn done_with(&mut self, fetched: &Fetched) {
        if let Some((_, known)) = &mut self.by_task {
            known.remove(&fetched.id);
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The first entry of `waiting` that may start, with its key's slot;
    /// those before it whose key is at its limit go aside.
    pub(super) fn admit(
        &mut self,
        waiting: &mut VecDeque<Fetched>,
    ) -> Option<(Fetched, Option<KeySlot>)> {
        // No limit per key (the common case): the front starts, with no
        // lock, no map and no subscription per batch.
        if self.entries.is_empty() && !self.slots.keys_limited() {
            return waiting.pop_front().map(|front| (front, None));
        }
        while let Some(front) = waiting.pop_front() {
            let limit = self.limit_key(&front);
            let rate = key_of(&front);
            if (limit.is_some() || rate.is_some()) && self.freed.is_none() {
                // Listening before the key is asked: a slot or tokens given
                // back in between must wake this batch.
                self.freed = Some(self.slots.watch_freed());
            }
            let behind = !self.entries.is_empty()
                && limit.as_deref().is_some_and(|k| self.keys.contains_key(k));
            // Its key's token first (a key without one sends for one), then
            // its slot; the token is taken only with the slot.
            if !behind
                && self.rates.ready(rate)
                && let Ok(slot) = self.slots.take(limit.as_deref())
            {
                self.rates.take(rate);
                self.done_with(&front);
                return Some((front, slot));
            }
            self.put(front, limit);
        }
        None
    }

    /// Waits until a key with entries here is given a slot or tokens
    /// back, and says which (`None`: this batch fell behind, any may
    /// have); for ever while nothing is aside. Only keys of this batch wake
    /// it: a thousand keys leasing must not make every batch look at every
    /// entry it holds aside.
    pub(super) async fn freed(&mut self) -> Option<Arc<str>> {
        let Some(freed) = self.freed.as_mut().filter(|_| !self.entries.is_empty()) else {
            return std::future::pending().await;
        };
        loop {
            match freed.recv().await {
                // A limit key given a unit or a slot back, or (with keys
                // from the task) a partition key given tokens back.
                Ok(key) if self.keys.contains_key(&*key) || self.rate_keys.contains_key(&*key) => {
                    return Some(key);
                }
                Ok(_) => {}
                Err(RecvError::Lagged(_)) => return None,
                Err(RecvError::Closed) => return std::future::pending().await,
            }
        }
    }

    /// Puts back in front of `waiting`, in their order, the entries of
    /// `key` (of every key, for `None`) that may start now.
    pub(super) fn back(&mut self, key: Option<&str>, waiting: &mut VecDeque<Fetched>) {
        let (mut back, mut kept) = (Vec::new(), VecDeque::new());
        // Asked once per key, not per entry.
        let mut ready: HashMap<(Option<String>, Option<String>), bool> = HashMap::new();
        for fetched in std::mem::take(&mut self.entries) {
            let limit = self.limit_key(&fetched);
            let rate = key_of(&fetched).map(str::to_owned);
            let wanted = key.is_none() || limit.as_deref() == key || rate.as_deref() == key;
            let may = wanted
                && *ready
                    .entry((limit.clone(), rate.clone()))
                    .or_insert_with(|| {
                        self.slots.has_room(limit.as_deref()) && self.rates.ready(rate.as_deref())
                    });
            if may {
                back.push((fetched, limit));
            } else {
                kept.push_back(fetched);
            }
        }
        self.entries = kept;
        for (fetched, limit) in back.iter() {
            let rate = self.rate_key(fetched);
            self.forget(limit.clone(), rate);
        }
        for (fetched, _) in back.into_iter().rev() {
            waiting.push_front(fetched);
        }
    }

    /// Every entry aside, for a hand-back.
    pub(super) fn take_all(&mut self) -> Vec<Fetched> {
        let all: Vec<Fetched> = self.entries.drain(..).collect();
        for fetched in &all {
            let limit = self.limit_key(fetched);
            let rate = self.rate_key(fetched);
            self.done_with(fetched);
            self.forget(limit, rate);
        }
        all
    }

    /// With keys from the task, `fetched`'s partition key (which its
    /// rate per key counts by); else none (it is its limit key).
    fn rate_key(&self, fetched: &Fetched) -> Option<String> {
        self.by_task.as_ref()?;
        key_of(fetched).map(str::to_owned)
    }

    fn put(&mut self, fetched: Fetched, limit: Option<String>) {
        self.slots.held_aside(limit.as_deref(), 1);
        if let Some(key) = limit {
            *self.keys.entry(key).or_default() += 1;
        }
        if let Some(key) = self.rate_key(&fetched) {
            *self.rate_keys.entry(key).or_default() += 1;
        }
        self.entries.push_back(fetched);
        self.held.aside(1);
    }

    fn forget(&mut self, key: Option<String>, rate: Option<String>) {
        self.slots.held_aside(key.as_deref(), -1);
        for (map, key) in [(&mut self.keys, key), (&mut self.rate_keys, rate)] {
            if let Some(key) = key
                && let Some(n) = map.get_mut(&key)
            {
                *n -= 1;
                if *n == 0 {
                    map.remove(&key);
                }
            }
        }
        self.held.aside(-1);
    }
}

impl Drop for Aside {
    fn drop(&mut self) {
        // Counted out however the batch ends.
        let n = self.entries.len();
        self.held.aside(-(n as isize));
        let mut keyed = 0;
        for (key, k) in std::mem::take(&mut self.keys) {
            self.slots.held_aside(Some(&key), -(k as isize));
            keyed += k;
        }
        self.slots.held_aside(None, -((n - keyed) as isize));
    }
}

/// The partition key of an entry that can be read.
fn key_of(fetched: &Fetched) -> Option<&str> {
    fetched.entry.as_ref().ok().and_then(|e| e.key.as_deref())
}
