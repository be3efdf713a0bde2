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

/// One entry aside: its place in the batch's order, and its keys.
struct Item {
    seq: u64,
    fetched: Fetched,
    /// The key its concurrency counts by.
    limit: Option<String>,
    /// With keys from the task, its partition key (its rate's).
    rate: Option<String>,
}

/// One batch's entries held aside.
pub(super) struct Aside {
    slots: Arc<KeySlots>,
    rates: Arc<KeyRates>,
    held: Held,
    /// The entries aside, by the key their concurrency counts by, each
    /// key's in their order: a key given a slot or tokens back moves its
    /// own entries back, with no walk over the others' (a walk of every
    /// entry aside for each key told cost the function-of-task key most
    /// of its time).
    queues: HashMap<Option<String>, VecDeque<Item>>,
    /// How many entries are aside.
    count: usize,
    /// The next entry's place.
    seq: u64,
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
            queues: HashMap::new(),
            count: 0,
            seq: 0,
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
        self.count == 0
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
            let limit = self.limit_key(&front);
            let rate = key_of(&front);
            if (limit.is_some() || rate.is_some()) && self.freed.is_none() {
                // Listening before the key is asked: a slot or tokens given
                // back in between must wake this batch.
                self.freed = Some(self.slots.watch_freed());
            }
            // A later entry of a key with entries aside goes aside too, so
            // a key's tasks start in order.
            let behind = limit.is_some() && self.queues.contains_key(&limit);
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
        let Some(freed) = self.freed.as_mut().filter(|_| self.count > 0) else {
            return std::future::pending().await;
        };
        loop {
            match freed.recv().await {
                // A limit key given a unit or a slot back, or (with keys
                // from the task) a partition key given tokens back.
                Ok(key)
                    if self.queues.contains_key(&Some(key.to_string()))
                        || self.rate_keys.contains_key(&*key) =>
                {
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
        let limits: Vec<Option<String>> = match key {
            // A partition key's tokens (keys from the task): its entries
            // may be under any limit key.
            Some(k) if self.rate_keys.contains_key(k) => self.queues.keys().cloned().collect(),
            Some(k) => vec![Some(k.to_owned())],
            None => self.queues.keys().cloned().collect(),
        };
        let mut back = Vec::new();
        for limit in limits {
            let Some(mut queue) = self.queues.remove(&limit) else {
                continue;
            };
            let room = self.slots.has_room(limit.as_deref());
            let mut kept = VecDeque::new();
            // Asked once per rate key, not per entry.
            let mut ready: HashMap<Option<String>, bool> = HashMap::new();
            for item in queue.drain(..) {
                let rate = item
                    .rate
                    .clone()
                    .or_else(|| key_of(&item.fetched).map(str::to_owned));
                let may = room
                    && *ready
                        .entry(rate.clone())
                        .or_insert_with(|| self.rates.ready(rate.as_deref()));
                match may {
                    true => back.push(item),
                    false => kept.push_back(item),
                }
            }
            if !kept.is_empty() {
                self.queues.insert(limit, kept);
            }
        }
        back.sort_by_key(|item| item.seq);
        for item in &back {
            self.forget(item);
        }
        for item in back.into_iter().rev() {
            waiting.push_front(item.fetched);
        }
    }

    /// Every entry aside, for a hand-back.
    pub(super) fn take_all(&mut self) -> Vec<Fetched> {
        let mut all: Vec<Item> = self.queues.drain().flat_map(|(_, q)| q).collect();
        all.sort_by_key(|item| item.seq);
        for item in &all {
            self.forget(item);
        }
        all.into_iter()
            .map(|item| {
                self.done_with(&item.fetched);
                item.fetched
            })
            .collect()
    }

    /// With keys from the task, `fetched`'s partition key (which its
    /// rate per key counts by); else none (it is its limit key).
    fn rate_key(&self, fetched: &Fetched) -> Option<String> {
        self.by_task.as_ref()?;
        key_of(fetched).map(str::to_owned)
    }

    fn put(&mut self, fetched: Fetched, limit: Option<String>) {
        self.slots.held_aside(limit.as_deref(), 1);
        let rate = self.rate_key(&fetched);
        if let Some(key) = &rate {
            *self.rate_keys.entry(key.clone()).or_default() += 1;
        }
        self.seq += 1;
        let item = Item {
            seq: self.seq,
            fetched,
            limit: limit.clone(),
            rate,
        };
        self.queues.entry(limit).or_default().push_back(item);
        self.count += 1;
        self.held.aside(1);
    }

    /// Counts out `item`, taken out of its queue.
    fn forget(&mut self, item: &Item) {
        self.slots.held_aside(item.limit.as_deref(), -1);
        if let Some(key) = &item.rate
            && let Some(n) = self.rate_keys.get_mut(key)
        {
            *n -= 1;
            if *n == 0 {
                self.rate_keys.remove(key);
            }
        }
        self.count -= 1;
        self.held.aside(-1);
    }
}

impl Drop for Aside {
    fn drop(&mut self) {
        // Counted out however the batch ends.
        self.held.aside(-(self.count as isize));
        for (key, queue) in self.queues.drain() {
            self.slots
                .held_aside(key.as_deref(), -(queue.len() as isize));
        }
    }
}

/// The partition key of an entry that can be read.
fn key_of(fetched: &Fetched) -> Option<&str> {
    fetched.entry.as_ref().ok().and_then(|e| e.key.as_deref())
}
