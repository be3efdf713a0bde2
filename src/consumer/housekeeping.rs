//! A worker's housekeeping, apart from its fetch loop: keep the entries it
//! runs fresh, move due delayed entries into the stream, trim what was
//! acknowledged.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::held::Held;
use super::ownership::Ownership;
use super::shared::Shared;
use super::store::Sizes;

/// How often the owner trims acknowledged entries from its partitions.
const TRIM_EVERY: Duration = Duration::from_secs(1);
/// How often the owner reads its partitions' sizes for the queue gauges, at
/// the least (and at least once per round interval).
const SIZES_EVERY: Duration = Duration::from_secs(1);
/// How often the owner looks for due delayed entries at the least.
const PROMOTE_EVERY: Duration = Duration::from_secs(1);
/// Most delayed entries moved in one script call.
const PROMOTE_BATCH: usize = 500;
/// Most entry ids kept fresh in one script call (Lua's `unpack` has a limit
/// of about 8,000 values).
const KEEP_CHUNK: usize = 1000;

/// The worker's housekeeping, apart from the fetch loop (which may wait for
/// room or block in a read for long), once the partition is acquired:
///
/// - resets the idle time of every entry this instance holds in the
///   partition, so that claiming never takes one that is still here; until
///   the worker's last task is done, drain included;
/// - trims the partition's acknowledged entries while it owns it, also when
///   the instance is too busy to read;
/// - reads the partition's sizes for the queue gauges while it owns it;
/// - moves due delayed entries into the stream.
///
/// The sizes also say when trimming and promotion have nothing to do: an
/// empty stream is not trimmed and an empty delayed set not searched, so an
/// idle partition costs its sizes' four commands a second, not eleven
/// more. When the sizes cannot be read, both run as if there were work.
pub(super) async fn housekeeping(
    shared: Arc<Shared>,
    ownership: Arc<Ownership>,
    held: Held,
    acquired: CancellationToken,
    done: CancellationToken,
) {
    tokio::select! {
        _ = done.cancelled() => return,
        _ = acquired.cancelled() => {}
    }
    let stop = &ownership.stop;
    let partition = ownership.store.partition();
    // The gauges count only partitions this instance owns.
    let _forget = Forget(&shared, partition);
    let sizes_every = shared.interval.min(SIZES_EVERY);
    let mut next_sizes = Instant::now();
    let keep_every = shared.settings.claim_idle / 3;
    let mut next_keep = Instant::now() + keep_every;
    let mut next_trim = Instant::now() + TRIM_EVERY;
    // At once: retries the previous owner delayed may be due.
    let mut next_promote = Instant::now();
    // The last sizes read; `None` before the first or after a failed read.
    let mut sizes = None;
    // This worker delayed a retry since the last promotion.
    let mut woken = false;
    loop {
        let next = if stop.is_cancelled() {
            next_keep
        } else {
            next_keep.min(next_trim).min(next_promote).min(next_sizes)
        };
        tokio::select! {
            _ = done.cancelled() => return,
            _ = tokio::time::sleep_until(next) => {}
            _ = ownership.delayed.notified() => {
                next_promote = Instant::now();
                woken = true;
            }
        }
        let now = Instant::now();
        if now >= next_keep {
            keep_fresh(&ownership, &held).await;
            next_keep = now + keep_every;
        }
        if stop.is_cancelled() {
            shared.queue.set(partition, None);
            continue;
        }
        if now >= next_sizes {
            sizes = match ownership.store.sizes().await {
                Ok(read) => {
                    shared.queue.set(partition, Some(read));
                    Some(read)
                }
                Err(e) => {
                    debug!(partition, cause = %e, "cannot read the partition's sizes");
                    None
                }
            };
            next_sizes = now + sizes_every;
        }
        if now >= next_trim {
            if sizes.is_none_or(|s: Sizes| s.length > 0) {
                trim(&ownership).await;
            }
            next_trim = now + TRIM_EVERY;
        }
        if now >= next_promote {
            next_promote = if woken || sizes.is_none_or(|s: Sizes| s.delayed > 0) {
                woken = false;
                promote(&ownership).await
            } else {
                now + PROMOTE_EVERY
            };
        }
    }
}

/// Moves the partition's due delayed entries into its stream; returns when
/// to look again.
async fn promote(ownership: &Ownership) -> Instant {
    let now = Instant::now();
    match ownership.store.promote(PROMOTE_BATCH).await {
        // More were due than one call moves.
        Ok((moved, _)) if moved as usize >= PROMOTE_BATCH => now,
        Ok((moved, next)) => {
            if moved > 0 {
                debug!(
                    partition = ownership.store.partition(),
                    moved, "delayed entries due"
                );
            }
            // Entries may be delayed by others too (the previous owner):
            // look at least every PROMOTE_EVERY.
            now + next.unwrap_or(PROMOTE_EVERY).min(PROMOTE_EVERY)
        }
        Err(e) => {
            warn!(partition = ownership.store.partition(), cause = %e, "cannot move due delayed entries");
            now + PROMOTE_EVERY
        }
    }
}

/// Resets the idle time of every entry this worker holds, so nobody claims
/// them.
async fn keep_fresh(ownership: &Ownership, held: &Held) {
    let ids = held.ids();
    for chunk in ids.chunks(KEEP_CHUNK) {
        match ownership.store.keep(chunk).await {
            Ok(true) => {}
            Ok(false) => return ownership.fenced("keeping held entries fresh"),
            Err(e) => {
                let partition = ownership.store.partition();
                return warn!(partition, cause = %e, "could not keep held entries fresh");
            }
        }
    }
}

/// Trims the partition's acknowledged entries.
async fn trim(ownership: &Ownership) {
    let partition = ownership.store.partition();
    match ownership.store.trim().await {
        Ok(0) => {}
        Ok(n) => debug!(partition, trimmed = n, "trimmed acknowledged entries"),
        Err(e) => warn!(partition, cause = %e, "trim failed"),
    }
}

/// Takes a partition out of the queue gauges when its housekeeping ends.
struct Forget<'a>(&'a Shared, u32);

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        self.0.queue.set(self.1, None);
    }
}
