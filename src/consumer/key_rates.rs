//! The rate limit per key (docs/design.md §15): each partition key's starts
//! take tokens of its own GCRA, `{N}:rate:<key>`, leased as the service's
//! limit's are ([`limiter`](super::limiter)): in small chunks that expire
//! 50 ms after their request.
//!
//! An entry whose key has no token steps aside like one whose key runs as
//! many tasks as it may ([`run::aside`](super::run)): a lease for its key
//! goes out in the background, and the entries aside look again when it
//! comes back. Other keys' entries start meanwhile.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use tokio::sync::watch;
use tokio::time::Instant;

use super::limiter::{Chunk, Leased, lease};
use crate::config::ServiceName;
use crate::connection::SharedConnection;
use crate::keys;
use crate::limits::Limits;

/// The tokens of one key, and whether a lease for it is out.
#[derive(Default)]
struct Pool {
    chunks: VecDeque<Chunk>,
    leasing: bool,
}

impl Pool {
    /// Drops what expired; whether a token is left.
    fn ready(&mut self, now: Instant) -> bool {
        self.chunks.retain(|c| c.left > 0 && c.until > now);
        !self.chunks.is_empty()
    }
}

/// One instance's tokens of each limited key.
pub(crate) struct KeyRates {
    name: ServiceName,
    conn: Arc<SharedConnection>,
    limits: watch::Receiver<Limits>,
    pools: Mutex<HashMap<String, Pool>>,
    /// Bumped when a lease comes back: the entries aside look again.
    leased: watch::Sender<u64>,
}

impl KeyRates {
    /// The pools of service `name`, following `limits`.
    pub(crate) fn new(
        name: &ServiceName,
        conn: Arc<SharedConnection>,
        limits: watch::Receiver<Limits>,
    ) -> Self {
        KeyRates {
            name: name.clone(),
            conn,
            limits,
            pools: Mutex::new(HashMap::new()),
            leased: watch::channel(0).0,
        }
    }

    /// Whether a task of `key` may start now as far as its key's rate
    /// says (always, without a limit per key or without a key); if not, a
    /// lease for the key goes out, if none is.
    pub(crate) fn ready(self: &Arc<Self>, key: Option<&str>) -> bool {
        let (Some(key), Some(_)) = (key, self.limits.borrow().rate_limit_per_key()) else {
            return true;
        };
        let mut pools = self.pools.lock().expect("not poisoned");
        let pool = pools.entry(key.to_owned()).or_default();
        if pool.ready(Instant::now()) {
            return true;
        }
        if !pool.leasing {
            pool.leasing = true;
            tokio::spawn(self.clone().lease(key.to_owned()));
        }
        false
    }

    /// Takes the token [`ready`](Self::ready) saw for a start of `key`
    /// (had another start of the key taken it meanwhile, this one starts
    /// without: at most one more, on a rare race).
    pub(crate) fn take(&self, key: Option<&str>) {
        let (Some(key), Some(_)) = (key, self.limits.borrow().rate_limit_per_key()) else {
            return;
        };
        let mut pools = self.pools.lock().expect("not poisoned");
        if let Some(chunk) = pools.get_mut(key).and_then(|p| p.chunks.front_mut()) {
            chunk.left = chunk.left.saturating_sub(1);
        }
    }

    /// Told each time a lease comes back.
    pub(crate) fn watch_leased(&self) -> watch::Receiver<u64> {
        self.leased.subscribe()
    }

    /// Leases tokens of `key` until some are granted (or the limit is
    /// gone), then wakes the entries aside and forgets the keys whose
    /// tokens all expired.
    async fn lease(self: Arc<Self>, key: String) {
        let state = keys::rate_of_key(&self.name, &key);
        loop {
            let Some(rate) = self.limits.borrow().rate_limit_per_key() else {
                break;
            };
            match lease(&self.conn, &state, rate, 1).await {
                Leased::Granted(chunk) => {
                    let mut pools = self.pools.lock().expect("not poisoned");
                    pools
                        .entry(key.clone())
                        .or_default()
                        .chunks
                        .push_back(chunk);
                    break;
                }
                Leased::Wait(wait) => tokio::time::sleep(wait).await,
            }
        }
        {
            let now = Instant::now();
            let mut pools = self.pools.lock().expect("not poisoned");
            if let Some(pool) = pools.get_mut(&key) {
                pool.leasing = false;
            }
            pools.retain(|_, pool| pool.leasing || pool.ready(now));
        }
        self.leased.send_modify(|n| *n = n.wrapping_add(1));
    }
}
