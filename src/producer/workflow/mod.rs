//! A producer's batches (docs/design.md §19): [`BatchBuilder`] opens one
//! with its callbacks, [`OpenBatch`] adds members and seals it; a chain
//! (`chain`) and a flow (`flow`) are batches too.
//!
//! Members are counted before they are enqueued: the batch script adds
//! each add's count to the batch's total once (`add`, by the add's id),
//! then they go as a batch enqueue whose entries carry the batch's id. A member's end reaches the batch through
//! the script that ends it, so a seal after every member ended finds the
//! batch complete and adds the callback at once.

use std::sync::Arc;
use std::time::Duration;

use deadpool_redis::redis::Value;
use serde::Serialize;

use super::{Options, Producer};
use crate::codec::Codec;
use crate::entry::{TaskId, field as entry_field};
use crate::error::{BatchRefused, Error, Result};
use crate::headers::Headers;
use crate::priority::Priority;
use crate::workflow::{BatchId, BatchKeys, field};

/// Default time an open batch waits to be sealed before it expires.
pub const DEFAULT_BATCH_EXPIRY: Duration = Duration::from_secs(24 * 3600);

/// Default time a done batch's record is kept (for `peerq batch show`).
pub const DEFAULT_BATCH_KEEP: Duration = Duration::from_secs(24 * 3600);

mod chain;
mod flow;

pub use chain::ChainBuilder;
pub use flow::Flow;

/// What a batch wants of members it adds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wanted {
    /// Their ends.
    Ends,
    /// Their ends and results (a flow's children).
    Results,
    /// A chain's first step: its end and result, and it is the step
    /// running.
    FirstStep,
}

/// A callback (or a chain's step), encoded.
#[derive(Debug)]
struct Callback {
    payload: Vec<u8>,
    headers: Headers,
}

/// Opens a batch: a callback task enqueued once every member is final
/// (succeeded, dead or cancelled), with a [`BatchSummary`]
/// (`TaskContext::batch_summary`). Made by [`Producer::batch`].
///
/// [`BatchSummary`]: crate::workflow::BatchSummary
///
/// ```no_run
/// # #[derive(serde::Serialize)]
/// # enum Job { Mail(u32), Report }
/// # async fn demo(producer: peerq::Producer) -> peerq::Result<()> {
/// let mails: Vec<Job> = (0..100).map(Job::Mail).collect();
/// // Open, add every member, seal: the report runs once, after the last.
/// let batch = producer.batch().callback(&Job::Report).enqueue(&mails).await?;
/// println!("batch {batch}");
/// # Ok(()) }
/// ```
#[must_use]
pub struct BatchBuilder<'p, C: Codec> {
    producer: &'p Producer<C>,
    callback: Option<Result<Callback>>,
    on_failure: Option<Result<Callback>>,
    expire_after: Duration,
    keep_for: Duration,
    /// The callback gets the members' results (a flow's parent).
    results: bool,
    /// A chain's steps after the first.
    steps: Vec<Callback>,
    /// The batch whose member the callback is (a flow's child that is a
    /// flow itself).
    member_of: Option<BatchId>,
    /// Its members are remembered for a cancel of the batch (a flow's, a
    /// [`cancellable`](Self::cancellable) batch's).
    remember: bool,
    /// Its id, when chosen before it opens (a subflow's, remembered by the
    /// flow above it).
    id: Option<BatchId>,
}

impl<C: Codec> std::fmt::Debug for BatchBuilder<'_, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BatchBuilder")
            .field("callback", &self.callback.is_some())
            .field("on_failure", &self.on_failure.is_some())
            .field("expire_after", &self.expire_after)
            .field("keep_for", &self.keep_for)
            .finish_non_exhaustive()
    }
}

impl<C: Codec> Producer<C> {
    /// A new batch of this producer's service: its members and callbacks
    /// are tasks of the service's task type.
    pub fn batch(&self) -> BatchBuilder<'_, C> {
        BatchBuilder {
            producer: self,
            callback: None,
            on_failure: None,
            expire_after: DEFAULT_BATCH_EXPIRY,
            keep_for: DEFAULT_BATCH_KEEP,
            results: false,
            steps: Vec::new(),
            member_of: None,
            remember: false,
            id: None,
        }
    }
}

impl<'p, C: Codec> BatchBuilder<'p, C> {
    /// The task enqueued once every member is final, whatever became of
    /// them (unless an [`on_failure`](Self::on_failure) callback is set
    /// and some member died or was cancelled).
    pub fn callback<T: Serialize>(self, task: &T) -> Self {
        self.callback_with(task, Options::new())
    }

    /// The callback with its headers (`options`' other settings are
    /// refused at [`open`](Self::open), naming them: a callback goes to the
    /// batch's home partition, at once).
    pub fn callback_with<T: Serialize>(mut self, task: &T, options: Options) -> Self {
        self.callback = Some(self.encode(task, options));
        self
    }

    /// The task enqueued instead of the callback when some member died or
    /// was cancelled; with every member succeeded, the callback alone
    /// runs (or nothing, without one).
    pub fn on_failure<T: Serialize>(mut self, task: &T) -> Self {
        self.on_failure = Some(self.encode(task, Options::new()));
        self
    }

    /// How long the batch may stay open (not sealed): after that it takes
    /// no member, is never sealed and sends no callback (`peerq batch
    /// show` says `expired`). Default 24 h.
    pub fn expire_after(mut self, after: Duration) -> Self {
        self.expire_after = after;
        self
    }

    /// How long a done batch's record is kept, for `peerq batch show`
    /// (and for a replayed member to find it). Default 24 h.
    pub fn keep_for(mut self, keep: Duration) -> Self {
        self.keep_for = keep;
        self
    }

    /// Remembers each member's handle in the batch (one more field per
    /// member in the batch's slot, written by each add), so that
    /// `Service::cancel_batch` cancels the members not final too; without,
    /// a cancel stops the callback only. Flows and chains always do.
    pub fn cancellable(mut self) -> Self {
        self.remember = true;
        self
    }

    fn encode<T: Serialize>(&self, task: &T, options: Options) -> Result<Callback> {
        let refused = [
            ("key", options.key.is_some()),
            ("idempotency_key", options.idempotency_key.is_some()),
            ("unique", options.unique.is_some()),
            ("delay", options.delay.is_some() || options.at.is_some()),
            ("priority", options.priority != Priority::Normal),
        ];
        if let Some((setting, _)) = refused.iter().find(|(_, set)| *set) {
            return Err(Error::invalid(
                setting,
                "a batch's callback is enqueued by the batch, to its home partition, as soon as \
                 the batch is done: it takes headers only",
            ));
        }
        options.headers.check()?;
        Ok(Callback {
            payload: self.producer.payload(task)?,
            headers: options.headers,
        })
    }

    /// Opens the batch in Redis: members may be added until it is sealed.
    /// An invalid setting or a callback that does not encode is refused
    /// here, naming it.
    pub async fn open(self) -> Result<OpenBatch<'p, C>> {
        for (setting, d) in [
            ("expire_after", self.expire_after),
            ("keep_for", self.keep_for),
        ] {
            if d < Duration::from_secs(1) {
                return Err(Error::invalid(
                    setting,
                    format!("{d:?} is too short: use 1 s or more"),
                ));
            }
        }
        let callback = self.callback.transpose()?;
        let on_failure = self.on_failure.transpose()?;
        let producer = self.producer;
        let id = self
            .id
            .clone()
            .unwrap_or_else(|| BatchId::generate(producer.partitions));
        let keys = BatchKeys::of(&producer.name, &id);
        let mut script = keys.call("open", &id);
        script
            .arg(self.expire_after.as_millis() as u64)
            .arg(self.keep_for.as_millis() as u64)
            .arg(u8::from(self.results));
        let member_of = self.member_of.as_ref();
        for callback in [&callback, &on_failure] {
            let fields = callback
                .as_ref()
                .map(|c| fields::<C>(c, &id, member_of))
                .unwrap_or_default();
            script.arg(fields.len());
            for (name, value) in fields {
                script.arg(name).arg(value);
            }
        }
        script.arg(self.steps.len());
        for step in &self.steps {
            let fields = fields::<C>(step, &id, None);
            script.arg(fields.len());
            for (name, value) in fields {
                script.arg(name).arg(value);
            }
        }
        let _: i64 = producer.conn.write_script(&script).await?;
        let remember = self.remember;
        Ok(OpenBatch {
            producer,
            id,
            remember,
        })
    }

    /// Opens the batch, adds `members` and seals it: its id.
    pub async fn enqueue<T: Serialize>(self, members: &[T]) -> Result<BatchId> {
        let batch = self.open().await?;
        batch.add(members).await?;
        batch.seal().await
    }
}

/// A callback's (or a chain's step's) entry fields but its attempt and
/// enqueue time, which the batch script writes as it adds it: a new id,
/// the batch's UUID as its partition key (its home partition is that
/// key's), codec, payload, headers; and, for a flow's parent that is an
/// outer flow's child, its membership there (its result wanted).
fn fields<C: Codec>(
    callback: &Callback,
    batch: &BatchId,
    member_of: Option<&BatchId>,
) -> Vec<(String, Vec<u8>)> {
    let id = TaskId::generate();
    let mut fields = vec![
        (entry_field::ID.to_owned(), id.as_str().as_bytes().to_vec()),
        (
            entry_field::KEY.to_owned(),
            batch.uuid().as_bytes().to_vec(),
        ),
        (entry_field::CODEC.to_owned(), C::NAME.as_bytes().to_vec()),
        (entry_field::PAYLOAD.to_owned(), callback.payload.clone()),
    ];
    fields.extend(callback.headers.fields().map(|(n, v)| (n.to_owned(), v)));
    if let Some(outer) = member_of {
        fields.push((field::BATCH.to_owned(), outer.as_str().as_bytes().to_vec()));
        fields.push((field::BATCH_RESULTS.to_owned(), b"1".to_vec()));
    }
    fields
}

/// An open batch: add members, then [`seal`](Self::seal) it.
///
/// An add that returns an error may have enqueued some of its members and
/// not others: such a batch cannot complete. Seal only after every add
/// succeeded; a batch never sealed expires (`expire_after`).
#[derive(Debug)]
pub struct OpenBatch<'p, C: Codec> {
    producer: &'p Producer<C>,
    id: BatchId,
    /// Its members' handles are remembered for a cancel.
    remember: bool,
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
    async fn send_encoded(
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
    async fn count(
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
