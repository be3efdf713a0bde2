//! PostgreSQL (feature `postgres`, docs/design.md §10): peerq's tables, and
//! enqueueing in the caller's transaction through an outbox.
//!
//! A service that inserts an order and then enqueues its confirmation mail
//! loses the mail when it crashes in between, or sends one for an order
//! that rolled back. [`Outbox::enqueue`] writes the task into
//! `peerq_outbox` in the caller's own transaction instead, so it commits or
//! rolls back with the order; a [`Relay`] (alone, or in each consumer given
//! a pool with `ConsumerBuilder::outbox_relay`) moves committed rows to the
//! service's Redis, each once under the task id the outbox gave it.
//!
//! ## Layout
//!
//! | module | owns |
//! |---|---|
//! | `migrate` | `migrations/*.sql`, embedded, applied once each under an advisory lock; `peerq_migrations` |
//! | `outbox` | [`Outbox`]: a task's row, written in the caller's transaction |
//! | `relay` | [`Relay`]: its builder and its loop (wake, pass over the lanes, back off) |
//! | `lane` | one lane's claim in one transaction: lock, select, relay each row, replace the rows by their markers, commit |
//! | `forget` | after a claim's commit: its records' expiry, beside the next claims, and the sweep of markers left |
//! | `verdict` | what the relay does with a row (enqueue or dead-letter), free of I/O |
//!
//! What stays in Redis's modules: the enqueue itself is the producer's
//! (`producer::stored`), under the row's task id with the dedup record
//! `outbox:<task id>`, so a row relayed twice (a relay killed after the
//! `XADD`, before its delete committed, or a delete that Postgres, away,
//! could not commit) is enqueued once. The record has no expiry until the
//! row's delete has committed (`peerq_outbox_sent` says so), then the
//! relay's grace.

mod forget;
mod inbox;
mod lane;
mod migrate;
mod outbox;
mod prune;
mod relay;
mod verdict;

pub use inbox::{Inbox, Once};
pub use migrate::{MIGRATIONS, Migration, migrate, migrate_url};
pub use outbox::Outbox;
pub use prune::{DEFAULT_INBOX_RETENTION, PRUNE_BATCH};
pub(crate) use prune::{prune_until, validate_retention};
pub use relay::{
    DEFAULT_POLL_INTERVAL, DEFAULT_RECORD_GRACE, DEFAULT_RELAY_BATCH, Relay, RelayBuilder,
};

use sqlx::{PgPool, Postgres, Transaction};

use crate::partition::fnv1a64;

/// The number of lanes of each service's outbox rows. A relay works on one
/// lane at a time, holding its advisory lock, so rows of one lane leave in
/// the order of their ids; 16 lets 16 relays work at once.
pub const LANES: u32 = 16;

/// The lane of a row whose partition key (its `key`, else its idempotency
/// key, else its task id) is `key`: `fnv1a64(key) % 16`, the hash that
/// places tasks in partitions (see [`partition_of`](crate::partition_of)), so a writer in
/// another language computes the same.
pub fn lane_of(key: &str) -> u32 {
    (fnv1a64(key.as_bytes()) % u64::from(LANES)) as u32
}

/// The first key of the relays' advisory locks of `service`
/// (`pg_try_advisory_xact_lock(<this>, lane)`): the low 32 bits of
/// `fnv1a64(service)`. Two services whose names collide here only share
/// their lanes' locks (a relay then waits for the other's lane), never
/// their rows.
pub(crate) fn service_lock(service: &str) -> i32 {
    fnv1a64(service.as_bytes()) as u32 as i32
}

/// A transaction of `pool`, begun on a task of its own.
///
/// sqlx's `begin` is not cancel-safe on Postgres (sqlx issue 4393, in
/// 0.8.6): dropped after sending `BEGIN` and before its reply, it leaves
/// the pooled connection inside a transaction nothing ends, and the next
/// borrower's statements run in it (an autocommit write there is lost when
/// that transaction rolls back). peerq drops a handler that ignores its
/// cancellation, and a relay's claim when the relay stops, and the pool is
/// the application's: so the `BEGIN` runs where such a drop cannot reach
/// it, and a transaction begun for a dropped caller is dropped whole, which
/// sqlx rolls back. Found by the ledger's crash test (60 "there is already
/// a transaction in progress" in one run, 0 since).
pub(crate) async fn begin(pool: &PgPool) -> sqlx::Result<Transaction<'static, Postgres>> {
    let pool = pool.clone();
    match tokio::spawn(async move { pool.begin().await }).await {
        Ok(tx) => tx,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        // The runtime is shutting down.
        Err(_) => Err(sqlx::Error::WorkerCrashed),
    }
}

/// The futures users spawn are `Send` (sqlx's executors make that easy to
/// lose: a borrow of a connection across an `.await` in a generic call).
#[allow(dead_code, unreachable_code, clippy::diverging_sub_expression)]
fn futures_are_send(pool: &sqlx::PgPool, conn: &mut sqlx::PgConnection) {
    fn send<T: Send>(_: T) {}
    send(migrate(pool));
    send(migrate_url(""));
    send(Outbox::enqueue(
        conn,
        "",
        &(),
        crate::producer::Options::new(),
    ));
    send(Relay::builder().build().unwrap().run_until(async {}));
    let cx = crate::handler::TaskContext::for_test("", Default::default());
    send(Inbox::run_once(
        pool,
        &cx,
        async |tx: &mut sqlx::PgConnection| {
            sqlx::query("").execute(&mut *tx).await?;
            Ok(())
        },
    ));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lanes_are_pinned_to_the_partition_hash() {
        // fnv1a64("user-42") = 0x32c6d7a54d35dacb (see `partition`); changing
        // these moves rows of one key between lanes while relays run.
        assert_eq!(lane_of("user-42"), 0xb);
        assert_eq!(lane_of("foobar"), 0x8);
        for i in 0..1000 {
            assert!(lane_of(&format!("k{i}")) < LANES);
        }
    }

    #[test]
    fn the_service_lock_is_the_low_half_of_the_hash() {
        assert_eq!(service_lock("user-42"), 0x4d35dacb);
        assert_eq!(service_lock("foobar"), 0xf73967e8u32 as i32);
    }
}
