//! A chain (docs/design.md §19): steps that run one after the other, each
//! once the step before succeeded, with its result. A batch whose record
//! holds the steps to come: the batch script adds step `i + 1`, a member
//! of the same batch, in the step that finds step `i` succeeded; a step
//! that dies (or is cancelled) stops the chain, and its record says so.

use serde::Serialize;

use super::{BatchBuilder, Callback, Wanted};
use crate::codec::Codec;
use crate::error::{Error, Result};
use crate::producer::{Options, Producer};
use crate::workflow::BatchId;

/// Builds a chain: `step(a).step(b).step(c)`; `b` runs once `a` succeeded
/// and reads `a`'s result with `TaskContext::previous_result`. Made by
/// [`Producer::chain`].
///
/// ```no_run
/// # #[derive(serde::Serialize)]
/// # enum Job { Resize(String), Upload, Notify }
/// # async fn demo(producer: peerq::Producer) -> peerq::Result<()> {
/// let chain = producer
///     .chain()
///     .step(&Job::Resize("cat.png".into()))
///     .step(&Job::Upload)
///     .step(&Job::Notify)
///     .enqueue()
///     .await?;
/// println!("chain {chain}: `peerq batch show` follows its steps");
/// # Ok(()) }
/// ```
#[must_use]
#[derive(Debug)]
pub struct ChainBuilder<'p, C: Codec> {
    batch: BatchBuilder<'p, C>,
    steps: Vec<Result<Vec<u8>>>,
}

impl<C: Codec> Producer<C> {
    /// A new chain of this producer's service.
    pub fn chain(&self) -> ChainBuilder<'_, C> {
        ChainBuilder {
            batch: self.batch(),
            steps: Vec::new(),
        }
    }
}

impl<C: Codec> ChainBuilder<'_, C> {
    /// The next step.
    pub fn step<T: Serialize>(mut self, task: &T) -> Self {
        self.steps.push(self.batch.producer.payload(task));
        self
    }

    /// A task enqueued after the last step succeeded, or after a step
    /// stopped the chain, with the chain's summary and its steps' results
    /// (`TaskContext::batch_summary`, `batch_results`).
    pub fn callback<T: Serialize>(mut self, task: &T) -> Self {
        self.batch = self.batch.callback(task);
        self
    }

    /// Enqueues the first step; the others follow, each after the one
    /// before succeeded. Returns the chain's id (a batch's).
    pub async fn enqueue(self) -> Result<BatchId> {
        let mut steps = self.steps.into_iter();
        let first = steps
            .next()
            .ok_or_else(|| Error::invalid("step", "a chain has one step at least"))??;
        let mut batch = self.batch;
        batch.results = true;
        for payload in steps {
            let payload = payload?;
            let headers = Default::default();
            batch.steps.push(Callback { payload, headers });
        }
        let open = batch.open().await?;
        open.send_encoded(vec![(first, Options::new())], Wanted::FirstStep)
            .await?;
        open.seal().await
    }
}
