//! The history checker: reads every process's history after the run and
//! checks it against the README's guarantees (docs/guide/13-guarantees.md)
//! and the list of what each fault allows ([`ALLOWED`]): tasks lost, tasks
//! run twice (each explained by a fault or not), order on the ordered
//! service, periodic due times run twice or missed, effects made after a
//! newer owner started, delayed tasks run early, batch callbacks run before
//! their members; and the latency and memory figures per minute.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;

use crate::history::{self, Event, Fault, FaultKind, Run, Word};
use crate::plan::{Kind, MAX_ATTEMPTS, Plan};
use crate::report::{Dup, Report};

mod precedence;
mod retention;
use precedence::{batches, order, stale_effects};
use retention::Ended;

/// What each kind of fault allows, written down before the run: a task
/// whose effect was made by a process while (or just before) this fault
/// hit it may run again, with a higher attempt. Nothing else may.
pub(crate) const ALLOWED: [(FaultKind, &str); 9] = [
    (
        FaultKind::Leave,
        "nothing: a graceful leave runs every task exactly once",
    ),
    (
        FaultKind::Join,
        "nothing: a join runs every task exactly once",
    ),
    (
        FaultKind::Kill,
        "the tasks in flight on the killed process run again",
    ),
    (
        FaultKind::Freeze,
        "the tasks in flight on the frozen process run again; the one it was running \
         between its `still_owned()` check and its effect may make that effect after a \
         newer owner started (and out of its key's order)",
    ),
    (
        FaultKind::Cut,
        "the tasks in flight on the cut-off process run again",
    ),
    (
        FaultKind::Delay,
        "the tasks in flight on the delayed process run again (a late round fences it)",
    ),
    (
        FaultKind::RedisRestart,
        "the tasks in flight anywhere run again (acks lost with the connection); periodic \
         due times while Redis is down are skipped",
    ),
    (
        FaultKind::Pause,
        "nothing run twice; periodic due times while paused are skipped",
    ),
    (
        FaultKind::Replay,
        "nothing: a replayed dead letter dies again, once",
    ),
];

/// The cause of a second run, or of a due time not triggered, that is no
/// injected fault: an instance that fenced itself.
pub(crate) const FENCED: &str = "fenced itself";

/// How long after an effect its ack may still be in flight: a fault on
/// the process within it explains a second run. Acks are sent again until
/// they land or the instance is fenced, and on two starved cores one was
/// seen in flight for 3.2 s (a run's effect at 988.6 s, its process cut
/// off at 991.8 s, the ack dropped as fenced at 994.3 s).
const ACK_WINDOW_US: u64 = 5_000_000;

/// One effect, with the process that made it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Effect {
    pub(crate) proc: u16,
    pub(crate) run: Run,
}

/// Everything the history holds, gathered.
#[derive(Default)]
struct History {
    labels: Vec<String>,
    enqueued: HashMap<u64, (u64, Kind)>,
    effects: HashMap<u64, Vec<Effect>>,
    ticks: BTreeMap<u64, Vec<Effect>>,
    /// Per (ordered, partition): each token's first start.
    starts: HashMap<(bool, u32), BTreeMap<u64, u64>>,
    dead: HashMap<u64, u32>,
    /// Tasks that started a run.
    started: HashSet<u64>,
    /// What each user's cancel answered, and the records read at the end.
    cancels: HashMap<u64, Word>,
    records: HashMap<u64, Word>,
    /// When each cancel that made its task final answered (for one
    /// without a time, its enqueue): a task's end, for the retention.
    cancelled_at: HashMap<u64, u64>,
    /// The partition of each task with a handle.
    handles: HashMap<u64, u32>,
    /// Each task's last start at the last attempt or later on the
    /// unordered service (partition, time): a poison task's end.
    last_attempts: HashMap<u64, (u32, u64)>,
    /// Per process: when its unordered instance was assigned, from, to.
    assigned: HashMap<u16, Vec<(u64, u64)>>,
    /// Per process: when one of its instances fenced itself, and which.
    fences: HashMap<u16, Vec<(bool, u64)>>,
    sealed: HashSet<u64>,
    faults: Vec<(FaultKind, String, Fault)>,
    window: Option<(u64, u64)>,
    limit: u64,
    /// Starts on the unordered service per second (the rate limit's).
    starts_per_second: HashMap<u64, u32>,
    rss: BTreeMap<String, Vec<(u64, u64)>>,
}

fn gather(dir: &Path) -> History {
    let mut h = History::default();
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .expect("the run's directory")
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "ev"))
        .collect();
    files.sort();
    for path in files {
        let label = path.file_stem().unwrap().to_string_lossy().into_owned();
        let proc = h.labels.len() as u16;
        h.labels.push(label.clone());
        history::read(&path, |event, target| match event {
            Event::Enqueued { n, at, kind } => {
                h.enqueued.insert(n, (at, kind));
            }
            Event::Sealed { batch } => {
                h.sealed.insert(batch);
            }
            Event::Start(run) => {
                h.started.insert(run.n);
                if !run.ordered && run.attempt >= MAX_ATTEMPTS {
                    let last = h.last_attempts.entry(run.n).or_insert((run.partition, 0));
                    if run.at >= last.1 {
                        *last = (run.partition, run.at);
                    }
                }
                if !run.ordered {
                    *h.starts_per_second.entry(run.at / 1_000_000).or_default() += 1;
                }
                let first = h
                    .starts
                    .entry((run.ordered, run.partition))
                    .or_default()
                    .entry(run.token)
                    .or_insert(run.at);
                *first = (*first).min(run.at);
            }
            Event::Effect(run) => h
                .effects
                .entry(run.n)
                .or_default()
                .push(Effect { proc, run }),
            Event::Tick(run) => h.ticks.entry(run.n).or_default().push(Effect { proc, run }),
            Event::Dead { n } => *h.dead.entry(n).or_default() += 1,
            Event::Handle { n, partition } => {
                h.handles.insert(n, partition);
            }
            Event::Cancelled { n, outcome, at } => {
                h.cancels.insert(n, outcome);
                if outcome.is("cancelled") {
                    h.cancelled_at.insert(n, at.unwrap_or(0));
                }
            }
            Event::Record { n, state } => {
                h.records.insert(n, state);
            }
            Event::Window { start, end, limit } => {
                h.window = Some((start, end));
                h.limit = limit;
            }
            Event::Standing { ordered, state, at } => {
                if state == b'f' {
                    h.fences.entry(proc).or_default().push((ordered, at));
                }
                if ordered {
                    return;
                }
                let spans = h.assigned.entry(proc).or_default();
                match (state == b'1', spans.last_mut()) {
                    (true, _) => spans.push((at, u64::MAX)),
                    (false, Some(open)) if open.1 == u64::MAX => open.1 = at,
                    (false, _) => {}
                }
            }
            Event::Fault(fault) => {
                h.faults
                    .push((fault.kind, target.unwrap_or_default().to_owned(), fault));
            }
            Event::Rss { rss_kb, at } => h
                .rss
                .entry(target.unwrap_or_default().to_owned())
                .or_default()
                .push((at, rss_kb)),
        });
    }
    h
}

impl History {
    /// What hit the process of `e` while its ack could still be in flight,
    /// and before the next run at `next`: a fault (its kind's name), or
    /// else a fence of its own (`fenced itself`: a round that failed, came
    /// late or was not counted, as under CPU starvation), if any.
    fn explain(&self, e: &Effect, next: u64) -> Option<&'static str> {
        let label = &self.labels[e.proc as usize];
        let (from, to) = (e.run.checked, (e.run.at + ACK_WINDOW_US).min(next));
        let fault = self.faults.iter().find(|(kind, target, f)| {
            let hits = target == label || *kind == FaultKind::RedisRestart;
            hits && f.start <= to && f.end >= from && !harmless(*kind)
        });
        if let Some((kind, _, _)) = fault {
            return Some(kind.name());
        }
        let fenced = self.fences.get(&e.proc).is_some_and(|fences| {
            fences
                .iter()
                .any(|&(ordered, at)| ordered == e.run.ordered && from <= at && at <= to)
        });
        fenced.then_some(FENCED)
    }

    /// A freeze of the process of `e` that began between its check and
    /// its effect.
    fn frozen_in_window(&self, e: &Effect) -> bool {
        let label = &self.labels[e.proc as usize];
        self.faults.iter().any(|(kind, target, f)| {
            *kind == FaultKind::Freeze
                && target == label
                && f.start >= e.run.checked
                && f.start <= e.run.at
        })
    }

    /// Whether a newer owner of the partition of `e` had started before
    /// its check passed.
    fn stale(&self, e: &Effect) -> bool {
        self.starts
            .get(&(e.run.ordered, e.run.partition))
            .is_some_and(|tokens| {
                tokens
                    .range(e.run.token + 1..)
                    .any(|(_, first)| *first < e.run.checked)
            })
    }

    /// Whether a periodic due time at `at` (µs) may be skipped: it fell
    /// in a pause or a Redis restart, or no process that could trigger it
    /// was assigned (not frozen, cut off, delayed or killed around it),
    /// give or take `slack` µs.
    fn skipped(&self, at: u64, slack: u64) -> bool {
        let near = |f: &Fault| f.start.saturating_sub(slack) <= at && at <= f.end + slack;
        let service_wide = self.faults.iter().any(|(kind, _, f)| {
            matches!(kind, FaultKind::Pause | FaultKind::RedisRestart) && near(f)
        });
        let able = |proc: u16| {
            let label = &self.labels[proc as usize];
            let fenced = self.fences.get(&proc).is_some_and(|fences| {
                fences
                    .iter()
                    .any(|&(ordered, f)| !ordered && f + slack >= at && f <= at + slack)
            });
            !fenced
                && !self.faults.iter().any(|(kind, target, f)| {
                    target == label
                        && match kind {
                            FaultKind::Kill | FaultKind::Leave => f.start <= at + slack,
                            FaultKind::Freeze | FaultKind::Cut | FaultKind::Delay => near(f),
                            _ => false,
                        }
                })
        };
        let assigned = self.assigned.iter().any(|(proc, spans)| {
            able(*proc) && spans.iter().any(|(from, to)| *from <= at && at < *to)
        });
        service_wide || !assigned
    }
}

/// Kinds that never explain a second run.
fn harmless(kind: FaultKind) -> bool {
    matches!(
        kind,
        FaultKind::Leave | FaultKind::Join | FaultKind::Pause | FaultKind::Replay
    )
}

/// Checks the history in `plan.dir` (its `W` line says when the faults
/// began and ended).
pub(crate) fn check(plan: &Plan) -> Report {
    let h = gather(&plan.dir);
    let ended = Ended::of(&h);
    let (started, injected_until) = h.window.expect("the history's `W` line");
    let mut counts: BTreeMap<FaultKind, u32> = BTreeMap::new();
    for (kind, _, _) in &h.faults {
        *counts.entry(*kind).or_default() += 1;
    }
    let mut r = Report::new(plan, started, injected_until, &counts);
    r.processes = h.labels.len();
    for (&n, &(enq_at, kind)) in &h.enqueued {
        r.tasks += 1;
        let effects = h.effects.get(&n).map(Vec::as_slice).unwrap_or(&[]);
        let dead = h.dead.get(&n).copied().unwrap_or(0);
        let cancel = h.cancels.get(&n).copied();
        if let Some(state) = h.records.get(&n) {
            let evictable = ended.evictable(n);
            record(
                &mut r,
                n,
                kind,
                *state,
                !effects.is_empty(),
                cancel,
                evictable,
            );
        }
        if kind == Kind::Cancel {
            r.to_cancel += 1;
            let cancelled = cancel.is_some_and(|o| o.is("cancelled"));
            if cancelled {
                r.cancelled += 1;
                if h.started.contains(&n) {
                    r.cancel_broken.push(format!(
                        "task {n}: cancelled before it started, yet it started"
                    ));
                }
            }
            // Unless the cancel found it ended, it need not have run.
            if effects.is_empty() && !cancel.is_some_and(|o| o.is("final")) {
                continue;
            }
        }
        if kind == Kind::Poison {
            r.poison += 1;
            match dead {
                0 => r
                    .lost
                    .push(format!("poison task {n}: not in the dead letters")),
                1 => {}
                d => r.twice_dead.push(format!("task {n}: {d} dead letters")),
            }
            continue;
        }
        if dead > 0 {
            r.wrongly_dead
                .push(format!("task {n} ({kind:?}) is in the dead letters"));
        }
        let Some(first) = effects.iter().min_by_key(|e| e.run.at) else {
            r.lost
                .push(format!("task {n} ({kind:?}), enqueued at {enq_at}"));
            continue;
        };
        match kind {
            Kind::Plain | Kind::Member { .. } => {
                r.latency(enq_at, first.run.at - enq_at.min(first.run.at))
            }
            Kind::Delayed { due_ms } => {
                if first.run.at + 2_000 < due_ms * 1000 {
                    r.early.push(format!(
                        "task {n} ran at {} before its due {due_ms} ms",
                        first.run.at
                    ));
                }
                r.lateness(first.run.at.saturating_sub(due_ms * 1000));
            }
            _ => {}
        }
        duplicates(&h, &mut r, n, effects);
    }
    for (&due, effects) in &h.ticks {
        r.ticks += 1;
        duplicates(&h, &mut r, due, effects);
    }
    // Due times from 10 s after the start (the first rounds) to the end
    // of the faults, one per second: each ran, or no instance able to
    // trigger it was assigned, or it fell in a pause or a Redis restart.
    let first_due = (started / 1_000_000 + 10) * 1000;
    for due in (first_due..injected_until / 1000).step_by(1000) {
        if !h.ticks.contains_key(&due) {
            if h.skipped(due * 1000, 1_000_000) {
                r.ticks_skipped += 1;
            } else {
                r.ticks_missed.push(due);
            }
        }
    }
    rate(&h, &mut r);
    stale_effects(&h, &mut r);
    order(&h, &mut r);
    batches(&h, &mut r);
    r.memory(&h.rss);
    for (n, letters) in &h.dead {
        if !h.enqueued.contains_key(n) {
            r.unknown_dead += u64::from(*letters);
        }
    }
    r
}

/// The unordered service's starts per second against its rate limit:
/// at most 1.08 times it in any second (docs/guide/08-flow-control.md),
/// unless a fault hit a process in that second or the one before (a
/// process frozen or cut off with its tokens starts late, in a later
/// second, what it was given earlier).
fn rate(h: &History, r: &mut Report) {
    if h.limit == 0 {
        return;
    }
    let bound = h.limit as f64 * 1.08;
    for (&second, &starts) in &h.starts_per_second {
        let ratio = f64::from(starts) / h.limit as f64;
        r.busiest_second = r.busiest_second.max(ratio);
        if f64::from(starts) > bound {
            let (from, to) = ((second - 1) * 1_000_000, (second + 1) * 1_000_000);
            let faulted = h
                .faults
                .iter()
                .any(|(kind, _, f)| !harmless(*kind) && f.start <= to && f.end >= from);
            if faulted {
                r.rate_explained += 1;
            } else {
                r.rate.push(format!(
                    "second {second}: {starts} starts, {ratio:.2} times the limit of {}",
                    h.limit
                ));
            }
        }
    }
}

/// Whether task `n`'s record, read after the drain, says what its history
/// does: `dead` for a poison task, `succeeded` for one that made its
/// effect, `cancelled` for one a cancel stopped before its effect; or is
/// gone, `evictable` by the retention (see [`retention`]).
fn record(
    r: &mut Report,
    n: u64,
    kind: Kind,
    state: Word,
    effect: bool,
    cancel: Option<Word>,
    evictable: bool,
) {
    r.records += 1;
    if state.is("none") && evictable {
        r.records_evicted += 1;
        return;
    }
    let expected = match kind {
        Kind::Poison => "dead",
        _ if effect => "succeeded",
        Kind::Cancel if cancel.is_some_and(|o| o.is("cancelled") || o.is("requested")) => {
            "cancelled"
        }
        // No effect and no cancel: a lost task, reported as such.
        _ => return,
    };
    if !state.is(expected) {
        let said = String::from_utf8_lossy(&state.0).into_owned();
        r.records_wrong.push(format!(
            "task {n} ({kind:?}): its record says {said}…, not {expected}"
        ));
    }
}

/// A task's effects beyond its first, each explained by a fault on the
/// process that made the one before it, or not.
fn duplicates(h: &History, r: &mut Report, n: u64, effects: &[Effect]) {
    if effects.len() < 2 {
        return;
    }
    let mut sorted = effects.to_vec();
    sorted.sort_by_key(|e| e.run.at);
    for pair in sorted.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        let dup = Dup {
            n,
            first: format!(
                "{} token {} attempt {} at {}",
                h.labels[a.proc as usize], a.run.token, a.run.attempt, a.run.at
            ),
            second: format!(
                "{} token {} attempt {} at {}",
                h.labels[b.proc as usize], b.run.token, b.run.attempt, b.run.at
            ),
        };
        // Whatever explains it, a second run has a higher attempt: an
        // attempt above 1 means "may have run" (docs/design.md §5).
        match h.explain(&a, b.run.at) {
            _ if b.run.attempt <= a.run.attempt => r.same_attempt.push(dup),
            Some(cause) => r.explained(cause),
            None => r.unexplained.push(dup),
        }
    }
}
