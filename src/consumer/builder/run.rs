//! Running a built consumer: validation, then the runtime until a stop.

use std::future::Future;

use serde::Serialize;
use serde::de::DeserializeOwned;
use tower::Service;

use tracing::Instrument;

use super::ConsumerBuilder;
use crate::codec::Codec;
use crate::connection;
use crate::consumer::erased::{KeyOfTask, Runner};
use crate::consumer::lifecycle;
use crate::error::{Error, Result};
use crate::handler::{BoxError, Task};
use crate::instance::InstanceId;

impl<T, S, C> ConsumerBuilder<T, S, C>
where
    T: DeserializeOwned + Send + 'static,
    S: Service<Task<T>> + Clone + Send + Sync + 'static,
    S::Response: Serialize + Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send,
    C: Codec,
{
    /// Validates the settings and runs until SIGTERM or ctrl-c, then leaves
    /// gracefully (docs/design.md §4 rule 7): it stops writing rounds, serves
    /// until the first round without it, then releases its partitions with
    /// marks, so the others take them over without waiting for a deadline.
    /// A second signal, or the [`leave_timeout`](Self::leave_timeout),
    /// leaves at once: running tasks are interrupted and enqueued again.
    ///
    /// Redis need not be up yet: while it cannot be reached (connection
    /// refused, a timeout, a name that does not resolve yet, Redis loading
    /// its data), the start is tried again with backoff (200 ms doubling to
    /// 10 s), with one warning per try, and a signal during that wait ends
    /// the run with `Ok`. It returns an error only for what retrying cannot
    /// fix: an invalid setting ([`Error::InvalidSetting`](crate::Error::InvalidSetting)), settings that
    /// differ from the service's `{N}:meta` ([`Error::SettingsMismatch`](crate::Error::SettingsMismatch)),
    /// a `maxmemory-policy` that may evict keys (see
    /// [`allow_eviction`](Self::allow_eviction)), or a Redis that refuses
    /// this client, such as a wrong password or an ACL ([`Error::Connect`](crate::Error::Connect),
    /// naming the URL without its password).
    pub async fn run(self) -> Result<()> {
        self.start(crate::shutdown::signal(), crate::shutdown::signal)
            .await
    }

    /// Like [`run`](Self::run), but leaves gracefully when `signal`
    /// resolves (and at once after the leave timeout).
    pub async fn run_until(self, signal: impl Future<Output = ()> + Send) -> Result<()> {
        self.start(signal, std::future::pending).await
    }

    async fn start<F: Future<Output = ()> + Send>(
        mut self,
        signal: impl Future<Output = ()> + Send,
        again: impl FnOnce() -> F + Send,
    ) -> Result<()> {
        crate::logs::hint_if_unseen();
        let name = self.validate()?;
        let limit_key = match self.limit_key.take() {
            None => None,
            Some(given) => Some(given.downcast::<KeyOfTask<T>>().map_err(|_| {
                Error::invalid(
                    "limit_key",
                    "its function takes another task type than the handler's: give it after \
                     the handler",
                )
            })?),
        };
        let redis = connection::given(self.redis)?;
        let (shown, backend) = (redis.to_string(), redis.backend()?);
        #[cfg(feature = "http")]
        let http = crate::consumer::endpoint::Endpoint::start(
            self.http,
            self.standing.subscribe(),
            self.clock.clone(),
            self.indexer.timing(self.settings.drain_timeout),
        )
        .await?;
        let id = InstanceId::generate();
        let mut runner = Runner::new::<T, S, C>(self.service);
        if let Some(key) = limit_key {
            runner = runner.limit_key::<T, C>((*key).clone());
        }
        // Everything the instance logs, in every task it spawns, is within
        // this span.
        let span = tracing::info_span!("peerq", service = %name, instance = %id);
        // The outbox relay and the inbox's pruning run beside the
        // instance, and stop with it.
        #[cfg(feature = "postgres")]
        let sidecars = self.postgres.start::<C>(
            &name,
            connection::Redis::built(backend.clone(), &shown),
            self.settings
                .partitions_given
                .then_some(self.settings.partitions),
            &span,
        )?;
        // Boxed: the runtime's future is deeply nested, and the compiler's
        // query depth limit (128) counts that nesting inside the caller's
        // own future: unboxed, a plain `async fn main` calling `run()` may
        // fail to compile ("queries overflow the depth limit").
        let result = Box::pin(
            lifecycle::run(
                lifecycle::Parts {
                    name,
                    id,
                    redis: shown,
                    backend,
                    indexer: self.indexer,
                    settings: self.settings,
                    runner,
                    standing: self.standing,
                    events: self.events,
                    clock: self.clock,
                    singletons: self.singletons,
                },
                signal,
                again,
            )
            .instrument(span),
        )
        .await;
        #[cfg(feature = "http")]
        http.stop().await;
        #[cfg(feature = "postgres")]
        sidecars.stop().await;
        result
    }
}
