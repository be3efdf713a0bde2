//! The builder's settings of task tracking (docs/design.md §14).

use super::ConsumerBuilder;
use crate::codec::Codec;
use crate::tracking::Tracking;

impl<T, S, C: Codec> ConsumerBuilder<T, S, C> {
    /// Task tracking's first value for the service (default off): written
    /// into `{N}:tracking` by the first instance that finds none there.
    /// After that the key decides, and operators switch tracking on a
    /// running service with `peerq tracking` (every instance follows
    /// within a second); this setting then changes nothing.
    ///
    /// ```no_run
    /// # async fn demo() -> peerq::Result<()> {
    /// use std::time::Duration;
    /// use peerq::Consumer;
    /// use peerq::tracking::Tracking;
    ///
    /// # struct Send;
    /// # impl peerq::Handler for Send {
    /// #     type Task = String;
    /// #     async fn handle(&self, _: String, _: peerq::TaskContext) -> Result<(), peerq::HandlerError> { Ok(()) }
    /// # }
    /// Consumer::builder()
    ///     .redis("redis://127.0.0.1/")
    ///     .name("mail-sender")
    ///     .tracking(Tracking::on().keep(Duration::from_secs(3600)))
    ///     .handler(Send)
    ///     .run()
    ///     .await
    /// # }
    /// ```
    pub fn tracking(mut self, tracking: Tracking) -> Self {
        self.settings.tracking = tracking;
        self
    }

    /// The largest result a tracked task's handler may return, encoded
    /// (default 64 KiB): a larger one is a failed attempt whose error
    /// says so. Results live in Redis with their records, so keep them
    /// small (an id, a count, a URL).
    pub fn max_result_bytes(mut self, bytes: usize) -> Self {
        self.settings.max_result_bytes = bytes;
        self
    }
}
