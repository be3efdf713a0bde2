//! The entries of a [`Batch`](super::Batch) held aside because their key
//! runs as many tasks as its limit allows, or has no token of its rate
//! limit now (docs/design.md §15, limits per key): other keys' entries behind them start meanwhile,
//! and they go back in front, in their order, when a slot of their key is
//! given back. While held aside they hold no running permit and no token;
//! they stay in the worker's [`Held`], which keeps them fresh.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use tokio::sync::broadcast::{self, error::RecvError};

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
}

impl Aside {
    pub(super) fn new(slots: Arc<KeySlots>, rates: Arc<KeyRates>, held: Held) -> Self {
        Aside {
            slots,
            rates,
            held,
            entries: VecDeque::new(),
            keys: HashMap::new(),
            freed: None,
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
            let key = key_of(&front);
            if key.is_some() && self.freed.is_none() {
                // Listening before the key is asked: a slot or tokens given
                // back in between must wake this batch.
                self.freed = Some(self.slots.watch_freed());
            }
            let behind = !self.entries.is_empty() && key.is_some_and(|k| self.keys.contains_key(k));
            // Its key's token first (a key without one sends for one), then
            // its slot; the token is taken only with the slot.
            if !behind
                && self.rates.ready(key)
                && let Ok(slot) = self.slots.take(key)
            {
                self.rates.take(key);
                return Some((front, slot));
            }
            self.put(front);
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
                Ok(key) if self.keys.contains_key(&*key) => return Some(key),
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
        let mut ready: HashMap<String, bool> = HashMap::new();
        for fetched in self.entries.drain(..) {
            let of = key_of(&fetched);
            let wanted = key.is_none() || of == key;
            let may = wanted
                && match of {
                    Some(k) => *ready.entry(k.to_owned()).or_insert_with(|| {
                        self.slots.has_room(Some(k)) && self.rates.ready(Some(k))
                    }),
                    None => true,
                };
            if may {
                back.push(fetched);
            } else {
                kept.push_back(fetched);
            }
        }
        self.entries = kept;
        for fetched in back.iter() {
            self.forget(key_of(fetched).map(str::to_owned));
        }
        for fetched in back.into_iter().rev() {
            waiting.push_front(fetched);
        }
    }

    /// Every entry aside, for a hand-back.
    pub(super) fn take_all(&mut self) -> Vec<Fetched> {
        let all: Vec<Fetched> = self.entries.drain(..).collect();
        for fetched in &all {
            self.forget(key_of(fetched).map(str::to_owned));
        }
        all
    }

    fn put(&mut self, fetched: Fetched) {
        if let Some(key) = key_of(&fetched) {
            *self.keys.entry(key.to_owned()).or_default() += 1;
        }
        self.entries.push_back(fetched);
        self.held.aside(1);
        self.slots.held_aside(1.0);
    }

    fn forget(&mut self, key: Option<String>) {
        if let Some(key) = key
            && let Some(n) = self.keys.get_mut(&key)
        {
            *n -= 1;
            if *n == 0 {
                self.keys.remove(&key);
            }
        }
        self.held.aside(-1);
        self.slots.held_aside(-1.0);
    }
}

impl Drop for Aside {
    fn drop(&mut self) {
        // Counted out however the batch ends.
        let n = self.entries.len();
        self.held.aside(-(n as isize));
        self.slots.held_aside(-(n as f64));
    }
}

/// The partition key of an entry that can be read.
fn key_of(fetched: &Fetched) -> Option<&str> {
    fetched.entry.as_ref().ok().and_then(|e| e.key.as_deref())
}
