//! [`Options`]: how one task is enqueued (a key, an idempotency key, a
//! unique key, a delay, a priority, headers), alone or in a batch.

use std::time::{Duration, SystemTime};

use crate::error::{Error, Result};
use crate::headers::Headers;
use crate::priority::Priority;

/// How to enqueue one task.
#[derive(Debug, Clone, Default)]
#[must_use]
pub struct Options {
    pub(crate) key: Option<String>,
    pub(crate) idempotency_key: Option<String>,
    pub(crate) unique: Option<String>,
    pub(crate) delay: Option<Duration>,
    pub(crate) at: Option<SystemTime>,
    pub(crate) priority: Priority,
    pub(crate) headers: Headers,
    /// A batch member's batch id (docs/design.md §19), set by
    /// [`OpenBatch::add`](crate::producer::OpenBatch::add).
    pub(crate) member_of: Option<std::sync::Arc<str>>,
    /// Whether its batch wants its result (a flow's child, a chain's
    /// step).
    pub(crate) member_results: bool,
    /// The id the task gets, when the caller chose it (a batch's members
    /// are counted by their ids before they go).
    pub(crate) id: Option<crate::entry::TaskId>,
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

    /// Refuse this task while another task with the same unique `key` is
    /// waiting, delayed, running or retrying: the enqueue returns
    /// [`Error::Duplicate`] with the id of the task that holds the key, and
    /// enqueues nothing (in a batch, [`Error::DuplicatesInBatch`] names the
    /// refused tasks; the others are enqueued). The key is free again at
    /// once when its task ends: succeeded, dead-lettered or cancelled by a
    /// user. The lock lives in the task's partition and the unique key
    /// places the task, so a different partition [`key`](Self::key) is
    /// refused (`invalid setting `unique``); an equal one is allowed. (The
    /// task's handle is `producer.handle_of(&id, Some(key))`, and its
    /// [`TaskContext::key`](crate::TaskContext::key) is the unique key.)
    ///
    /// With an [`idempotency_key`](Self::idempotency_key) too, a repeat of
    /// the idempotency key is answered first (the earlier task's id, no
    /// error), then the unique key is checked; use the same idempotency
    /// key with one unique key only, since the unique key places the task.
    ///
    /// ```no_run
    /// # async fn demo(producer: peerq::Producer) -> peerq::Result<()> {
    /// use peerq::{Error, Options};
    ///
    /// let nightly = Options::new().unique("report:customer-7");
    /// let first = producer.enqueue_with("build report", nightly.clone()).await?;
    /// match producer.enqueue_with("build report", nightly).await {
    ///     Err(Error::Duplicate(held)) => assert_eq!(held.existing, first),
    ///     other => panic!("{other:?}"),
    /// }
    /// # Ok(()) }
    /// ```
    pub fn unique(mut self, key: impl Into<String>) -> Self {
        self.unique = Some(key.into());
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

    /// The task's priority level (default [`Priority::Normal`]): the
    /// service's instances start it before lower levels' tasks they have
    /// read, and read its level first (docs/design.md §17). The service
    /// must have the level (its consumers'
    /// [`priorities`](crate::consumer::ConsumerBuilder::priorities)), else
    /// the enqueue is refused naming `priority`. A partition key keeps
    /// its tasks' order within one level only. Refused beside a
    /// [`unique`](Self::unique) key unless normal: the unique key's lock
    /// lives in the normal level's partition.
    ///
    /// ```no_run
    /// # async fn demo(producer: peerq::Producer) -> peerq::Result<()> {
    /// use peerq::{Options, Priority};
    ///
    /// let reset = Options::new().key("user-42").priority(Priority::High);
    /// producer.enqueue_with("password reset", reset).await?;
    /// # Ok(()) }
    /// ```
    pub fn priority(mut self, priority: Priority) -> Self {
        self.priority = priority;
        self
    }

    /// Sets header `name` to `value` on the task ([`Headers`]): kept
    /// through every retry, hand-back, take-over, delay, dead letter and
    /// replay, and read by its handler with
    /// [`TaskContext::headers`](crate::TaskContext::headers). At most 32
    /// headers and 4 KiB of names and values a task; a name is ASCII
    /// letters, digits, `-`, `_` and `.`; the enqueue refuses more
    /// (`invalid setting `header``).
    ///
    /// ```no_run
    /// # async fn demo(producer: peerq::Producer) -> peerq::Result<()> {
    /// use peerq::Options;
    ///
    /// let traced = Options::new()
    ///     .header("request-id", "req-7f3a")
    ///     .header("tenant", "acme");
    /// producer.enqueue_with("welcome mail", traced).await?;
    /// # Ok(()) }
    /// ```
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.insert(name, value);
        self
    }

    /// Whether the task goes through the enqueue script.
    pub(super) fn scripted(&self) -> bool {
        self.idempotency_key.is_some()
            || self.unique.is_some()
            || self.delay.is_some()
            || self.at.is_some()
    }

    /// The key that places the task, when it is not its id: the partition
    /// key, else the unique key (its lock is in the task's partition),
    /// else the idempotency key, so a repeat of an idempotency key lands in
    /// the partition that holds the key's record.
    pub(crate) fn partition_key(&self) -> Option<&str> {
        self.key
            .as_deref()
            .or(self.unique.as_deref())
            .or(self.idempotency_key.as_deref())
    }

    /// Refuses headers out of their bounds, and a unique key beside a
    /// different partition key: the unique
    /// key's lock is in the partition the task goes to, so a repeat with
    /// another partition key would look for it elsewhere; and a unique key
    /// at a level other than normal, for the same reason.
    pub(crate) fn check(&self) -> Result<()> {
        self.headers.check()?;
        if self.unique.is_some() && self.priority != Priority::Normal {
            return Err(Error::invalid(
                "priority",
                format!(
                    "a unique task runs at the normal level: its key's lock lives in the normal \
                     level's partition, where a task of another level could not see it; leave \
                     out `priority` (asked: {})",
                    self.priority
                ),
            ));
        }
        match (&self.unique, &self.key) {
            (Some(unique), Some(key)) if unique != key => Err(Error::invalid(
                "unique",
                format!(
                    "the unique key `{unique}` chooses the task's partition, and the partition \
                     key `{key}` differs; leave out `key`, or give the same value to both"
                ),
            )),
            _ => Ok(()),
        }
    }

    /// How long after `now` the task may run: its delay, or the time from
    /// `now` to its `at`; `None` when it may run at once. (The outbox stores
    /// a delay.)
    #[cfg(feature = "postgres")]
    pub(crate) fn delay_after(&self, now: SystemTime) -> Option<Duration> {
        let delay = match (self.delay, self.at) {
            (Some(delay), _) => delay,
            (None, Some(at)) => at.duration_since(now).unwrap_or_default(),
            (None, None) => return None,
        };
        (!delay.is_zero()).then_some(delay)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_or_the_idempotency_key_places_the_task() {
        assert_eq!(Options::new().partition_key(), None);
        let once = Options::new().idempotency_key("order-1");
        assert_eq!(once.partition_key(), Some("order-1"));
        assert_eq!(once.clone().key("user-42").partition_key(), Some("user-42"));
        let unique = once.unique("report-7");
        assert_eq!(unique.partition_key(), Some("report-7"));
        unique.check().unwrap();
    }

    #[test]
    fn a_unique_key_beside_another_partition_key_is_refused_by_name() {
        let err = Options::new().unique("a").key("b").check().unwrap_err();
        assert!(
            err.to_string().starts_with("invalid setting `unique`: "),
            "{err}"
        );
        Options::new().unique("a").key("a").check().unwrap();
    }

    #[cfg(feature = "postgres")]
    #[test]
    fn a_delay_or_a_time_is_a_delay_from_now_and_the_past_is_none() {
        let now = SystemTime::now();
        let s = Duration::from_secs;
        assert_eq!(Options::new().delay_after(now), None);
        assert_eq!(Options::new().delay(s(5)).delay_after(now), Some(s(5)));
        assert_eq!(Options::new().at(now + s(7)).delay_after(now), Some(s(7)));
        assert_eq!(Options::new().at(now - s(7)).delay_after(now), None);
        assert_eq!(Options::new().delay(Duration::ZERO).delay_after(now), None);
    }
}
