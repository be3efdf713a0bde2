//! The builder's singletons (docs/design.md §20).

use std::future::Future;

use super::ConsumerBuilder;
use crate::codec::Codec;
use crate::handler::BoxError;
use crate::singleton::{Declared, SingletonContext};

impl<T, S, C: Codec> ConsumerBuilder<T, S, C> {
    /// Runs `job` as singleton `name`: on exactly one instance of the
    /// service at a time, chosen by the assignor like a partition (weights
    /// and rendezvous apply, and several singletons spread over the
    /// instances). Call it once per singleton; every instance of the
    /// service must declare the same ones (an instance the assignor picks
    /// for a name it does not declare runs nothing for it).
    ///
    /// It moves as a partition does: at a graceful handover the job's
    /// [`cancelled`](SingletonContext::cancelled) fires, it may go on until
    /// the drain timeout, then its future is dropped, and only then does
    /// the next holder start; after a crash or a freeze the next holder
    /// starts after the lease, and the old one's
    /// [`still_owned`](SingletonContext::still_owned) is false from its
    /// lease's end. A run that returns (`Ok` or `Err`) or panics is started
    /// again while the instance holds the singleton: 100 ms after it
    /// ended, doubling after each run shorter than a minute, at most 30 s.
    /// A pause of the service stops it as a handover does, and a resume
    /// starts it again. Work the job spawns without awaiting it escapes
    /// all of this.
    ///
    /// A name is 1 to 64 letters, digits, `_`, `.` or `-`; another is an
    /// [`Error::InvalidSetting`](crate::Error::InvalidSetting) naming
    /// `singleton` when the consumer starts.
    ///
    /// ```no_run
    /// # async fn demo() -> peerq::Result<()> {
    /// use peerq::Consumer;
    /// use peerq::singleton::SingletonContext;
    /// # struct Send;
    /// # impl peerq::Handler for Send {
    /// #     type Task = String;
    /// #     async fn handle(&self, _: String, _: peerq::TaskContext) -> Result<(), peerq::HandlerError> { Ok(()) }
    /// # }
    /// Consumer::builder()
    ///     .redis("redis://127.0.0.1/")
    ///     .name("mail-sender")
    ///     .singleton("bounce-poller", |cx: SingletonContext| async move {
    ///         while !cx.is_cancelled() && cx.still_owned() {
    ///             // fetch bounces, write them with cx.fencing_token() …
    ///             tokio::select! {
    ///                 _ = cx.cancelled() => {}
    ///                 _ = tokio::time::sleep(std::time::Duration::from_secs(5)) => {}
    ///             }
    ///         }
    ///         Ok::<_, std::io::Error>(())
    ///     })
    ///     .handler(Send)
    ///     .run()
    ///     .await
    /// # }
    /// ```
    pub fn singleton<F, Fut, E>(mut self, name: &str, job: F) -> Self
    where
        F: Fn(SingletonContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<(), E>> + Send + 'static,
        E: Into<BoxError> + 'static,
    {
        self.singletons.push(Declared::new(name, job));
        self
    }
}
