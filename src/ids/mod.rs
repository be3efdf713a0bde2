//! Monotonic IDs over a majority of independent Redis servers
//! ([`MajorityIds`]): unique, increasing numbers that survive the loss of
//! a server, such as invoice numbers (docs/design.md §13).
//!
//! Each server holds its copy of the sequence: the highest ID it took. An
//! ID is drawn the seed's way: read the copies of a majority, propose
//! their maximum plus one, have every server take it if its copy is lower
//! (one script), and keep it when a majority took it; else draw again
//! after a random pause. Any two majorities share a server, so a later
//! read sees every ID issued before and proposes above it; and a server
//! takes a given ID once, so two callers never both get it.
//!
//! That needs every server to keep what it acknowledged (AOF with
//! `appendfsync always`, checked on each connection), and a server that
//! lost its copy (restarted empty) to vote only after
//! [`MajorityIds::repair`] set it from a majority of the others. This
//! module owns the sequences' keys (`peerq:ids:<key>`) and nothing of the
//! queues.

mod builder;
mod error;
mod server;
mod votes;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::future::join_all;
use futures_util::stream::FuturesUnordered;
use tokio::time::Instant;

pub use builder::MajorityIdsBuilder;
pub use error::IdsError;
pub use votes::{ServerState, ServerStatus};

use crate::error::Result;
use crate::metrics::IDS_ATTEMPTS_TOTAL;
use crate::retry::{self, Backoff};
use server::Server;
use votes::{ReadDecision, ReadTally, Write, WriteDecision, WriteTally, majority};

/// Unique, strictly increasing `u64` IDs from a majority of independent
/// Redis servers: a crash of a minority of them (or their loss, once
/// repaired) neither stops the IDs nor issues one twice. Cheap to clone;
/// the clones share the connections.
///
/// ```no_run
/// use peerq::ids::MajorityIds;
///
/// # async fn f() -> Result<(), peerq::ids::IdsError> {
/// let invoices = MajorityIds::builder()
///     .servers(["redis://ids-a:6379/", "redis://ids-b:6379/", "redis://ids-c:6379/"])
///     .key("invoices")
///     .build()
///     .await?;
/// invoices.init(1000).await?; // once, when the sequence is new
/// let number = invoices.next().await?; // 1000, then 1001, …
/// # let _ = number; Ok(()) }
/// ```
///
/// IDs are unique and each caller's increase, but they may have gaps: an
/// ID that a minority of servers took while a concurrent caller's higher
/// one won is never issued.
#[derive(Debug, Clone)]
pub struct MajorityIds {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// The sequence's name, as given (the metrics' `key` label).
    name: String,
    /// Its Redis key on every server.
    key: String,
    servers: Vec<Server>,
    timeout: Duration,
    backoff: Backoff,
}

/// What [`MajorityIds::repair`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Repaired {
    /// The highest value a majority of the servers held: what the
    /// repaired servers were set to.
    pub value: u64,
    /// The servers that were set (their URLs without passwords); empty
    /// when none needed it.
    pub servers: Vec<String>,
}

impl MajorityIds {
    /// A builder: [`servers`](MajorityIdsBuilder::servers) and
    /// [`key`](MajorityIdsBuilder::key) are required.
    pub fn builder() -> MajorityIdsBuilder {
        MajorityIdsBuilder::default()
    }

    /// The Redis key of the sequence on each server (`peerq:ids:<key>`).
    pub fn key(&self) -> &str {
        &self.inner.key
    }

    /// The next ID: larger than every ID issued before this call began,
    /// and never issued to anyone else. Tries until the builder's
    /// `timeout`, pausing a random time between attempts.
    ///
    /// Errors: [`IdsError::NoMajority`] or [`IdsError::Contended`] when the
    /// time ran out; at once [`IdsError::NeedsRepair`] (too few servers
    /// hold the sequence even counting the unreachable ones) or
    /// [`IdsError::NotCreated`] (no server holds it: [`init`](Self::init)).
    pub async fn next(&self) -> Result<u64, IdsError> {
        let started = Instant::now();
        let deadline = started + self.inner.timeout;
        let mut failures = 0u32;
        let mut last = None;
        let issued = retry::until_ok(
            self.inner.backoff,
            tokio::time::sleep_until(deadline),
            || self.attempt(deadline),
            |e, wait| {
                failures += 1;
                tracing::debug!(key = %self.inner.key, attempt = failures, cause = %e, ?wait,
                    "ids attempt failed");
                last = Some(e.clone());
            },
        )
        .await;
        let made = failures + 1;
        match issued {
            Ok(Some(id)) => Ok(id),
            // The deadline is only looked at after a failed attempt, whose
            // error (always an `IdsError`) is `last`.
            Ok(None) => Err(last
                .unwrap_or_else(|| IdsError::Contended {
                    key: self.inner.key.clone(),
                    attempts: 0,
                    elapsed: Duration::ZERO,
                })
                .after(failures, started.elapsed())),
            Err(e) => Err(e.after(made, started.elapsed())),
        }
    }

    /// One attempt: read a majority, propose the next ID, write it.
    async fn attempt(&self, deadline: Instant) -> Result<u64, IdsError> {
        let (decision, servers) = self.read(deadline).await;
        let inner = &*self.inner;
        let needed = majority(inner.servers.len());
        let key = inner.key.clone();
        let highest = match decision {
            ReadDecision::Majority(highest) => highest,
            ReadDecision::NotCreated => {
                return Err(IdsError::NotCreated {
                    key,
                    servers: inner.servers.len(),
                });
            }
            ReadDecision::Unavailable => {
                self.count("unavailable");
                return Err(IdsError::NoMajority {
                    key,
                    needed,
                    servers,
                    attempts: 1,
                    elapsed: Duration::ZERO,
                });
            }
            ReadDecision::NeedsRepair => {
                self.count("unavailable");
                return Err(IdsError::NeedsRepair {
                    key,
                    needed,
                    servers,
                });
            }
        };
        let id = highest
            .checked_add(1)
            .ok_or(IdsError::Exhausted { key: key.clone() })?;
        let mut tally = WriteTally::new(inner.servers.len());
        let mut contended = false;
        self.ask(
            deadline,
            |server| server.advance(&inner.key, id, false),
            |i, write| {
                contended |= matches!(write, Write::Higher(_));
                tally.add(i, write);
                tally.decision().is_some()
            },
        )
        .await;
        tally.close();
        if tally.decision() == Some(WriteDecision::Issued) {
            self.count("issued");
            return Ok(id);
        }
        self.count("lost");
        let servers = tally.finish(&self.names(), id);
        Err(if contended {
            IdsError::Contended {
                key,
                attempts: 1,
                elapsed: Duration::ZERO,
            }
        } else {
            IdsError::NoMajority {
                key,
                needed,
                servers,
                attempts: 1,
                elapsed: Duration::ZERO,
            }
        })
    }

    /// Reads the servers' copies until a majority of holders settles it
    /// (or nothing more can change it, or the deadline).
    async fn read(&self, deadline: Instant) -> (ReadDecision, Vec<ServerStatus>) {
        let inner = &*self.inner;
        let mut tally = ReadTally::new(inner.servers.len());
        self.ask(
            deadline,
            |server| server.read(&inner.key),
            |i, state| {
                tally.add(i, state);
                tally.decision().is_some()
            },
        )
        .await;
        tally.close();
        let decision = tally.decision().expect("a closed tally decides");
        (decision, tally.finish(&self.names()))
    }

    /// Sends `ask` to every server at once and hands each reply to
    /// `take`, until `take` says it has decided or the deadline passes;
    /// the replies not taken are dropped (a server that is slow or frozen
    /// never delays a decision the others made).
    async fn ask<'a, T, F>(
        &'a self,
        deadline: Instant,
        ask: impl Fn(&'a Server) -> F,
        mut take: impl FnMut(usize, T) -> bool,
    ) where
        F: Future<Output = T> + 'a,
    {
        let mut pending: FuturesUnordered<_> = self
            .inner
            .servers
            .iter()
            .enumerate()
            .map(|(i, server)| {
                let reply = ask(server);
                async move { (i, reply.await) }
            })
            .collect();
        while let Ok(Some((i, reply))) = tokio::time::timeout_at(deadline, pending.next()).await {
            if take(i, reply) {
                return;
            }
        }
    }

    /// Every server's state, waiting for all of them (until the timeout).
    pub async fn status(&self) -> Vec<ServerStatus> {
        let deadline = Instant::now() + self.inner.timeout;
        let inner = &*self.inner;
        let mut states = vec![None; inner.servers.len()];
        self.ask(
            deadline,
            |server| server.read(&inner.key),
            |i, state| {
                states[i] = Some(state);
                false
            },
        )
        .await;
        states
            .into_iter()
            .zip(self.names())
            .map(|(state, server)| ServerStatus {
                server,
                state: state
                    .unwrap_or_else(|| ServerState::Unreachable("no reply in time".to_owned())),
            })
            .collect()
    }

    /// Sets every server that lost the sequence (its key missing) to the
    /// highest value a majority of the servers hold, so that it votes
    /// again. Safe to run at any time, also while IDs are drawn, and more
    /// than once.
    ///
    /// Refused ([`IdsError::CannotRepair`], changing nothing) unless a
    /// majority of all the servers hold the sequence and answer: fewer
    /// could miss the latest IDs, and the repaired servers would then vote
    /// for IDs issued already. A server that could not be written stays in
    /// need of repair ([`status`](Self::status) shows it).
    pub async fn repair(&self) -> Result<Repaired, IdsError> {
        let servers = self.status().await;
        let inner = &*self.inner;
        let needed = majority(inner.servers.len());
        let held: Vec<u64> = servers
            .iter()
            .filter_map(|s| match s.state {
                ServerState::Holds(value) => Some(value),
                _ => None,
            })
            .collect();
        let Some(&value) = held.iter().max().filter(|_| held.len() >= needed) else {
            return Err(IdsError::CannotRepair {
                key: inner.key.clone(),
                needed,
                servers,
            });
        };
        let lost: Vec<&Server> = inner
            .servers
            .iter()
            .zip(&servers)
            .filter(|(_, status)| status.state == ServerState::NeedsRepair)
            .map(|(server, _)| server)
            .collect();
        let writes = join_all(lost.iter().map(|s| s.advance(&inner.key, value, true))).await;
        let repaired: Vec<String> = lost
            .iter()
            .zip(writes)
            .filter(|(_, write)| matches!(write, Write::Set | Write::Higher(_)))
            .map(|(server, _)| server.name().to_owned())
            .collect();
        for server in &repaired {
            tracing::info!(key = %inner.key, server, value, "ids server repaired");
        }
        Ok(Repaired {
            value,
            servers: repaired,
        })
    }

    /// Creates the sequence on every server, so that the first
    /// [`next`](Self::next) returns `first` (at least 1). Only for a new
    /// sequence: every server must answer and none may hold it (see
    /// [`IdsError::NotNew`]); `next` never creates one by itself, so that a
    /// sequence whose servers all lost their data is not started again
    /// below IDs issued already.
    pub async fn init(&self, first: u64) -> Result<(), IdsError> {
        if first == 0 {
            return Err(IdsError::FirstIsZero);
        }
        let servers = self.status().await;
        let inner = &*self.inner;
        let not_new = |servers| IdsError::NotNew {
            key: inner.key.clone(),
            servers,
        };
        if servers.iter().any(|s| s.state != ServerState::NeedsRepair) {
            return Err(not_new(servers));
        }
        let created = join_all(
            inner
                .servers
                .iter()
                .map(|server| server.create(&inner.key, first - 1)),
        )
        .await;
        if created.iter().all(|created| created == &Ok(true)) {
            return Ok(());
        }
        // Another init (or a server that failed meanwhile): what each
        // server holds now says which.
        Err(not_new(self.status().await))
    }

    fn names(&self) -> Vec<String> {
        self.inner
            .servers
            .iter()
            .map(|s| s.name().to_owned())
            .collect()
    }

    fn count(&self, outcome: &'static str) {
        metrics::counter!(IDS_ATTEMPTS_TOTAL, "key" => self.inner.name.clone(), "outcome" => outcome)
            .increment(1);
    }
}
