//! The orchestrator: a Redis with AOF (`appendfsync always`), consumer
//! slots behind proxies, two producers; faults while tasks flow; then every
//! fault healed, the producers stopped, the backlog drained, the dead
//! letters written down, the consumers stopped gracefully, and the checker
//! run over the whole history.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use peerq::admin::Admin;
use peerq::tracking::TaskHandle;
use peerq::{Bincode, Codec, DeadLetters};
use support::{RedisServer, ServerOptions, unique_name};
use tokio::time::{Instant, sleep};

use crate::again;
use crate::check;
use crate::faults::Stage;
use crate::fleet::{self, Process, Slot, rss_kb};
use crate::history::Log;
use crate::plan::{Job, Plan, RECORDS, now_us};
use crate::report::Report;

/// Runs the plan the environment gives (or, with `PEERQ_CHAOS_CHECK` set
/// to a run's directory, checks that run's history again); panics when a
/// guarantee broke.
pub(crate) fn main() {
    let mut plan = Plan::from_env();
    if let Ok(dir) = std::env::var("PEERQ_CHAOS_CHECK") {
        plan.dir = dir.into();
        return finish(&plan, check::check(&plan));
    }
    let _ = std::fs::remove_dir_all(&plan.dir);
    std::fs::create_dir_all(&plan.dir).expect("the run's directory");
    fleet::keep_binary(&plan.dir);
    println!(
        "chaos: seed={} minutes={:.1} rate={}/s consumers={}..={} fault every {:?} dir={}",
        plan.seed,
        plan.run_for.as_secs_f64() / 60.0,
        plan.rate,
        plan.min_consumers,
        plan.max_consumers,
        plan.fault_every,
        plan.dir.display()
    );
    let redis = RedisServer::start_with(ServerOptions {
        aof: true,
        ..ServerOptions::default()
    });
    let (url, port) = (redis.url(), redis.port());
    let service = unique_name("chaos");
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let started = now_us();
    let report = runtime.block_on(async {
        let mut slots: Vec<Slot> = (0..plan.max_consumers)
            .map(|i| Slot::new(i, port))
            .collect();
        for slot in slots
            .iter_mut()
            .take((plan.min_consumers + plan.max_consumers) / 2)
        {
            slot.start(&plan.dir, &service, plan.limit());
        }
        let admin = Admin::connect(url.as_str()).await.expect("an admin");
        let ordered = format!("{service}-ordered");
        let admin_services = [
            admin_service(&admin, &service).await,
            admin_service(&admin, &ordered).await,
        ];
        let log = Log::open(&fleet::events_path(&plan.dir, "orchestra"));
        let stage = Arc::new(Stage {
            plan: plan.clone(),
            service: service.clone(),
            slots: Mutex::new(slots),
            redis: Arc::new(Mutex::new(redis)),
            admin: admin_services,
            dead: DeadLetters::connect(url.as_str(), &service)
                .await
                .expect("the dead letters"),
            log,
        });
        let rate = plan.rate / 2;
        let mut producers: Vec<Process> = (0..2u64)
            .map(|i| {
                let env = [
                    ("PEERQ_CHAOS_REDIS", url.clone()),
                    ("PEERQ_CHAOS_SERVICE", service.clone()),
                    ("PEERQ_CHAOS_PRODUCER", (i + 1).to_string()),
                    ("PEERQ_CHAOS_RATE", rate.to_string()),
                    ("PEERQ_CHAOS_SEED", plan.seed.to_string()),
                ];
                fleet::spawn(&plan.dir, &format!("p{}", i + 1), "produce", &env)
            })
            .collect();
        let sampler = tokio::spawn(sample_memory(stage.clone(), producers_pids(&producers)));
        let until = Instant::now() + plan.run_for;
        let faults_ended = {
            let stage = stage.clone();
            tokio::spawn(async move { stage.inject(until).await })
        };
        faults_ended.await.expect("the injector");
        stage
            .log
            .write(&format!("W {started} {} {}\n", now_us(), plan.limit()));
        println!("chaos: faults over; stopping the producers");
        stage.fill(plan.min_consumers);
        for p in &producers {
            p.signal("TERM");
        }
        for p in &mut producers {
            let deadline = Instant::now() + Duration::from_secs(60);
            while !p.exited() {
                assert!(
                    Instant::now() < deadline,
                    "producer {} did not stop",
                    p.label
                );
                sleep(Duration::from_millis(50)).await;
            }
        }
        drain(&stage).await;
        sampler.abort();
        write_dead_letters(&stage).await;
        write_records(&stage).await;
        println!("chaos: stopping the consumers");
        let mut slots = std::mem::take(&mut *stage.slots());
        for slot in &slots {
            if let Some(p) = &slot.process {
                p.signal("TERM");
            }
        }
        for slot in &mut slots {
            if let Some(p) = slot.process.as_mut() {
                let deadline = Instant::now() + Duration::from_secs(30);
                while !p.exited() {
                    assert!(Instant::now() < deadline, "{} did not leave", p.label);
                    sleep(Duration::from_millis(50)).await;
                }
            }
        }
        check::check(&plan)
    });
    finish(&plan, report);
}

/// Writes the report, prints it, and fails on a violation.
fn finish(plan: &Plan, report: Report) {
    let text = report.markdown();
    std::fs::write(plan.dir.join("report.md"), &text).expect("write the report");
    println!("{text}");
    // A run that passed in a directory of its own choosing (the CI's)
    // leaves nothing behind but what it printed; a history checked again
    // stays where it was.
    let chosen = ["PEERQ_CHAOS_DIR", "PEERQ_CHAOS_CHECK"];
    if report.violations() == 0 && chosen.iter().all(|v| std::env::var_os(v).is_none()) {
        let _ = std::fs::remove_dir_all(&plan.dir);
    }
    assert!(
        report.violations() == 0,
        "the chaos run broke a guarantee (seed {}): see the report above and {}",
        plan.seed,
        plan.dir.display()
    );
}

/// The admin view of service `name`, once its first consumer made it.
async fn admin_service(admin: &Admin, name: &str) -> peerq::admin::Service {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match admin.service(name).await {
            Ok(s) => return s,
            Err(e) => {
                assert!(
                    Instant::now() < deadline,
                    "service {name} never appeared: {e}"
                );
                sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

fn producers_pids(producers: &[Process]) -> Vec<(String, u32)> {
    producers
        .iter()
        .map(|p| (p.label.clone(), p.pid()))
        .collect()
}

/// Every 10 s, each process's resident memory.
async fn sample_memory(stage: Arc<Stage>, producers: Vec<(String, u32)>) {
    loop {
        let mut all = producers.clone();
        all.extend(stage.slots().iter().filter_map(|s| {
            let p = s.process.as_ref()?;
            Some((p.label.clone(), p.pid()))
        }));
        let at = now_us();
        let lines: String = all
            .iter()
            .filter_map(|(label, pid)| Some(format!("M {label} {} {at}\n", rss_kb(*pid)?)))
            .collect();
        stage.log.write(&lines);
        sleep(Duration::from_secs(10)).await;
    }
}

/// Waits until neither service has a task waiting, pending or delayed,
/// three polls in a row, for up to 3 minutes: a backlog that never
/// drains shows in the check as lost tasks.
async fn drain(stage: &Stage) {
    let deadline = Instant::now() + Duration::from_secs(180);
    let mut quiet = 0;
    while quiet < 3 {
        if Instant::now() > deadline {
            println!("chaos: the backlog did not drain in 3 minutes; checking what ran");
            return;
        }
        sleep(Duration::from_secs(1)).await;
        let mut left = 0;
        for service in &stage.admin {
            match service.status().await {
                Ok(s) => left += s.totals.backlog + s.totals.pending + s.totals.delayed,
                Err(e) => {
                    eprintln!("status: {e}");
                    left += 1;
                }
            }
        }
        quiet = if left == 0 { quiet + 1 } else { 0 };
    }
}

/// `L n` for every dead letter of the unordered service.
async fn write_dead_letters(stage: &Stage) {
    let mut after = None;
    let mut lines = String::new();
    loop {
        let scan = again("scan the dead letters", || {
            stage.dead.scan(after.as_ref(), 1000)
        })
        .await;
        for letter in &scan.letters {
            let job: Job = Bincode
                .decode(&letter.payload)
                .expect("a dead letter's task");
            lines.push_str(&format!("L {}\n", job.n));
        }
        match scan.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    stage.log.write(&lines);
}

/// `R n state` for the last [`RECORDS`] handles each producer wrote down
/// (`none` when the task has no record).
async fn write_records(stage: &Stage) {
    let mut lines = String::new();
    for producer in ["p1", "p2"] {
        let text = std::fs::read_to_string(fleet::events_path(&stage.plan.dir, producer))
            .expect("a producer's history");
        let handles: Vec<(&str, &str)> = text
            .lines()
            .filter_map(|l| l.strip_prefix("H ")?.split_once(' '))
            .collect();
        for (n, handle) in handles.iter().rev().take(RECORDS) {
            let handle: TaskHandle = handle.parse().expect("a task handle");
            let record = again("read a task", || stage.admin[0].task(&handle)).await;
            let state = record.and_then(|r| r.state).map(|s| s.as_str());
            lines.push_str(&format!("R {n} {}\n", state.unwrap_or("none")));
        }
    }
    stage.log.write(&lines);
}
