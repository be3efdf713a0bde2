//! The handler, its layers and the codec, erased into one [`Runner`] when
//! the consumer is built.
//!
//! Everything past the builder (the handover driver, workers, fetching,
//! settling, housekeeping) works with entries and [`TaskContext`]s only, so
//! none of it is generic over the task type, the service or the codec: it
//! is compiled once, and a change to it reads without type parameters. The
//! price is one boxed future per task, which is small beside a round trip.

use std::any::TypeId;
use std::marker::PhantomData;
use std::sync::Arc;

use futures_util::future::BoxFuture;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tower::{Service, ServiceExt};

use crate::codec::Codec;
use crate::entry::{Entry, Unrunnable};
use crate::handler::{BoxError, Task, TaskContext};

/// A handler service the runtime can drive: a tower service of `Task<T>`
/// that can be cloned per task and sent across threads.
pub(crate) trait TaskService<T>:
    Service<Task<T>, Response: Serialize + Send + 'static, Error: Into<BoxError>, Future: Send>
    + Clone
    + Send
    + Sync
    + 'static
{
}

impl<T, S> TaskService<T> for S
where
    S: Service<Task<T>> + Clone + Send + Sync + 'static,
    S::Response: Serialize + Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send,
{
}

/// A task payload type the runtime can decode and move across threads.
pub(crate) trait Payload: DeserializeOwned + Send + 'static {}
impl<T: DeserializeOwned + Send + 'static> Payload for T {}

/// One task's call of the handler service, decoded and with its context:
/// one boxed future, polled to run it.
pub(crate) type Call = BoxFuture<'static, HandlerResult>;

/// What the handler service returned: with tracking on, its result
/// encoded with the service's codec (`None`: none to keep, such as `()`).
pub(crate) type HandlerResult = Result<Option<Vec<u8>>, BoxError>;

/// Decodes an entry's payload and prepares the call of the handler.
trait Prepare: Send + Sync {
    fn prepare(&self, entry: &Entry, cx: TaskContext) -> Result<Call, Unrunnable>;
}

/// The handler service `S` of tasks `T` encoded with `C`.
struct Typed<T, S, C> {
    service: S,
    codec: C,
    task: PhantomData<fn() -> T>,
}

impl<T: Payload, S: TaskService<T>, C: Codec> Prepare for Typed<T, S, C> {
    fn prepare(&self, entry: &Entry, cx: TaskContext) -> Result<Call, Unrunnable> {
        let payload: T = entry.decode(&self.codec)?;
        // A clone per task, as tower's services expect (`ConcurrencyLimit`
        // takes its permit in `poll_ready` and gives it back on drop).
        let mut service = self.service.clone();
        // Results are kept only for tracked tasks and for members whose
        // batch wants them (docs/design.md §19), and `()` never.
        let wanted = cx.tracked.is_some() || cx.batch.as_ref().is_some_and(|b| b.wants_result);
        let keep = wanted && TypeId::of::<S::Response>() != TypeId::of::<()>();
        let codec = self.codec.clone();
        // One allocation per task: the call's future, boxed once.
        Ok(Box::pin(async move {
            let service = service.ready().await.map_err(Into::into)?;
            let output = service
                .call(Task { payload, cx })
                .await
                .map_err(Into::into)?;
            if !keep {
                return Ok(None);
            }
            let encoded = codec
                .encode(&output)
                .map_err(|e| format!("the handler's result does not encode: {e}"))?;
            Ok(Some(encoded))
        }))
    }
}

/// The key the limits per key count a task by, when a function of the
/// task gives it (docs/design.md §15): the entry's payload decoded, then
/// the user's function; `None` for a task it gives none, or one that does
/// not decode (its run dead-letters it).
pub(crate) type LimitKey = Arc<dyn Fn(&Entry) -> Option<String> + Send + Sync>;

/// The user's function of a task of type `T` that gives its limit key.
pub(crate) type KeyOfTask<T> = Arc<dyn Fn(&T) -> Option<String> + Send + Sync>;

/// The handler service with its layers and the service's codec, with their
/// types erased; cheap to clone.
#[derive(Clone)]
pub(crate) struct Runner {
    prepare: Arc<dyn Prepare>,
    codec: &'static str,
    limit_key: Option<LimitKey>,
}

impl std::fmt::Debug for Runner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runner")
            .field("codec", &self.codec)
            .finish_non_exhaustive()
    }
}

impl Runner {
    /// Erases `service`, a service of tasks `T` encoded with `C`.
    pub(crate) fn new<T: Payload, S: TaskService<T>, C: Codec>(service: S) -> Runner {
        Runner {
            prepare: Arc::new(Typed {
                service,
                codec: C::default(),
                task: PhantomData::<fn() -> T>,
            }),
            codec: C::NAME,
            limit_key: None,
        }
    }

    /// With the limits per key counting by `key` of each task `T`
    /// (encoded with `C`) instead of its partition key.
    pub(crate) fn limit_key<T: Payload, C: Codec>(mut self, key: KeyOfTask<T>) -> Runner {
        let codec = C::default();
        self.limit_key = Some(Arc::new(move |entry: &Entry| {
            let task: T = entry.decode(&codec).ok()?;
            key(&task)
        }));
        self
    }

    /// The function of the task the limits per key count by, if one was
    /// given.
    pub(crate) fn limit_key_of(&self) -> Option<&LimitKey> {
        self.limit_key.as_ref()
    }

    /// The codec's name, as `{N}:meta` and each entry record it.
    pub(crate) fn codec(&self) -> &'static str {
        self.codec
    }

    /// Decodes `entry`'s payload into the task and prepares the handler's
    /// call with `cx`; the error says why it cannot run (the dead letters'
    /// reason). Nothing runs until the call is polled.
    pub(crate) fn prepare(&self, entry: &Entry, cx: TaskContext) -> Result<Call, Unrunnable> {
        self.prepare.prepare(entry, cx)
    }
}
