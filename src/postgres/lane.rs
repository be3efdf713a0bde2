//! One lane's claim, in one transaction (docs/design.md §10): take the
//! lane's advisory lock (or leave it to the relay that holds it), claim its
//! oldest rows, enqueue each under its task id or dead-letter it, replace
//! the rows by their markers in `peerq_outbox_sent`, commit. What follows
//! the commit, the records' expiry, is `forget`'s.
//!
//! A row's dedup record `outbox:<task id>` lives as long as the row may be
//! sent again. Its first send writes it without an expiry; it gets one (the
//! relay's grace, 15 minutes by default) only once the row's delete is seen
//! committed, which its marker proves. A relay that dies, or whose delete
//! or commit fails (Postgres away for however long), leaves the rows and
//! their records in place; whichever relay claims the rows next sends them
//! again as no-ops.
//!
//! A relay that freezes mid-claim is stopped by Redis itself: each claim
//! reads Redis's clock before it begins, and every send of it carries that
//! time plus the claim's time to send ([`SENDING`]) as a deadline the
//! script checks. Another relay can only claim the rows after this claim's
//! session ended, so after its deadline was set; their records then expire
//! no earlier than the grace after that relay's commit, later than the
//! frozen claim's deadline as long as the grace exceeds [`SENDING`].

use std::time::Duration;

use sqlx::{PgPool, Row as _};
use tracing::{debug, error, warn};

use super::verdict::{Row, Verdict, verdict};
use crate::codec::Codec;
use crate::entry::TaskId;
use crate::error::{Error, Result};
use crate::producer::{Producer, Sent};

/// How long a row's dedup record is kept once its row's delete has
/// committed, by default: a Postgres failover that loses that commit, and
/// whose relays send the row again within it, still enqueues it once.
pub(crate) const GRACE: Duration = Duration::from_secs(15 * 60);
/// The relay's transactions' `idle_in_transaction_session_timeout`: a
/// relay that freezes while it holds a lane gives it up after this, and
/// another relay takes it over.
const IDLE: Duration = Duration::from_secs(60);
/// How long a claim may spend on enqueueing its rows, from just before its
/// transaction begins, by Redis's clock; past it, Redis refuses its sends
/// and it rolls back. Far below [`GRACE`].
pub(crate) const SENDING: Duration = Duration::from_secs(20);

/// Called with the task ids of a lane's rows once they are in Redis, before
/// their delete: for tests that kill a relay there.
pub(crate) type AfterSend = std::sync::Arc<dyn Fn(&[TaskId]) + Send + Sync>;
/// Called with a row's task id right before it is sent: for tests that
/// freeze a relay there.
pub(crate) type BeforeSend = std::sync::Arc<dyn Fn(&TaskId) + Send + Sync>;

/// A claim's timings and test hooks: the relay's settings.
#[derive(Clone, Default)]
pub(crate) struct Claiming {
    /// Rows per claim.
    pub(crate) batch: usize,
    /// The claim's time to send ([`SENDING`]).
    pub(crate) sending: Duration,
    /// How long a record outlives its row's committed delete ([`GRACE`]).
    pub(crate) grace: Duration,
    pub(crate) after_send: Option<AfterSend>,
    pub(crate) before_send: Option<BeforeSend>,
}

impl std::fmt::Debug for Claiming {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Claiming")
            .field("batch", &self.batch)
            .field("sending", &self.sending)
            .field("grace", &self.grace)
            .finish_non_exhaustive()
    }
}

/// What one claim did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Claimed {
    /// Another relay holds the lane.
    Busy,
    /// It moved these rows (enqueued or dead-lettered: each task's id and
    /// partition) and committed; their records still have no expiry
    /// (`forget` gives it).
    Moved(Vec<(TaskId, u32)>),
}

/// The lanes of `service` that hold rows, in one round trip.
pub(crate) async fn busy_lanes(pool: &PgPool, service: &str) -> Result<Vec<u32>> {
    let rows = sqlx::query(
        "SELECT lane FROM generate_series(0, $2 - 1) AS lane \
         WHERE EXISTS (SELECT 1 FROM peerq_outbox o WHERE o.service = $1 AND o.lane = lane)",
    )
    .bind(service)
    .bind(super::LANES as i32)
    .fetch_all(pool)
    .await?;
    rows.iter()
        .map(|row| Ok(row.try_get::<i32, _>(0)? as u32))
        .collect()
}

/// Claims up to `claiming.batch` of the oldest rows of `lane` and moves
/// them.
pub(crate) async fn claim<C: Codec>(
    pool: &PgPool,
    producer: &Producer<C>,
    service: &str,
    lane: u32,
    claiming: &Claiming,
) -> Result<Claimed> {
    // Redis's clock is read before the lane's lock is taken (at the same
    // time as the `BEGIN`, whose round trip hides it): any relay that claims
    // these rows after this one takes the lock later, and commits after
    // this deadline's start. Not `pool.begin()`: a relay that stops drops
    // its claim (`super::begin`).
    let (now_ms, tx) = tokio::join!(producer.redis_now_ms(), super::begin(pool));
    let (until_ms, mut tx) = (now_ms? + claiming.sending.as_millis() as u64, tx?);
    let locked: bool = sqlx::query(
        "SELECT set_config('idle_in_transaction_session_timeout', $1, true), \
                pg_try_advisory_xact_lock($2, $3)",
    )
    .bind(format!("{}ms", IDLE.as_millis()))
    .bind(super::service_lock(service))
    .bind(lane as i32)
    .fetch_one(&mut *tx)
    .await?
    .try_get(1)?;
    if !locked {
        tx.rollback().await?;
        return Ok(Claimed::Busy);
    }
    let rows = sqlx::query(
        "SELECT id, task_id, partition_key, idempotency_key, delay_ms, codec, payload, \
                (extract(epoch FROM created_at) * 1000)::bigint, headers \
         FROM peerq_outbox WHERE service = $1 AND lane = $2 \
         ORDER BY id LIMIT $3 FOR UPDATE SKIP LOCKED",
    )
    .bind(service)
    .bind(lane as i32)
    .bind(claiming.batch as i64)
    .fetch_all(&mut *tx)
    .await?;
    let rows = rows
        .iter()
        .map(|row| {
            Ok(Row {
                id: row.try_get(0)?,
                task_id: row.try_get(1)?,
                partition_key: row.try_get(2)?,
                idempotency_key: row.try_get(3)?,
                delay_ms: row.try_get(4)?,
                codec: row.try_get(5)?,
                payload: row.try_get(6)?,
                created_ms: row.try_get(7)?,
                headers: row.try_get(8)?,
            })
        })
        .collect::<Result<Vec<_>, sqlx::Error>>()?;
    if rows.is_empty() {
        tx.commit().await?;
        return Ok(Claimed::Moved(Vec::new()));
    }
    let ids: Vec<i64> = rows.iter().map(|row| row.id).collect();
    let sent = send(producer, service, rows, until_ms, claiming).await?;
    if let Some(hook) = &claiming.after_send {
        let ids: Vec<TaskId> = sent.iter().map(|(id, _)| id.clone()).collect();
        hook(&ids);
    }
    let (task_ids, partitions): (Vec<&str>, Vec<i32>) =
        sent.iter().map(|(id, p)| (id.as_str(), *p as i32)).unzip();
    // The rows and their markers, in one statement: a marker exists
    // exactly when its row's delete committed.
    sqlx::query(
        "WITH gone AS (DELETE FROM peerq_outbox WHERE id = ANY($1)) \
         INSERT INTO peerq_outbox_sent (service, task_id, partition) \
         SELECT $2, * FROM unnest($3::text[], $4::int[])",
    )
    .bind(&ids)
    .bind(service)
    .bind(&task_ids)
    .bind(&partitions)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    debug!(service, lane, rows = ids.len(), "outbox rows relayed");
    Ok(Claimed::Moved(sent))
}

/// Enqueues or dead-letters `rows` in their order, until Redis's clock
/// passes `until_ms`; their task ids and partitions.
async fn send<C: Codec>(
    producer: &Producer<C>,
    service: &str,
    rows: Vec<Row>,
    until_ms: u64,
    claiming: &Claiming,
) -> Result<Vec<(TaskId, u32)>> {
    let mut sent = Vec::with_capacity(rows.len());
    for row in rows {
        let outbox_id = row.id;
        let verdict = verdict(row, producer.codec_name(), producer.max_payload());
        let (Verdict::Enqueue(stored) | Verdict::DeadLetter(stored, _)) = &verdict;
        if let Some(hook) = &claiming.before_send {
            hook(&stored.id);
        }
        let done = match &verdict {
            Verdict::Enqueue(stored) => producer.send_stored(stored, until_ms).await?,
            Verdict::DeadLetter(stored, why) => {
                let done = producer.dead_letter_stored(stored, why, until_ms).await?;
                if done == Sent::Now {
                    error!(
                        service,
                        task_id = %stored.id,
                        outbox_id,
                        error = %why,
                        "outbox row moved to the dead letters"
                    );
                }
                done
            }
        };
        if done == Sent::Late {
            // Frozen or slowed past its time: another relay may hold the
            // lane now, so this claim writes nothing more and rolls back.
            warn!(service, outbox_id, sending = ?claiming.sending, "a relay's claim ran out of time to send, by redis's clock; its rows are left to the next claim");
            return Err(Error::Timeout(claiming.sending));
        }
        sent.push((stored.id.clone(), producer.partition_of_stored(stored)));
    }
    Ok(sent)
}
