//! Why a partition stopped on a consumer and started there again, told
//! from what that consumer printed about itself.
//!
//! Kept partitions never pause, but an instance stops a partition and may
//! later acquire it anew when:
//!
//! - it fences itself (the design's rules 5 and 6): a round without an
//!   assignment (failed, late, not counted, clock beyond the skew), a lease
//!   that lapsed before the next assignment arrived, an assignment that
//!   arrived after its own lease, a skipped epoch, or a leave at once. Each
//!   is logged (`fencing every partition`, `assignment arrived after its
//!   lease`) before the partitions stop;
//! - Redis refused one of its writes on that partition (rule 8), logged with
//!   the partition and the worker's fencing token before it stops;
//! - an assignment moved the partition away and a later one gave it back,
//!   and the instance it moved to never printed that it started it (it was
//!   killed first, or the move was undone before its acquire completed): the
//!   standing it printed right after the stop does not own the partition;
//! - it left (then it never starts anything again).
//!
//! Anything else is a kept partition that paused: a bug.

use std::collections::BTreeMap;

/// A line a consumer printed about itself: its log (stderr) or its standing
/// and partition events (stdout), with the time, in microseconds since the
/// Unix epoch.
#[derive(Debug, Clone)]
pub(crate) struct Note {
    pub(crate) consumer: usize,
    pub(crate) at: u128,
    pub(crate) text: String,
}

/// The time a log line starts with (tracing's RFC 3339 stamp; the consumers
/// run with `NO_COLOR`, so it is the first word).
pub(crate) fn log_time(line: &str) -> Option<u128> {
    let stamp = line.split_whitespace().next()?;
    let t = chrono::DateTime::parse_from_rfc3339(stamp).ok()?;
    u128::try_from(t.timestamp_micros()).ok()
}

/// The value of `key=value` in a line (the first such word).
pub(crate) fn field<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    text.split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
}

fn number(text: &str, key: &str) -> Option<u64> {
    field(text, key)?.trim_matches('"').parse().ok()
}

/// What explains that partition `p`, started on a consumer at `started`
/// with fencing token `token`, stopped there at `stopped`: `notes` are that
/// consumer's. `None` if nothing does.
pub(crate) fn cause(
    notes: &[&Note],
    p: u32,
    token: u64,
    started: u128,
    stopped: u128,
) -> Option<&'static str> {
    // A fence or a refusal is logged before the partition stops, and
    // after it started (the stop is what it caused).
    for n in notes.iter().filter(|n| started <= n.at && n.at <= stopped) {
        let t = n.text.as_str();
        if t.contains("fencing every partition") {
            return Some(if t.contains("the lease expired") {
                "lapsed lease"
            } else if t.contains("no assignment for epoch") {
                "round without an assignment"
            } else if t.contains("an epoch was skipped") {
                "skipped epoch"
            } else if t.contains("leaving at once") {
                "leave at once"
            } else {
                "other fence"
            });
        }
        if t.contains("assignment arrived after its lease") {
            return Some("assignment after its lease");
        }
        if t.contains("fenced: another instance owns the partition now")
            && number(t, "partition") == Some(u64::from(p))
            && number(t, "token") == Some(token)
        {
            return Some("refused write");
        }
    }
    // Released by an assignment or a leave: the consumer prints that
    // standing once it has acted on it, so it is the next one after the
    // stop.
    let next = notes
        .iter()
        .filter(|n| n.text.starts_with("standing ") && n.at >= stopped)
        .min_by_key(|n| n.at)?;
    match field(&next.text, "kind")? {
        "assigned" => {
            let index = number(&next.text, "index")?;
            let replicas = number(&next.text, "replicas")?;
            (u64::from(p) % replicas + 1 != index).then_some("moved away and back")
        }
        "left" => Some("leave"),
        _ => None,
    }
}

/// What the consumers printed about partition `p` from `from` to `to`, and
/// everything consumer `consumer` printed then that names no other
/// partition: what a failure shows.
pub(crate) fn around(notes: &[Note], consumer: usize, p: u32, from: u128, to: u128) -> String {
    let mut shown: BTreeMap<(u128, usize), Vec<&str>> = BTreeMap::new();
    for n in notes.iter().filter(|n| from <= n.at && n.at <= to) {
        let partition = number(&n.text, "partition");
        let about_p = partition == Some(u64::from(p));
        if about_p || (n.consumer == consumer && partition.is_none()) {
            shown.entry((n.at, n.consumer)).or_default().push(&n.text);
        }
    }
    let mut out = String::new();
    for ((at, c), texts) in shown {
        for text in texts {
            out.push_str(&format!("  c{c} at={at}: {text}\n"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn note(at: u128, text: &str) -> Note {
        Note {
            consumer: 4,
            at,
            text: text.to_owned(),
        }
    }

    const LAPSE: &str = "2026-11-23T10:53:21.535586Z  WARN peerq::consumer::handover: fencing every partition service=t-crash-b12183d9 why=\"the lease expired before a new assignment arrived\"";

    #[test]
    fn a_log_line_has_its_time() {
        assert_eq!(log_time(LAPSE), Some(1_795_431_201_535_586));
        assert_eq!(log_time("thread 'main' panicked"), None);
    }

    #[test]
    fn each_cause_is_told_from_the_consumer_lines_and_nothing_else_is() {
        let lapse = note(1_795_431_201_535_586, LAPSE);
        let kept = note(
            5_000,
            "standing kind=assigned epoch=7 index=3 replicas=4 at=5000",
        );
        let moved = note(
            5_000,
            "standing kind=assigned epoch=7 index=2 replicas=3 at=5000",
        );
        let refused = note(
            3_000,
            "2026-11-23T10:53:21.535586Z ERROR peerq::consumer::worker: fenced: another instance owns the partition now; dropping its work partition=2 token=6 what=\"acking\"",
        );
        // The lapse lies inside the stretch.
        assert_eq!(
            cause(
                &[&lapse],
                2,
                6,
                1_795_431_200_000_000,
                1_795_431_201_600_000
            ),
            Some("lapsed lease")
        );
        // Not when it came after the stop.
        assert_eq!(cause(&[&lapse, &kept], 2, 6, 1_000, 4_000), None);
        assert_eq!(
            cause(&[&refused, &kept], 2, 6, 1_000, 4_000),
            Some("refused write")
        );
        assert_eq!(
            cause(&[&refused, &kept], 2, 5, 1_000, 4_000),
            None,
            "another token"
        );
        assert_eq!(
            cause(&[&refused, &kept], 10, 6, 1_000, 4_000),
            None,
            "another partition"
        );
        // Index 3 of 4 owns partition 2; index 2 of 3 does not.
        assert_eq!(cause(&[&kept], 2, 6, 1_000, 4_000), None);
        assert_eq!(
            cause(&[&moved], 2, 6, 1_000, 4_000),
            Some("moved away and back")
        );
    }
}
