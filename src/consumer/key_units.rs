//! Concurrency per key by a function of the task (docs/design.md §15): the
//! units of each limit key this instance holds, taken from and given back
//! to Redis (`key_units.lua`, one sorted set per key in `{N}`).
//!
//! Why Redis here, when the partition key's limit is counted in memory: a
//! key that a function of the task gives does not choose the partition, so
//! one key's tasks run on every instance, and only a count they all share
//! can bound them. Why units held by instances rather than a count per
//! task: a unit outlives the task that took it while another task of its
//! key waits here, so a busy key on one instance costs a round trip per
//! wait, not per task; and a unit lapses when its holder stops keeping it
//! (a crash, a freeze), so no count stays stuck.
//!
//! A task takes a unit its instance holds, at once, or steps aside like a
//! task of a key at its limit in memory; the instance's one leaser sends
//! for a unit of each key with tasks aside, in one script call for every
//! key, every [`RETRY`] while Redis refuses (the key is at its limit
//! elsewhere), and tells the key on the channel of freed keys when it
//! holds one. A task that ends leaves its unit to a waiting task of its
//! key here or to the next one read; a unit nobody takes within
//! [`LINGER`] goes back. So a key busy on one instance costs Redis
//! nothing per task (its units stay), and an idle one holds nothing for
//! long.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use deadpool_redis::redis::Script;
use tokio::sync::{Notify, broadcast, watch};
use tokio::time::Instant;
use tracing::warn;

use crate::config::ServiceName;
use crate::connection::SharedConnection;
use crate::keys;
use crate::limits::Limits;

static UNITS: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/key_units.lua")));

/// How soon a key Redis refused a unit for asks again.
const RETRY: Duration = Duration::from_millis(20);
/// How long a unit no task here uses is kept before it goes back.
const LINGER: Duration = Duration::from_millis(100);
/// How long an instance keeps a unit for its own tasks of the key before
/// it gives it back as a task ends, so that other instances' tasks of a
/// busy key get their turn. At 250 ms every busy key's units cycled
/// through Redis while its tasks piled up aside (0.09x in `cargo bench
/// --bench limits`); at 1 s, 0.60x; at 10 s, 0.78x, but others would wait
/// up to 10 s.
const HOLD_AT_MOST: Duration = Duration::from_millis(1_000);
/// After a failed call, before the next.
const BACKOFF: Duration = Duration::from_millis(200);
/// Most operations in one script call.
const MOST_AT_ONCE: usize = 1_000;

/// One limit key's units on this instance.
#[derive(Default)]
struct Key {
    /// The units held (their members in the key's set), oldest first,
    /// with when each was taken.
    units: VecDeque<(String, Instant)>,
    /// How many of them running tasks use.
    in_use: usize,
    /// Tasks of the key waiting aside here.
    waiters: usize,
    /// Since when a unit is held that no task uses.
    idle_since: Option<Instant>,
}

impl Key {
    fn wants(&self) -> bool {
        self.waiters + self.in_use > self.units.len()
    }

    fn idle(&self) -> bool {
        self.units.len() > self.in_use
    }

    fn empty(&self) -> bool {
        self.units.is_empty() && self.in_use == 0 && self.waiters == 0
    }
}

#[derive(Default)]
struct State {
    keys: HashMap<Arc<str>, Key>,
    /// Units given back, not sent yet.
    released: Vec<(Arc<str>, String)>,
    /// The next unit's number.
    next: u64,
}

/// This instance's units of the limit keys.
pub(crate) struct KeyUnits {
    name: ServiceName,
    /// Units are `<instance id>/<n>`.
    instance: String,
    limits: watch::Receiver<Limits>,
    /// How long a unit lives without a keep: its holder keeps its units
    /// every third of it.
    ttl: Duration,
    state: Mutex<State>,
    /// Wakes the leaser: a key wants a unit, or a unit was given back.
    wake: Notify,
    /// Whether the leaser looks again within [`RETRY`] anyway.
    polling: AtomicBool,
    /// Where a key given a unit is told (the channel of
    /// [`KeySlots`](super::key_slots::KeySlots)).
    freed: broadcast::Sender<Arc<str>>,
}

impl KeyUnits {
    /// The units of service `name`'s instance `instance`, living `ttl`
    /// without a keep, telling keys given a unit on `freed`.
    pub(crate) fn new(
        name: ServiceName,
        instance: &str,
        limits: watch::Receiver<Limits>,
        ttl: Duration,
        freed: broadcast::Sender<Arc<str>>,
    ) -> Self {
        KeyUnits {
            name,
            instance: instance.to_owned(),
            limits,
            ttl,
            state: Mutex::default(),
            wake: Notify::new(),
            polling: AtomicBool::new(false),
            freed,
        }
    }

    /// A unit of `key` for a task to start, if this instance holds a free
    /// one.
    pub(crate) fn take(&self, key: &str) -> bool {
        let mut state = self.state.lock().expect("not poisoned");
        let Some(held) = state.keys.get_mut(key) else {
            return false;
        };
        if held.in_use < held.units.len() {
            held.in_use += 1;
            held.idle_since = None;
            return true;
        }
        false
    }

    /// Whether a task of `key` could take a unit now.
    pub(crate) fn has_room(&self, key: &str) -> bool {
        let state = self.state.lock().expect("not poisoned");
        state.keys.get(key).is_some_and(Key::idle)
    }

    /// `delta` more (or fewer) tasks of `key` wait aside here: the leaser
    /// sends for a unit while any does.
    pub(crate) fn waiting(&self, key: &str, delta: isize) {
        let mut state = self.state.lock().expect("not poisoned");
        // A key's name is allocated once, when it first waits.
        if !state.keys.contains_key(key) {
            state.keys.insert(Arc::from(key), Key::default());
        }
        let held = state.keys.get_mut(key).expect("just added");
        held.waiters = held.waiters.saturating_add_signed(delta);
        if held.empty() {
            state.keys.remove(key);
        }
        drop(state);
        if delta > 0 {
            self.wake.notify_one();
        }
    }

    /// A task of `key` ended: its unit stays, for a task of the key waiting
    /// here or the next one read, and goes back to Redis once unused for
    /// [`LINGER`]. True when tasks of the key wait here (the caller tells
    /// the key: only then, as every batch with tasks aside hears every
    /// key told).
    pub(crate) fn give_back(&self, key: &str) -> bool {
        let mut state = self.state.lock().expect("not poisoned");
        let Some(held) = state.keys.get_mut(key) else {
            return false;
        };
        let waiting = held.waiters > 0;
        held.in_use = held.in_use.saturating_sub(1);
        held.idle_since.get_or_insert_with(Instant::now);
        // Other instances' tasks of the key get their turn: a unit held
        // past HOLD_AT_MOST goes back as its task ends, even while tasks
        // here wait (they ask for it again, on equal terms).
        let State { keys, released, .. } = &mut *state;
        if let Some(held) = keys.get_mut(key)
            && held.idle()
            && held
                .units
                .front()
                .is_some_and(|(_, at)| at.elapsed() >= HOLD_AT_MOST)
            && let Some((unit, _)) = held.units.pop_front()
        {
            released.push((Arc::from(key), unit));
            drop(state);
            self.wake.notify_one();
        }
        // An idle unit goes back with the leaser's next look: it looks
        // every RETRY while units idle, and is woken only when it does not
        // (woken at every end, it walked every key at every end: 0.08x).
        if !self.polling.load(Ordering::Relaxed) {
            self.wake.notify_one();
        }
        waiting
    }

    /// The leaser: until the instance stops, takes units for keys that
    /// want them, gives back the released and the unused, and keeps the
    /// held.
    pub(crate) async fn lease(self: Arc<Self>, conn: Arc<SharedConnection>) {
        let keep_every = self.ttl / 3;
        let mut keep_at = Instant::now() + keep_every;
        let mut soon: Option<Instant> = None;
        loop {
            let next = soon.map_or(keep_at, |s| s.min(keep_at));
            tokio::select! {
                _ = self.wake.notified() => {}
                _ = tokio::time::sleep_until(next) => {}
            }
            let now = Instant::now();
            let keep = now >= keep_at;
            if keep {
                keep_at = now + keep_every;
            }
            let (ops, busy) = self.operations(now, keep);
            soon = busy.then(|| now + RETRY);
            self.polling.store(busy, Ordering::Relaxed);
            if ops.is_empty() {
                continue;
            }
            match self.send(&conn, &ops).await {
                Ok(replies) => self.apply(&ops, &replies),
                Err(e) => {
                    warn!(service = %self.name, cause = %e, "units of the limit keys not taken or given back; trying again");
                    self.undo(ops);
                    soon = Some(Instant::now() + BACKOFF);
                }
            }
        }
    }

    /// What to send now: the released units, the unused ones held past
    /// [`LINGER`], a unit for each key whose tasks wait, and (when `keep`)
    /// every held unit; and whether to look again within [`RETRY`] (a key
    /// waits, or a unit idles).
    fn operations(&self, now: Instant, keep: bool) -> (Vec<Op>, bool) {
        let mut state = self.state.lock().expect("not poisoned");
        let State {
            keys,
            released,
            next,
        } = &mut *state;
        let mut ops: Vec<Op> = released
            .drain(..)
            .map(|(key, unit)| Op::Release(key, unit))
            .collect();
        let mut busy = false;
        for (key, held) in keys.iter_mut() {
            if held.wants() {
                // A unit for each task waiting beyond those held.
                let short = held.waiters + held.in_use - held.units.len();
                for _ in 0..short.min(MOST_AT_ONCE.saturating_sub(ops.len())) {
                    *next += 1;
                    ops.push(Op::Take(key.clone(), format!("{}/{next}", self.instance)));
                }
                busy = true;
            }
            if held.idle() && !held.wants() {
                let since = *held.idle_since.get_or_insert(now);
                if now.duration_since(since) >= LINGER {
                    while held.idle() {
                        let (unit, _) =
                            held.units.pop_back().expect("idle: more units than in use");
                        ops.push(Op::Release(key.clone(), unit));
                    }
                    held.idle_since = None;
                } else {
                    busy = true;
                }
            }
            if keep {
                ops.extend(
                    held.units
                        .iter()
                        .map(|(u, _)| Op::Keep(key.clone(), u.clone())),
                );
            }
        }
        keys.retain(|_, held| !held.empty());
        (ops, busy)
    }

    async fn send(&self, conn: &SharedConnection, ops: &[Op]) -> crate::error::Result<Vec<u8>> {
        let most = self.limits.borrow().per_key().unwrap_or(u32::MAX);
        let mut replies = Vec::with_capacity(ops.len());
        for part in ops.chunks(MOST_AT_ONCE) {
            let mut script = UNITS.prepare_invoke();
            script.arg(most).arg(self.ttl.as_millis() as u64);
            for op in part {
                let (key, code, unit) = op.parts();
                script.key(keys::units(&self.name, key)).arg(code).arg(unit);
            }
            let reply: Vec<u8> = conn.invoke(&script).await?;
            replies.extend(reply);
        }
        Ok(replies)
    }

    /// Applies Redis's `replies` to `ops`.
    fn apply(&self, ops: &[Op], replies: &[u8]) {
        let mut told = Vec::new();
        let mut state = self.state.lock().expect("not poisoned");
        for (op, &ok) in ops.iter().zip(replies) {
            match op {
                Op::Release(..) => {}
                Op::Take(key, unit) if ok == 1 => {
                    let held = state.keys.entry(key.clone()).or_default();
                    held.units.push_back((unit.clone(), Instant::now()));
                    held.idle_since = Some(Instant::now());
                    told.push(key.clone());
                }
                // Refused: the key is at its limit; asked again in RETRY.
                Op::Take(..) => {}
                Op::Keep(key, unit) if ok == 0 => {
                    // Lapsed: the leaser could not keep it in time (Redis
                    // away, this process frozen), and another instance may
                    // hold it now. Its task runs on; the key may be over
                    // its bound until that task ends.
                    warn!(service = %self.name, key = %key, "a unit of a limit key lapsed while this instance held it");
                    if let Some(held) = state.keys.get_mut(key) {
                        held.units.retain(|(u, _)| u != unit);
                    }
                }
                Op::Keep(..) => {}
            }
        }
        drop(state);
        for key in told {
            // None listening is no error: the key's tasks were handed back.
            let _ = self.freed.send(key);
        }
    }

    /// Gives back every unit this instance holds (it stops; its tasks
    /// ended).
    pub(crate) async fn give_all_back(&self, conn: &SharedConnection) {
        let ops: Vec<Op> = {
            let mut state = self.state.lock().expect("not poisoned");
            let State { keys, released, .. } = &mut *state;
            let held = keys.drain().flat_map(|(key, held)| {
                held.units
                    .into_iter()
                    .map(move |(unit, _)| Op::Release(key.clone(), unit))
            });
            released
                .drain(..)
                .map(|(key, unit)| Op::Release(key, unit))
                .chain(held)
                .collect()
        };
        if !ops.is_empty()
            && let Err(e) = self.send(conn, &ops).await
        {
            warn!(service = %self.name, cause = %e, "units of the limit keys not given back; they lapse");
        }
    }

    /// A call failed: the releases go out with the next one.
    fn undo(&self, ops: Vec<Op>) {
        let mut state = self.state.lock().expect("not poisoned");
        for op in ops {
            if let Op::Release(key, unit) = op {
                state.released.push((key, unit));
            }
        }
    }
}

/// One operation on a key's units.
enum Op {
    Take(Arc<str>, String),
    Keep(Arc<str>, String),
    Release(Arc<str>, String),
}

impl Op {
    fn parts(&self) -> (&str, &'static str, &str) {
        match self {
            Op::Take(k, u) => (k, "a", u),
            Op::Keep(k, u) => (k, "k", u),
            Op::Release(k, u) => (k, "r", u),
        }
    }
}
