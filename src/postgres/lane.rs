//! One lane's claim, in one transaction (docs/design.md §10): take the
//! lane's advisory lock (or leave it to the relay that holds it), claim its
//! oldest rows, enqueue each under its task id or dead-letter it, delete
//! them, commit.
//!
//! A relay that dies after the `XADD`s, before the commit, leaves the rows
//! in place (Postgres rolls its transaction back); the next relay sends
//! them again, and the dedup record `outbox:<task id>` that the first send
//! wrote makes that a no-op. The record lasts [`ONCE`], longer than a
//! transaction of a relay may: its session ends after [`IDLE`] without a
//! statement, and it sends nothing to Redis after [`SENDING`].

use std::time::Duration;

use sqlx::{PgPool, Row as _};
use tokio::time::Instant;
use tracing::{debug, error};

use super::verdict::{Row, Verdict, verdict};
use crate::codec::Codec;
use crate::error::{Error, Result};
use crate::producer::Producer;
use crate::task::TaskId;

/// How long the dedup record of a relayed row lasts.
pub(crate) const ONCE: Duration = Duration::from_secs(15 * 60);
/// The relay's transactions' `idle_in_transaction_session_timeout`: a
/// relay that freezes while it holds a lane gives it up after this, and
/// another relay takes it over.
const IDLE: Duration = Duration::from_secs(60);
/// How long a claim may spend on enqueueing its rows; past it, it sends
/// nothing more and rolls back. Below [`IDLE`], far below [`ONCE`].
const SENDING: Duration = Duration::from_secs(20);

/// Called with the task ids of a lane's rows once they are in Redis, before
/// their delete: for tests that kill a relay there.
pub(crate) type AfterSend = std::sync::Arc<dyn Fn(&[TaskId]) + Send + Sync>;

/// What one claim did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Claimed {
    /// Another relay holds the lane.
    Busy,
    /// It moved this many rows (enqueued or dead-lettered) and committed.
    Moved(usize),
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

/// Claims up to `batch` of the oldest rows of `lane` and moves them.
pub(crate) async fn claim<C: Codec>(
    pool: &PgPool,
    producer: &Producer<C>,
    service: &str,
    lane: u32,
    batch: usize,
    after_send: Option<&AfterSend>,
) -> Result<Claimed> {
    // Not `pool.begin()`: a relay that stops drops its claim (`super::begin`).
    let mut tx = super::begin(pool).await?;
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
                (extract(epoch FROM created_at) * 1000)::bigint \
         FROM peerq_outbox WHERE service = $1 AND lane = $2 \
         ORDER BY id LIMIT $3 FOR UPDATE SKIP LOCKED",
    )
    .bind(service)
    .bind(lane as i32)
    .bind(batch as i64)
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
            })
        })
        .collect::<Result<Vec<_>, sqlx::Error>>()?;
    if rows.is_empty() {
        tx.commit().await?;
        return Ok(Claimed::Moved(0));
    }
    let ids: Vec<i64> = rows.iter().map(|row| row.id).collect();
    let sent = send(producer, service, rows).await?;
    if let Some(hook) = after_send {
        hook(&sent);
    }
    sqlx::query("DELETE FROM peerq_outbox WHERE id = ANY($1)")
        .bind(&ids)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    debug!(service, lane, rows = ids.len(), "outbox rows relayed");
    Ok(Claimed::Moved(ids.len()))
}

/// Enqueues or dead-letters `rows` in their order; their task ids.
async fn send<C: Codec>(
    producer: &Producer<C>,
    service: &str,
    rows: Vec<Row>,
) -> Result<Vec<TaskId>> {
    let until = Instant::now() + SENDING;
    let mut sent = Vec::with_capacity(rows.len());
    for row in rows {
        // Checked before each send, by the monotonic clock: a relay that
        // was frozen past it may have lost its lane to another relay.
        if Instant::now() >= until {
            return Err(Error::Timeout(SENDING));
        }
        let outbox_id = row.id;
        match verdict(row, producer.codec_name(), producer.max_payload()) {
            Verdict::Enqueue(stored) => {
                producer.send_stored(&stored, ONCE).await?;
                sent.push(stored.id);
            }
            Verdict::DeadLetter(stored, why) => {
                error!(
                    service,
                    task_id = %stored.id,
                    outbox_id,
                    error = %why,
                    "outbox row moved to the dead letters"
                );
                producer.dead_letter_stored(&stored, &why, ONCE).await?;
                sent.push(stored.id);
            }
        }
    }
    Ok(sent)
}
