//! [`Outbox`]: a task written as a row of `peerq_outbox` in the caller's
//! transaction (docs/design.md §10). It commits or rolls back with the
//! caller's other writes; a relay enqueues it once it is committed.

use std::time::SystemTime;

use serde::Serialize;
use sqlx::PgConnection;

use super::lane_of;
use crate::codec::{Bincode, Codec};
use crate::config::ServiceName;
use crate::entry::TaskId;
use crate::error::{Error, Result};
use crate::producer::{DEFAULT_MAX_PAYLOAD, Options};

/// Enqueues tasks in the caller's PostgreSQL transaction.
///
/// ```no_run
/// # #[derive(serde::Serialize)] struct Mail { to: String }
/// # async fn demo(pool: sqlx::PgPool) -> peerq::Result<()> {
/// use peerq::Options;
/// use peerq::postgres::Outbox;
///
/// let mut tx = pool.begin().await?;
/// sqlx::query("INSERT INTO orders (id, email) VALUES ($1, $2)")
///     .bind(1041_i64)
///     .bind("a@example.com")
///     .execute(&mut *tx)
///     .await?;
/// let mail = Mail { to: "a@example.com".into() };
/// Outbox::enqueue(&mut *tx, "mail-sender", &mail, Options::new().key("order-1041")).await?;
/// tx.commit().await?; // the order and its mail, or neither
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Outbox;

impl Outbox {
    /// Writes `task`, encoded with bincode (the default codec), as a task of
    /// service `service` into `peerq_outbox` on `conn`: pass `&mut *tx` to
    /// enqueue it in transaction `tx`. Returns the id it will have in
    /// Redis, a new UUIDv7.
    ///
    /// `options` are the producer's: the partition key (tasks with one key
    /// are relayed in the order of their rows and handled in that order),
    /// an idempotency key (the relay enqueues the task at most once per
    /// key, as a producer does) and a delay or a time (counted from the
    /// transaction's start, Postgres's `now()`).
    ///
    /// Refused before anything is written: a service name that is not
    /// one ([`Error::InvalidSetting`]), a task that does not encode, and a
    /// payload over the producer's default limit, 1 MiB
    /// ([`Error::PayloadTooLarge`]).
    pub async fn enqueue<T: Serialize>(
        conn: &mut PgConnection,
        service: &str,
        task: &T,
        options: Options,
    ) -> Result<TaskId> {
        Outbox::enqueue_with_codec(conn, service, Bincode, task, options).await
    }

    /// [`enqueue`](Self::enqueue) for a service whose codec is `codec`
    /// (such as [`Json`](crate::codec::Json)). A relay dead-letters rows of
    /// a codec other than its service's, with reason `relay`.
    pub async fn enqueue_with_codec<C: Codec, T: Serialize>(
        conn: &mut PgConnection,
        service: &str,
        codec: C,
        task: &T,
        options: Options,
    ) -> Result<TaskId> {
        let service = ServiceName::new(service)?;
        if options.unique.is_some() {
            // The relay sends a row once its transaction committed, when
            // the caller can no longer be told that the key was held.
            return Err(Error::invalid(
                "unique",
                "a unique key cannot go through the outbox: a refusal would come after the \
                 transaction committed, with nobody to tell; enqueue it with a Producer",
            ));
        }
        if options.priority != crate::priority::Priority::Normal {
            return Err(Error::invalid(
                "priority",
                "the outbox relays every row at the normal level (its rows have no level); \
                 enqueue a task of another level with a Producer",
            ));
        }
        let payload = codec.encode(task)?;
        if payload.len() > DEFAULT_MAX_PAYLOAD {
            return Err(Error::PayloadTooLarge {
                size: payload.len(),
                limit: DEFAULT_MAX_PAYLOAD,
            });
        }
        #[allow(unused_mut)]
        let mut headers = options.headers.clone();
        #[cfg(feature = "otel")]
        crate::trace_context::add(&mut headers, crate::trace_context::current().as_ref());
        let id = TaskId::generate();
        let lane = lane_of(options.partition_key().unwrap_or(id.as_str()));
        // From this process's clock to the row's: the relay counts the
        // delay from `created_at`, the transaction's start by Postgres's.
        let delay_ms = options
            .delay_after(SystemTime::now())
            .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        sqlx::query(
            "INSERT INTO peerq_outbox \
             (service, task_id, lane, partition_key, idempotency_key, delay_ms, codec, payload, \
              headers) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
        )
        .bind(service.as_str())
        .bind(id.as_str())
        .bind(lane as i32)
        .bind(options.key.as_deref())
        .bind(options.idempotency_key.as_deref())
        .bind(delay_ms)
        .bind(C::NAME)
        .bind(payload)
        .bind(headers.to_json())
        .execute(conn)
        .await?;
        Ok(id)
    }
}
