//! Every Redis key name of peerq, in one place (docs/design.md §3).
//!
//! Braces are literal Redis Cluster hash tags: the coordination keys of one
//! service (`{N}:…`) share one slot, and the keys of one partition
//! (`{N/p}:…`) share another, so every script touches keys of one slot only.

use crate::config::ServiceName;
use crate::partition::Shown;

/// The key of one indexer round: a counter (`Incr`) or a sorted set (`Ranked`).
pub(crate) fn round(name: &ServiceName, number: u64) -> String {
    format!("{{{name}}}:{number}")
}

/// Rendezvous: whether round `number`'s member list equals round
/// `number - 1`'s, compared once by its first reader.
pub(crate) fn round_same(name: &ServiceName, number: u64) -> String {
    format!("{{{name}}}:{number}:same")
}

/// `Incr` mode: who took which value from round `number`'s counter.
pub(crate) fn round_takers(name: &ServiceName, number: u64) -> String {
    format!("{{{name}}}:{number}:by")
}

/// The etcd endpoints the service's instances use when its membership is
/// on etcd (docs/design.md §2.2), JSON: written by each instance at start,
/// read by `peerq status`. Not in `{N}:meta`: one cluster can be reached
/// at other URLs from other places, and it changes with the cluster.
pub(crate) fn etcd(name: &ServiceName) -> String {
    format!("{{{name}}}:etcd")
}

/// The hash of service-wide settings, written on first use.
pub(crate) fn meta(name: &ServiceName) -> String {
    format!("{{{name}}}:meta")
}

/// The `SCAN` pattern of every service's `{N}:meta` key: how the admin
/// tools find the services on a Redis (never `KEYS`).
pub(crate) const META_PATTERN: &str = "{*}:meta";

/// The service whose `{N}:meta` key `key` is; `None` for any other key
/// (one [`META_PATTERN`] matches by accident, such as `{a}:b{c}:meta`).
pub(crate) fn service_of_meta(key: &str) -> Option<ServiceName> {
    let name = key.strip_prefix('{')?.strip_suffix("}:meta")?;
    ServiceName::new(name).ok()
}

/// The service's layout (docs/design.md §21): the current generation of
/// partitions, the one it replaces while a reshard runs, and its state.
pub(crate) fn layout(name: &ServiceName) -> String {
    format!("{{{name}}}:layout")
}

/// The hash of release marks: partition -> newest epoch it was released for.
pub(crate) fn transition(name: &ServiceName) -> String {
    format!("{{{name}}}:transition")
}

/// The hash of the service's running instances: instance id -> its JSON
/// record, written each round (docs/design.md §7).
pub(crate) fn members(name: &ServiceName) -> String {
    format!("{{{name}}}:members")
}

/// The hash of task counts of one Unix minute: `ok`, `failed`, `dead`,
/// `retried`.
pub(crate) fn stats(name: &ServiceName, minute: u64) -> String {
    format!("{{{name}}}:stats:{minute}")
}

/// The hash of each instance's last applied stats flush (instance id ->
/// sequence number), so a flush sent again is not counted twice.
pub(crate) fn stats_flushed(name: &ServiceName) -> String {
    format!("{{{name}}}:stats:flushed")
}

/// Present while the service is paused: JSON `{ "at_ms", "by" }`
/// (docs/design.md §7).
pub(crate) fn paused(name: &ServiceName) -> String {
    format!("{{{name}}}:paused")
}

/// The service's due index: partition -> the earliest due time (Unix ms,
/// Redis's clock) that a producer or an operator put into the partition's
/// delayed set since its owner last looked (docs/design.md §6). A key of
/// its own slot: never in a script with a partition's keys.
pub(crate) fn due(name: &ServiceName) -> String {
    format!("{{{name}}}:due")
}

/// The hash of periodic jobs: job name -> its JSON schedule.
pub(crate) fn periodic(name: &ServiceName) -> String {
    format!("{{{name}}}:periodic")
}

/// The service's task tracking (docs/design.md §14): a hash of `on`
/// (`1` or `0`), `keep_ms` and `keep_count`, which consumers create from
/// their builder's value and operators change on a running service.
pub(crate) fn tracking(name: &ServiceName) -> String {
    format!("{{{name}}}:tracking")
}

/// The service's flow limits (docs/design.md §15): a hash of `v` (always
/// `1`, so a cleared limit stays cleared), `rate` and `rate_per_key`
/// (`<count>/<per ms>`) and `per_key` (tasks of one key at once),
/// which consumers create from their builder's value and operators change
/// on a running service with `peerq limit`.
pub(crate) fn limits(name: &ServiceName) -> String {
    format!("{{{name}}}:limits")
}

/// The service-wide rate limit's state (docs/design.md §15): the GCRA's
/// theoretical arrival time, Unix µs by Redis's clock, from which instances
/// lease tokens (`rate.lua`); it expires once it holds no information.
pub(crate) fn rate(name: &ServiceName) -> String {
    format!("{{{name}}}:rate")
}

/// The units of concurrency of limit key `key` held across the service,
/// when the limits per key count by a function of the task (docs/design.md
/// §15): a hash of a field per instance holding units, `<count> <short>
/// <lapse ms>`; in the service's slot, so one script takes many keys'
/// units.
pub(crate) fn units(name: &ServiceName, key: &str) -> String {
    format!("{{{name}}}:units:{key}")
}

/// The rate per key of limit key `key`, when the limits per key count by a
/// function of the task (docs/design.md §15): a GCRA's theoretical arrival
/// time as [`rate`]'s, from which instances lease the key's tokens
/// (`task_keys.lua`); it expires once it holds no information.
pub(crate) fn key_rate(name: &ServiceName, key: &str) -> String {
    format!("{{{name}}}:rate:{key}")
}

/// The service's singletons (docs/design.md §20): a hash of `<name>`, the
/// holder's record `<token>:<instance id>`, and `<name>:since`, when it
/// was recorded (Redis time, ms), for each singleton ever held.
pub(crate) fn singletons(name: &ServiceName) -> String {
    format!("{{{name}}}:singletons")
}

/// The field of singleton `singleton`'s release mark in `{N}:transition`.
pub(crate) fn singleton_mark(singleton: &str) -> String {
    format!("singleton:{singleton}")
}

/// The channel the owners of a service's partitions hear user cancels on:
/// each message is a task handle, `<partition>/<task id>`.
pub(crate) fn cancels(name: &ServiceName) -> String {
    format!("{{{name}}}:cancels")
}

/// The consumer group of every partition stream.
pub(crate) const GROUP: &str = "peerq";

/// The stream of partition `p`. `{N/p}` is its own hash tag, so under Redis
/// Cluster the partitions spread over the slots.
pub(crate) fn stream(name: &ServiceName, p: u32) -> String {
    format!("{{{name}/{}}}:stream", Shown(p))
}

/// Present once partition `p` is sealed by a reshard (docs/design.md §21):
/// the new generation's number. Scripts that add entries find it.
pub(crate) fn sealed(name: &ServiceName, p: u32) -> String {
    format!("{{{name}/{}}}:sealed", Shown(p))
}

/// Present once sealed partition `p` is empty and retired
/// (docs/design.md §21); never removed.
pub(crate) fn retired(name: &ServiceName, p: u32) -> String {
    format!("{{{name}/{}}}:retired", Shown(p))
}

/// The dead letters moved into partition `p` by a reshard, by their
/// source reference (docs/design.md §21), so a move repeated after a crash
/// adds none twice; a week's expiry.
pub(crate) fn moved(name: &ServiceName, p: u32) -> String {
    format!("{{{name}/{}}}:moved", Shown(p))
}

/// The entries a batch (docs/design.md §19) could not add to its home
/// partition `p` once a reshard sealed it, by `<batch id> <task id>`: the
/// consumers send them to the layout in use (§21).
pub(crate) fn parked(name: &ServiceName, p: u32) -> String {
    format!("{{{name}/{}}}:parked", Shown(p))
}

/// The fencing record of partition `p`: `<epoch>:<instance id>`.
pub(crate) fn owner(name: &ServiceName, p: u32) -> String {
    format!("{{{name}/{}}}:owner", Shown(p))
}

/// The delayed entries of partition `p` (retries waiting for their
/// backoff), scored by due time in Redis milliseconds.
pub(crate) fn delayed(name: &ServiceName, p: u32) -> String {
    format!("{{{name}/{}}}:delayed", Shown(p))
}

/// The producer's record that an idempotency key was enqueued (in the
/// task's partition, so one script checks it and adds the entry).
pub(crate) fn dedup(name: &ServiceName, p: u32, key: &str) -> String {
    format!("{{{name}/{}}}:dedup:{key}", Shown(p))
}

/// The unique keys of partition `p` held by tasks not final yet, one hash:
/// unique key → `<where> <task id>`, where the task's entry is now
/// (`s:<stream id>` or `d:<due ms>`; docs/design.md §16).
pub(crate) fn unique(name: &ServiceName, p: u32) -> String {
    format!("{{{name}/{}}}:unique", Shown(p))
}

/// The latest due time of periodic job `job` that was triggered, in the
/// job's partition `p`.
pub(crate) fn cron(name: &ServiceName, p: u32, job: &str) -> String {
    format!("{{{name}/{}}}:cron:{job}", Shown(p))
}

/// Ordered partitions: the failed runs of partition `p`'s pending entries
/// that failed at least once (entry id → count), since an ordered entry is
/// retried in place and never rewritten (docs/design.md §6).
pub(crate) fn failures(name: &ServiceName, p: u32) -> String {
    format!("{{{name}/{}}}:failures", Shown(p))
}

/// The records of partition `p`'s tracked tasks, one hash: task id → its
/// record, MessagePack names and values (state, result, progress, …;
/// `tracking::packed`, docs/design.md §14).
pub(crate) fn tasks(name: &ServiceName, p: u32) -> String {
    format!("{{{name}/{}}}:tasks", Shown(p))
}

/// The tracked tasks of partition `p` that run: task id →
/// `instance|token|attempt|started_at` (docs/design.md §14), set for a
/// batch at its start and removed as each task moves or ends.
pub(crate) fn running(name: &ServiceName, p: u32) -> String {
    format!("{{{name}/{}}}:running", Shown(p))
}

/// The cancel requests of partition `p`'s tasks not yet final: task id
/// scored by the request's time (Unix ms). The scripts derive it from the
/// records' key (`track.lua`).
pub(crate) fn cancel_requests(name: &ServiceName, p: u32) -> String {
    format!("{{{name}/{}}}:cancel_requests", Shown(p))
}

/// The ids of partition `p`'s final tasks whose records are kept, oldest
/// first: how the records' count is bounded.
pub(crate) fn ended(name: &ServiceName, p: u32) -> String {
    format!("{{{name}/{}}}:ended", Shown(p))
}

/// When the ids of `ended` ended: `<end, Unix ms> <how many>`, one item per
/// script that ended tasks, in the same order: how the records' time is
/// bounded. The scripts name it after `ended` (`track.lua`).
pub(crate) fn ended_at(name: &ServiceName, p: u32) -> String {
    format!("{{{name}/{}}}:ended_at", Shown(p))
}

/// The channel that hears the id of each task of partition `p` that
/// became final (sharded on a Cluster: it lives in the partition's slot).
pub(crate) fn final_channel(name: &ServiceName, p: u32) -> String {
    format!("{{{name}/{}}}:final", Shown(p))
}

/// The dead letters of partition `p`.
pub(crate) fn dead(name: &ServiceName, p: u32) -> String {
    format!("{{{name}/{}}}:dead", Shown(p))
}

/// The completion records of partition `p`'s batch members (docs/design.md
/// §19): a stream, each entry a member's end (`b` batch id, `t` task id,
/// `s` state), written by the script that ends it and deleted once the
/// partition's owner forwarded it to the batch. The scripts name it after
/// the stream (`members.lua`).
pub(crate) fn completions(name: &ServiceName, p: u32) -> String {
    format!("{{{name}/{}}}:completions", Shown(p))
}

/// The record of batch `<h>/<uuid>` (docs/design.md §19), a hash in the
/// slot of its home partition `h`, where its callback is added.
pub(crate) fn batch(name: &ServiceName, h: u32, uuid: &str) -> String {
    format!("{{{name}/{}}}:batch:{uuid}", Shown(h))
}

/// The dead members of batch `<h>/<uuid>`: task id → 1, for its
/// callback's summary (a replayed one leaves).
pub(crate) fn batch_members(name: &ServiceName, h: u32, uuid: &str) -> String {
    format!("{{{name}/{}}}:batch:{uuid}:m", Shown(h))
}

/// The results of batch `<h>/<uuid>`'s members, when it wants them (a
/// flow's parent, a chain's next step): task id → the result's bytes.
pub(crate) fn batch_results(name: &ServiceName, h: u32, uuid: &str) -> String {
    format!("{{{name}/{}}}:batch:{uuid}:r", Shown(h))
}

/// The members a cancel of batch `<h>/<uuid>` cancels (a flow's children
/// and subflows, a chain's first step, a cancellable batch's members):
/// `t:<p>/<task id>` and `b:<batch id>` → 1.
pub(crate) fn batch_children(name: &ServiceName, h: u32, uuid: &str) -> String {
    format!("{{{name}/{}}}:batch:{uuid}:c", Shown(h))
}

/// One sequence of [`MajorityIds`](crate::ids::MajorityIds) on each of
/// its servers: the highest ID the server has taken, as a decimal string
/// (docs/design.md §13). Not a service key: the servers are independent,
/// so there is no slot to share.
pub(crate) fn ids(key: &str) -> String {
    format!("peerq:ids:{key}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_follow_the_design_layout() {
        let n = ServiceName::new("mail-sender").unwrap();
        assert_eq!(round(&n, 42), "{mail-sender}:42");
        assert_eq!(round_takers(&n, 42), "{mail-sender}:42:by");
        assert_eq!(meta(&n), "{mail-sender}:meta");
        assert_eq!(paused(&n), "{mail-sender}:paused");
        assert_eq!(due(&n), "{mail-sender}:due");
        assert_eq!(transition(&n), "{mail-sender}:transition");
        assert_eq!(stream(&n, 7), "{mail-sender/7}:stream");
        assert_eq!(owner(&n, 7), "{mail-sender/7}:owner");
        assert_eq!(dead(&n, 7), "{mail-sender/7}:dead");
        assert_eq!(delayed(&n, 7), "{mail-sender/7}:delayed");
        assert_eq!(failures(&n, 7), "{mail-sender/7}:failures");
        assert_eq!(dedup(&n, 7, "order-1"), "{mail-sender/7}:dedup:order-1");
        assert_eq!(tracking(&n), "{mail-sender}:tracking");
        assert_eq!(cancels(&n), "{mail-sender}:cancels");
        assert_eq!(tasks(&n, 7), "{mail-sender/7}:tasks");
        assert_eq!(ended(&n, 7), "{mail-sender/7}:ended");
        assert_eq!(ended_at(&n, 7), format!("{}_at", ended(&n, 7)));
        assert_eq!(running(&n, 7), "{mail-sender/7}:running");
        assert_eq!(cancel_requests(&n, 7), "{mail-sender/7}:cancel_requests");
        assert_eq!(final_channel(&n, 7), "{mail-sender/7}:final");
        assert_eq!(completions(&n, 7), "{mail-sender/7}:completions");
        assert_eq!(batch(&n, 7, "u"), "{mail-sender/7}:batch:u");
        assert_eq!(batch_members(&n, 7, "u"), "{mail-sender/7}:batch:u:m");
        assert_eq!(batch_results(&n, 7, "u"), "{mail-sender/7}:batch:u:r");
        assert_eq!(batch_children(&n, 7, "u"), "{mail-sender/7}:batch:u:c");
        // A later generation's unit (docs/design.md §21).
        let u = crate::partition::unit(2, 7);
        assert_eq!(stream(&n, u), "{mail-sender/2.7}:stream");
        assert_eq!(owner(&n, u), "{mail-sender/2.7}:owner");
    }

    #[test]
    fn a_meta_key_names_its_service_and_no_other_key_does() {
        let n = ServiceName::new("mail-sender").unwrap();
        assert_eq!(service_of_meta(&meta(&n)), Some(n.clone()));
        for other in [
            "{mail-sender}:members",
            "{mail-sender/3}:meta",
            "{a}:b{c}:meta",
            "mail-sender:meta",
            "{}:meta",
        ] {
            assert_eq!(service_of_meta(other), None, "{other}");
        }
    }

    #[test]
    fn service_keys_share_one_hash_tag() {
        let n = ServiceName::new("svc").unwrap();
        for k in [round(&n, 1), round_takers(&n, 1), meta(&n), transition(&n)] {
            assert!(k.starts_with("{svc}:"), "{k}");
        }
    }
}
