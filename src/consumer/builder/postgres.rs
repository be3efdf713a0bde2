//! What a consumer does in PostgreSQL beside its handler (feature
//! `postgres`): relay its service's outbox, and prune its inbox. Both run
//! beside the instance and stop with it.

use std::time::Duration;

use sqlx::PgPool;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, Span};

use super::ConsumerBuilder;
use crate::codec::Codec;
use crate::config::ServiceName;
use crate::connection::Redis;
use crate::error::Result;
use crate::postgres::{DEFAULT_INBOX_RETENTION, Relay, prune_until, validate_retention};

/// The databases a consumer works with beside Redis.
#[derive(Debug, Clone)]
pub(super) struct PostgresParts {
    /// The outbox's database, for a relay in the instance.
    outbox: Option<PgPool>,
    /// The inbox's database, pruned by the instance.
    inbox: Option<PgPool>,
    retention: Duration,
}

impl Default for PostgresParts {
    fn default() -> Self {
        PostgresParts {
            outbox: None,
            inbox: None,
            retention: DEFAULT_INBOX_RETENTION,
        }
    }
}

impl<T, S, C: Codec> ConsumerBuilder<T, S, C> {
    /// Runs an outbox relay in the instance (feature `postgres`): it moves
    /// the rows that [`Outbox::enqueue`](crate::postgres::Outbox::enqueue)
    /// wrote for this service into `pool`'s `peerq_outbox` to the
    /// instance's Redis, with its codec and partitions (the service's, when
    /// the consumer was given none), and stops with the
    /// instance. Every instance may run one: the relays share the lanes
    /// without a leader (see [`Relay`], which also runs alone). It takes
    /// one of the pool's connections for good and another while it claims
    /// rows.
    pub fn outbox_relay(mut self, pool: PgPool) -> Self {
        self.postgres.outbox = Some(pool);
        self
    }

    /// The database of the handler's [`Inbox`](crate::postgres::Inbox)
    /// (feature `postgres`): the instance removes this service's inbox
    /// rows past their [retention](Self::inbox_retention), at its start
    /// and every minute, a few hundred at a time without blocking a
    /// handler.
    pub fn inbox(mut self, pool: PgPool) -> Self {
        self.postgres.inbox = Some(pool);
        self
    }

    /// How long inbox rows are kept (default 7 days, at least a minute): a
    /// task run again after its row is removed runs again. Service-wide
    /// in effect: the instance that prunes first decides.
    pub fn inbox_retention(mut self, retention: Duration) -> Self {
        self.postgres.retention = retention;
        self
    }
}

impl PostgresParts {
    pub(super) fn validate(&self) -> Result<()> {
        validate_retention(self.retention)
    }

    /// Starts the relay and the pruning, within `span`.
    pub(super) fn start<C: Codec>(
        self,
        name: &ServiceName,
        redis: Redis,
        partitions: Option<u32>,
        span: &Span,
    ) -> Result<Sidecars> {
        let stop = CancellationToken::new();
        let mut running = Vec::new();
        if let Some(pool) = self.outbox {
            let relay = Relay::builder()
                .postgres(pool)
                .name(name.as_str())
                .codec(C::default())
                .redis(redis);
            // Not given to the consumer: its producer takes the service's.
            let relay = match partitions {
                Some(partitions) => relay.partitions(partitions),
                None => relay,
            };
            let relay = relay.build()?;
            let stopped = stop.clone().cancelled_owned();
            running.push(tokio::spawn(
                async move {
                    // It only ever returns `Ok` once stopped.
                    let _ = relay.run_until(stopped).await;
                }
                .instrument(span.clone()),
            ));
        }
        if let Some(pool) = self.inbox {
            let pruning = prune_until(pool, name.to_string(), self.retention, stop.clone());
            running.push(tokio::spawn(pruning.instrument(span.clone())));
        }
        Ok(Sidecars { stop, running })
    }
}

/// The relay and the pruning of a running instance.
pub(super) struct Sidecars {
    stop: CancellationToken,
    running: Vec<JoinHandle<()>>,
}

impl Sidecars {
    /// Stops them and waits until they have.
    pub(super) async fn stop(self) {
        self.stop.cancel();
        for running in self.running {
            let _ = running.await;
        }
    }
}
