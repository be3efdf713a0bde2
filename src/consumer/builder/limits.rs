//! The builder's flow limits and priority levels (docs/design.md §15, §17).

use std::sync::Arc;
use std::time::Duration;

use super::ConsumerBuilder;
use crate::codec::Codec;
use crate::consumer::erased::KeyOfTask;
use crate::limits::RateLimit;
use crate::priority::Priority;

impl<T, S, C: Codec> ConsumerBuilder<T, S, C> {
    /// The service-wide rate limit's first value (default none): at most
    /// `count` handler starts per `per` across every instance of the
    /// service, however many run and however the backlog lies over the
    /// partitions. Written into `{N}:limits` by the first instance that
    /// finds none there; after that the key decides, and operators change
    /// the limit on a running service with `peerq limit set|clear` (every
    /// instance follows within a second); this setting then changes
    /// nothing. Refused by name when `count` is 0 or `per` is outside 1 ms
    /// to 1 day.
    ///
    /// ```no_run
    /// # async fn demo() -> peerq::Result<()> {
    /// use std::time::Duration;
    /// use peerq::Consumer;
    ///
    /// # struct Send;
    /// # impl peerq::Handler for Send {
    /// #     type Task = String;
    /// #     async fn handle(&self, _: String, _: peerq::TaskContext) -> Result<(), peerq::HandlerError> { Ok(()) }
    /// # }
    /// // The mail provider allows 300 sends a second, whoever sends them.
    /// Consumer::builder()
    ///     .redis("redis://127.0.0.1/")
    ///     .name("mail-sender")
    ///     .rate_limit(300, Duration::from_secs(1))
    ///     .handler(Send)
    ///     .run()
    ///     .await
    /// # }
    /// ```
    pub fn rate_limit(mut self, count: u32, per: Duration) -> Self {
        self.settings.limits = self.settings.limits.rate(RateLimit::new(count, per));
        self
    }

    /// The rate limit per key's first value (default none): at most
    /// `count` starts per `per` of each partition key
    /// ([`Options::key`](crate::Options::key)), across every instance;
    /// tasks without a key are not limited by it. Written into
    /// `{N}:limits` like [`rate_limit`](Self::rate_limit), changed the same
    /// way (`peerq limit set --rate-per-key N/PERIOD`). The owner of a
    /// key's partition keeps its rate in memory: right after a handover a
    /// key may start one burst (30 ms of its rate, at least one task)
    /// early. A key out of tokens does not hold up other keys: its entries
    /// wait aside, pending in Redis, as under
    /// [`concurrency_per_key`](Self::concurrency_per_key).
    pub fn rate_limit_per_key(mut self, count: u32, per: Duration) -> Self {
        self.settings.limits = self
            .settings
            .limits
            .rate_per_key(RateLimit::new(count, per));
        self
    }

    /// The limit per key's first value (default none): at most `n` tasks
    /// of one partition key ([`Options::key`](crate::Options::key)) run at
    /// once across the service, while other keys run freely; tasks without
    /// a key are not limited. Written into `{N}:limits` like
    /// [`rate_limit`](Self::rate_limit), and changed the same way
    /// (`peerq limit set --concurrency-per-key N`).
    ///
    /// The owner of a key's partition counts its runs. When one key floods
    /// its partition, the owner reads past its waiting entries so that
    /// other keys' entries there still start, holding up to 1,000 of them
    /// aside (pending in Redis, kept fresh); beyond that the partition
    /// waits. After a crash or a freeze, a frozen instance may still run
    /// tasks of a key that its partition's next owner also starts, so the
    /// bound can be exceeded by the frozen instance's tasks until they end.
    ///
    /// ```no_run
    /// # async fn demo() -> peerq::Result<()> {
    /// use peerq::Consumer;
    ///
    /// # struct Deliver;
    /// # impl peerq::Handler for Deliver {
    /// #     type Task = String;
    /// #     async fn handle(&self, _: String, _: peerq::TaskContext) -> Result<(), peerq::HandlerError> { Ok(()) }
    /// # }
    /// // Webhooks keyed by customer: at most 2 calls to one customer at a
    /// // time, and one customer's flood does not hold up the others.
    /// Consumer::builder()
    ///     .redis("redis://127.0.0.1/")
    ///     .name("webhooks")
    ///     .concurrency_per_key(2)
    ///     .handler(Deliver)
    ///     .run()
    ///     .await
    /// # }
    /// ```
    pub fn concurrency_per_key(mut self, n: u32) -> Self {
        self.settings.limits = self.settings.limits.concurrency_per_key(n);
        self
    }

    /// What the concurrency per key counts a task by (default: its
    /// partition key): `key(&task)`, such as a customer id or a domain
    /// inside the task, whatever its partition; a task it gives `None` is
    /// not limited. Give it after the handler (it takes the handler's task
    /// type). Service-wide: recorded in `{N}:meta` (`limit_key`), and
    /// every instance must give one (the same function).
    ///
    /// Such a key does not choose the partition, so its tasks run on every
    /// instance: the instances count its runs in Redis, in units that each
    /// holds and keeps alive (`{N}:units:<key>`, docs/design.md §15). A
    /// task takes a unit its instance holds at once; else it waits aside
    /// (pending in Redis, kept fresh) while the instance sends for one, in
    /// one script call for every waiting key, every 20 ms while the key is
    /// at its limit elsewhere. A unit whose holder stops keeping it (a
    /// crash, a freeze) lapses after three intervals, so a frozen holder's
    /// tasks may still run while others start: the bound can be exceeded by
    /// them until they end. The rate limit per key still counts by the
    /// partition key.
    ///
    /// ```no_run
    /// # async fn demo() -> peerq::Result<()> {
    /// use peerq::Consumer;
    ///
    /// #[derive(serde::Deserialize)]
    /// struct Webhook { customer: String, url: String }
    /// # struct Deliver;
    /// # impl peerq::Handler for Deliver {
    /// #     type Task = Webhook;
    /// #     async fn handle(&self, _: Webhook, _: peerq::TaskContext) -> Result<(), peerq::HandlerError> { Ok(()) }
    /// # }
    /// // At most 2 calls to one customer at once, however the webhooks
    /// // were keyed when enqueued.
    /// Consumer::builder()
    ///     .redis("redis://127.0.0.1/")
    ///     .name("webhooks")
    ///     .handler(Deliver)
    ///     .concurrency_per_key(2)
    ///     .limit_key(|hook: &Webhook| Some(hook.customer.clone()))
    ///     .run()
    ///     .await
    /// # }
    /// ```
    pub fn limit_key<F>(mut self, key: F) -> Self
    where
        F: Fn(&T) -> Option<String> + Send + Sync + 'static,
        T: 'static,
    {
        let key: KeyOfTask<T> = Arc::new(key);
        self.limit_key = Some(Arc::new(key));
        self.settings.limit_key = true;
        self
    }

    /// The service's priority levels (default: `normal` alone), recorded
    /// in `{N}:meta` by its first instance; every instance must give the
    /// same. Must include [`Priority::Normal`], the level of a task
    /// enqueued without one ([`Options::priority`](crate::Options::priority)).
    /// Each level has the service's `partitions` of its own, so three
    /// levels cost three times the partitions (and idle reads).
    ///
    /// An instance starts what it has read at a higher level first: a
    /// freed concurrency permit goes to a waiting higher-level task, except
    /// that a level passed over 9 times in a row while it waited takes the
    /// next one, so a flood of high tasks slows lower levels to a tenth of
    /// the permits but never stops them (docs/design.md §17). Refused by
    /// name with [`ordered`](Self::ordered) (a higher level would overtake
    /// the stream's order).
    ///
    /// ```no_run
    /// # async fn demo() -> peerq::Result<()> {
    /// use peerq::{Consumer, Priority};
    ///
    /// # struct Send;
    /// # impl peerq::Handler for Send {
    /// #     type Task = String;
    /// #     async fn handle(&self, _: String, _: peerq::TaskContext) -> Result<(), peerq::HandlerError> { Ok(()) }
    /// # }
    /// // Password resets overtake the newsletter backlog.
    /// Consumer::builder()
    ///     .redis("redis://127.0.0.1/")
    ///     .name("mail-sender")
    ///     .priorities([Priority::High, Priority::Normal, Priority::Low])
    ///     .handler(Send)
    ///     .run()
    ///     .await
    /// # }
    /// ```
    pub fn priorities(mut self, levels: impl IntoIterator<Item = Priority>) -> Self {
        self.settings.priorities = levels.into_iter().collect();
        self
    }
}
