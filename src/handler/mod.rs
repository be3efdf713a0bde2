//! The user's side: the [`Handler`] trait, what a failed run says
//! ([`HandlerError`], [`Disposition`]), the [`TaskContext`] it receives
//! (in `context`), and the adapter that makes a handler a
//! `tower::Service`, so that timeouts, concurrency and rate limits are
//! tower layers.

use std::error::Error as StdError;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;

mod context;

pub use context::{CancelReason, TaskContext};
pub(crate) use context::{Tenure, TrackedAt, Tracker};

/// The error type tower services and layers use.
pub type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// Why a handler run failed. Any error converts into it with `?`.
///
/// By default the task is retried after the consumer's backoff; the error
/// can say otherwise:
///
/// ```
/// use std::time::Duration;
/// use peerq::HandlerError;
/// use peerq::handler::Disposition;
///
/// fn parse(s: &str) -> Result<u32, HandlerError> {
///     Ok(s.parse::<u32>()?)
/// }
/// assert!(parse("x").unwrap_err().to_string().contains("invalid digit"));
///
/// // The mail server said "try again in a minute".
/// let busy = HandlerError::msg("421 busy").retry_after(Duration::from_secs(60));
/// assert_eq!(busy.disposition(), Disposition::RetryAfter(Duration::from_secs(60)));
/// // No address will ever make this mail deliverable: straight to the dead letters.
/// let bad = HandlerError::msg("550 no such user").permanent();
/// assert_eq!(bad.disposition(), Disposition::Permanent);
/// ```
pub struct HandlerError {
    source: BoxError,
    disposition: Disposition,
}

/// What happens to a task after a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Disposition {
    /// Retried after the consumer's backoff (exponential, with jitter),
    /// until `max_attempts`; then dead-lettered.
    Backoff,
    /// Retried after this delay instead of the backoff (still counted
    /// towards `max_attempts`).
    RetryAfter(Duration),
    /// Never retried: moved to the dead letters at once.
    Permanent,
    /// Not a failure of the task: a fence where the handler writes (such as
    /// the [Postgres inbox](crate::postgres)'s) holds a newer fencing token
    /// for the partition, so a newer owner has it. As when Redis refuses
    /// one of peerq's own writes, this instance drops the partition's work:
    /// the task is neither acked nor retried here, no attempt is spent, and
    /// the partition's owner runs it.
    Stale,
}

impl HandlerError {
    /// An error with this message.
    pub fn msg(message: impl fmt::Display) -> Self {
        HandlerError {
            source: message.to_string().into(),
            disposition: Disposition::Backoff,
        }
    }

    /// Wraps an error a tower layer returned (keeping its disposition, if
    /// it came from a `HandlerError`).
    pub fn from_boxed(source: BoxError) -> Self {
        match source.downcast::<Failure>() {
            Ok(failure) => HandlerError {
                source: failure.source,
                disposition: failure.disposition,
            },
            Err(source) => HandlerError {
                source,
                disposition: Disposition::Backoff,
            },
        }
    }

    /// Retry after `delay` rather than after the backoff.
    pub fn retry_after(mut self, delay: Duration) -> Self {
        self.disposition = Disposition::RetryAfter(delay);
        self
    }

    /// Do not retry: the task goes to the dead letters at once.
    pub fn permanent(mut self) -> Self {
        self.disposition = Disposition::Permanent;
        self
    }

    /// This instance is no longer the partition's owner: a fence where the
    /// handler writes holds a newer [fencing token](TaskContext::fencing_token).
    /// The partition's work is dropped here and its owner runs the task
    /// ([`Disposition::Stale`]).
    pub fn stale(mut self) -> Self {
        self.disposition = Disposition::Stale;
        self
    }

    /// What happens to the task.
    pub fn disposition(&self) -> Disposition {
        self.disposition
    }

    /// The underlying error.
    pub fn source(&self) -> &(dyn StdError + Send + Sync + 'static) {
        &*self.source
    }
}

// Like anyhow: every error converts, so `?` works in handlers. That is why
// HandlerError itself does not implement `std::error::Error`.
impl<E: StdError + Send + Sync + 'static> From<E> for HandlerError {
    fn from(e: E) -> Self {
        HandlerError {
            source: Box::new(e),
            disposition: Disposition::Backoff,
        }
    }
}

/// A `HandlerError` on its way through tower layers as a [`BoxError`]: the
/// runtime reads the disposition back from it.
#[derive(Debug)]
pub(crate) struct Failure {
    source: BoxError,
    disposition: Disposition,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.source, f)
    }
}

impl StdError for Failure {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.source.source()
    }
}

/// The disposition of an error a handler service returned.
pub(crate) fn disposition_of(error: &BoxError) -> Disposition {
    // A layer may wrap the handler's error and keep it as its source.
    let mut next: Option<&(dyn StdError + 'static)> = Some(&**error);
    while let Some(e) = next {
        if let Some(failure) = e.downcast_ref::<Failure>() {
            return failure.disposition;
        }
        next = e.source();
    }
    Disposition::Backoff
}

impl From<HandlerError> for BoxError {
    fn from(e: HandlerError) -> Self {
        match e.disposition {
            Disposition::Backoff => e.source,
            disposition => Box::new(Failure {
                source: e.source,
                disposition,
            }),
        }
    }
}

impl fmt::Display for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.source, f)
    }
}

impl fmt::Debug for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.source, f)
    }
}

/// A task for a handler: implement this, and peerq does the rest.
///
/// ```
/// use peerq::{Handler, HandlerError, TaskContext};
///
/// #[derive(serde::Deserialize)]
/// struct Mail { to: String, body: String }
///
/// struct SendMail;
///
/// impl Handler for SendMail {
///     type Task = Mail;
///     async fn handle(&self, mail: Mail, cx: TaskContext) -> Result<(), HandlerError> {
///         println!("attempt {} of {}: mail to {}", cx.attempt(), cx.task_id(), mail.to);
///         Ok(())
///     }
/// }
/// ```
pub trait Handler: Send + Sync + 'static {
    /// The task type; decoded from the entry's payload with the service's codec.
    type Task: DeserializeOwned + Send + 'static;

    /// Runs one task. An `Err` (or a panic) is a failed attempt.
    fn handle(
        &self,
        task: Self::Task,
        cx: TaskContext,
    ) -> impl Future<Output = Result<(), HandlerError>> + Send;
}

/// A handler that returns a result: with tracking on, the result is
/// encoded with the service's codec and kept with the task's record, for
/// [`Service::task`](crate::admin::Service::task), `wait` and `peerq task
/// show` (docs/design.md §14). Every [`Handler`] is one, with the result
/// `()`, which is not stored.
///
/// ```
/// use peerq::handler::HandlerWithResult;
/// use peerq::{HandlerError, TaskContext};
///
/// struct Resize;
///
/// #[derive(serde::Serialize)]
/// struct Resized { url: String, bytes: u64 }
///
/// impl HandlerWithResult for Resize {
///     type Task = String;
///     type Output = Resized;
///     async fn handle(&self, image: String, cx: TaskContext) -> Result<Resized, HandlerError> {
///         cx.progress(&50u8);
///         Ok(Resized { url: format!("{image}-small"), bytes: 1024 })
///     }
/// }
/// ```
pub trait HandlerWithResult: Send + Sync + 'static {
    /// The task type; decoded from the entry's payload with the service's codec.
    type Task: DeserializeOwned + Send + 'static;
    /// The result, encoded with the service's codec.
    type Output: Serialize + Send + 'static;

    /// Runs one task. An `Err` (or a panic) is a failed attempt.
    fn handle(
        &self,
        task: Self::Task,
        cx: TaskContext,
    ) -> impl Future<Output = Result<Self::Output, HandlerError>> + Send;
}

impl<H: Handler> HandlerWithResult for H {
    type Task = H::Task;
    type Output = ();

    fn handle(
        &self,
        task: Self::Task,
        cx: TaskContext,
    ) -> impl Future<Output = Result<(), HandlerError>> + Send {
        Handler::handle(self, task, cx)
    }
}

/// A decoded task and its context: the request a handler service receives.
#[derive(Debug)]
pub struct Task<T> {
    /// The decoded payload.
    pub payload: T,
    /// Its context.
    pub cx: TaskContext,
}

/// A [`Handler`] (or a [`HandlerWithResult`]) as a
/// `tower::Service<Task<H::Task>>`.
#[derive(Debug)]
pub struct HandlerService<H> {
    handler: Arc<H>,
}

impl<H> HandlerService<H> {
    /// Wraps `handler`.
    pub fn new(handler: H) -> Self {
        HandlerService {
            handler: Arc::new(handler),
        }
    }
}

impl<H> Clone for HandlerService<H> {
    fn clone(&self) -> Self {
        HandlerService {
            handler: self.handler.clone(),
        }
    }
}

impl<H: HandlerWithResult> tower::Service<Task<H::Task>> for HandlerService<H> {
    type Response = H::Output;
    type Error = HandlerError;
    type Future = Pin<Box<dyn Future<Output = Result<H::Output, HandlerError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, task: Task<H::Task>) -> Self::Future {
        let handler = self.handler.clone();
        Box::pin(async move { HandlerWithResult::handle(&*handler, task.payload, task.cx).await })
    }
}
