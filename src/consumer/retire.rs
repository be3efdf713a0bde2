//! A partition of the generation a reshard replaces (docs/design.md §21):
//! its owner seals it once its assignment's layout says so, drains it as
//! ever, moves its delayed tasks and dead letters to the new layout, and
//! retires it once nothing is left. A worker of the current generation
//! only waits here, on its assignment, for a reshard to begin.

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use deadpool_redis::redis::{self, Script};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::ownership::Ownership;
use super::shared::Shared;
use super::store::Retire;
use crate::assignment::Assignment;
use crate::error::Result;
use crate::keys;
use crate::partition::{Shown, generation_of};
use crate::reshard::{Generation, Layout};
use crate::timing::Timing;
use crate::tracking::watch::Watched;

/// How often a sealed partition looks whether it can retire.
const LOOK_EVERY: Duration = Duration::from_millis(200);
/// After a failed seal, retire or move.
const AGAIN_AFTER: Duration = Duration::from_secs(1);

/// Follows `ownership`'s partition through a reshard while it is owned,
/// from its acquire on (`acquired`: before, its owner record is another's).
pub(super) async fn follow(
    ownership: Arc<Ownership>,
    mut assignment: watch::Receiver<Assignment>,
    acquired: CancellationToken,
    tracking: Watched,
) {
    tokio::select! {
        _ = ownership.stop.cancelled() => return,
        _ = acquired.cancelled() => {}
    }
    let unit = ownership.store.partition();
    let Some((from, to)) = replaced(&ownership, &mut assignment, unit).await else {
        return;
    };
    let store = &ownership.store;
    let stop = ownership.stop.clone();
    let pause = |d| {
        let stop = stop.clone();
        async move {
            tokio::select! {
                _ = stop.cancelled() => false,
                _ = tokio::time::sleep(d) => true,
            }
        }
    };
    loop {
        // Sealed, then its periodic marks copied (a repeat is harmless).
        let sealed = match store.seal(to.number).await {
            Ok(true) => store.copy_marks(from, to).await.map(|()| true),
            other => other,
        };
        match sealed {
            Ok(true) => break,
            Ok(false) => return ownership.fenced("seal"),
            Err(e) => warn!(partition = %Shown(unit), cause = %e, "cannot seal the partition yet"),
        }
        if !pause(AGAIN_AFTER).await {
            return;
        }
    }
    info!(partition = %Shown(unit), generation = to.number, "sealed for the reshard; draining");
    loop {
        let wait = match store.retire(tracking.settings().kept_for()).await {
            Ok(Retire::Done) => {
                info!(partition = %Shown(unit), "retired: nothing is left in it");
                return;
            }
            Ok(Retire::Fenced) => return ownership.fenced("retire"),
            Ok(Retire::Busy) => LOOK_EVERY,
            Ok(Retire::Leftovers) => match store.move_out(from, to).await {
                Ok(_) => Duration::ZERO,
                Err(e) => {
                    warn!(partition = %Shown(unit), cause = %e, "cannot move delayed tasks or dead letters yet");
                    AGAIN_AFTER
                }
            },
            Err(e) => {
                warn!(partition = %Shown(unit), cause = %e, "cannot retire the partition yet");
                AGAIN_AFTER
            }
        };
        if !pause(wait).await {
            return;
        }
    }
}

/// Waits until the assignment's layout replaces `unit`'s generation:
/// `Some((from, to))`; `None` once the partition stops here first.
async fn replaced(
    ownership: &Ownership,
    assignment: &mut watch::Receiver<Assignment>,
    unit: u32,
) -> Option<(Generation, Generation)> {
    loop {
        let found = assignment.borrow_and_update().layout().and_then(|l| {
            l.from
                .filter(|f| f.number == generation_of(unit) && l.current.number > f.number)
                .map(|f| (f, l.current))
        });
        if found.is_some() {
            return found;
        }
        tokio::select! {
            _ = ownership.stop.cancelled() => return None,
            changed = assignment.changed() => changed.ok()?,
        }
    }
}

static OPEN: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../scripts/open.lua")));

/// How often the instance with index 1 looks at the old partitions'
/// retired records while a reshard drains.
const OPEN_LOOK_EVERY: Duration = Duration::from_millis(100);

/// The cut-over (docs/design.md §21), looked at by the instance with index
/// 1 while a reshard drains, every 100 ms for an interval from each
/// assignment on: once every partition of the generation `layout`
/// replaces is retired, opens the new one, live from the next round or
/// the one after (`open.lua`). Returns the open epoch when it opened it.
pub(super) async fn open_when_retired(
    shared: Arc<Shared>,
    layout: Layout,
    timing: Timing,
) -> Result<Option<u64>> {
    let Some(from) = layout.from else {
        return Ok(None);
    };
    let levels = shared.settings.levels().count();
    let mut pipe = redis::pipe();
    for u in from.units(levels) {
        pipe.cmd("EXISTS").arg(keys::retired(&shared.name, u));
    }
    let until = tokio::time::Instant::now() + timing.interval;
    loop {
        let retired: Vec<u8> = shared.conn.query_pipe(&pipe).await?;
        if !retired.contains(&0) {
            break;
        }
        if tokio::time::Instant::now() + OPEN_LOOK_EVERY > until {
            return Ok(None);
        }
        tokio::time::sleep(OPEN_LOOK_EVERY).await;
    }
    let mut script = OPEN.key(keys::layout(&shared.name));
    script
        .arg(layout.current.number)
        .arg(timing.interval.as_millis() as u64)
        .arg(timing.skew.as_millis() as u64);
    let open_epoch: u64 = shared.conn.invoke(&script).await?;
    if open_epoch > 0 {
        info!(service = %shared.name, generation = layout.current.number, open_epoch,
              "every partition of the old layout is retired; the new one is live from epoch {open_epoch}");
    }
    Ok((open_epoch > 0).then_some(open_epoch))
}
