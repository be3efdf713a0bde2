//! The faults: chosen at random from the plan's seed, one every
//! `fault_every` on average, several under way at once (each on its own
//! target), each written to the history (`K kind target start end`) when
//! it ends. The first nine are one of each kind, so a short run has them
//! all.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use peerq::DeadLetters;
use peerq::admin::Service;
use rand::rngs::StdRng;
use rand::seq::{IndexedMutRandom, SliceRandom};
use rand::{Rng, SeedableRng};
use support::RedisServer;
use tokio::time::{Instant, sleep};

use crate::again;
use crate::fleet::Slot;
use crate::history::{FaultKind, Log};
use crate::plan::{Plan, now_us};

/// What the injector acts on.
pub(crate) struct Stage {
    pub(crate) plan: Plan,
    pub(crate) service: String,
    pub(crate) slots: Mutex<Vec<Slot>>,
    pub(crate) redis: Arc<Mutex<RedisServer>>,
    /// Both services, for pause and resume.
    pub(crate) admin: [Service; 2],
    pub(crate) dead: DeadLetters,
    /// The orchestrator's history: faults, memory, dead letters.
    pub(crate) log: Log,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// How often each kind is chosen, after the first round.
const WEIGHTS: [(FaultKind, u32); 9] = [
    (FaultKind::Leave, 10),
    (FaultKind::Join, 10),
    (FaultKind::Kill, 10),
    (FaultKind::Freeze, 12),
    (FaultKind::Cut, 12),
    (FaultKind::Delay, 8),
    (FaultKind::RedisRestart, 2),
    (FaultKind::Pause, 4),
    (FaultKind::Replay, 4),
];

impl Stage {
    pub(crate) fn slots(&self) -> MutexGuard<'_, Vec<Slot>> {
        lock(&self.slots)
    }

    /// Records a fault that ended.
    fn record(&self, kind: FaultKind, target: &str, start: u128) {
        self.log.write(&format!(
            "K {} {target} {start} {}\n",
            kind.name(),
            now_us()
        ));
    }

    /// Injects faults until `until`, then waits for those under way.
    pub(crate) async fn inject(self: Arc<Self>, until: Instant) {
        let mut rng = StdRng::seed_from_u64(self.plan.seed);
        let mut first: Vec<FaultKind> = FaultKind::ALL.to_vec();
        first.shuffle(&mut rng);
        first.reverse();
        let total: u32 = WEIGHTS.iter().map(|(_, w)| w).sum();
        let mut running = Vec::new();
        loop {
            // Exponential gaps: faults bunch and spread as they would.
            let mean = self.plan.fault_every.as_secs_f64();
            let gap = -mean * (1.0 - rng.random::<f64>()).ln();
            sleep(Duration::from_secs_f64(gap.min(mean * 4.0))).await;
            if Instant::now() >= until {
                break;
            }
            let kind = first.pop().unwrap_or_else(|| {
                let mut pick = rng.random_range(0..total);
                WEIGHTS
                    .iter()
                    .find(|(_, w)| {
                        let hit = pick < *w;
                        pick = pick.saturating_sub(*w);
                        hit
                    })
                    .map(|(k, _)| *k)
                    .expect("a weight")
            });
            let seed = rng.random();
            running.push(tokio::spawn(self.clone().fault(kind, seed)));
        }
        for fault in running {
            fault.await.expect("a fault");
        }
    }

    /// Starts consumers until `min` run (after kills and leaves).
    pub(crate) fn fill(&self, min: usize) {
        let mut slots = self.slots();
        let mut running = slots.iter().filter(|s| s.process.is_some()).count();
        for slot in slots.iter_mut() {
            if running >= min {
                break;
            }
            if slot.process.is_none() && !slot.busy {
                let label = slot
                    .start(&self.plan.dir, &self.service, self.plan.limit())
                    .label
                    .clone();
                self.record(FaultKind::Join, &label, now_us());
                running += 1;
            }
        }
    }

    /// A slot to act on: running, not busy, lasting or not as `lasting`
    /// allows; marked busy.
    fn take(&self, rng: &mut StdRng, lasting: bool) -> Option<(usize, String)> {
        let mut slots = self.slots();
        let mut free: Vec<&mut Slot> = slots
            .iter_mut()
            .filter(|s| s.process.is_some() && !s.busy && (lasting || !s.lasting()))
            .collect();
        let slot = free.choose_mut(rng)?;
        slot.busy = true;
        Some((slot.index, slot.label()?.to_owned()))
    }

    fn release(&self, index: usize) {
        self.slots()[index].busy = false;
    }

    fn running(&self) -> usize {
        self.slots().iter().filter(|s| s.process.is_some()).count()
    }

    async fn fault(self: Arc<Self>, kind: FaultKind, seed: u64) {
        let mut rng = StdRng::seed_from_u64(seed);
        let start = now_us();
        let (min, max) = (self.plan.min_consumers, self.plan.max_consumers);
        match kind {
            FaultKind::Join => {
                let mut slots = self.slots();
                let running = slots.iter().filter(|s| s.process.is_some()).count();
                let empty = slots.iter_mut().find(|s| s.process.is_none() && !s.busy);
                if let (true, Some(slot)) = (running < max, empty) {
                    let label = slot
                        .start(&self.plan.dir, &self.service, self.plan.limit())
                        .label
                        .clone();
                    drop(slots);
                    self.record(kind, &label, start);
                }
            }
            FaultKind::Leave | FaultKind::Kill => {
                if self.running() <= min {
                    self.fill(min + 1);
                }
                let Some((index, label)) = self.take(&mut rng, false) else {
                    return;
                };
                let sig = if kind == FaultKind::Kill {
                    "KILL"
                } else {
                    "TERM"
                };
                self.slots()[index].process.as_ref().unwrap().signal(sig);
                // A leave takes an interval or two; one that has not ended
                // in 30 s is a bug the log shows.
                let deadline = Instant::now() + Duration::from_secs(30);
                while !self.slots()[index].process.as_mut().unwrap().exited() {
                    assert!(
                        Instant::now() < deadline,
                        "{label} did not leave within 30 s"
                    );
                    sleep(Duration::from_millis(50)).await;
                }
                self.slots()[index].process = None;
                self.record(kind, &label, start);
                self.release(index);
            }
            FaultKind::Freeze | FaultKind::Cut | FaultKind::Delay => {
                let Some((index, label)) = self.take(&mut rng, true) else {
                    return;
                };
                let (secs, name) = match kind {
                    FaultKind::Freeze => {
                        // Past the lease (1.5 intervals) most of the time.
                        self.slots()[index].process.as_ref().unwrap().signal("STOP");
                        (rng.random_range(1.0..4.0), kind)
                    }
                    FaultKind::Cut => {
                        let slots = self.slots();
                        if rng.random_bool(0.5) {
                            slots[index].proxy.cut();
                        } else {
                            slots[index].proxy.blackhole();
                        }
                        (rng.random_range(0.3..4.0), kind)
                    }
                    _ => {
                        let max = Duration::from_millis(rng.random_range(20..150));
                        self.slots()[index].proxy.jitter(max);
                        (rng.random_range(2.0..8.0), kind)
                    }
                };
                sleep(Duration::from_secs_f64(secs)).await;
                {
                    let slots = self.slots();
                    match name {
                        FaultKind::Freeze => slots[index].process.as_ref().unwrap().signal("CONT"),
                        FaultKind::Cut => slots[index].proxy.restore(),
                        _ => slots[index].proxy.jitter(Duration::ZERO),
                    }
                }
                self.record(kind, &label, start);
                self.release(index);
            }
            FaultKind::RedisRestart => {
                let down = Duration::from_millis(rng.random_range(0..1500));
                let redis = self.redis.clone();
                tokio::task::spawn_blocking(move || lock(&redis).kill_and_restart_after(down))
                    .await
                    .expect("restart Redis");
                self.record(kind, "redis", start);
            }
            FaultKind::Pause => {
                for service in &self.admin {
                    again("pause", || service.pause("chaos")).await;
                }
                sleep(Duration::from_secs_f64(rng.random_range(1.0..3.0))).await;
                for service in &self.admin {
                    again("resume", || service.resume()).await;
                }
                self.record(kind, "all", start);
            }
            FaultKind::Replay => {
                let n = again("replay", || self.dead.replay_all(None)).await;
                self.log.write(&format!("# replayed {n} dead letters\n"));
                self.record(kind, "all", start);
            }
        }
    }
}
