//! Where a producer's tasks go (docs/design.md §21): the service's current
//! generation of partitions, read at connect and again whenever a
//! partition refuses an entry because a reshard sealed it.

use std::sync::Arc;
use std::time::Duration;

use deadpool_redis::redis::RedisError;

use super::Producer;
use crate::codec::Codec;
use crate::config::ServiceName;
use crate::connection::SharedConnection;
use crate::error::Result;
use crate::keys;
use crate::partition::unit;
use crate::priority::Priority;
use crate::reshard::{Generation, Phase};

/// How many times one enqueue follows a reshard before it gives up: each
/// time the layout read names a newer generation, so more means a reshard
/// started again and again while one task was being sent.
pub(super) const FOLLOW_AT_MOST: u32 = 10;

/// The generation a producer writes, and its streams' keys.
#[derive(Debug)]
pub(super) struct Route {
    pub(super) current: Generation,
    /// The generation a reshard replaced, while its records may still
    /// matter to an enqueue: until its idempotency records have expired
    /// (`until_ms`, Unix ms by the producer's clock; `None`: while it
    /// drains).
    pub(super) from: Option<(Generation, Option<u64>)>,
    /// Every level's stream of the current generation, by its number in
    /// the generation (a batch's entries are added without formatting a
    /// key each).
    pub(super) streams: Box<[String]>,
}

impl Route {
    pub(super) fn new(
        name: &ServiceName,
        current: Generation,
        from: Option<(Generation, Option<u64>)>,
    ) -> Route {
        let levels = Priority::ALL.len() as u32;
        Route {
            current,
            from,
            streams: (0..levels * current.partitions)
                .map(|i| keys::stream(name, unit(current.number, i)))
                .collect(),
        }
    }
}

/// The generation producers write for service `name` (`first`: its
/// `{N}:meta` count, the layout of a service never resharded), and the one
/// a reshard replaced with, once open, when it opened (Unix ms).
pub(super) async fn current(
    conn: &SharedConnection,
    name: &ServiceName,
    first: u32,
) -> Result<(Generation, Option<(Generation, Option<u64>)>)> {
    let Some(layout) = crate::reshard::read_layout(conn, name).await? else {
        let first = Generation {
            number: 0,
            partitions: first,
        };
        return Ok((first, None));
    };
    let opened = match layout.phase {
        Phase::Draining => None,
        Phase::Open { .. } => Some(layout.opened_ms.unwrap_or_default()),
    };
    Ok((layout.current, layout.from.map(|f| (f, opened))))
}

/// How long after the open an enqueue still asks the replaced generation:
/// the idempotency records' time to live, and a minute for the clocks.
pub(super) fn asked_until(opened_ms: u64, ttl: Duration) -> u64 {
    opened_ms + ttl.as_millis() as u64 + 60_000
}

/// Whether Redis refused an `XADD` because a reshard sealed the partition
/// (docs/design.md §21): the stream's last id is the last possible one.
pub(super) fn is_sealed(e: &RedisError) -> bool {
    e.to_string().contains("exhausted the last possible ID")
}

impl<C: Codec> Producer<C> {
    /// The route in force.
    pub(super) fn route(&self) -> Arc<Route> {
        self.route.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Reads the layout again after a partition refused an entry (a
    /// reshard sealed it): the route of the newest generation.
    pub(super) async fn follow_reshard(&self) -> Result<()> {
        let (current, from) = current(&self.conn, &self.name, self.partitions).await?;
        let route = Route::new(&self.name, current, self.asked(from));
        let mut held = self.route.write().unwrap_or_else(|e| e.into_inner());
        if route.current.number > held.current.number
            || (route.current == held.current && route.from != held.from)
        {
            *held = Arc::new(route);
        }
        Ok(())
    }

    /// The replaced generation as a route keeps it: with the instant
    /// after which its records no longer matter.
    pub(super) fn asked(
        &self,
        from: Option<(Generation, Option<u64>)>,
    ) -> Option<(Generation, Option<u64>)> {
        from.map(|(g, opened)| (g, opened.map(|o| asked_until(o, self.idempotency_ttl))))
    }

    /// The generation an enqueue with an idempotency key, a unique key or
    /// the outbox relay's record must ask first (docs/design.md §21): the
    /// replaced one, while it drains and until its records expired.
    pub(super) fn to_ask(&self, route: &Route) -> Option<Generation> {
        let (from, until) = route.from?;
        let now = crate::entry::now_ms();
        until.is_none_or(|until| now < until).then_some(from)
    }
}
