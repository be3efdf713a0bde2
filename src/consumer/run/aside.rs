//! The entries of a [`Batch`](super::Batch) held aside because their key
//! runs as many tasks as its limit allows, or has no token of its rate
//! limit now (docs/design.md §15, limits per key): other keys' entries
//! behind them start meanwhile, and they go back in front, in their order,
//! when their key is given a slot or tokens back. While held aside they
//! hold no running permit and no token; they stay in the worker's
//! [`Held`], which keeps them fresh. Both limits per key count by one key:
//! the partition key, or what the function of the task gives.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use crate::consumer::erased::LimitKey;
use crate::consumer::held::Held;
use crate::consumer::key_rates::KeyRates;
use crate::consumer::key_slots::{KeySlot, KeySlots};
use crate::consumer::key_wakes::{KeyWakes, Wake};
use crate::consumer::store::Fetched;

/// One entry aside: its place in the batch's order.
struct Item {
    seq: u64,
    fetched: Fetched,
}

/// One batch's entries held aside.
pub(super) struct Aside {
    slots: Arc<KeySlots>,
    rates: Arc<KeyRates>,
    held: Held,
    /// The entries aside, by the key their limits count by, each key's in
    /// their order: a key given a slot or tokens back moves its own entries
    /// back, with no walk over the others' (a walk of every entry aside
    /// for each key told cost the function-of-task key most of its time).
    queues: HashMap<String, VecDeque<Item>>,
    /// How many entries are aside.
    count: usize,
    /// The next entry's place.
    seq: u64,
    /// Where this batch hears the keys of its queues (each watched from
    /// its queue's first entry to its last).
    wakes: Arc<KeyWakes>,
    wake: Arc<Wake>,
    /// With a function of the task as the limits' key: it, and the key it
    /// gave each entry put back from aside (by stream id: computed once per
    /// entry). Its keys' slots and tokens are both counted in Redis
    /// ([`KeySlots`]'s task keys), the partition key's in memory.
    by_task: Option<(LimitKey, HashMap<String, Option<String>>)>,
}

impl Aside {
    /// `limit_key`: the function of the task the limits per key count by,
    /// if one was given.
    pub(super) fn new(
        slots: Arc<KeySlots>,
        rates: Arc<KeyRates>,
        held: Held,
        limit_key: Option<LimitKey>,
    ) -> Self {
        Aside {
            wakes: slots.wakes().clone(),
            slots,
            rates,
            held,
            queues: HashMap::new(),
            count: 0,
            seq: 0,
            wake: Arc::default(),
            by_task: limit_key.map(|f| (f, HashMap::new())),
        }
    }

    /// The key `fetched`'s limits count by: its partition key, or what the
    /// function of its task gives (computed once: an entry put back from
    /// aside finds the key it had).
    fn limit_key(&mut self, fetched: &Fetched) -> Option<String> {
        let Some((key_of_task, known)) = &mut self.by_task else {
            return key_of(fetched).map(str::to_owned);
        };
        if let Some(key) = known.remove(&fetched.id) {
            return key;
        }
        fetched.entry.as_ref().ok().and_then(|e| key_of_task(e))
    }

    pub(super) fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Whether a task of `key` could start now: a slot, and (the partition
    /// key's rate kept here) a token; a key out of tokens is told when its
    /// next is due.
    fn has_room(&self, key: &str) -> bool {
        self.slots.has_room(Some(key)) && (self.by_task.is_some() || self.rates.ready(Some(key)))
    }

    /// The first entry of `waiting` that may start, with its key's slot;
    /// those before it whose key is at its limit go aside.
    pub(super) fn admit(
        &mut self,
        waiting: &mut VecDeque<Fetched>,
    ) -> Option<(Fetched, Option<KeySlot>)> {
        // No limit per key (the common case): the front starts, with no
        // lock, no map and no subscription per batch.
        if self.count == 0 && !self.slots.keys_limited() {
            return waiting.pop_front().map(|front| (front, None));
        }
        while let Some(front) = waiting.pop_front() {
            let Some(limit) = self.limit_key(&front) else {
                // No key: no limit per key.
                return Some((front, None));
            };
            // A later entry of a key with entries aside goes aside too, so
            // a key's tasks start in order.
            if !self.queues.contains_key(&limit) {
                // The partition key's rate is kept here; a task key's with
                // its slot, in Redis.
                let rate = Some(limit.as_str()).filter(|_| self.by_task.is_none());
                // Its key's token first (a key without one is told when one
                // is due), then its slot; the token is taken only with the
                // slot.
                if self.rates.ready(rate)
                    && let Ok(slot) = self.slots.take(Some(&limit))
                {
                    self.rates.take(rate);
                    return Some((front, slot));
                }
            }
            self.put(front, limit);
        }
        None
    }

    /// Waits until keys with entries here are given a slot or tokens back,
    /// and says which (and perhaps others it held before); for ever while
    /// nothing is aside. Only keys of this batch wake it: a thousand keys
    /// leasing must not make every batch look at every entry it holds
    /// aside.
    pub(super) async fn freed(&self) -> Vec<Arc<str>> {
        if self.count == 0 {
            return std::future::pending().await;
        }
        let mut told = Vec::new();
        self.wake.told(&mut told).await;
        told
    }

    /// Puts back in front of `waiting`, in their order, the entries of
    /// `keys` that may start now.
    pub(super) fn back(&mut self, keys: &[Arc<str>], waiting: &mut VecDeque<Fetched>) {
        let mut back = Vec::new();
        for key in keys {
            if !self.queues.contains_key(&**key) || !self.has_room(key) {
                continue;
            }
            let queue = self.queues.remove(&**key).expect("just found");
            self.forget(key, queue.len());
            if let Some((_, known)) = &mut self.by_task {
                let limit = Some(key.to_string());
                known.extend(queue.iter().map(|i| (i.fetched.id.clone(), limit.clone())));
            }
            back.extend(queue);
        }
        back.sort_by_key(|item| item.seq);
        for item in back.into_iter().rev() {
            waiting.push_front(item.fetched);
        }
    }

    /// Every entry aside, for a hand-back.
    pub(super) fn take_all(&mut self) -> Vec<Fetched> {
        let queues: Vec<(String, VecDeque<Item>)> = self.queues.drain().collect();
        let mut all = Vec::with_capacity(self.count);
        for (key, queue) in queues {
            self.forget(&key, queue.len());
            all.extend(queue);
        }
        all.sort_by_key(|item| item.seq);
        all.into_iter().map(|item| item.fetched).collect()
    }

    fn put(&mut self, fetched: Fetched, key: String) {
        let first = !self.queues.contains_key(&key);
        // Listening before the key is counted as waiting (which sends for
        // its units and tokens), then looking again: a slot or tokens given
        // back since the entry was refused must not be missed.
        if first {
            self.wakes.watch(&key, &self.wake);
        }
        self.slots.held_aside(Some(&key), 1);
        if first && self.has_room(&key) {
            self.wake.tell_self(&key);
        }
        self.seq += 1;
        let item = Item {
            seq: self.seq,
            fetched,
        };
        self.queues.entry(key).or_default().push_back(item);
        self.count += 1;
        self.held.aside(1);
    }

    /// Counts out `n` entries of `key`, whose queue was taken out.
    fn forget(&mut self, key: &str, n: usize) {
        self.wakes.unwatch(key, &self.wake);
        self.slots.held_aside(Some(key), -(n as isize));
        self.count -= n;
        self.held.aside(-(n as isize));
    }
}

impl Drop for Aside {
    fn drop(&mut self) {
        // Counted out however the batch ends.
        self.held.aside(-(self.count as isize));
        for (key, queue) in self.queues.drain() {
            self.wakes.unwatch(&key, &self.wake);
            self.slots.held_aside(Some(&key), -(queue.len() as isize));
        }
    }
}

/// The partition key of an entry that can be read.
fn key_of(fetched: &Fetched) -> Option<&str> {
    fetched.entry.as_ref().ok().and_then(|e| e.key.as_deref())
}
