//! The round loop's check of this instance's clock against Redis `TIME`:
//! an instance whose clock is off by more than the tolerated skew fences
//! itself (docs/design.md §2.1), and says so once per change.

use std::time::Duration;

use deadpool_redis::redis;
use tracing::{error, info};

use super::RoundLoop;
use crate::assignment::FenceReason;
use crate::clock::signed_secs;
use crate::error::Result;
use crate::{keys, metrics as m};

impl RoundLoop {
    /// Measures this instance's clock against Redis `TIME`, corrected by
    /// half the round trip (at start; rounds measure with their script).
    /// A clock beyond the skew is logged and fences the rounds that follow.
    pub(in crate::indexer) async fn check_clock(&mut self) -> Result<()> {
        let before = self.clock.now();
        // The clock of the node with the service's keys, on a Cluster.
        let time = redis::cmd("TIME");
        let (secs, micros): (u64, u64) = self.conn.query_at(&time, &keys::meta(&self.name)).await?;
        let after = self.clock.now();
        let server = Duration::from_secs(secs) + Duration::from_micros(micros);
        self.judge_clock(before, after, server);
        Ok(())
    }

    /// Judges one clock measurement: local time read `before` and `after` a
    /// request that Redis served at `server`. Returns the fence reason while
    /// the offset exceeds the tolerated skew, and logs each change.
    pub(super) fn judge_clock(
        &mut self,
        before: Duration,
        after: Duration,
        server: Duration,
    ) -> Option<FenceReason> {
        let half_rtt = after.saturating_sub(before) / 2;
        let offset = signed_secs(before + half_rtt, server);
        metrics::gauge!(m::CLOCK_OFFSET_SECONDS, "service" => self.name.to_string()).set(offset);
        let tolerated = self.settings.skew;
        let offset_ms = (offset * 1e4).round() / 10.0;
        // The estimate is off by up to half the round trip (a reply that
        // waited for a busy runtime makes `after` late). Fence only on an
        // offset beyond the skew whatever the error: a slow round must not
        // look like a bad clock.
        if offset.abs() - half_rtt.as_secs_f64() <= tolerated.as_secs_f64() {
            if self.clock_fenced {
                self.clock_fenced = false;
                info!(service = %self.name, instance = %self.id, offset_ms, "clock back within the tolerated skew");
            }
            return None;
        }
        if !self.clock_fenced {
            self.clock_fenced = true;
            error!(
                service = %self.name,
                instance = %self.id,
                offset_ms,
                ?tolerated,
                "clock offset against redis TIME exceeds the tolerated skew: fencing this instance until it is back within"
            );
        }
        Some(FenceReason::ClockSkew {
            offset_us: (offset * 1e6) as i64,
            tolerated,
        })
    }
}
