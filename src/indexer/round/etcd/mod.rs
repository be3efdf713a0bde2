//! The rounds on etcd ([`Membership::Etcd`], docs/design.md §2.2): the same
//! round as on Redis, with the registration and the read of the previous
//! round in an etcd transaction, and the clock check and the layout still
//! from the service's Redis.
//!
//! One round is one etcd transaction in the common case: register for
//! round `m` if it is not closed, and get round `m - 1`'s close key. The
//! first reader of a round finds no close key and closes it
//! ([`closed::close`], two more requests, once per round for the whole
//! service). A lease keeps the registrations ([`lease`]).

mod closed;
mod endpoints;
mod lease;

use std::collections::HashMap;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use deadpool_redis::redis::Script;
use etcd_client::{Compare, CompareOp, ConnectOptions, GetOptions, PutOptions, Txn, TxnOp};
use tracing::warn;

use self::closed::RoundKeys;
use self::endpoints::Endpoints;
use self::lease::Lease;
use super::script::{RoundReply, Written, read_layout};
use crate::config::ServiceName;
use crate::connection::Conn;
use crate::error::{Error, Result};
use crate::indexer::listed::Read;
use crate::indexer::{IndexerSettings, Indexing};
use crate::keys;
use crate::membership::{self, Membership};
use crate::reshard::Layout;

static REDIS_SIDE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../scripts/etcd_round.lua")));

/// The longest a request waits on one etcd endpoint before it asks the
/// next one.
const PATIENCE: Duration = Duration::from_secs(2);

/// What a round asks of etcd.
#[derive(Debug, Clone, Copy)]
pub(in crate::indexer::round) struct Ask<'a> {
    /// The round's number: it registers in round `number` and reads round
    /// `number - 1`.
    pub(in crate::indexer::round) number: u64,
    /// This instance's member name, `<id>@<weight>`.
    pub(in crate::indexer::round) member: &'a str,
    /// Its offset in µs, the order of ranked indexing.
    pub(in crate::indexer::round) offset_us: u64,
    /// Whether to register (not while leaving or fenced by the clock).
    pub(in crate::indexer::round) write: bool,
    /// Whether to read round `number - 1` (this instance registered there).
    pub(in crate::indexer::round) read_prev: bool,
    /// Whether the reply carries the member names (rendezvous).
    pub(in crate::indexer::round) rendezvous: bool,
}

/// The rounds' etcd client, lease and keys.
pub(in crate::indexer::round) struct EtcdRounds {
    /// As given, for errors.
    shown: String,
    /// One client per endpoint, made on the rounds' runtime (their
    /// channels' tasks live there) at first use.
    endpoints: Endpoints,
    keys: RoundKeys,
    indexing: Indexing,
    /// The lease TTL asked for: half the interval, so that a registration
    /// of an instance that crashed right after it is gone before the round
    /// closes, an interval later (etcd raises it to its minimum).
    ttl: Duration,
    lease: Option<Lease>,
}

impl std::fmt::Debug for EtcdRounds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdRounds")
            .field("endpoints", &self.shown)
            .field("keys", &self.keys)
            .finish_non_exhaustive()
    }
}

impl EtcdRounds {
    /// The etcd side of the rounds, for a service whose membership is on
    /// etcd; `None` on Redis. Reads the TLS files now, so a missing one is
    /// refused at start naming the setting.
    pub(in crate::indexer) fn new(
        settings: &IndexerSettings,
        name: &ServiceName,
    ) -> Result<Option<EtcdRounds>> {
        let Membership::Etcd {
            endpoints,
            prefix,
            tls,
            auth,
        } = &settings.membership
        else {
            return Ok(None);
        };
        // A request's time on one endpoint before the next is asked: a
        // third of the interval, so that a round still ends in its window
        // after one endpoint that hangs, and at most 2 s.
        let patience = (settings.interval / 3).min(PATIENCE);
        let mut options = ConnectOptions::new()
            // Requests fail at once without a leader (a cluster without
            // quorum) instead of waiting: the round is missed and says why.
            .with_require_leader(true)
            .with_connect_timeout(patience)
            .with_keep_alive(patience, patience)
            // A token that expired (a JWT's TTL, a simple token unused for
            // five minutes at long intervals) is fetched again.
            .with_auto_token_refresh(true);
        if let Some(auth) = auth {
            options = options.with_user(&auth.user, &auth.password);
        }
        if let Some(tls) = tls {
            let config =
                membership::tls_options(tls).map_err(|e| Error::invalid("membership", e))?;
            options = options.with_tls(config);
        }
        Ok(Some(EtcdRounds {
            shown: endpoints.join(","),
            endpoints: Endpoints::new(endpoints.clone(), options, patience),
            keys: RoundKeys::new(prefix, &name.to_string()),
            indexing: settings.indexing,
            ttl: settings.interval / 2,
            lease: None,
        }))
    }

    /// Maps an etcd error to peerq's, naming the endpoints.
    fn at(&self) -> impl Fn(etcd_client::Error) -> Error + use<> {
        let endpoints = self.shown.clone();
        move |source| Error::Etcd {
            endpoints: endpoints.clone(),
            source,
        }
    }

    /// The lease to register under: the one held, or a new one when etcd
    /// said it expired.
    async fn lease(&mut self) -> Result<i64> {
        if let Some(id) = self.lease.as_ref().and_then(Lease::id) {
            return Ok(id);
        }
        let lease = Lease::grant(&mut self.endpoints, self.ttl)
            .await
            .map_err(self.at())?;
        let id = lease.id().unwrap_or_default();
        self.lease = Some(lease);
        Ok(id)
    }

    /// Registers in round `ask.number` and reads round `ask.number - 1` on
    /// etcd, and reads Redis's clock and the layout from Redis.
    pub(in crate::indexer::round) async fn exchange(
        &mut self,
        conn: &mut Conn,
        name: &ServiceName,
        ask: Ask<'_>,
    ) -> Result<RoundReply> {
        let (etcd, redis) = tokio::join!(self.etcd_round(ask), redis_side(conn, name, ask));
        let (redis_now, layout) = redis?;
        let (written, prev) = etcd?;
        let prev = prev.and_then(|list| {
            let Some(at) = list.iter().position(|m| m == ask.member) else {
                // Registered, but the lease ended before the round closed
                // (a freeze, a cut from etcd): not counted, like everyone
                // else reads it.
                warn!(service = %name, round = ask.number - 1,
                      "this instance's etcd registration expired before its round closed");
                return None;
            };
            Some((at, list))
        });
        let (prev, members) = match prev {
            Some((at, list)) => {
                let count = list.len() as u64;
                let names = if ask.rendezvous { list } else { Vec::new() };
                (Some((Some(at as u64 + 1), Some(count))), Read::Names(names))
            }
            None => (None, Read::Names(Vec::new())),
        };
        Ok(RoundReply {
            written,
            prev,
            members,
            redis_now,
            layout,
        })
    }

    /// The etcd half of a round: whether the registration landed, and the
    /// previous round's closed list when asked.
    async fn etcd_round(&mut self, ask: Ask<'_>) -> Result<(Written, Option<Vec<String>>)> {
        let prev_closed = self.keys.closed(ask.number - 1);
        let get_prev: Vec<TxnOp> = if ask.read_prev {
            vec![TxnOp::get(prev_closed, None)]
        } else {
            Vec::new()
        };
        let (written, responses) = if ask.write {
            let lease = self.lease().await?;
            let register = TxnOp::put(
                self.keys.member(ask.number, ask.member),
                ask.offset_us.to_string(),
                Some(PutOptions::new().with_lease(lease)),
            );
            let txn = Txn::new()
                .when([Compare::create_revision(
                    self.keys.closed(ask.number),
                    CompareOp::Equal,
                    0,
                )])
                .and_then([vec![register], get_prev.clone()].concat())
                .or_else(get_prev);
            let reply = self.txn(txn).await;
            let reply = reply.inspect_err(|e| {
                // Expired between the keep-alive's last answer and now.
                if e.to_string().contains("lease not found") {
                    self.lease = None;
                }
            });
            let reply = reply.map_err(self.at())?;
            let written = if reply.succeeded() {
                Written::Yes(None)
            } else {
                Written::Closed
            };
            (written, reply.op_responses())
        } else if ask.read_prev {
            let reply = self.txn(Txn::new().and_then(get_prev)).await;
            (Written::NotAsked, reply.map_err(self.at())?.op_responses())
        } else {
            return Ok((Written::NotAsked, None));
        };
        if !ask.read_prev {
            return Ok((written, None));
        }
        let list = match closed::closed_in(&responses) {
            Some(stored) => closed::decode(stored)?,
            None => {
                let at = self.at();
                let m = ask.number - 1;
                closed::close(&mut self.endpoints, &self.keys, m, self.indexing, at).await?
            }
        };
        Ok((written, Some(list)))
    }

    /// Reads the service's rounds once, before the first round: a setting
    /// that cannot work (a wrong password, a user without the rights, a
    /// bad TLS setup) is refused at start, naming etcd, rather than
    /// fencing every round. An etcd that cannot be reached now is not
    /// refused: the rounds fence and try again each interval, as they do
    /// when it goes away later.
    pub(in crate::indexer::round) async fn check(&mut self) -> Result<()> {
        let base = self.keys.base().to_owned();
        let read = self
            .endpoints
            .run(|mut client| {
                let base = base.clone();
                async move {
                    let options = GetOptions::new()
                        .with_prefix()
                        .with_keys_only()
                        .with_limit(1);
                    client.get(base, Some(options)).await
                }
            })
            .await;
        match read {
            Ok(_) => Ok(()),
            Err(e) if endpoints::moves_on(&e) => {
                warn!(endpoints = %self.shown, cause = %e, "etcd cannot be reached yet; the rounds fence until it can");
                Ok(())
            }
            Err(e) => Err(self.at()(e)),
        }
    }

    /// Sends `txn`, on the next endpoint while one cannot serve it.
    async fn txn(
        &mut self,
        txn: Txn,
    ) -> std::result::Result<etcd_client::TxnResponse, etcd_client::Error> {
        self.endpoints
            .run(|mut client| {
                let txn = txn.clone();
                async move { client.txn(txn).await }
            })
            .await
    }

    /// After a graceful leave: gives the lease back, so the registrations go
    /// at once (every round they were in is closed: the instance left).
    pub(in crate::indexer::round) async fn leave(&mut self) {
        if let Some(lease) = self.lease.take() {
            lease.revoke(&mut self.endpoints).await;
        }
    }
}

/// The Redis half of an etcd round: Redis's clock, the service's layout,
/// and a refusal when Redis rounds run under the same name (an instance of
/// a peerq that does not record the backend in `{N}:meta`).
async fn redis_side(
    conn: &mut Conn,
    name: &ServiceName,
    ask: Ask<'_>,
) -> Result<(Duration, Option<Arc<Layout>>)> {
    let mut script = REDIS_SIDE.key(keys::layout(name));
    script
        .key(keys::round(name, ask.number))
        .key(keys::round(name, ask.number - 1));
    let (now, layout, redis_rounds): (u64, HashMap<String, String>, u64) =
        script.invoke_async(conn).await?;
    if redis_rounds > 0 {
        return Err(Error::Runtime(format!(
            "redis holds round keys of `{name}` ({}): an instance with its rounds on redis \
             runs under this name beside the etcd ones; fenced until it stops",
            keys::round(name, ask.number - 1)
        )));
    }
    Ok((Duration::from_micros(now), read_layout(&layout)?))
}

#[cfg(test)]
mod tests;
