//! The checker's findings, and the report in Markdown (the RELIABILITY.md
//! shape): the run, the faults by kind, the tasks, every check with its
//! count, latency per minute and memory per process.

use std::collections::BTreeMap;
use std::fmt::Write;

use crate::check::{ALLOWED, FENCED};
use crate::history::FaultKind;
use crate::plan::Plan;

/// A task that ran twice with no fault to explain it.
#[derive(Debug)]
pub(crate) struct Dup {
    pub(crate) n: u64,
    pub(crate) first: String,
    pub(crate) second: String,
}

/// What the checker found.
#[derive(Debug, Default)]
pub(crate) struct Report {
    header: String,
    faults: BTreeMap<FaultKind, u32>,
    started: u64,
    pub(crate) processes: usize,
    pub(crate) tasks: u64,
    pub(crate) poison: u64,
    pub(crate) ticks: u64,
    pub(crate) batches: u64,
    pub(crate) ordered_keys: u64,
    /// Tasks to cancel; those whose cancel answered `cancelled`; those
    /// that started all the same.
    pub(crate) to_cancel: u64,
    pub(crate) cancelled: u64,
    pub(crate) cancel_broken: Vec<String>,
    /// Records read after the drain; those gone that the retention
    /// explains (at least `KEEP_RECORDS` later ends in their partition);
    /// those that said something else than the history.
    pub(crate) records: u64,
    pub(crate) records_evicted: u64,
    pub(crate) records_wrong: Vec<String>,
    /// The busiest second's starts over the rate limit; seconds above
    /// 1.08 times it, with a fault around them or not.
    pub(crate) busiest_second: f64,
    pub(crate) rate_explained: u64,
    pub(crate) rate: Vec<String>,
    pub(crate) lost: Vec<String>,
    pub(crate) twice_dead: Vec<String>,
    pub(crate) wrongly_dead: Vec<String>,
    pub(crate) unknown_dead: u64,
    pub(crate) early: Vec<String>,
    explained: BTreeMap<&'static str, u64>,
    pub(crate) unexplained: Vec<Dup>,
    /// Second runs whose attempt was not higher than the run before.
    pub(crate) same_attempt: Vec<Dup>,
    pub(crate) ticks_skipped: u64,
    pub(crate) ticks_missed: Vec<u64>,
    pub(crate) stale: Vec<String>,
    pub(crate) stale_explained: u64,
    pub(crate) order: Vec<String>,
    pub(crate) order_explained: u64,
    /// Per minute since the start: the latencies (µs) of plain tasks.
    minutes: BTreeMap<u64, Vec<u32>>,
    lateness: Vec<u32>,
    memory: Vec<String>,
}

impl Report {
    pub(crate) fn new(
        plan: &Plan,
        started: u64,
        injected_until: u64,
        counts: &BTreeMap<FaultKind, u32>,
    ) -> Report {
        let header = format!(
            "seed {}, {:.1} minutes of faults ({:.1} planned), {} tasks/s planned, {} to {} consumer processes and 2 producers, a fault every {:?} on average",
            plan.seed,
            (injected_until - started) as f64 / 60e6,
            plan.run_for.as_secs_f64() / 60.0,
            plan.rate,
            plan.min_consumers,
            plan.max_consumers,
            plan.fault_every
        );
        Report {
            header,
            faults: counts.clone(),
            started,
            ..Report::default()
        }
    }

    pub(crate) fn latency(&mut self, enqueued_at: u64, us: u64) {
        let minute = enqueued_at.saturating_sub(self.started) / 60_000_000;
        let us = u32::try_from(us).unwrap_or(u32::MAX);
        self.minutes.entry(minute).or_default().push(us);
    }

    pub(crate) fn lateness(&mut self, us: u64) {
        self.lateness.push(u32::try_from(us).unwrap_or(u32::MAX));
    }

    pub(crate) fn explained(&mut self, cause: &'static str) {
        *self.explained.entry(cause).or_default() += 1;
    }

    /// Per process: its memory in the first and the last minute it was
    /// sampled, and its peak; for those that lived at least 5 minutes.
    pub(crate) fn memory(&mut self, rss: &BTreeMap<String, Vec<(u64, u64)>>) {
        for (label, samples) in rss {
            let (first, last) = (samples[0].0, samples[samples.len() - 1].0);
            if last - first < 5 * 60_000_000 {
                continue;
            }
            let avg = |from: u64, to: u64| {
                let v: Vec<u64> = samples
                    .iter()
                    .filter(|(at, _)| (from..=to).contains(at))
                    .map(|(_, kb)| *kb)
                    .collect();
                v.iter().sum::<u64>() / v.len().max(1) as u64
            };
            // The first minute after the first two (start-up allocations).
            let early = avg(first + 120_000_000, first + 180_000_000);
            let late = avg(last - 60_000_000, last);
            let peak = samples.iter().map(|(_, kb)| *kb).max().unwrap_or(0);
            let flat = late <= early + early / 4 + 16 * 1024;
            self.memory.push(format!(
                "| {label} | {:.0} | {} | {} | {} | {} |",
                (last - first) as f64 / 60e6,
                early / 1024,
                late / 1024,
                peak / 1024,
                if flat { "flat" } else { "grew" }
            ));
        }
    }

    /// Broken guarantees.
    pub(crate) fn violations(&self) -> usize {
        self.lost.len()
            + self.twice_dead.len()
            + self.wrongly_dead.len()
            + self.early.len()
            + self.unexplained.len()
            + self.same_attempt.len()
            + self.ticks_missed.len()
            + self.stale.len()
            + self.order.len()
            + self.cancel_broken.len()
            + self.records_wrong.len()
            + self.rate.len()
    }

    pub(crate) fn markdown(&self) -> String {
        let mut s = String::new();
        let w = &mut s;
        let _ = writeln!(w, "## Chaos run: {}\n", self.header);
        let _ = writeln!(
            w,
            "### Faults injected\n\n| kind | count | what it allows |\n|---|---|---|"
        );
        for (kind, allows) in ALLOWED {
            let n = self.faults.get(&kind).copied().unwrap_or(0);
            let _ = writeln!(w, "| {} | {n} | {allows} |", kind.name());
        }
        let _ = writeln!(
            w,
            "| ({FENCED}) | not injected | an instance whose round failed, came late or was not counted (CPU starvation, a cut, a delay) fences itself, as a frozen one does: the tasks it had finished whose acks had not landed run again; periodic due times it would have triggered may be skipped |"
        );
        let _ = writeln!(
            w,
            "\n### Tasks\n\n{} tasks enqueued with success ({} poison, {} cancelled through their handles of {} to cancel), {} periodic due times run, {} workflow batches sealed, {} ordered keys, {} processes; {} task records read after the run.\n",
            self.tasks,
            self.poison,
            self.cancelled,
            self.to_cancel,
            self.ticks,
            self.batches,
            self.ordered_keys,
            self.processes,
            self.records
        );
        let explained: u64 = self.explained.values().sum();
        let by_kind: Vec<String> = self
            .explained
            .iter()
            .map(|(cause, n)| format!("{cause} {n}"))
            .collect();
        let _ = writeln!(
            w,
            "### Checks\n\n| check | found | allowed by a fault | violations |\n|---|---|---|---|"
        );
        let rows = [
            (
                "tasks lost (no effect, not dead)",
                self.lost.len() as u64,
                0,
                self.lost.len(),
            ),
            (
                "poison tasks with more than one dead letter",
                self.twice_dead.len() as u64,
                0,
                self.twice_dead.len(),
            ),
            (
                "tasks dead that should have succeeded",
                self.wrongly_dead.len() as u64,
                0,
                self.wrongly_dead.len(),
            ),
            (
                "tasks run twice",
                explained + self.unexplained.len() as u64,
                explained,
                self.unexplained.len(),
            ),
            (
                "second runs with an attempt no higher than the run before",
                self.same_attempt.len() as u64,
                0,
                self.same_attempt.len(),
            ),
            (
                "order violations on the ordered service",
                self.order_explained + self.order.len() as u64,
                self.order_explained,
                self.order.len(),
            ),
            (
                "periodic due times not run",
                self.ticks_skipped + self.ticks_missed.len() as u64,
                self.ticks_skipped,
                self.ticks_missed.len(),
            ),
            (
                "effects after a newer owner started",
                self.stale_explained + self.stale.len() as u64,
                self.stale_explained,
                self.stale.len(),
            ),
            (
                "delayed tasks early, callbacks before members",
                self.early.len() as u64,
                0,
                self.early.len(),
            ),
            (
                "tasks cancelled before they started that started",
                self.cancel_broken.len() as u64,
                0,
                self.cancel_broken.len(),
            ),
            (
                "seconds above 1.08 times the rate limit",
                self.rate_explained + self.rate.len() as u64,
                self.rate_explained,
                self.rate.len(),
            ),
            (
                "task records that disagree with the history (gone: allowed by the retention)",
                self.records_evicted + self.records_wrong.len() as u64,
                self.records_evicted,
                self.records_wrong.len(),
            ),
        ];
        for (name, found, allowed, bad) in rows {
            let _ = writeln!(w, "| {name} | {found} | {allowed} | {bad} |");
        }
        let _ = writeln!(
            w,
            "\nThe unordered service's busiest second started {:.2} times its rate limit.\n\nRuns twice allowed, by the fault that allows them: {}. Periodic due times not run fell in a pause or a Redis restart (skipped by design). Dead letters of tasks the producers never saw confirmed: {}.\n",
            self.busiest_second,
            if by_kind.is_empty() {
                "none".to_owned()
            } else {
                by_kind.join(", ")
            },
            self.unknown_dead
        );
        let problems = self
            .lost
            .iter()
            .chain(&self.twice_dead)
            .chain(&self.wrongly_dead)
            .chain(&self.early)
            .chain(&self.stale)
            .chain(&self.order)
            .chain(&self.cancel_broken)
            .chain(&self.records_wrong)
            .chain(&self.rate);
        let listed: Vec<&String> = problems.take(20).collect();
        if !listed.is_empty()
            || !self.unexplained.is_empty()
            || !self.same_attempt.is_empty()
            || !self.ticks_missed.is_empty()
        {
            let _ = writeln!(w, "### Violations (the first 20 of each)\n");
            for p in listed {
                let _ = writeln!(w, "- {p}");
            }
            for d in self.unexplained.iter().take(20) {
                let _ = writeln!(
                    w,
                    "- task {} ran twice: {}, then {}",
                    d.n, d.first, d.second
                );
            }
            for d in self.same_attempt.iter().take(20) {
                let _ = writeln!(
                    w,
                    "- task {} ran again with no higher attempt: {}, then {}",
                    d.n, d.first, d.second
                );
            }
            for due in self.ticks_missed.iter().take(20) {
                let _ = writeln!(w, "- periodic due time {due} ms never ran");
            }
            let _ = writeln!(w);
        }
        let _ = writeln!(
            w,
            "### Latency per minute (enqueue to effect, plain tasks)\n\n| minute | tasks | p50 ms | p99 ms | max ms |\n|---|---|---|---|---|"
        );
        for (minute, lat) in &self.minutes {
            let mut lat = lat.clone();
            lat.sort_unstable();
            let q = |p: f64| lat[((lat.len() - 1) as f64 * p) as usize] as f64 / 1000.0;
            let _ = writeln!(
                w,
                "| {minute} | {} | {:.1} | {:.1} | {:.0} |",
                lat.len(),
                q(0.5),
                q(0.99),
                q(1.0)
            );
        }
        if !self.lateness.is_empty() {
            let mut late = self.lateness.clone();
            late.sort_unstable();
            let q = |p: f64| late[((late.len() - 1) as f64 * p) as usize] as f64 / 1000.0;
            let _ = writeln!(
                w,
                "\nDelayed tasks, due time to effect: p50 {:.1} ms, p99 {:.1} ms, max {:.0} ms ({} tasks).",
                q(0.5),
                q(0.99),
                q(1.0),
                late.len()
            );
        }
        if !self.memory.is_empty() {
            let _ = writeln!(
                w,
                "\n### Memory (RSS, MiB) of the processes that lived 5 minutes or more\n\n| process | minutes | minute 3 | last minute | peak | |\n|---|---|---|---|---|---|"
            );
            for line in &self.memory {
                let _ = writeln!(w, "{line}");
            }
        }
        let _ = writeln!(w, "\n**{} violations.**", self.violations());
        s
    }
}
