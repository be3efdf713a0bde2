//! A flow (docs/design.md §19): a parent task that runs once all its
//! children are final, and reads their results; a child may be a flow
//! itself (a tree). Each parent is the callback of a batch of its
//! children; a child that is a flow is its own batch's callback and a
//! member of its parent's batch, so it counts there when it ran, with its
//! result.

use std::future::Future;
use std::pin::Pin;

use serde::Serialize;

use super::Wanted;
use crate::codec::Codec;
use crate::error::Result;
use crate::producer::{Options, Producer};
use crate::workflow::BatchId;

/// A parent and its children. The parent gets the children's results
/// (`TaskContext::batch_results`) and a summary (`batch_summary`); it runs
/// whatever became of them (dead or cancelled children included: the
/// summary says so).
///
/// ```no_run
/// # #[derive(serde::Serialize)]
/// # enum Job { Chunk(u32), Index, Report }
/// # async fn demo(producer: peerq::Producer) -> peerq::Result<()> {
/// use peerq::producer::Flow;
/// // The report once the index is built, the index once every chunk is.
/// let index = Flow::new(Job::Index).children((0..500).map(Job::Chunk));
/// let flow = Flow::new(Job::Report).subflow(index);
/// let id = producer.enqueue_flow(&flow).await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Flow<T> {
    parent: T,
    children: Vec<Child<T>>,
}

#[derive(Debug, Clone)]
enum Child<T> {
    Task(T),
    Flow(Flow<T>),
}

impl<T: Serialize> Flow<T> {
    /// A flow whose parent is `parent`, with no children yet (with none,
    /// the parent runs at once).
    pub fn new(parent: T) -> Self {
        Flow {
            parent,
            children: Vec::new(),
        }
    }

    /// A child task.
    pub fn child(mut self, task: T) -> Self {
        self.children.push(Child::Task(task));
        self
    }

    /// Child tasks.
    pub fn children(mut self, tasks: impl IntoIterator<Item = T>) -> Self {
        self.children.extend(tasks.into_iter().map(Child::Task));
        self
    }

    /// A child that is a flow: its parent runs after its own children, and
    /// counts as this flow's child once it ran.
    pub fn subflow(mut self, flow: Flow<T>) -> Self {
        self.children.push(Child::Flow(flow));
        self
    }
}

impl<C: Codec> Producer<C> {
    /// Enqueues `flow`'s children (and its subflows' own, all the way
    /// down); each parent is enqueued once all its children are final.
    /// Returns the id of the batch of the top parent's children.
    pub async fn enqueue_flow<T: Serialize + Sync>(&self, flow: &Flow<T>) -> Result<BatchId> {
        self.enqueue_flow_in(flow, None, None).await
    }

    /// `flow`, whose parent is a member of batch `outer`, if any, as batch
    /// `id` (`None`: a new id).
    fn enqueue_flow_in<'a, T: Serialize + Sync>(
        &'a self,
        flow: &'a Flow<T>,
        outer: Option<BatchId>,
        id: Option<BatchId>,
    ) -> Pin<Box<dyn Future<Output = Result<BatchId>> + Send + 'a>> {
        Box::pin(async move {
            let mut builder = self.batch().callback(&flow.parent);
            builder.results = true;
            builder.member_of = outer;
            builder.remember = true;
            builder.id = id;
            let open = builder.open().await?;
            let mut leaves = Vec::new();
            let mut subflows = Vec::new();
            for child in &flow.children {
                match child {
                    Child::Task(task) => leaves.push((self.payload(task)?, Options::new())),
                    Child::Flow(sub) => subflows.push(sub),
                }
            }
            // The subflows' parents are counted before any can end, and
            // their batches remembered (for a cancel) under ids chosen now.
            let ids: Vec<BatchId> = subflows
                .iter()
                .map(|_| BatchId::generate(self.partitions))
                .collect();
            if !subflows.is_empty() {
                let remembered: Vec<String> = ids.iter().map(|id| format!("b:{id}")).collect();
                open.count(subflows.len(), None, &remembered).await?;
            }
            for (sub, id) in subflows.into_iter().zip(ids) {
                self.enqueue_flow_in(sub, Some(open.id().clone()), Some(id))
                    .await?;
            }
            if !leaves.is_empty() {
                open.send_encoded(leaves, Wanted::Results).await?;
            }
            open.seal().await
        })
    }
}
