//! The instance's side of the service-wide rate limit (docs/design.md
//! §15): a pool of tokens leased from `{N}:rate` (`rate.lua`), one taken
//! by each handler start.
//!
//! Why lease rather than ask per start: a round trip per start would cap
//! a fast instance at its Redis latency and put every start of the service
//! on one key. A lease asks for the tokens of [`AHEAD`] at the limit's rate
//! or what the instance is about to start, whichever is more, at most the
//! [`BURST`]'s worth; one request at a time per instance.
//!
//! Why tokens expire: a token may be used only within [`VALID`] of the
//! request that leased it, by this instance's clock. A paused, starved or
//! frozen instance therefore cannot save tokens up and start a burst later;
//! in any window of length `W` the service starts at most
//! `rate × (W + BURST + VALID)` tasks (1.08× the limit over a second).
//!
//! The fetch loops read no more than the tokens they reserved
//! ([`Limiter::reserve`]), so a limited instance reads what it can start
//! and nothing waits outside Redis's pending list; an entry without a
//! reserved token (from the idle read) takes one from the pool before it
//! starts.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use deadpool_redis::redis::Script;
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::warn;

use crate::config::ServiceName;
use crate::connection::SharedConnection;
use crate::keys;
use crate::limits::{Limits, RateLimit};
use crate::metrics as m;

/// The most credit the limit's state accrues: a service idle for longer
/// starts at most this much of the rate at once.
const BURST: Duration = Duration::from_millis(30);
/// How long a leased token may be used, from its lease's request.
const VALID: Duration = Duration::from_millis(50);
/// A lease asks for at least this much of the rate.
const AHEAD: Duration = Duration::from_millis(10);
/// The longest wait between two requests while no token is granted: a
/// cleared or raised limit is heard within it.
const MOST_WAIT: Duration = Duration::from_millis(250);

static RATE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../scripts/rate.lua")));

/// Tokens leased together, usable until `until`.
#[derive(Debug)]
struct Chunk {
    left: u32,
    until: Instant,
}

/// What a lease request got.
enum Leased {
    Granted(Chunk),
    /// None now: ask again after this.
    Wait(Duration),
}

/// Asks `key` (a GCRA of `rate`) for tokens for about `want` starts: at
/// least [`AHEAD`] of the rate, at most the [`BURST`]'s worth. A Redis that
/// cannot be reached gives none: the starts wait, and it is asked again.
async fn lease(conn: &SharedConnection, key: &str, rate: RateLimit, want: usize) -> Leased {
    let interval = rate.interval_us();
    let most = (BURST.as_micros() as f64 / interval).floor().max(1.0);
    let ahead = (AHEAD.as_micros() as f64 / interval).ceil();
    let asked = (want as f64).max(ahead).clamp(1.0, most) as u64;
    let sent = Instant::now();
    let mut script = RATE.key(key);
    script
        .arg(interval)
        .arg(BURST.as_micros() as u64)
        .arg(asked);
    let wait = match conn.invoke::<(u64, u64)>(&script).await {
        Ok((0, wait_us)) => Duration::from_micros(wait_us),
        Ok((granted, _)) => {
            return Leased::Granted(Chunk {
                left: granted.min(u64::from(u32::MAX)) as u32,
                // From the request: the bound of docs/design.md §15.
                until: sent + VALID,
            });
        }
        Err(e) => {
            warn!(cause = %e, key, "cannot lease tokens of a rate limit; limited tasks wait");
            Duration::from_millis(100)
        }
    };
    Leased::Wait(wait.clamp(Duration::from_micros(500), MOST_WAIT))
}

/// One instance's pool of tokens, and its view of the service's limits.
pub(crate) struct Limiter {
    conn: Arc<SharedConnection>,
    key: String,
    limits: watch::Receiver<Limits>,
    pool: Mutex<VecDeque<Chunk>>,
    /// One lease request at a time: the others wait for its tokens.
    leasing: tokio::sync::Mutex<()>,
    waiting: metrics::Gauge,
    leased: metrics::Counter,
}

impl Limiter {
    /// The limiter of service `name`, following `limits`.
    pub(crate) fn new(
        name: &ServiceName,
        conn: Arc<SharedConnection>,
        limits: watch::Receiver<Limits>,
    ) -> Self {
        let labels = [("service", name.to_string()), ("limit", "rate".to_owned())];
        Limiter {
            conn,
            key: keys::rate(name),
            limits,
            pool: Mutex::new(VecDeque::new()),
            leasing: tokio::sync::Mutex::new(()),
            waiting: metrics::gauge!(m::LIMITED_TASKS, &labels),
            leased: metrics::counter!(m::LIMIT_TOKENS_TOTAL, &labels),
        }
    }

    /// Whether starts are limited now.
    pub(crate) fn limited(&self) -> bool {
        self.limits.borrow().rate_limit().is_some()
    }

    /// Takes up to `want` tokens for a read, waiting until at least one is
    /// there: the read asks for no more entries than it holds. Without a
    /// limit, `want` at once.
    pub(crate) async fn reserve(self: &Arc<Self>, want: usize) -> Reserved {
        loop {
            if !self.limited() {
                return Reserved::unlimited(want);
            }
            if let Some(reserved) = self.take_up_to(want) {
                return reserved;
            }
            self.lease(want).await;
        }
    }

    /// Takes one token for a start now, if the pool holds one (or nothing
    /// is limited).
    pub(crate) fn try_take(&self) -> bool {
        !self.limited() || self.take_up_to(1).is_some_and(|r| r.take())
    }

    /// Waits until the pool may hold a token for a start (take it with
    /// [`try_take`](Self::try_take)), counted as a waiting task meanwhile.
    pub(crate) async fn replenished(&self) {
        self.waiting.increment(1.0);
        let _counted = Counted(&self.waiting);
        self.lease(1).await;
    }

    /// Up to `want` tokens of the pool's first chunk that has not expired.
    fn take_up_to(&self, want: usize) -> Option<Reserved> {
        let mut pool = self.pool.lock().expect("not poisoned");
        let now = Instant::now();
        while let Some(chunk) = pool.front_mut() {
            if chunk.until <= now || chunk.left == 0 {
                pool.pop_front();
                continue;
            }
            let n = chunk.left.min(want.min(u32::MAX as usize) as u32);
            chunk.left -= n;
            return Some(Reserved {
                left: AtomicU32::new(n),
                until: Some(chunk.until),
                pool: None,
            });
        }
        None
    }

    /// Puts `n` unused tokens valid until `until` back in the pool.
    fn give_back(&self, n: u32, until: Instant) {
        if n == 0 || until <= Instant::now() {
            return;
        }
        let mut pool = self.pool.lock().expect("not poisoned");
        // Soonest to expire first: used first.
        let at = pool.partition_point(|c| c.until <= until);
        pool.insert(at, Chunk { left: n, until });
    }

    /// Leases tokens for about `want` starts, or waits until the limit has
    /// some again; returns once the pool may hold tokens (or the limit is
    /// gone). A Redis that cannot be reached starts nothing limited: the
    /// entries wait, pending, and the lease is asked again.
    async fn lease(&self, want: usize) {
        let _one = self.leasing.lock().await;
        if self.has_tokens() {
            return;
        }
        let Some(rate) = self.limits.borrow().rate_limit() else {
            return;
        };
        match lease(&self.conn, &self.key, rate, want).await {
            Leased::Granted(chunk) => {
                self.leased.increment(u64::from(chunk.left));
                self.give_back(chunk.left, chunk.until);
            }
            // Holding the lease's turn: the instance asks once per wait,
            // not once per waiting start.
            Leased::Wait(wait) => tokio::time::sleep(wait).await,
        }
    }

    fn has_tokens(&self) -> bool {
        let pool = self.pool.lock().expect("not poisoned");
        let now = Instant::now();
        pool.iter().any(|c| c.left > 0 && c.until > now)
    }
}

/// Tokens a read reserved for the entries it returns; the unused ones go
/// back to the pool when dropped.
pub(crate) struct Reserved {
    left: AtomicU32,
    /// When they expire; `None`: not limited (every take succeeds).
    until: Option<Instant>,
    pool: Option<Arc<Limiter>>,
}

impl Reserved {
    /// No token: its entries take theirs from the pool (those of the idle
    /// read, a claim, an ordered partition).
    pub(crate) fn none() -> Self {
        Reserved {
            left: AtomicU32::new(0),
            until: Some(Instant::now()),
            pool: None,
        }
    }

    fn unlimited(want: usize) -> Self {
        Reserved {
            left: AtomicU32::new(want.min(u32::MAX as usize) as u32),
            until: None,
            pool: None,
        }
    }

    /// How many entries the read may ask for.
    pub(crate) fn count(&self) -> usize {
        self.left.load(Ordering::Relaxed) as usize
    }

    /// Gives the unused tokens back to `limiter`'s pool once dropped.
    pub(crate) fn returned_to(mut self, limiter: &Arc<Limiter>) -> Self {
        self.pool = self.until.map(|_| limiter.clone());
        self
    }

    /// Takes one reserved token for a start, if one is left and valid.
    pub(crate) fn take(&self) -> bool {
        let Some(until) = self.until else {
            return true;
        };
        until > Instant::now()
            && self
                .left
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                .is_ok()
    }
}

impl Drop for Reserved {
    fn drop(&mut self) {
        if let (Some(pool), Some(until)) = (self.pool.take(), self.until) {
            pool.give_back(*self.left.get_mut(), until);
        }
    }
}

/// Counts a task waiting for a token until dropped (also when its wait is
/// cut short by a release).
struct Counted<'a>(&'a metrics::Gauge);

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.decrement(1.0);
    }
}

#[cfg(test)]
mod tests {
    use peerq_test_support as support;

    use super::*;

    /// A freeze is time passing for the frozen instance's clock too: a
    /// token leased before it is gone after it, so a frozen (or paused,
    /// or starved) instance saves up no burst (docs/design.md §15).
    #[tokio::test]
    async fn a_leased_token_is_gone_once_its_validity_has_passed() {
        let server = support::RedisServer::start();
        let conn = Arc::new(SharedConnection::new(server.pool()));
        let name = ServiceName::new("tokens").unwrap();
        let limit = Limits::none().rate(RateLimit::new(1_000, Duration::from_secs(1)));
        let (_set, limits) = watch::channel(limit);
        let limiter = Arc::new(Limiter::new(&name, conn, limits));
        // A lease from Redis: 30 ms of the rate, half for a read, half
        // back in the pool.
        let read = limiter.reserve(30).await;
        assert!(read.count() > 10, "{} tokens", read.count());
        let half = read.count() as u32 / 2;
        limiter.give_back(half, read.until.unwrap());
        read.left.fetch_sub(half, Ordering::Relaxed);
        assert!(read.take() && limiter.try_take());
        tokio::time::pause();
        tokio::time::advance(VALID).await;
        // Neither the read's tokens nor the pool's may start a task now.
        assert!(!read.take());
        assert!(!limiter.try_take());
        assert!(!limiter.has_tokens());
    }
}
