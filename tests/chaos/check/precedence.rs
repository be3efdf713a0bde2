//! What must come before what: no effect checked after a newer owner of
//! its partition started, a key's tasks in their order, a batch's callback
//! after its members.

use std::collections::HashMap;

use super::{Effect, History};
use crate::plan::Kind;
use crate::report::Report;

/// Effects whose `still_owned()` check passed after a newer owner of the
/// partition had started: only a freeze between check and effect allows it.
pub(super) fn stale_effects(h: &History, r: &mut Report) {
    let all = h
        .effects
        .values()
        .flatten()
        .chain(h.ticks.values().flatten());
    for e in all {
        if h.stale(e) {
            if h.frozen_in_window(e) {
                r.stale_explained += 1;
            } else {
                r.stale.push(format!(
                    "{} made an effect of task {} on partition {} with token {} at {}, checked at {}, after a newer owner started",
                    h.labels[e.proc as usize], e.run.n, e.run.partition, e.run.token, e.run.at, e.run.checked
                ));
            }
        }
    }
}

/// Per key of the ordered service: the first runs in sequence order, and
/// no run of a lower sequence after a higher one but a frozen process's.
pub(super) fn order(h: &History, r: &mut Report) {
    let mut keys: HashMap<u32, Vec<(u64, Effect)>> = HashMap::new();
    for (n, &(_, kind)) in &h.enqueued {
        if let Kind::Ordered { key, seq } = kind {
            for e in h.effects.get(n).into_iter().flatten() {
                keys.entry(key).or_default().push((seq, *e));
            }
        }
    }
    for (key, mut runs) in keys {
        runs.sort_by_key(|(_, e)| e.run.at);
        r.ordered_keys += 1;
        let mut highest = 0;
        for (seq, e) in runs {
            if seq < highest {
                if h.frozen_in_window(&e) {
                    r.order_explained += 1;
                } else {
                    r.order.push(format!(
                        "key {key}: seq {seq} ran at {} after seq {highest}",
                        e.run.at
                    ));
                }
            } else if seq > highest + 1 {
                r.order.push(format!(
                    "key {key}: seq {seq} ran first at {} before seq {}",
                    e.run.at,
                    highest + 1
                ));
            }
            highest = highest.max(seq);
        }
    }
}

/// Each sealed batch's callback ran after all its members' first runs.
pub(super) fn batches(h: &History, r: &mut Report) {
    let mut members: HashMap<u64, u64> = HashMap::new();
    let mut callbacks: HashMap<u64, u64> = HashMap::new();
    for (n, &(_, kind)) in &h.enqueued {
        let first = || h.effects.get(n)?.iter().map(|e| e.run.at).min();
        match kind {
            Kind::Member { batch } => {
                let at = first().unwrap_or(u64::MAX);
                let last = members.entry(batch).or_default();
                *last = (*last).max(at);
            }
            Kind::Callback { batch } => {
                if let Some(at) = first() {
                    callbacks.insert(batch, at);
                }
            }
            _ => {}
        }
    }
    for batch in &h.sealed {
        r.batches += 1;
        if let (Some(cb), Some(last)) = (callbacks.get(batch), members.get(batch))
            && cb < last
        {
            r.early.push(format!(
                "batch {batch}: its callback ran at {cb}, before its last member at {last}"
            ));
        }
    }
}
