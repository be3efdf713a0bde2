//! What this instance holds of one limit key, and what it should ask Redis
//! for next: its units (the concurrency per key) and its share of the
//! key's rate (the rate per key), each a [`Holding`]. Free of I/O: the
//! leaser asks [`Key::units_op`] and [`Key::rate_op`] what to send and
//! tells the replies back.
//!
//! Why a share of the rate rather than tokens leased per request: a token
//! leased from Redis may be used only within 50 ms of its request (the
//! bound of docs/design.md §15), so every busy key cost a Redis call every
//! few tens of milliseconds, and under load (a call behind the instance's
//! reads) tokens arrived expired and every task of every key waited aside
//! (0.25–0.85× in `cargo bench --bench limits`). A share is a part of the
//! key's count per period that this instance may start at, by a GCRA of
//! its own in memory: it costs Redis nothing per task, and the shares of
//! the live instances never add up to more than the key's rate.

use std::time::Duration;

use tokio::time::Instant;

use super::holding::{Ask, Holding, LINGER};
use super::script::Kind;
use crate::limits::RateLimit;

/// The most credit a key's share accrues here: an idle key starts at most
/// this much of its share at once (at least one task).
const BURST: Duration = Duration::from_millis(30);

/// One limit key on this instance.
#[derive(Debug, Default)]
pub(super) struct Key {
    /// Units of the key's concurrency.
    units: Holding,
    /// How many of them running tasks use.
    in_use: u32,
    /// Tasks of the key waiting aside here.
    waiters: u32,
    /// The most units the key's tasks here needed (running and waiting)
    /// since the leaser last looked: a busy key's short tasks leave it
    /// needing none at most instants, and a count sized by the instant of
    /// the look went back and was asked for again every [`LINGER`]
    /// (0.77x in `cargo bench --bench limits`).
    peak: u32,
    /// The share of the key's rate: a count per the limit's period.
    rate: Holding,
    /// The share's GCRA: when the next start conforms, less the burst.
    tat: Option<Instant>,
    /// When a task of the key last started here.
    last_start: Option<Instant>,
}

impl Key {
    /// Whether a task could start now: a free unit (if `units` count) and
    /// a start the share of `rate` allows (if a rate counts).
    pub(super) fn has_room(&self, now: Instant, units: bool, rate: Option<RateLimit>) -> bool {
        (!units || self.in_use < self.units.usable(now))
            && rate.is_none_or(|r| self.rate_due(now, r).is_some_and(|due| due <= now))
    }

    /// When the share of `rate` next allows a start (`None`: no share).
    fn rate_due(&self, now: Instant, rate: RateLimit) -> Option<Instant> {
        let interval = interval(rate, self.rate.usable(now))?;
        let tolerance = BURST.saturating_sub(interval);
        Some(
            self.tat
                .map_or(now, |t| t.checked_sub(tolerance).unwrap_or(t)),
        )
    }

    /// Takes a unit and a start of the share (those that count) for a
    /// task, or neither.
    pub(super) fn take(&mut self, now: Instant, units: bool, rate: Option<RateLimit>) -> bool {
        if !self.has_room(now, units, rate) {
            return false;
        }
        if units {
            self.in_use += 1;
            self.peak = self.peak.max(self.need());
        }
        if let Some(rate) = rate
            && let Some(interval) = interval(rate, self.rate.usable(now))
        {
            self.tat = Some(self.tat.map_or(now, |t| t.max(now)) + interval);
        }
        self.last_start = Some(now);
        true
    }

    /// `delta` more (or fewer) tasks of the key wait aside here.
    pub(super) fn waiting(&mut self, delta: isize) {
        self.waiters = self.waiters.saturating_add_signed(delta as i32);
        self.peak = self.peak.max(self.need());
    }

    /// Whether tasks of the key wait aside here.
    pub(super) fn has_waiters(&self) -> bool {
        self.waiters > 0
    }

    fn need(&self) -> u32 {
        self.in_use + self.waiters
    }

    /// A task that held a unit ended. True when units are wanted back at
    /// once (another instance is short): the leaser should look now.
    pub(super) fn end(&mut self) -> bool {
        self.in_use = self.in_use.saturating_sub(1);
        self.units.share().is_some()
    }

    /// The units op to send now, `(usable, wanted)`, if any; `most` is the
    /// limit (`None`: units do not count, and any held go back); `keep`:
    /// the held ones are kept now.
    pub(super) fn units_op(&mut self, now: Instant, most: Option<u32>, keep: bool) -> Option<Ask> {
        let Some(most) = most else {
            return self.units.release();
        };
        if let Some(op) = self.units.cap(most) {
            return Some(op);
        }
        let need = self.need().max(self.peak);
        self.peak = self.need();
        let desired = match self.units.share() {
            // Another instance is short: no more than an even share.
            Some(share) => need.min(share),
            // A cushion of half what the tasks here need: the next task of a
            // busy key starts without a round trip.
            None if need > 0 => need + (need / 2).max(1),
            None => 0,
        }
        .min(most);
        self.units
            .op(now, desired, self.in_use, self.waiters > 0, keep)
    }

    /// The rate op to send now, `(usable, wanted)`, if any: the whole rate
    /// while the key's tasks wait or started here within [`LINGER`] (an
    /// even share while another instance is short), nothing after (`None`:
    /// no rate counts, and the share goes back).
    pub(super) fn rate_op(
        &mut self,
        now: Instant,
        rate: Option<RateLimit>,
        keep: bool,
    ) -> Option<Ask> {
        let Some(rate) = rate else {
            return self.rate.release();
        };
        if let Some(op) = self.rate.cap(rate.count()) {
            return Some(op);
        }
        let busy = self.waiters > 0
            || self
                .last_start
                .is_some_and(|s| now.duration_since(s) < LINGER);
        let desired = match (busy, self.rate.share()) {
            (false, _) => 0,
            (true, Some(share)) => share.min(rate.count()),
            (true, None) => rate.count(),
        };
        self.rate.op(now, desired, 0, self.waiters > 0, keep)
    }

    /// Redis granted `granted` (of `wanted`) of `kind` to a request sent
    /// at `sent`; `share`: another instance is short. True when the key's
    /// tasks waiting here may start now.
    pub(super) fn granted(
        &mut self,
        kind: Kind,
        sent: Instant,
        ttl: Duration,
        (wanted, granted): (u32, u32),
        share: Option<u32>,
    ) -> bool {
        let holding = match kind {
            Kind::Units => &mut self.units,
            Kind::Rate => &mut self.rate,
        };
        holding.granted(sent, ttl, wanted, granted, share) && self.waiters > 0
    }

    /// Everything held goes back (the instance stops): the units op and
    /// the rate op, if any; and forgets them (a reply may not come).
    pub(super) fn release(&mut self) -> [(Kind, Option<Ask>); 2] {
        let ops = [
            (Kind::Units, self.units.release()),
            (Kind::Rate, self.rate.release()),
        ];
        self.units.forget();
        self.rate.forget();
        ops
    }

    /// Whether tasks wait here that the share of `rate` allows again now,
    /// with a unit free (if `units` count): the key is told.
    pub(super) fn due(&self, now: Instant, units: bool, rate: Option<RateLimit>) -> bool {
        self.waiters > 0 && rate.is_some() && self.has_room(now, units, rate)
    }

    /// When the leaser should look at this key again by itself: a retry, a
    /// surplus to give back, the share's next start for tasks waiting.
    pub(super) fn next_look(&self, now: Instant, rate: Option<RateLimit>) -> Option<Instant> {
        let waiting = self.waiters > 0;
        let due = rate
            .filter(|_| waiting)
            .and_then(|r| self.rate_due(now, r))
            .filter(|due| *due > now);
        [
            self.units.next_look(waiting),
            self.rate.next_look(waiting),
            due,
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Whether it holds a share of the rate: the leaser looks every
    /// [`LINGER`] for shares that went idle (a look per key at each start
    /// would wake it at every start).
    pub(super) fn holds_rate(&self) -> bool {
        !self.rate.is_empty()
    }

    /// Nothing to remember: nothing held, no task, nothing in Redis.
    pub(super) fn forgettable(&self) -> bool {
        self.units.is_empty() && self.rate.is_empty() && self.in_use == 0 && self.waiters == 0
    }
}

/// The time between two starts of a share of `share` of `rate`'s count
/// (`None` for none).
fn interval(rate: RateLimit, share: u32) -> Option<Duration> {
    (share > 0).then(|| rate.per() / share)
}

#[cfg(test)]
mod tests;
