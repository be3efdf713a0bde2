//! What follows a lane's commit (docs/design.md §10): the relayed rows'
//! dedup records get their expiry, the relay's grace, and then their
//! markers in `peerq_outbox_sent` go. A record may only start to expire
//! once its row's delete has committed, which its marker proves.
//!
//! A relay does this beside its next claims ([`Forgetting`]), so a claim
//! never waits for the previous one's expiries; markers that a relay did
//! not get to (it stopped or died, Redis or Postgres was away, too many
//! were waiting) are taken up by [`sweep`], which every relay runs at its
//! start and every minute. Both are safe to repeat and to run beside each
//! other: a second expiry only restarts a record's grace.

use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tracing::warn;

use crate::codec::Codec;
use crate::entry::TaskId;
use crate::error::Result;
use crate::producer::Producer;

/// Markers [`sweep`] handles per round trip.
const SWEEP_BATCH: i64 = 1000;
/// Committed claims whose expiries may wait at once; past that, the sweep
/// does them (Redis or Postgres is slow).
const UNDERWAY: usize = 64;
/// How long the expiries of committed claims are gathered before they are
/// given: one round trip for many claims under load, and none in the
/// moment right after a commit, when the relay sends its next rows.
const GATHER: Duration = Duration::from_millis(100);

/// Gives the dedup records of `sent` (task ids and their partitions),
/// whose rows' delete has committed, an expiry of `grace`, then removes
/// their markers.
pub(crate) async fn forget<C: Codec>(
    pool: &PgPool,
    producer: &Producer<C>,
    service: &str,
    sent: &[(TaskId, u32)],
    grace: Duration,
) -> Result<()> {
    if sent.is_empty() {
        return Ok(());
    }
    producer.forget_stored(sent, grace).await?;
    let ids: Vec<&str> = sent.iter().map(|(id, _)| id.as_str()).collect();
    sqlx::query("DELETE FROM peerq_outbox_sent WHERE service = $1 AND task_id = ANY($2)")
        .bind(service)
        .bind(&ids)
        .execute(pool)
        .await?;
    Ok(())
}

/// For every marker of `service`, gives the row's record its expiry and
/// removes the marker, a batch at a time; the number of markers removed.
pub(crate) async fn sweep<C: Codec>(
    pool: &PgPool,
    producer: &Producer<C>,
    service: &str,
    grace: Duration,
) -> Result<u64> {
    let mut swept = 0;
    loop {
        let markers: Vec<(String, i32)> = sqlx::query_as(
            "SELECT task_id, partition FROM peerq_outbox_sent WHERE service = $1 LIMIT $2",
        )
        .bind(service)
        .bind(SWEEP_BATCH)
        .fetch_all(pool)
        .await?;
        let sent: Vec<(TaskId, u32)> = markers
            .iter()
            .map(|(id, p)| (TaskId::from(id.as_str()), *p as u32))
            .collect();
        forget(pool, producer, service, &sent, grace).await?;
        swept += sent.len() as u64;
        if (sent.len() as i64) < SWEEP_BATCH {
            return Ok(swept);
        }
    }
}

/// A relay's expiries, given by a task of its own beside the claims: it
/// gathers the committed claims of [`GATHER`] and does them in one
/// round trip per node and one statement (per [`SWEEP_BATCH`] rows). Ended
/// when this is dropped; what it had not done waits for the sweep.
#[derive(Debug)]
pub(crate) struct Forgetting<C: Codec> {
    pool: PgPool,
    producer: Arc<Producer<C>>,
    service: String,
    grace: Duration,
    claims: mpsc::Sender<Vec<(TaskId, u32)>>,
    worker: JoinHandle<()>,
}

impl<C: Codec> Forgetting<C> {
    pub(crate) fn new(
        pool: PgPool,
        producer: Arc<Producer<C>>,
        service: &str,
        grace: Duration,
    ) -> Self {
        let (claims, rx) = mpsc::channel(UNDERWAY);
        let worker = tokio::spawn(gather(
            rx,
            pool.clone(),
            producer.clone(),
            service.to_owned(),
            grace,
        ));
        Forgetting {
            pool,
            producer,
            service: service.to_owned(),
            grace,
            claims,
            worker,
        }
    }

    /// Hands over a committed claim's records `sent`; when too many wait
    /// (Redis or Postgres slow), they are left to the sweep.
    pub(crate) fn start(&self, sent: Vec<(TaskId, u32)>) {
        if !sent.is_empty() {
            let _ = self.claims.try_send(sent);
        }
    }

    /// Runs a sweep now, waiting for it; the number of markers removed.
    pub(crate) async fn sweep(&self) -> Result<u64> {
        sweep(&self.pool, &self.producer, &self.service, self.grace).await
    }

    /// The relay's producer.
    pub(crate) fn producer(&self) -> &Producer<C> {
        &self.producer
    }
}

impl<C: Codec> Drop for Forgetting<C> {
    fn drop(&mut self) {
        self.worker.abort();
    }
}

/// The worker of [`Forgetting`].
async fn gather<C: Codec>(
    mut claims: mpsc::Receiver<Vec<(TaskId, u32)>>,
    pool: PgPool,
    producer: Arc<Producer<C>>,
    service: String,
    grace: Duration,
) {
    while let Some(mut sent) = claims.recv().await {
        tokio::time::sleep(GATHER).await;
        while let Ok(more) = claims.try_recv() {
            sent.extend(more);
        }
        for batch in sent.chunks(SWEEP_BATCH as usize) {
            if let Err(e) = forget(&pool, &producer, &service, batch, grace).await {
                warn!(service, rows = sent.len(), cause = %e, "cannot let relayed rows' dedup records expire yet; the relay's sweep tries again within a minute");
                break;
            }
        }
    }
}
