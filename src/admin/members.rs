//! A service's running instances as they describe themselves in
//! `{N}:members` (the record `presence` writes each round).

use std::collections::HashMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::presence::GONE_AFTER_INTERVALS;

/// One instance of a service, from its `{N}:members` record (docs/design.md
/// §7), with how long ago it was seen. Its JSON: `id`, `host`, `pid`,
/// `version`, `started_at_ms`, `standing` (`joining`, `assigned`, `fenced`,
/// `leaving`, or `unreadable` for a record that does not parse), `index`,
/// `replicas`, `epoch` (null unless assigned), `owned`, `in_flight`,
/// `handled`, `aside`, `seen_at_ms`, `seen_ago_ms` and `live`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct Member {
    /// The instance id (`<host>-<pid>-<8 hex digits>`).
    pub id: String,
    /// The machine it runs on.
    pub host: String,
    /// Its process id.
    pub pid: u32,
    /// The peerq version it runs.
    pub version: String,
    /// When it started (its clock), Unix ms.
    pub started_at_ms: u64,
    /// How it stands: `joining`, `assigned`, `fenced` or `leaving`.
    pub standing: String,
    /// Its index, while assigned.
    pub index: Option<u32>,
    /// The instances of its assignment, while assigned.
    pub replicas: Option<u32>,
    /// Its assignment's epoch, while assigned.
    pub epoch: Option<u64>,
    /// Partitions it fetches.
    pub owned: u64,
    /// Handler runs in progress.
    pub in_flight: u64,
    /// Tasks it handled (acks that landed) since it started.
    pub handled: u64,
    /// Tasks it read and holds aside, waiting on a limit per key (0 from
    /// an instance of a version without limits per key).
    pub aside: u64,
    /// When it last wrote its record (its clock), Unix ms.
    pub seen_at_ms: u64,
    /// How long ago that was, by Redis's clock.
    #[serde(skip_deserializing)]
    pub seen_ago_ms: u64,
    /// Whether it was seen within three round intervals (the instances
    /// prune records older than that).
    #[serde(skip_deserializing)]
    pub live: bool,
}

/// The members of `records` (`{N}:members`: id -> JSON), sorted by index
/// then id, judged at `now_ms` with round interval `interval`.
pub(crate) fn members(
    records: HashMap<String, String>,
    now_ms: u64,
    interval: Duration,
) -> Vec<Member> {
    let gone_after = (interval * GONE_AFTER_INTERVALS).as_millis() as u64;
    let mut members: Vec<Member> = records
        .into_iter()
        .map(|(id, record)| {
            let mut member = serde_json::from_str(&record).unwrap_or_else(|_| Member {
                standing: "unreadable".to_owned(),
                ..Member::default()
            });
            member.id = id;
            member.seen_ago_ms = now_ms.saturating_sub(member.seen_at_ms);
            member.live = member.seen_ago_ms <= gone_after;
            member
        })
        .collect();
    members.sort_by(|a, b| {
        (a.index.is_none(), a.index, &a.id).cmp(&(b.index.is_none(), b.index, &b.id))
    });
    members
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_read_judged_and_sorted() {
        let record = |index: Option<u32>, seen: u64| {
            serde_json::json!({
                "host": "h", "pid": 7, "version": "0.1.0", "started_at_ms": 1,
                "standing": if index.is_some() { "assigned" } else { "joining" },
                "index": index, "replicas": index.map(|_| 2), "epoch": index.map(|_| 9),
                "owned": 4, "in_flight": 1, "handled": 10, "weight": 1, "seen_at_ms": seen,
                "a_field_of_a_later_version": true,
            })
            .to_string()
        };
        let records = HashMap::from([
            ("c".to_owned(), record(None, 10_000)),
            ("b".to_owned(), record(Some(2), 9_000)),
            ("a".to_owned(), record(Some(1), 1_000)),
            ("z".to_owned(), "not json".to_owned()),
        ]);
        let members = members(records, 10_000, Duration::from_secs(1));
        let ids: Vec<&str> = members.iter().map(|m| m.id.as_str()).collect();
        assert_eq!(ids, ["a", "b", "c", "z"], "by index, then the unassigned");
        assert_eq!((members[0].seen_ago_ms, members[0].live), (9_000, false));
        assert_eq!((members[1].seen_ago_ms, members[1].live), (1_000, true));
        assert_eq!(
            (members[1].index, members[1].replicas, members[1].epoch),
            (Some(2), Some(2), Some(9))
        );
        assert_eq!(members[1].handled, 10);
        assert_eq!(members[3].standing, "unreadable");
    }
}
