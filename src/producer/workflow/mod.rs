//! A producer's batches (docs/design.md §19): [`BatchBuilder`] opens one
//! with its callbacks, [`OpenBatch`] adds members and seals it; a chain
//! (`chain`) and a flow (`flow`) are batches too.
//!
//! Members are counted before they are enqueued: the batch script adds
//! each add's count to the batch's total once (`add`, by the add's id),
//! then they go as a batch enqueue whose entries carry the batch's id. A member's end reaches the batch through
//! the script that ends it, so a seal after every member ended finds the
//! batch complete and adds the callback at once.

use std::time::Duration;

use serde::Serialize;

use super::{Options, Producer};
use crate::codec::Codec;
use crate::entry::{TaskId, field as entry_field};
use crate::error::{Error, Result};
use crate::headers::Headers;
use crate::priority::Priority;
use crate::workflow::{BatchId, BatchKeys, field};

/// Default time an open batch waits to be sealed before it expires.
pub const DEFAULT_BATCH_EXPIRY: Duration = Duration::from_secs(24 * 3600);

/// Default time a done batch's record is kept (for `peerq batch show`).
pub const DEFAULT_BATCH_KEEP: Duration = Duration::from_secs(24 * 3600);

mod chain;
mod flow;
mod open;

pub use chain::ChainBuilder;
pub use flow::Flow;
pub use open::OpenBatch;

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
