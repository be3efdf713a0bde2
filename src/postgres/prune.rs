//! Removing inbox rows older than a retention, a small batch at a time.
//!
//! A row of `peerq_inbox` says a task's writes committed; it only has to
//! outlive any later run of that task (a crash's or a freeze's re-run
//! comes within seconds). Rows are deleted oldest first, in batches of
//! [`PRUNE_BATCH`] with `FOR UPDATE SKIP LOCKED`, each batch its own short
//! statement: a handler's transaction never waits for the pruner, and
//! instances pruning at once take different rows.

use std::time::Duration;

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::error::{Error, Result};

/// The default retention of inbox rows.
pub const DEFAULT_INBOX_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

/// Rows deleted per statement.
pub const PRUNE_BATCH: i64 = 500;

/// How often a consumer prunes (or every retention, if shorter).
const PRUNE_EVERY: Duration = Duration::from_secs(60);

/// The pause between two batches of one pass, leaving the table to the
/// handlers.
const BETWEEN_BATCHES: Duration = Duration::from_millis(20);

/// Deletes `service`'s inbox rows done more than `retention` ago, batch by
/// batch; the number deleted.
pub(crate) async fn prune(pool: &PgPool, service: &str, retention: Duration) -> Result<u64> {
    let retention_ms = i64::try_from(retention.as_millis()).unwrap_or(i64::MAX);
    let mut deleted = 0;
    loop {
        let batch = sqlx::query(
            "DELETE FROM peerq_inbox WHERE ctid IN ( \
                 SELECT ctid FROM peerq_inbox \
                 WHERE service = $1 AND done_at < now() - $2 * interval '1 millisecond' \
                 ORDER BY done_at LIMIT $3 FOR UPDATE SKIP LOCKED)",
        )
        .bind(service)
        .bind(retention_ms)
        .bind(PRUNE_BATCH)
        .execute(pool)
        .await?
        .rows_affected();
        deleted += batch;
        if batch < PRUNE_BATCH as u64 {
            return Ok(deleted);
        }
        tokio::time::sleep(BETWEEN_BATCHES).await;
    }
}

/// Prunes `service`'s inbox every minute (or every `retention`, if
/// shorter) until `stop`; a failed pass is logged and tried at the next.
pub(crate) async fn prune_until(
    pool: PgPool,
    service: String,
    retention: Duration,
    stop: CancellationToken,
) {
    let every = PRUNE_EVERY.min(retention);
    loop {
        match prune(&pool, &service, retention).await {
            Ok(0) => {}
            Ok(deleted) => debug!(deleted, "inbox rows past their retention removed"),
            Err(e) => warn!(cause = %e, "cannot remove old inbox rows; trying again later"),
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
    }
}

/// Refuses a retention under a minute (a task's re-run after a crash
/// comes after the handover's deadline, and must find its row), naming
/// the setting.
pub(crate) fn validate_retention(retention: Duration) -> Result<()> {
    if retention < Duration::from_secs(60) {
        return Err(Error::invalid(
            "inbox_retention",
            format!("{retention:?} is too short; use at least 1 minute (default 7 days)"),
        ));
    }
    Ok(())
}
