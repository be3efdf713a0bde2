//! 1,000 peer indexers on one Redis (issue 22): how long until each holds
//! a distinct index, whether they hold still, what Redis spends meanwhile,
//! and how many intervals 100 leaving and 100 joining at once take.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use peerq::assignment::Standing;
use peerq::indexer::{Indexer, IndexerHandle};
use peerq::{Assignor, Indexing};

use crate::redis_load;
use support::{RedisServer, unique_name};

const INTERVAL: Duration = Duration::from_secs(1);
/// Intervals of stability watched.
const STABLE_INTERVALS: u64 = 30;
/// Indexers started at once.
const START_BATCH: usize = 50;
/// How many leave and how many join in the churn.
const CHURN: usize = 100;

/// One running indexer and every standing it published, with when.
struct Member {
    handle: IndexerHandle,
    log: Arc<Mutex<Vec<(Instant, Standing)>>>,
}

impl Member {
    async fn start(server: &RedisServer, name: &str, assignor: Assignor) -> Member {
        let handle = Indexer::builder()
            .name(name)
            .redis(server.url())
            .interval(INTERVAL)
            .indexing(Indexing::Ranked)
            .assignor(assignor)
            .build()
            .unwrap()
            .start()
            .await
            .unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let mut standing = handle.standing();
        let record = log.clone();
        tokio::spawn(async move {
            while standing.changed().await.is_ok() {
                let now = standing.borrow_and_update().clone();
                record.lock().unwrap().push((Instant::now(), now));
            }
        });
        Member { handle, log }
    }

    /// `(index, replicas, when)` per epoch it was assigned in.
    fn assigned(&self) -> HashMap<u64, (u32, u32, Instant)> {
        let log = self.log.lock().unwrap();
        log.iter()
            .filter_map(|(at, s)| match s {
                Standing::Assigned(a) => Some((a.epoch, (a.index, a.replicas, *at))),
                _ => None,
            })
            .collect()
    }

    /// Fences published after `since`, by reason (their text without
    /// figures).
    fn fences_since(&self, since: Instant, reasons: &mut HashMap<String, usize>) -> usize {
        let log = self.log.lock().unwrap();
        let mut n = 0;
        for (at, s) in log.iter().filter(|(at, _)| *at >= since) {
            if let Standing::Fenced { reason, .. } = s {
                let _ = at;
                let text = reason.to_string();
                let kind: String = text.split(':').next().unwrap_or("").to_owned();
                *reasons.entry(kind).or_default() += 1;
                n += 1;
            }
        }
        n
    }

    fn latest_epoch(&self) -> Option<u64> {
        self.assigned().keys().max().copied()
    }
}

/// Starts `n` members, `START_BATCH` at a time.
async fn start_many(server: &RedisServer, name: &str, assignor: Assignor, n: usize) -> Vec<Member> {
    let mut members = Vec::with_capacity(n);
    while members.len() < n {
        let batch = START_BATCH.min(n - members.len());
        members.extend(join_all((0..batch).map(|_| Member::start(server, name, assignor))).await);
    }
    members
}

/// The first epoch from `from` in which every one of `members` is assigned
/// with `replicas = members.len()` and a distinct index, and when the last
/// of them learned it; waits up to `within`.
async fn settled(members: &[Member], from: u64, within: Duration) -> Option<(u64, Instant)> {
    let deadline = Instant::now() + within;
    let n = members.len() as u32;
    while Instant::now() < deadline {
        tokio::time::sleep(INTERVAL / 4).await;
        let logs: Vec<_> = members.iter().map(Member::assigned).collect();
        let mut epochs: BTreeSet<u64> = BTreeSet::new();
        for log in &logs {
            epochs.extend(log.keys().filter(|e| **e >= from));
        }
        'epoch: for epoch in epochs {
            let mut indices = BTreeSet::new();
            let mut last = None::<Instant>;
            for log in &logs {
                match log.get(&epoch) {
                    Some((index, replicas, at)) if *replicas == n && indices.insert(*index) => {
                        last = Some(last.map_or(*at, |l| l.max(*at)));
                    }
                    _ => continue 'epoch,
                }
            }
            if indices.len() as u32 == n && indices.iter().next_back() == Some(&n) {
                return last.map(|at| (epoch, at));
            }
        }
    }
    None
}

/// Index changes between consecutive epochs in `from..=to`, over members.
fn index_changes(members: &[Member], from: u64, to: u64) -> (usize, usize) {
    let (mut changes, mut missing) = (0, 0);
    for m in members {
        let log = m.assigned();
        for e in from + 1..=to {
            match (log.get(&(e - 1)), log.get(&e)) {
                (Some(a), Some(b)) if a.0 != b.0 => changes += 1,
                (Some(_), Some(_)) => {}
                _ => missing += 1,
            }
        }
    }
    (changes, missing)
}

pub(crate) async fn run(server: &RedisServer, n: usize, assignor: Assignor) {
    let name = unique_name("scale-indexers");
    println!("\n## {n} indexers, Ranked, {assignor}, I = 1 s\n");
    let t0 = Instant::now();
    let mut members = start_many(server, &name, assignor, n).await;
    let all_started = t0.elapsed();
    let (epoch, at) = settled(&members, 0, Duration::from_secs(120))
        .await
        .expect("the indexers never settled");
    println!("| step | figure |\n|---|---|");
    println!(
        "| start {n} ({START_BATCH} at a time) | {:.1} s |",
        all_started.as_secs_f64()
    );
    println!(
        "| until every one holds a distinct index in 1..={n} | {:.1} s after the first start (epoch {epoch}) |",
        (at - t0).as_secs_f64()
    );
    // Stability, and Redis's load meanwhile.
    let watch_from = Instant::now();
    let before = redis_load::read(server).await;
    tokio::time::sleep(INTERVAL * STABLE_INTERVALS as u32 + INTERVAL).await;
    let load = redis_load::since(server, &before).await;
    let (changes, missing) = index_changes(&members, epoch, epoch + STABLE_INTERVALS);
    let mut reasons = HashMap::new();
    let fences: usize = members
        .iter()
        .map(|m| m.fences_since(watch_from, &mut reasons))
        .sum();
    println!(
        "| {STABLE_INTERVALS} intervals after that | {changes} index changes, {missing} instance-epochs without an assignment, {fences} fences {reasons:?} |"
    );
    println!(
        "| Redis while stable | {:.0} commands/s, CPU {:.1} % of a core, {} connections |",
        load.commands_per_sec, load.cpu_percent, load.clients
    );
    // Churn: the first CHURN leave gracefully while CHURN new ones join.
    let churn_epoch = members[0].latest_epoch().unwrap();
    let leaving: Vec<Member> = members.drain(..CHURN.min(members.len())).collect();
    let churn_at = Instant::now();
    for m in &leaving {
        m.handle.leave();
    }
    let joined = start_many(server, &name, assignor, CHURN).await;
    members.extend(joined);
    let (settled_epoch, settled_at) = settled(&members, churn_epoch + 1, Duration::from_secs(120))
        .await
        .expect("the indexers never settled after the churn");
    let left = join_all(leaving.into_iter().map(|m| m.handle.finished()));
    tokio::time::timeout(Duration::from_secs(30), left)
        .await
        .expect("the leaving indexers did not finish");
    println!(
        "| {CHURN} leave and {CHURN} join at once | settled in epoch {settled_epoch}, {} intervals after the churn's epoch; {:.1} s after it began |",
        settled_epoch - churn_epoch,
        (settled_at - churn_at).as_secs_f64()
    );
    let stayers_from = settled_epoch;
    tokio::time::sleep(INTERVAL * 3).await;
    let (changes, missing) = index_changes(&members, stayers_from, stayers_from + 2);
    println!("| 2 intervals after that | {changes} index changes, {missing} missing |");
    join_all(members.into_iter().map(|m| m.handle.stop())).await;
}
