//! A network cut of the master from its replicas and sentinels, on a split
//! set (`SentinelOptions::split`: the master in a network namespace of its
//! own, the others in another, the test in the root one reaching both).
//! peerq's connections to the old master stay up through the cut: it goes
//! on taking the writes it is sent, until the sentinels, once the cut
//! heals, make it a replica of the master they promoted meanwhile, and it
//! throws away everything it took since the cut.
//!
//! Each run: two consumers and a producer (one enqueue at a time, under
//! idempotency keys) of a fresh service; the cut once tasks run, kept
//! until the sentinels have promoted a replica and find the old master
//! down, and two seconds more; the heal; two seconds more of tasks.
//! "Discarded" counts the enqueues that returned success and of which the
//! final master has no record (their idempotency key's): what the cut-off
//! old master confirmed and then dropped. "Never ran" counts the enqueues
//! that returned success whose task never ran (a task the old master both
//! confirmed and handed out ran, and is not among them).

use std::time::Instant;

use deadpool_redis::redis;
use support::{MinReplicas, SentinelOptions};

use super::*;
use crate::flow::{Enqueue, Flow, dedup_records};

/// How long the cut lasts once the sentinels promoted a replica and find
/// the old master down.
const HOLD: Duration = Duration::from_secs(2);
/// `min-replicas-to-write 1` with a small lag (Redis counts it in whole
/// seconds): a master refuses writes once no replica acknowledged its
/// stream for more than 2 s. Not 1 s: replicas acknowledge once a second,
/// and on two loaded cores a late one made the master refuse writes with
/// nothing cut.
const ONE_REPLICA_WITHIN_2S: MinReplicas = MinReplicas {
    to_write: 1,
    max_lag_secs: 2,
};

/// What a run through a cut counted, and when things happened.
struct CutRun {
    /// Each enqueue, by seq.
    enqueues: Vec<Enqueue>,
    /// Confirmed enqueues of which the final master has no record.
    discarded: Vec<u64>,
    /// Confirmed enqueues whose task never ran.
    never_ran: Vec<u64>,
    /// Tasks that ran more than once.
    twice: Vec<u64>,
    /// Each task's first run.
    first_run: Vec<Option<Instant>>,
    cut: Instant,
    /// When the sentinels had promoted a replica.
    promoted: Instant,
    /// When the cut was healed.
    healed: Instant,
    /// When the old master was a synced replica of the new one, after
    /// the heal.
    settled: Instant,
    /// How far the old master's replication offset moved while cut off:
    /// the bytes of the writes it took then (all thrown away).
    old_master_took: u64,
    /// What the old master answered a write of the test's own, at the end
    /// of the cut.
    probe: Result<(), String>,
}

impl CutRun {
    /// The counts, and a few seqs of each kind, for a failed assertion.
    fn summary(&self) -> String {
        let few = |seqs: &[u64]| seqs.iter().take(10).copied().collect::<Vec<_>>();
        format!(
            "{} enqueued; {} discarded {:?}…, {} never ran {:?}…, {} ran twice {:?}…",
            self.enqueues.len(),
            self.discarded.len(),
            few(&self.discarded),
            self.never_ran.len(),
            few(&self.never_ran),
            self.twice.len(),
            few(&self.twice),
        )
    }

    /// Seconds from the cut to `at` (negative before it), for messages.
    fn since_cut(&self, at: Instant) -> f64 {
        match at.checked_duration_since(self.cut) {
            Some(d) => d.as_secs_f64(),
            None => -(self.cut - at).as_secs_f64(),
        }
    }

    /// The tasks run twice whose first run started outside `from..until`.
    fn twice_outside(&self, from: Instant, until: Instant) -> Vec<(u64, f64)> {
        self.twice
            .iter()
            .filter_map(|seq| {
                let first = self.first_run[*seq as usize]?;
                (first < from || first > until).then(|| (*seq, self.since_cut(first)))
            })
            .collect()
    }
}

/// `INFO replication`'s `master_repl_offset` of the server on `port`.
fn repl_offset(set: &SentinelSet, port: u16) -> u64 {
    let info: String = set
        .query_server(port, redis::cmd("INFO").arg("replication"))
        .expect("INFO replication of the old master");
    info.lines()
        .find_map(|line| line.strip_prefix("master_repl_offset:"))
        .and_then(|n| n.trim().parse().ok())
        .expect("a master_repl_offset")
}

/// Runs the tasks through a cut of the master, on a split set with
/// `min_replicas` on its servers, every part waiting for `wait` replicas.
/// Asserts that the cut happened: the sentinels promoted another server
/// and found the old master down while it answered the test as a master
/// and took writes, and it ended a replica of the new master.
async fn through_a_cut(
    prefix: &str,
    wait: Option<u32>,
    min_replicas: Option<MinReplicas>,
) -> CutRun {
    let set = tokio::task::block_in_place(|| {
        SentinelSet::start_with(SentinelOptions {
            split: true,
            min_replicas,
            ..SentinelOptions::default()
        })
    });
    let name = unique_name(prefix);
    let Flow {
        record,
        instances,
        stop,
        enqueues: flowing,
    } = Flow::start(|| redis(&set, wait), &name).await;
    let old = set.master_port();
    let (took, probe, cut, promoted, healed) = tokio::task::block_in_place(|| {
        let before = repl_offset(&set, old);
        let cut = Instant::now();
        set.cut_master();
        let promoted = Instant::now();
        // A real cut: every sentinel finds the old master down (once it
        // has not answered them for their down-after time on the link they
        // made to it as a replica when they switched)...
        let deadline = Instant::now() + Duration::from_secs(15);
        while !set.sentinels_find_down(old) {
            assert!(
                Instant::now() < deadline,
                "a sentinel reaches the old master: no cut\n{}",
                set.state()
            );
            std::thread::sleep(50 * MS);
        }
        std::thread::sleep(HOLD);
        let probe = set
            .query_server::<()>(old, redis::cmd("SET").arg("probe").arg(1))
            .map_err(|e| e.to_string());
        // ... while it answers the test, as a master.
        assert_eq!(
            set.role(old).map(|(role, _)| role).as_deref(),
            Some("master"),
            "the old master was demoted while cut off"
        );
        let took = repl_offset(&set, old) - before;
        (took, probe, cut, promoted, Instant::now())
    });
    let new = tokio::task::block_in_place(|| set.heal());
    let settled = Instant::now();
    assert_ne!(old, new, "the sentinels promoted no other server");
    assert_eq!(
        set.role(old),
        Some(("slave".to_owned(), Some(new))),
        "the old master is not a replica of the new one"
    );
    // Tasks enqueued after the heal run too: every part found the master.
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.cancel();
    let enqueues = flowing.await.unwrap();
    let enqueued = enqueues.len() as u64;
    wait_ran(&record, &instances, enqueued, STALL).await;
    for instance in instances {
        instance.shutdown().await;
    }
    let last = set.master_port();
    let recorded = tokio::task::block_in_place(|| dedup_records(&set, last, &name));
    let discarded = (0..enqueued).filter(|seq| !recorded.contains(seq));
    let (never_ran, twice) = record.tally(enqueued);
    let per_seq = record.per_seq();
    let run = CutRun {
        discarded: discarded.collect(),
        never_ran,
        twice,
        first_run: (0..enqueued)
            .map(|seq| per_seq.get(&seq).map(|runs| runs[0]))
            .collect(),
        enqueues,
        cut,
        promoted,
        healed,
        settled,
        old_master_took: took,
        probe,
    };
    let cut_window = run
        .enqueues
        .iter()
        .filter(|e| e.confirmed >= cut && e.confirmed <= settled)
        .count();
    eprintln!(
        "{prefix}, wait_for_replicas {wait:?}, {min_replicas:?}: {enqueued} enqueued, \
         {} confirmed from the cut to the heal's end; promoted after {:.1} s, settled {:.1} s \
         after; the old master took {} bytes cut off and answered a write {:?}; \
         {} discarded {:?} (confirmed {:?} s after the cut), {} never ran {:?}, {} ran twice",
        cut_window,
        run.since_cut(run.promoted),
        run.since_cut(run.settled),
        run.old_master_took,
        run.probe,
        run.discarded.len(),
        first_last(&run.discarded),
        first_last(&run.discarded).map(|(first, last)| {
            let at = |seq: u64| run.since_cut(run.enqueues[seq as usize].confirmed);
            (at(first), at(last))
        }),
        run.never_ran.len(),
        first_last(&run.never_ran),
        run.twice.len(),
    );
    assert!(
        run.old_master_took > 1000,
        "the old master took {took} bytes of writes while cut off: no cut, or no writes"
    );
    run
}

/// The first and last of `seqs`, for a message.
fn first_last(seqs: &[u64]) -> Option<(u64, u64)> {
    Some((*seqs.first()?, *seqs.last()?))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_cut_off_loses_no_task_when_writes_wait_for_every_replica() {
    let run = through_a_cut("sentinel-cut", Some(EVERY_REPLICA), None).await;
    // The old master took the writes (an enqueue, a read, an ack) but
    // never confirmed one: no replica acknowledged it. The producer sent
    // each again, under its idempotency key, until the new master took it.
    assert!(run.discarded.is_empty(), "{}", run.summary());
    assert!(run.never_ran.is_empty(), "{}", run.summary());
    // Exactly once holds away from the failover: a task runs twice only if
    // it was handed out or acked around the cut (on the old master, which
    // then dropped the ack or the read) or enqueued while it lasted.
    let from = run.cut - Duration::from_secs(1);
    let until = run.settled + Duration::from_secs(1);
    let outside = run.twice_outside(from, until);
    assert!(
        outside.is_empty(),
        "tasks ran twice whose first run was away from the cut (seq, s after the cut): \
         {outside:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_cut_off_without_waiting_for_replicas_is_measured() {
    let run = through_a_cut("sentinel-cut-nowait", None, None).await;
    // Nothing stops the old master: it confirms every enqueue it gets from
    // the cut until its demotion, after the heal, and drops them all.
    assert!(run.probe.is_ok(), "{:?}", run.probe);
    assert!(
        !run.discarded.is_empty(),
        "the old master confirmed no enqueue it then dropped: {}",
        run.summary()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_cut_off_with_min_replicas_to_write_loses_only_the_lag_window() {
    let run = through_a_cut("sentinel-cut-minrep", None, Some(ONE_REPLICA_WITHIN_2S)).await;
    // Once its replicas' last acknowledgement is older than the lag, the
    // old master refuses writes (`NOREPLICAS`), and peerq asks the
    // sentinels for the master again.
    let refused = run.probe.as_ref().err();
    assert!(
        refused.is_some_and(|e| e.contains("NOREPLICAS")),
        "the old master took a write at the end of the cut: {:?}",
        run.probe
    );
    // What it confirmed before then is lost, and only that: the producer
    // sends one enqueue at a time, so an enqueue confirmed after its
    // first refusal went to the new master.
    let (seq, (at, why)) = run
        .enqueues
        .iter()
        .enumerate()
        .find_map(|(seq, e)| Some((seq as u64, e.failed.clone()?)).filter(|(_, f)| f.0 > run.cut))
        .expect("no enqueue failed after the cut");
    assert!(why.contains("NOREPLICAS"), "the first refusal: {why}");
    let late: Vec<&u64> = run.discarded.iter().filter(|s| **s >= seq).collect();
    assert!(
        late.is_empty(),
        "discarded enqueues after the first refusal (seq {seq}): {late:?}"
    );
    // And it refused them cut off, not only once demoted: the window is
    // the lag, plus up to a second in which the master notices (it counts
    // its good replicas once a second), on two cores that other work may
    // load.
    let window = at - run.cut;
    assert!(
        at < run.healed,
        "the old master took writes until the heal ({window:?} after the cut)"
    );
    eprintln!("the old master refused writes {window:?} after the cut: {why}");
}
