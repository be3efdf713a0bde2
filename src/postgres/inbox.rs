//! [`Inbox`]: a handler's writes to PostgreSQL and the record that its task
//! is done, committed together, behind the partition's fence
//! (docs/design.md §10).
//!
//! peerq runs a task once while instances come and go gracefully; after a
//! crash or a freeze it may run it twice. Through the inbox the handler's
//! writes still commit once: the task's row in `peerq_inbox` commits with
//! them, so a second run finds it and skips, and the partition's row in
//! `peerq_fences`, moved forward only, turns away an owner that a newer one
//! has replaced (a process that froze past its lease).

use std::time::Duration;

use sqlx::{PgConnection, PgPool, Postgres, Transaction};
use tokio::time::Instant;
use tracing::{debug, warn};

use super::prune;
use crate::config::ServiceName;
use crate::error::Result;
use crate::handler::{HandlerError, TaskContext};

/// How long [`Inbox::run_once`] waits for the partition's fence, in
/// intervals, before it warns (and again after as long): an older owner's
/// idle transaction is ended by Postgres within one interval, so a longer
/// wait is a transaction busy in a statement.
const WARN_AFTER_INTERVALS: u32 = 4;

/// Runs a handler's PostgreSQL writes exactly once per task.
///
/// ```no_run
/// use peerq::postgres::Inbox;
/// use peerq::{Handler, HandlerError, TaskContext};
///
/// #[derive(serde::Deserialize)]
/// struct Transfer { seq: i64, cents: i64 }
///
/// struct Ledger { pool: sqlx::PgPool }
///
/// impl Handler for Ledger {
///     type Task = Transfer;
///     async fn handle(&self, t: Transfer, cx: TaskContext) -> Result<(), HandlerError> {
///         Inbox::run_once(&self.pool, &cx, async |tx| {
///             sqlx::query("INSERT INTO entries (seq, cents) VALUES ($1, $2)")
///                 .bind(t.seq)
///                 .bind(t.cents)
///                 .execute(&mut *tx)
///                 .await?;
///             Ok(())
///         })
///         .await?;
///         Ok(())
///     }
/// }
/// ```
#[derive(Debug)]
pub struct Inbox;

/// What [`Inbox::run_once`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum Once<T> {
    /// The writes committed now; the closure's value.
    Ran(T),
    /// An earlier run of the task committed (its inbox row is there): the
    /// closure did not run now.
    DoneBefore,
}

/// What the fence and the inbox said of a task, in one statement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Claim {
    /// The fence is at this owner's token and the task's inbox row is
    /// inserted (uncommitted): run the writes.
    Run,
    /// The fence is at this owner's token, and the task's row was there.
    Done,
    /// The fence is at a newer owner's token.
    Newer(i64),
    /// No fence yet, or an older owner's: move it forward first.
    Behind,
}

/// The partition, the owner's token and where the statements are bound.
struct Fence<'a> {
    service: &'a str,
    partition: i32,
    token: i64,
    /// `lock_timeout` and `idle_in_transaction_session_timeout`.
    lock: Duration,
    idle: Duration,
}

impl Inbox {
    /// Runs `writes` on one transaction of `pool` and commits it with the
    /// task's inbox row, unless an earlier run of the task committed
    /// ([`Once::DoneBefore`]); the task is then acked.
    ///
    /// In the one transaction, before `writes`: the partition's fence
    /// (`peerq_fences`) is read with `FOR SHARE`, so no newer owner moves
    /// it until this commits; found at an older token, it is moved forward
    /// to this owner's [fencing token](TaskContext::fencing_token) first;
    /// found at a newer one, nothing is written and the error is
    /// [stale](HandlerError::stale): this instance drops the partition, no
    /// attempt is spent, and its owner runs the task. Then the inbox row
    /// `(service, task_id)` is inserted; if it is there already, the
    /// transaction rolls back and the task counts as done.
    ///
    /// An error from `writes` rolls everything back and is the attempt's
    /// error (its disposition kept). The transaction has a `lock_timeout`
    /// of half the indexer's interval and an
    /// `idle_in_transaction_session_timeout` of the interval, so a frozen
    /// owner's open transaction, idle, is ended by Postgres within an
    /// interval: `writes` should be database work only, not a call to
    /// another service. Until an older owner's transaction ends (idle, by
    /// that timeout; busy in a statement, when the statement ends), the
    /// fence cannot move forward: this run waits for it, trying again
    /// every half interval and warning after a few intervals, and spends
    /// no attempt. If the run is interrupted meanwhile (a drain, a lost
    /// lease: [`still_owned`](TaskContext::still_owned) turns false), it
    /// returns an error the consumer counts as an interruption, not a
    /// failure. After the commit the task is
    /// [finished](TaskContext::finished).
    ///
    /// What it needs: the migrations applied ([`migrate`](super::migrate)),
    /// and the effect written in this database, on `tx`. Inbox rows are
    /// removed after a retention (7 days by default) by a consumer given
    /// the pool with `ConsumerBuilder::inbox`; a task run again after its
    /// row is gone runs again.
    pub async fn run_once<T, F>(
        pool: &PgPool,
        cx: &TaskContext,
        writes: F,
    ) -> Result<Once<T>, HandlerError>
    where
        F: AsyncFnOnce(&mut PgConnection) -> Result<T, HandlerError>,
    {
        let interval = cx.interval();
        let fence = Fence {
            service: cx.service(),
            partition: cx.unit() as i32,
            token: i64::try_from(cx.fencing_token()).unwrap_or(i64::MAX),
            lock: (interval / 2).max(Duration::from_millis(50)),
            idle: interval,
        };
        let task_id = cx.task_id().as_str();
        let mut waiting = Waiting::new(interval);
        let mut tx = loop {
            let mut tx = fence.begin(pool).await?;
            let claim = match fence.claim(&mut tx, task_id).await {
                Ok(claim) => claim,
                Err(e) if is_lock_timeout(&e) => {
                    waiting.again(&fence, cx)?;
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            match claim {
                Claim::Run => break tx,
                Claim::Done => {
                    tx.rollback().await?;
                    cx.finished();
                    return Ok(Once::DoneBefore);
                }
                Claim::Newer(token) => {
                    tx.rollback().await?;
                    return Err(HandlerError::msg(format!(
                        "stale: partition {}'s fence holds token {token}, newer than this owner's {}",
                        fence.partition, fence.token
                    ))
                    .stale());
                }
                Claim::Behind => {
                    tx.rollback().await?;
                    match fence.advance(pool).await {
                        Ok(()) => {}
                        // An older owner's transaction still holds the
                        // fence `FOR SHARE`.
                        Err(e) if is_lock_timeout(&e) => waiting.again(&fence, cx)?,
                        Err(e) => return Err(e.into()),
                    }
                }
            }
        };
        let value = writes(&mut tx).await?;
        tx.commit().await?;
        cx.finished();
        Ok(Once::Ran(value))
    }

    /// Deletes `service`'s inbox rows done more than `retention` ago, a
    /// small batch at a time that never waits for a handler; the number
    /// deleted. A consumer given the pool with `ConsumerBuilder::inbox`
    /// does this every minute; this is for a service that prunes from a
    /// job of its own.
    pub async fn prune(pool: &PgPool, service: &str, retention: Duration) -> Result<u64> {
        ServiceName::new(service)?;
        prune::validate_retention(retention)?;
        prune::prune(pool, service, retention).await
    }
}

impl Fence<'_> {
    /// A transaction with the fence's timeouts (begun where the handler's
    /// drop cannot cut its `BEGIN` short: [`super::begin`]).
    async fn begin(&self, pool: &PgPool) -> sqlx::Result<Transaction<'static, Postgres>> {
        let mut tx = super::begin(pool).await?;
        sqlx::query(
            "SELECT set_config('lock_timeout', $1, true), \
             set_config('idle_in_transaction_session_timeout', $2, true)",
        )
        .bind(format!("{}ms", self.lock.as_millis()))
        .bind(format!("{}ms", self.idle.as_millis()))
        .execute(&mut *tx)
        .await?;
        Ok(tx)
    }

    /// Reads the fence with `FOR SHARE` and, at this owner's token, inserts
    /// the task's inbox row: one round trip.
    async fn claim(&self, tx: &mut PgConnection, task_id: &str) -> sqlx::Result<Claim> {
        let (fence, inserted): (Option<i64>, bool) = sqlx::query_as(
            "WITH fence AS ( \
                 SELECT token FROM peerq_fences \
                 WHERE service = $1 AND partition = $2 FOR SHARE \
             ), done AS ( \
                 INSERT INTO peerq_inbox (service, task_id, partition, token) \
                 SELECT $1, $3, $2, $4 FROM fence WHERE fence.token = $4 \
                 ON CONFLICT (service, task_id) DO NOTHING \
                 RETURNING 1 \
             ) \
             SELECT (SELECT token FROM fence), EXISTS (SELECT 1 FROM done)",
        )
        .bind(self.service)
        .bind(self.partition)
        .bind(task_id)
        .bind(self.token)
        .fetch_one(tx)
        .await?;
        Ok(match fence {
            Some(token) if token == self.token && inserted => Claim::Run,
            Some(token) if token == self.token => Claim::Done,
            Some(token) if token > self.token => Claim::Newer(token),
            _ => Claim::Behind,
        })
    }

    /// Moves the fence forward to this owner's token, in a transaction of
    /// its own: never backward (a newer owner's token stays), and not
    /// under the `FOR SHARE` of a task's transaction, where two of this
    /// owner's tasks upgrading their locks at once would deadlock.
    async fn advance(&self, pool: &PgPool) -> sqlx::Result<()> {
        let mut tx = self.begin(pool).await?;
        sqlx::query(
            "INSERT INTO peerq_fences (service, partition, token) VALUES ($1, $2, $3) \
             ON CONFLICT (service, partition) DO UPDATE SET token = excluded.token \
             WHERE peerq_fences.token < excluded.token",
        )
        .bind(self.service)
        .bind(self.partition)
        .bind(self.token)
        .execute(&mut *tx)
        .await?;
        tx.commit().await
    }
}

/// A run's wait for a fence that another transaction holds.
struct Waiting {
    since: Instant,
    /// When to warn next.
    warn_at: Instant,
    /// How long between warnings.
    every: Duration,
}

impl Waiting {
    fn new(interval: Duration) -> Self {
        let every = interval * WARN_AFTER_INTERVALS;
        let since = Instant::now();
        Waiting {
            since,
            warn_at: since + every,
            every,
        }
    }

    /// A lock on the fence was not granted in time: the run tries again,
    /// spending no attempt, while it may still act on the task; else the
    /// error that ends it, which the consumer counts as an interruption
    /// (the task runs again on the partition's owner).
    fn again(&mut self, fence: &Fence<'_>, cx: &TaskContext) -> Result<(), HandlerError> {
        let waited = self.since.elapsed();
        if !cx.still_owned() {
            return Err(HandlerError::msg(format!(
                "interrupted after waiting {waited:?} for partition {}'s fence, held by an older \
                 owner's open transaction",
                fence.partition
            )));
        }
        if Instant::now() >= self.warn_at {
            self.warn_at = Instant::now() + self.every;
            warn!(
                partition = fence.partition,
                token = fence.token,
                ?waited,
                "the partition's fence is held by another transaction, most likely an older owner's busy in a statement (its idle timeout ends only idle ones); the partition's tasks wait for it, spending no attempt"
            );
        } else {
            debug!(
                partition = fence.partition,
                "the fence is locked; trying again"
            );
        }
        Ok(())
    }
}

/// Whether Postgres refused a lock in time (`55P03`): the fence row is
/// held by another transaction (a frozen owner's, until its session ends).
fn is_lock_timeout(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db) if db.code().as_deref() == Some("55P03"))
}
