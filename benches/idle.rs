//! What idle consumers cost Redis (issue 26): the connections they hold and
//! the commands they send per second with nothing to do.
//!
//! Run with `cargo bench --bench idle` (release build). For each scenario
//! (one instance at 64 and at 1,024 partitions, 20 instances at 64) it
//! starts a private `redis-server`, runs the instances in this process
//! through the public API (default settings, a no-op handler, no tasks),
//! waits until they own every partition and settle, then measures over
//! `WINDOW`:
//!
//! - connections: `CLIENT LIST`, without the bench's own;
//! - commands per second as Redis counts them: `INFO commandstats`' calls
//!   (commands run inside scripts included), without the bench's `INFO`;
//! - Redis's CPU time, and this process's (the instances').
//!
//! Then it watches Redis's `MONITOR` feed for `WATCH` (after the window: the
//! feed costs Redis CPU) to tell which part sends what: each call by its
//! command and key pattern, or by its script. It prints markdown tables.

// The test harness crate (`tests/support`), named `support` here.
extern crate peerq_test_support as support;

mod meter;
#[path = "idle/monitor.rs"]
mod monitor;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use meter::{Client, Cost};
use peerq::assignment::Standing;
use peerq::consumer::{PartitionChange, PartitionEvent};
use peerq::handler::Task;
use peerq::{Consumer, HandlerError};
use support::{RedisServer, unique_name};
use tokio::sync::{broadcast, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// How long the counters are read over: the longest period of the
/// housekeeping (the dead letters' and delayed set's sizes, every 30 s), so
/// each part shows at its average rate.
const WINDOW: Duration = Duration::from_secs(30);
/// How long the instances run on after owning every partition before the
/// window opens, so the acquisition's own commands stay out of it.
const SETTLE: Duration = Duration::from_secs(3);
/// How long the `MONITOR` feed is watched: as long as the window, for the
/// same reason.
const WATCH: Duration = Duration::from_secs(30);
/// How long the instances may take to own every partition.
const OWN_WITHIN: Duration = Duration::from_secs(60);
/// Commands listed per scenario.
const TOP: usize = 10;

/// Idle instances of one service.
#[derive(Debug, Clone, Copy)]
struct Scenario {
    instances: usize,
    partitions: u32,
}

/// What one scenario measured.
struct Measured {
    scenario: Scenario,
    /// The instances' connections at the window's start and end.
    clients: (Vec<Client>, Vec<Client>),
    cost: Cost,
    window: Duration,
    feed: monitor::Tally,
}

#[tokio::main]
async fn main() {
    let scenarios = [
        Scenario {
            instances: 1,
            partitions: 64,
        },
        Scenario {
            instances: 1,
            partitions: 1024,
        },
        Scenario {
            instances: 20,
            partitions: 64,
        },
    ];
    let mut measured = Vec::new();
    for scenario in scenarios {
        measured.push(measure(scenario).await);
    }
    println!();
    print_summary(&measured);
    for m in &measured {
        print_commands(m);
        print_origins(m);
    }
}

async fn measure(scenario: Scenario) -> Measured {
    let server = RedisServer::start();
    let mut conn = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let me = meter::client_id(&mut conn).await;
    let mut fleet = Fleet::start(&server.url(), &unique_name("idle"), scenario);
    fleet.owns_every_partition().await;
    tokio::time::sleep(SETTLE).await;
    let others = |clients: Vec<Client>| -> Vec<Client> {
        clients.into_iter().filter(|c| c.id != me).collect()
    };
    let at_start = others(meter::clients(&mut conn).await);
    let before = meter::read(&mut conn).await;
    let opened = Instant::now();
    tokio::time::sleep(WINDOW).await;
    let after = meter::read(&mut conn).await;
    let window = opened.elapsed();
    let at_end = others(meter::clients(&mut conn).await);
    let feed = monitor::watch(server.port(), &mut conn, WATCH).await;
    fleet.stop().await;
    Measured {
        scenario,
        clients: (at_start, at_end),
        cost: after.since(&before),
        window,
        feed,
    }
}

/// The running instances.
struct Fleet {
    scenario: Scenario,
    stop: CancellationToken,
    runs: Vec<JoinHandle<peerq::Result<()>>>,
    standings: Vec<watch::Receiver<Standing>>,
    events: Vec<broadcast::Receiver<PartitionEvent>>,
}

impl Fleet {
    /// Starts the scenario's instances of service `name`, each with the
    /// defaults and a handler that does nothing.
    fn start(url: &str, name: &str, scenario: Scenario) -> Fleet {
        let stop = CancellationToken::new();
        let mut fleet = Fleet {
            scenario,
            stop: stop.clone(),
            runs: Vec::new(),
            standings: Vec::new(),
            events: Vec::new(),
        };
        for _ in 0..scenario.instances {
            let noop = tower::service_fn(|_task: Task<()>| async { Ok::<(), HandlerError>(()) });
            let consumer = Consumer::builder()
                .name(name)
                .redis(url)
                .partitions(scenario.partitions)
                .service(noop);
            fleet.standings.push(consumer.standing());
            fleet.events.push(consumer.partition_events());
            let signal = stop.clone().cancelled_owned();
            fleet.runs.push(tokio::spawn(
                async move { consumer.run_until(signal).await },
            ));
        }
        fleet
    }

    /// Waits until every instance is assigned among all of them and fetches
    /// exactly the partitions its assignment owns.
    async fn owns_every_partition(&mut self) {
        let mut fetching: Vec<BTreeSet<u32>> = vec![BTreeSet::new(); self.events.len()];
        let deadline = Instant::now() + OWN_WITHIN;
        loop {
            for (rx, set) in self.events.iter_mut().zip(&mut fetching) {
                loop {
                    match rx.try_recv() {
                        Ok(event) => match event.change {
                            PartitionChange::Started { .. } => {
                                set.insert(event.partition);
                            }
                            PartitionChange::Stopped => {
                                set.remove(&event.partition);
                            }
                            _ => {}
                        },
                        Err(broadcast::error::TryRecvError::Empty) => break,
                        Err(e) => panic!("partition events: {e}"),
                    }
                }
            }
            let settled = self.standings.iter().zip(&fetching).all(|(standing, set)| {
                standing.borrow().assignment().is_some_and(|a| {
                    a.replicas as usize == self.scenario.instances
                        && a.owned_partitions(self.scenario.partitions)
                            .into_iter()
                            .eq(set.iter().copied())
                })
            });
            if settled {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{:?}: the instances did not own every partition within {OWN_WITHIN:?}",
                self.scenario
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Stops every instance (a graceful leave) and waits for them.
    async fn stop(self) {
        self.stop.cancel();
        for run in self.runs {
            run.await.unwrap().unwrap();
        }
    }
}

/// `n` per second over `window`.
fn per_second(n: u64, window: Duration) -> f64 {
    n as f64 / window.as_secs_f64()
}

/// Clients by the last command they ran: `xreadgroup 64, evalsha 2`.
fn by_last_command(clients: &[Client]) -> String {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for c in clients {
        *counts.entry(c.cmd.as_str()).or_default() += 1;
    }
    let mut counts: Vec<(&str, usize)> = counts.into_iter().collect();
    counts.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    counts
        .iter()
        .map(|(cmd, n)| format!("{cmd} {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn print_summary(measured: &[Measured]) {
    println!(
        "| instances × partitions | connections (per instance) | by last command | commands/s as Redis counts them (per instance) | sent by clients/s, run in scripts/s (MONITOR) | Redis CPU | instances' CPU |"
    );
    println!("|---|---|---|---|---|---|---|");
    for m in measured {
        let s = m.scenario;
        let n = s.instances as f64;
        let (start, end) = (m.clients.0.len(), m.clients.1.len());
        let connections = if start == end {
            format!("{end} ({:.1})", end as f64 / n)
        } else {
            format!("{start} at the start, {end} at the end")
        };
        let calls = per_second(m.cost.calls(), m.window);
        let cpu_share =
            |d: Duration| format!("{:.1} %", 100.0 * d.as_secs_f64() / m.window.as_secs_f64());
        println!(
            "| {} × {} | {connections} | {} | {calls:.0} ({:.1}) | {:.0}, {:.0} | {} | {} |",
            s.instances,
            s.partitions,
            by_last_command(&m.clients.1),
            calls / n,
            per_second(m.feed.sent(), m.feed.window),
            per_second(m.feed.inner(), m.feed.window),
            cpu_share(m.cost.redis_cpu),
            cpu_share(m.cost.process_cpu),
        );
    }
    println!();
}

fn print_commands(m: &Measured) {
    let s = m.scenario;
    let partition_seconds = s.partitions as f64 * m.window.as_secs_f64();
    println!(
        "| {} × {}: command (INFO commandstats) | calls/s | per partition and second | Redis µs/s |",
        s.instances, s.partitions
    );
    println!("|---|---|---|---|");
    for (command, calls) in m.cost.by_calls().into_iter().take(TOP) {
        println!(
            "| {command} | {:.1} | {:.2} | {:.0} |",
            per_second(calls.calls, m.window),
            calls.calls as f64 / partition_seconds,
            per_second(calls.usec, m.window),
        );
    }
    println!();
}

fn print_origins(m: &Measured) {
    let s = m.scenario;
    let window = m.feed.window;
    println!(
        "| {} × {}: sent as (MONITOR, {:.1} s) | calls/s | inside a script, per call |",
        s.instances,
        s.partitions,
        window.as_secs_f64()
    );
    println!("|---|---|---|");
    for (origin, o) in m.feed.by_calls() {
        let inner: Vec<String> = o
            .inner
            .iter()
            .map(|(cmd, n)| format!("{cmd} {:.2}", *n as f64 / o.calls.max(1) as f64))
            .collect();
        println!(
            "| {origin} | {:.1} | {} |",
            per_second(o.calls, window),
            inner.join(", ")
        );
    }
    println!();
}
