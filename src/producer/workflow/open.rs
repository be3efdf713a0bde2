//! An open batch (docs/design.md §19): its members are counted (once per
//! add), remembered for a cancel when the batch wants it, and enqueued;
//! then it is sealed.

use std::sync::Arc;

use deadpool_redis::redis::Value;
use serde::Serialize;

use super::Wanted;
use crate::codec::Codec;
use crate::entry::TaskId;
use crate::error::{BatchRefused, Error, Result};
use crate::priority::Priority;
use crate::producer::{Options, Producer};
use crate::workflow::{BatchId, BatchKeys};

/// An open batch: add members, then [`seal`](Self::seal) it.
///
/// An add that returns an error may have enqueued some of its members and
/// not others: such a batch cannot complete. Seal only after every add
/// succeeded; a batch never sealed expires (`expire_after`).
#[derive(Debug)]
pub struct OpenBatch<'p, C: Codec> {
    pub(super) producer: &'p Producer<C>,
    pub(super) id: BatchId,
    /// Its members' handles are remembered for a cancel.
    pub(super) remember: bool,
}

impl<C: Codec> OpenBatch<'_, C> {
    /// The batch's id, `<home partition>/<uuid>`.
    pub fn id(&self) -> &BatchId {
        &self.id
    }

    /// Adds and enqueues `members`; their task ids, in order.
    pub async fn add<T: Serialize>(&self, members: &[T]) -> Result<Vec<TaskId>> {
        let items: Vec<(&T, Options)> = members.iter().map(|m| (m, Options::new())).collect();
        self.send(&items, Wanted::Ends).await
    }

    /// Adds and enqueues `members`, each with its options: a key, a delay,
    /// a priority, headers. An idempotency key and a unique key are
    /// refused, naming them: a member refused or deduplicated would be
    /// counted and never end.
    pub async fn add_with<T: Serialize>(&self, members: &[(T, Options)]) -> Result<Vec<TaskId>> {
        let items: Vec<(&T, Options)> = members.iter().map(|(m, o)| (m, o.clone())).collect();
        self.send(&items, Wanted::Ends).await
    }

    /// Adds and enqueues `members`, with what the batch wants of them.
    async fn send<T: Serialize>(
        &self,
        members: &[(&T, Options)],
        wanted: Wanted,
    ) -> Result<Vec<TaskId>> {
        let encoded = members
            .iter()
            .map(|(member, options)| Ok((self.producer.payload(member)?, options.clone())))
            .collect::<Result<Vec<_>>>()?;
        self.send_encoded(encoded, wanted).await
    }

    /// Adds and enqueues `members`, encoded, with what the batch wants of
    /// them.
    pub(super) async fn send_encoded(
        &self,
        members: Vec<(Vec<u8>, Options)>,
        wanted: Wanted,
    ) -> Result<Vec<TaskId>> {
        let batch: Arc<str> = self.id.as_str().into();
        let mut tasks = Vec::with_capacity(members.len());
        for (member, options) in members {
            for (setting, set) in [
                ("idempotency_key", options.idempotency_key.is_some()),
                ("unique", options.unique.is_some()),
            ] {
                if set {
                    return Err(Error::invalid(
                        setting,
                        "a batch member is counted before it is enqueued: one that an \
                         idempotency or unique key kept out would never end",
                    ));
                }
            }
            options.check()?;
            let mut options = options;
            options.id = Some(TaskId::generate());
            options.member_of = Some(batch.clone());
            options.member_results = wanted != Wanted::Ends;
            tasks.push((member, options));
        }
        let first_step = match wanted {
            Wanted::FirstStep => tasks.first().and_then(|(_, o)| o.id.as_ref()),
            _ => None,
        };
        // A flow's children and a chain's first step are remembered for a
        // cancel, as a cancellable batch's members.
        let remembered = match (self.remember, wanted) {
            (false, Wanted::Ends) => Vec::new(),
            _ => tasks
                .iter()
                .filter_map(|(_, o)| {
                    Some(format!(
                        "t:{}",
                        self.producer.handle_with(o.id.as_ref()?, o)
                    ))
                })
                .collect(),
        };
        self.count(tasks.len(), first_step, &remembered).await?;
        let producer = self.producer;
        // Collected: an iterator held across the await is not `Send` in a
        // boxed future (a flow's).
        let levels: Vec<Priority> = tasks.iter().map(|(_, o)| o.priority).collect();
        producer.know_levels(levels).await?;
        let items = tasks.iter().map(|(m, o)| (m.clone(), Some(o))).collect();
        let sent = producer.send_items(items).await;
        match &sent {
            Ok(sent) => producer.enqueued.increment(sent.new as u64),
            Err(_) => producer.errors.increment(1),
        }
        Ok(sent?.ids)
    }

    /// Counts `n` more members, before they go: once, under an id of this
    /// add's own (sent again after a lost reply, it counts nothing more);
    /// a chain's first step is named as the step running.
    pub(super) async fn count(
        &self,
        n: usize,
        first_step: Option<&TaskId>,
        remembered: &[String],
    ) -> Result<()> {
        let keys = BatchKeys::of(&self.producer.name, &self.id);
        let mut script = keys.call("add", &self.id);
        let step = first_step.map_or("", TaskId::as_str);
        script.arg(TaskId::generate().as_str()).arg(n).arg(step);
        for member in remembered {
            script.arg(member).arg(1);
        }
        let (code, _total): (i64, Value) = self.producer.conn.write_script(&script).await?;
        self.refused(code)
    }

    fn refused(&self, code: i64) -> Result<()> {
        let id = self.id.to_string();
        match code {
            1 => Ok(()),
            0 => Err(BatchRefused::Gone(id).into()),
            -1 => Err(BatchRefused::Sealed(id).into()),
            -3 => Err(BatchRefused::Cancelled(id).into()),
            _ => Err(BatchRefused::Expired(id).into()),
        }
    }

    /// Seals the batch: no member may be added any more. If every member
    /// is already final, the callback is enqueued now. Returns its id.
    pub async fn seal(self) -> Result<BatchId> {
        let keys = BatchKeys::of(&self.producer.name, &self.id);
        let script = keys.call("seal", &self.id);
        let (code, _state): (i64, Value) = self.producer.conn.write_script(&script).await?;
        self.refused(code)?;
        Ok(self.id)
    }
}
