//! [`Options`]: how one task is enqueued (a key, an idempotency key, a
//! delay); the batch takes none.

use std::time::{Duration, SystemTime};

/// How to enqueue one task.
#[derive(Debug, Clone, Default)]
#[must_use]
pub struct Options {
    pub(super) key: Option<String>,
    pub(super) idempotency_key: Option<String>,
    pub(super) delay: Option<Duration>,
    pub(super) at: Option<SystemTime>,
}

impl Options {
    /// The defaults: the task id is the partition key.
    pub fn new() -> Self {
        Options::default()
    }

    /// The partition key: tasks with one key go to one partition and are
    /// delivered in enqueue order.
    pub fn key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// Enqueue the task at most once per `key` while the producer's
    /// idempotency TTL lasts (default 24 h): a second enqueue with the
    /// same key, say a retry after an ambiguous error, enqueues nothing
    /// and returns the first task's id. Without a [`key`](Self::key), it
    /// is also the partition key.
    ///
    /// ```no_run
    /// # #[derive(serde::Serialize)]
    /// # struct Mail { to: String }
    /// # async fn demo(producer: peerq::Producer) -> peerq::Result<()> {
    /// use peerq::Options;
    /// // A task of the service's task type (its handler's `Task`).
    /// let mail = Mail { to: "a@example.com".into() };
    /// let once = Options::new().idempotency_key("order-1041-confirmation");
    /// let first = producer.enqueue_with(&mail, once.clone()).await?;
    /// let again = producer.enqueue_with(&mail, once).await?; // nothing enqueued
    /// assert_eq!(first, again);
    /// # Ok(()) }
    /// ```
    pub fn idempotency_key(mut self, key: impl Into<String>) -> Self {
        self.idempotency_key = Some(key.into());
        self
    }

    /// Run the task no earlier than `delay` from now, by Redis's clock. It
    /// waits in its partition's delayed set; the partition's owner moves it
    /// into the stream when due: within milliseconds for delays above a
    /// second, at most about a second late for shorter ones.
    pub fn delay(mut self, delay: Duration) -> Self {
        self.delay = Some(delay);
        self.at = None;
        self
    }

    /// Run the task no earlier than `at` (by this process's clock); see
    /// [`delay`](Self::delay). A time in the past enqueues it at once.
    pub fn at(mut self, at: SystemTime) -> Self {
        self.at = Some(at);
        self.delay = None;
        self
    }

    /// Whether the task goes through the enqueue script.
    pub(super) fn scripted(&self) -> bool {
        self.idempotency_key.is_some() || self.delay.is_some() || self.at.is_some()
    }
}
