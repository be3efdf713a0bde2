//! What this instance holds of one limit key in Redis, of one kind (its
//! units of concurrency, or its share of the key's rate), and when to ask
//! for more, give some back, or keep it. Free of I/O.
//!
//! The count in Redis is the authority: the others' live counts and this
//! one's never add up to more than the limit. So a count lowered is used
//! lowered here before it is sent (nothing here uses what Redis may give
//! another instance meanwhile), a count raised only once Redis granted it,
//! and a count not confirmed within its life (Redis away, this process
//! frozen) is used no more: by then its field may have lapsed and its
//! part been given to others.

use std::time::Duration;

use tokio::time::Instant;

/// How long more than the key's tasks here need is kept before it goes
/// back (the next task of a busy key finds it at once).
pub(super) const LINGER: Duration = Duration::from_millis(100);
/// How soon what Redis refused is asked for again.
pub(super) const RETRY: Duration = Duration::from_millis(20);

/// An op to send: `(usable, wanted)`, what tasks here may use meanwhile
/// (the op never lowers the count below it) and the count wanted.
pub(super) type Ask = (u32, u32);

/// One kind of holding of one key.
#[derive(Debug, Default)]
pub(super) struct Holding {
    /// What this instance may use: never more than its count in Redis.
    granted: u32,
    /// Whether its field may be in Redis (it holds some, or is recorded
    /// short): a key is forgotten only after it is gone.
    in_redis: bool,
    /// While another instance is short of the key (the last reply), the
    /// even share this one gives back down to.
    share: Option<u32>,
    /// Until when `granted` may be used: the lapse of the last count Redis
    /// confirmed, by this clock, counted from before its request was sent.
    good_until: Option<Instant>,
    /// Since when more is held than the tasks here need.
    surplus_since: Option<Instant>,
    /// Refused: not asked again before this.
    refused_until: Option<Instant>,
}

impl Holding {
    /// What may be used now (0 once unconfirmed past its life).
    pub(super) fn usable(&self, now: Instant) -> u32 {
        match self.good_until {
            Some(good) if good > now => self.granted,
            _ => 0,
        }
    }

    /// While another instance is short: the even share to keep at most.
    pub(super) fn share(&self) -> Option<u32> {
        self.share
    }

    /// The op to send now, `(usable, wanted)`, if any: more when `desired`
    /// is above what is held (or tasks wait on a count not confirmed any
    /// more: `confirm`), less when what is held is above `floor` (what is
    /// in use; units in use are never given back) and `desired`, for
    /// [`LINGER`] or at once while another instance is short, and the same
    /// again when `keep`.
    pub(super) fn op(
        &mut self,
        now: Instant,
        desired: u32,
        floor: u32,
        confirm: bool,
        keep: bool,
    ) -> Option<Ask> {
        let confirmed = self.good_until.is_some_and(|g| g > now);
        if desired > self.granted || (confirm && !confirmed) {
            if self.refused_until.is_some_and(|r| r > now) {
                return None;
            }
            return Some((self.granted, desired.max(self.granted)));
        }
        let to = desired.max(floor);
        if self.granted > to {
            let since = *self.surplus_since.get_or_insert(now);
            if self.share.is_some() || now.duration_since(since) >= LINGER {
                self.surplus_since = None;
                return Some(self.lower(to));
            }
        } else {
            self.surplus_since = None;
        }
        (keep && self.in_redis).then_some((self.granted, self.granted))
    }

    /// Lowered at once to a limit lowered below what is held (`None`:
    /// nothing to lower).
    pub(super) fn cap(&mut self, most: u32) -> Option<Ask> {
        (self.granted > most).then(|| self.lower(most))
    }

    /// Lowers what may be used to `to` here, before it is sent.
    pub(super) fn lower(&mut self, to: u32) -> Ask {
        self.granted = self.granted.min(to);
        (self.granted, to)
    }

    /// Everything goes back (the instance stops, or the limit is gone):
    /// the op, if its field may be in Redis.
    pub(super) fn release(&mut self) -> Option<Ask> {
        self.in_redis.then(|| self.lower(0))
    }

    /// A release was sent and not answered: the field lapses by itself.
    pub(super) fn forget(&mut self) {
        self.in_redis = false;
    }

    /// Redis granted `granted` (of `wanted`) to a request sent at `sent`,
    /// living `ttl`; `share`: another instance is short, and this one
    /// keeps no more than that. True when more may be used than before.
    pub(super) fn granted(
        &mut self,
        sent: Instant,
        ttl: Duration,
        wanted: u32,
        granted: u32,
        share: Option<u32>,
    ) -> bool {
        let more = granted > self.granted;
        self.granted = granted;
        self.share = share;
        self.in_redis = granted > 0 || wanted > granted;
        self.good_until = Some(sent + ttl);
        self.refused_until = (granted < wanted).then(|| sent + RETRY);
        more
    }

    /// When to look again by itself: a retry, if `waiting`, and the end
    /// of a surplus's linger.
    pub(super) fn next_look(&self, waiting: bool) -> Option<Instant> {
        let retry = self.refused_until.filter(|_| waiting);
        let surplus = self.surplus_since.map(|s| s + LINGER);
        [retry, surplus].into_iter().flatten().min()
    }

    /// Nothing held and nothing in Redis.
    pub(super) fn is_empty(&self) -> bool {
        self.granted == 0 && !self.in_redis
    }
}
