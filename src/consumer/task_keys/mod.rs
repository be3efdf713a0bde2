//! Limits per key by a function of the task (docs/design.md §15): what
//! this instance holds of each limit key, units of its concurrency and a
//! share of its rate, taken from and given back to Redis by one leaser
//! (`task_keys.lua`, keys `{N}:units:<key>` and `{N}:rate:<key>`).
//!
//! Why Redis here, when the partition key's limits are kept in memory: a
//! key that a function of the task gives does not choose the partition,
//! so one key's tasks run on every instance, and only a state they all
//! share can bound them. Why an instance holds a count of units and a
//! share of the rate rather than asking per task: a key busy on one
//! instance then costs Redis nothing per task; what it holds stays while
//! its tasks run (units with a cushion of half as many again, the whole
//! rate while no other instance asks), and goes back once nobody here
//! needs it for [`LINGER`], or down to an even share at once while
//! another instance is short of the key (the script tells), so a key's
//! limit moves to where its tasks wait.
//!
//! A task takes a unit and a start of its key's share here at once, or
//! steps aside like a task of a key at its limit in memory; the leaser
//! sends, in one script call for every key, what each key needs (more,
//! less, keeps), again every [`RETRY`](holding::RETRY) while Redis
//! refuses, and tells a key given room to the batches waiting on it.

mod holding;
mod key;
mod script;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tracing::warn;

use self::holding::LINGER;
use self::key::Key;
use self::script::{Kind, Op, Reply};
use super::key_wakes::KeyWakes;
use crate::config::ServiceName;
use crate::connection::SharedConnection;
use crate::limits::{Limits, RateLimit};

/// After a failed call, before the next.
const BACKOFF: Duration = Duration::from_millis(200);

/// This instance's share of the limit keys.
pub(crate) struct TaskKeys {
    name: ServiceName,
    /// This instance's field in each key's units.
    instance: String,
    limits: watch::Receiver<Limits>,
    /// How long units live in Redis without a keep: they are kept every
    /// third of it.
    ttl: Duration,
    keys: Mutex<HashMap<Arc<str>, Key>>,
    /// Wakes the leaser: a key's tasks wait, or a key's units are wanted
    /// elsewhere.
    wake: Notify,
    /// Whether the leaser is looking (or about to): a wake is then not
    /// needed.
    looking: AtomicBool,
    /// Where a key given room is told (the batches of
    /// [`KeySlots`](super::key_slots::KeySlots) waiting on it).
    freed: Arc<KeyWakes>,
}

impl TaskKeys {
    /// The share of service `name`'s instance `instance`, its units living
    /// `ttl` without a keep, telling keys given room on `freed`.
    pub(crate) fn new(
        name: ServiceName,
        instance: &str,
        limits: watch::Receiver<Limits>,
        ttl: Duration,
        freed: Arc<KeyWakes>,
    ) -> Self {
        TaskKeys {
            name,
            instance: instance.to_owned(),
            limits,
            ttl,
            keys: Mutex::default(),
            wake: Notify::new(),
            looking: AtomicBool::new(false),
            freed,
        }
    }

    /// Whether units (a concurrency per key) count now, and the rate per
    /// key, if one does.
    fn counting(&self) -> (bool, Option<RateLimit>) {
        let limits = self.limits.borrow();
        (limits.per_key().is_some(), limits.rate_limit_per_key())
    }

    /// Takes what a task of `key` needs to start (a unit, a start of the
    /// rate: those that count), if this instance holds them; with the
    /// key's name when it took a unit (given back with
    /// [`end`](Self::end)), `None` when the task must wait.
    pub(crate) fn take(&self, key: &str) -> Option<Option<Arc<str>>> {
        let (units, rate) = self.counting();
        let now = Instant::now();
        let mut keys = self.keys.lock().expect("not poisoned");
        if !keys.get_mut(key)?.take(now, units, rate) {
            return None;
        }
        // The map's name, not a new one: no allocation per start.
        Some(units.then(|| keys.get_key_value(key).expect("just taken").0.clone()))
    }

    /// Whether a task of `key` could start now.
    pub(crate) fn has_room(&self, key: &str) -> bool {
        let (units, rate) = self.counting();
        let keys = self.keys.lock().expect("not poisoned");
        keys.get(key)
            .is_some_and(|k| k.has_room(Instant::now(), units, rate))
    }

    /// `delta` more (or fewer) tasks of `key` wait aside here: the leaser
    /// sends for what they lack while any does.
    pub(crate) fn waiting(&self, key: &str, delta: isize) {
        let mut keys = self.keys.lock().expect("not poisoned");
        // A key's name is allocated once, when it first waits.
        if !keys.contains_key(key) {
            keys.insert(Arc::from(key), Key::default());
        }
        keys.get_mut(key).expect("just added").waiting(delta);
        drop(keys);
        if delta > 0 {
            self.look();
        }
    }

    /// A task of `key` that held a unit ended: the unit stays here, for
    /// the key's next task, unless another instance is short of the key.
    /// True when tasks of the key wait here (the caller tells the key).
    pub(crate) fn end(&self, key: &str) -> bool {
        let mut keys = self.keys.lock().expect("not poisoned");
        let Some(held) = keys.get_mut(key) else {
            return false;
        };
        let wanted = held.end();
        let waiting = held.has_waiters();
        drop(keys);
        // Woken only when wanted elsewhere: woken at every end, the leaser
        // walked every key at every end (0.08x in `cargo bench --bench
        // limits`); a surplus goes back with its next look.
        if wanted {
            self.look();
        }
        waiting
    }

    fn look(&self) {
        if !self.looking.swap(true, Ordering::AcqRel) {
            self.wake.notify_one();
        }
    }

    /// The leaser: until the instance stops, sends what each key needs,
    /// keeps the held units every third of their life, and tells keys
    /// given room.
    pub(crate) async fn lease(self: Arc<Self>, conn: Arc<SharedConnection>) {
        let keep_every = self.ttl / 3;
        let mut keep_at = Instant::now() + keep_every;
        let mut next: Option<Instant> = None;
        loop {
            let wake_at = next.map_or(keep_at, |n| n.min(keep_at));
            tokio::select! {
                _ = self.wake.notified() => {}
                _ = tokio::time::sleep_until(wake_at) => {}
            }
            // Wakes asked for from here on look again.
            self.looking.store(false, Ordering::Release);
            let now = Instant::now();
            let keep = now >= keep_at;
            if keep {
                keep_at = now + keep_every;
            }
            let (ops, due, soonest) = self.operations(now, keep);
            for key in due {
                self.freed.tell(&key);
            }
            next = soonest;
            if ops.is_empty() {
                continue;
            }
            let sent = Instant::now();
            let limits = *self.limits.borrow();
            let sending = script::send(&conn, &self.name, &self.instance, self.ttl, &limits, &ops);
            match sending.await {
                Ok(replies) => self.apply(sent, &ops, &replies),
                Err(e) => {
                    warn!(service = %self.name, cause = %e, "cannot take or give back the limit keys' units and tokens; trying again");
                    next = Some(Instant::now() + BACKOFF);
                }
            }
        }
    }

    /// What to send now, the keys to tell (tasks wait that their share of
    /// the rate allows again), and when to look again by itself.
    fn operations(&self, now: Instant, keep: bool) -> (Vec<Op>, Vec<Arc<str>>, Option<Instant>) {
        let limits = *self.limits.borrow();
        let (most, rate) = (limits.per_key(), limits.rate_limit_per_key());
        let mut keys = self.keys.lock().expect("not poisoned");
        let (mut ops, mut told) = (Vec::new(), Vec::new());
        let mut soonest: Option<Instant> = None;
        let mut sooner = |at: Instant| soonest = Some(soonest.map_or(at, |s| s.min(at)));
        for (name, held) in keys.iter_mut() {
            let asks = [
                (Kind::Units, held.units_op(now, most, keep)),
                (Kind::Rate, held.rate_op(now, rate, keep)),
            ];
            ops.extend(Op::all(name, asks));
            if held.due(now, most.is_some(), rate) {
                told.push(name.clone());
            }
            if let Some(at) = held.next_look(now, rate) {
                sooner(at);
            }
            if held.holds_rate() {
                sooner(now + LINGER);
            }
        }
        keys.retain(|_, held| !held.forgettable());
        (ops, told, soonest)
    }

    /// Applies Redis's `replies` to `ops`, sent at `sent`.
    fn apply(&self, sent: Instant, ops: &[Op], replies: &[Reply]) {
        let mut told = Vec::new();
        let mut keys = self.keys.lock().expect("not poisoned");
        for (op, reply) in ops.iter().zip(replies) {
            let held = keys.entry(op.key.clone()).or_default();
            let counts = (op.want, reply.granted);
            let room = held.granted(op.kind, sent, self.ttl, counts, reply.share);
            if room {
                told.push(op.key.clone());
            }
        }
        drop(keys);
        for key in told {
            self.freed.tell(&key);
        }
    }

    /// Gives back everything this instance holds (it stops; its tasks
    /// ended).
    pub(crate) async fn give_all_back(&self, conn: &SharedConnection) {
        let ops: Vec<Op> = {
            let mut keys = self.keys.lock().expect("not poisoned");
            let mut ops = Vec::new();
            for (name, held) in keys.iter_mut() {
                ops.extend(Op::all(name, held.release()));
            }
            ops
        };
        let limits = *self.limits.borrow();
        if !ops.is_empty()
            && let Err(e) =
                script::send(conn, &self.name, &self.instance, self.ttl, &limits, &ops).await
        {
            warn!(service = %self.name, cause = %e, "the limit keys' units and shares not given back; they lapse");
        }
    }
}
