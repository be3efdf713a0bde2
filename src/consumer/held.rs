//! The entries a worker holds in its partition: fetched, running, or
//! finished and waiting for their ack to land.
//!
//! An entry is held from the moment the read that returned it returns
//! (the worker's own read, the idle read's delivery, a claim) until it is
//! acked, moved or let go left pending: whatever the gate, the lanes or
//! the idle read's mailboxes do meanwhile, it is kept fresh and no claim
//! of this worker takes it over (docs/design.md §3, held entries).
//!
//! They are skipped when an entry comes back from a read of the pending
//! list or a claim, and kept fresh so nobody claims them. While the worker
//! re-reads its own pending list (`0`, after a read error and at start), a
//! reply can be older than an entry's ack: it may list an entry whose task
//! has finished meanwhile. The entries finished during a re-read are
//! remembered until it ends, so such a stale reply never runs a task again.

use std::sync::{Arc, Mutex, MutexGuard};

use fnv::FnvHashSet;

/// A stream id as the sets keep it: Redis's ids are `<ms>-<seq>` in
/// decimal without leading zeros, kept as the two numbers (no allocation
/// per task, cheap to hash: the sets were about 4 % of the consumer's CPU
/// with the ids as strings); anything else, which Redis never sends, as
/// text.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Key {
    Id(u64, u64),
    Text(String),
}

impl Key {
    fn of(id: &str) -> Key {
        id.split_once('-')
            .and_then(|(ms, seq)| Some(Key::Id(decimal(ms)?, decimal(seq)?)))
            .unwrap_or_else(|| Key::Text(id.to_owned()))
    }

    fn to_id(&self) -> String {
        match self {
            Key::Id(ms, seq) => format!("{ms}-{seq}"),
            Key::Text(id) => id.clone(),
        }
    }
}

/// A number written as Redis writes it (so that [`Key::to_id`] gives the
/// id back): digits, no sign, no leading zero.
fn decimal(text: &str) -> Option<u64> {
    let canonical =
        text.bytes().all(|b| b.is_ascii_digit()) && !(text.len() > 1 && text.starts_with('0'));
    canonical.then(|| text.parse().ok()).flatten()
}

// FNV rather than SipHash: the ids are this worker's own partition's, a
// few thousand at most, and hashed twice per task.
#[derive(Debug, Default)]
struct Entries {
    running: FnvHashSet<Key>,
    /// How many of `running` wait aside for a slot of their key
    /// (`run::aside`).
    aside: usize,
    /// `Some` while a re-read of the pending list is underway.
    finished: Option<FnvHashSet<Key>>,
}

impl Entries {
    fn take(&mut self, id: &str) -> bool {
        let key = Key::of(id);
        if self.finished.as_ref().is_some_and(|f| f.contains(&key)) {
            return false;
        }
        self.running.insert(key)
    }

    fn release(&mut self, id: &str, settled: bool) {
        let key = Key::of(id);
        self.running.remove(&key);
        if let Some(finished) = &mut self.finished
            && settled
        {
            finished.insert(key);
        }
    }
}

/// The entries one worker holds; cheap to clone.
#[derive(Debug, Clone, Default)]
pub(crate) struct Held(Arc<Mutex<Entries>>);

impl Held {
    fn lock(&self) -> MutexGuard<'_, Entries> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes `id` to run it; false if it is running already, or finished
    /// during the re-read underway (a stale reply).
    #[cfg(test)]
    fn take(&self, id: &str) -> bool {
        self.lock().take(id)
    }

    /// Keeps of `items` (entries by their `id`) those it takes to run, as
    /// [`take`](Self::take) would, under one lock.
    pub(crate) fn take_all<T>(&self, items: &mut Vec<T>, id: impl Fn(&T) -> &str) {
        let mut entries = self.lock();
        items.retain(|item| entries.take(id(item)));
    }

    /// `id` is done here: `settled` if acked or moved, else left pending
    /// (a failed write, no lease). Only a settled one is remembered during a
    /// re-read: one left pending must be read and run again.
    pub(crate) fn release(&self, id: &str, settled: bool) {
        self.lock().release(id, settled);
    }

    /// Each of `done` (an id, and whether it was settled) is done here, as
    /// [`release`](Self::release) says, under one lock.
    pub(crate) fn release_all<'a>(&self, done: impl IntoIterator<Item = (&'a str, bool)>) {
        let mut entries = self.lock();
        for (id, settled) in done {
            entries.release(id, settled);
        }
    }

    /// The ids held now.
    pub(crate) fn ids(&self) -> Vec<String> {
        self.lock().running.iter().map(Key::to_id).collect()
    }

    /// `delta` more (or fewer) of the held entries wait aside for a slot
    /// of their key.
    pub(crate) fn aside(&self, delta: isize) {
        let mut entries = self.lock();
        entries.aside = entries.aside.saturating_add_signed(delta);
    }

    /// How many held entries wait aside for a slot of their key.
    pub(crate) fn aside_count(&self) -> usize {
        self.lock().aside
    }

    /// A re-read of the pending list begins.
    pub(crate) fn begin_reread(&self) {
        self.lock().finished.get_or_insert_with(FnvHashSet::default);
    }

    /// The re-read ended: only new entries (`>`) are read from now on,
    /// which never include a finished one.
    pub(crate) fn end_reread(&self) {
        self.lock().finished = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_finished_during_a_reread_is_not_taken_again_until_it_ends() {
        let held = Held::default();
        assert!(held.take("1-0"));
        assert!(!held.take("1-0"), "running already");
        held.begin_reread();
        held.release("1-0", true);
        assert!(!held.take("1-0"), "a stale reply of the re-read");
        assert!(held.take("3-0"));
        held.release("3-0", false);
        assert!(held.take("3-0"), "left pending: it runs again");
        held.release("3-0", true);
        held.end_reread();
        held.release("2-0", true);
        assert!(held.take("2-0"), "outside a re-read nothing is remembered");
        assert_eq!(held.ids(), vec!["2-0".to_owned()]);
    }

    #[test]
    fn a_batch_is_taken_and_released_as_one_at_a_time() {
        let held = Held::default();
        assert!(held.take("2-0"));
        held.begin_reread();
        assert!(held.take("3-0"));
        held.release("3-0", true);
        let mut ids = vec!["1-0", "2-0", "3-0", "4-0", "1-0"];
        held.take_all(&mut ids, |id| id);
        assert_eq!(ids, ["1-0", "4-0"], "not running, not finished, once");
        held.release_all([("1-0", true), ("4-0", false), ("2-0", true)]);
        let mut again = vec!["1-0", "2-0", "4-0"];
        held.take_all(&mut again, |id| id);
        assert_eq!(again, ["4-0"], "only the one left pending runs again");
    }

    #[test]
    fn ids_are_kept_as_redis_wrote_them() {
        let held = Held::default();
        for id in [
            "1700000000000-0",
            "1-18446744073709551615",
            "01-2",
            "x",
            "1-2-3",
            "+1-2",
            "1-99999999999999999999",
        ] {
            assert!(held.take(id), "{id}");
        }
        assert!(!held.take("01-2"), "held, as text");
        assert!(held.take("1-2"), "not the same id as 01-2");
        let mut ids = held.ids();
        ids.sort();
        assert_eq!(
            ids,
            [
                "+1-2",
                "01-2",
                "1-18446744073709551615",
                "1-2",
                "1-2-3",
                "1-99999999999999999999",
                "1700000000000-0",
                "x"
            ]
        );
    }
}
