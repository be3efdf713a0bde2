//! A service's flow limits on a running service (docs/design.md §15).

use super::Service;
use crate::error::Result;
use crate::limits::{self, Limits};

impl Service {
    /// The service's limits as `{N}:limits` holds them (none when never
    /// set).
    pub async fn limits(&self) -> Result<Limits> {
        Ok(limits::read(&self.admin.conn, &self.name)
            .await?
            .unwrap_or_default())
    }

    /// Sets the service's limits on a running service: every instance
    /// follows within about a second. A limit out of range is refused by
    /// name, and nothing is written.
    ///
    /// ```no_run
    /// # async fn demo(service: peerq::admin::Service) -> peerq::Result<()> {
    /// use std::time::Duration;
    /// use peerq::limits::RateLimit;
    ///
    /// let limits = service.limits().await?;
    /// let doubled = RateLimit::new(600, Duration::from_secs(1));
    /// service.set_limits(limits.rate(doubled)).await?;
    /// # Ok(()) }
    /// ```
    pub async fn set_limits(&self, limits: Limits) -> Result<()> {
        limits::set(&self.admin.conn, &self.name, limits).await
    }
}
