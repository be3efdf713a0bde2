//! Batches (docs/design.md §19) with the `flows` example's processes: 200
//! batches of 20 members each, a callback each, while consumers join and
//! leave gracefully (3 → 5 → 2) or are SIGKILLed (one of them by the test
//! hook that aborts right after an ack of members, before their ends are
//! forwarded). Checked from the processes' own lines: every batch's
//! callback runs with the right counts, exactly once under graceful churn,
//! and under kills more than once only where the earlier runs were on
//! processes killed afterwards; every member succeeded or died as
//! `--fail-every` says, once each under graceful churn.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use support::{Proc, RedisServer, signal, unique_name};

const BATCHES: u64 = 200;
const SIZE: u64 = 20;
const FAIL_EVERY: u64 = 7;
const PARTITIONS: &str = "16";

/// A line of a consumer: which process printed it, and what.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Line {
    Member {
        b: u64,
        m: u64,
    },
    Dead {
        b: u64,
        m: u64,
    },
    Callback {
        b: u64,
        total: u64,
        ok: u64,
        dead: u64,
    },
}

fn parse(line: &str) -> Option<Line> {
    let (kind, rest) = line.split_once(' ')?;
    let fields: BTreeMap<&str, u64> = rest
        .split(' ')
        .filter_map(|kv| kv.split_once('='))
        .filter_map(|(k, v)| Some((k, v.parse().ok()?)))
        .collect();
    let (b, m) = (fields.get("batch").copied(), fields.get("m").copied());
    Some(match kind {
        "member" => Line::Member { b: b?, m: m? },
        "dead" => Line::Dead { b: b?, m: m? },
        "callback" => Line::Callback {
            b: b?,
            total: *fields.get("total")?,
            ok: *fields.get("ok")?,
            dead: *fields.get("dead")?,
        },
        _ => return None,
    })
}

/// Every line seen: the number of the process that printed it, the line.
type Lines = Arc<Mutex<Vec<(usize, Line)>>>;

struct Fleet {
    url: String,
    name: String,
    /// The service's partitions.
    partitions: &'static str,
    /// The consumers' `--fail-every`.
    fail_every: u64,
    lines: Lines,
    /// Every consumer started, by its number (`None` once it ended).
    procs: Vec<Option<Proc>>,
    /// The numbers of the processes killed.
    killed: Vec<usize>,
    /// Where the consumers' logs go (their warnings, shown if the test
    /// fails).
    logs: std::path::PathBuf,
}

impl Fleet {
    fn new(server: &RedisServer) -> Fleet {
        Fleet {
            url: server.url(),
            name: unique_name("flows"),
            partitions: PARTITIONS,
            fail_every: FAIL_EVERY,
            lines: Lines::default(),
            procs: Vec::new(),
            killed: Vec::new(),
            logs: std::env::temp_dir().join(unique_name("flows-logs")),
        }
    }

    /// Three consumers, and the producer's run of [`BATCHES`] under way.
    fn producing(server: &RedisServer) -> (Fleet, std::thread::JoinHandle<Vec<String>>) {
        let mut fleet = Fleet::new(server);
        for _ in 0..3 {
            fleet.start(false);
        }
        let produced = fleet.produce();
        (fleet, produced)
    }

    /// Starts consumer number `procs.len()`; `crash`: with the test hook.
    fn start(&mut self, crash: bool) -> usize {
        let me = self.procs.len();
        let mut command = Command::new(support::example_binary("flows"));
        command
            .args(["consume", "--redis", &self.url, "--name", &self.name])
            .args(["--partitions", self.partitions, "--fail-every"])
            .arg(self.fail_every.to_string())
            // A drain of 400 ms: under a loaded machine (CI runs four tests
            // at once) 200 ms let a leave's drain time out, and a task ran
            // twice, as a drain that times out may (design §5).
            // The delivery scenarios' timing (I = 1 s, drain 0.3 s): at 0.5 s
            // and 0.2 s a loaded machine let drains time out, which may run
            // a task twice (design §5).
            .args(["--interval-ms", "1000", "--drain-ms", "300"])
            .stdout(Stdio::piped())
            .stderr(self.log(me));
        if crash {
            command.env("PEERQ_TEST_CRASH_AFTER_MEMBER_ACK", "1");
        }
        let mut child = command.spawn().expect("start a consumer");
        let stdout = child.stdout.take().unwrap();
        let lines = self.lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(line) = parse(&line) {
                    lines.lock().unwrap().push((me, line));
                }
            }
        });
        self.procs.push(Some(Proc(child)));
        me
    }

    /// Consumer `n`'s log file.
    fn log(&self, n: usize) -> std::fs::File {
        std::fs::create_dir_all(&self.logs).unwrap();
        std::fs::File::create(self.logs.join(n.to_string())).unwrap()
    }

    fn pid(&self, n: usize) -> u32 {
        self.procs[n].as_ref().expect("running").0.id()
    }

    /// SIGTERMs consumer `n` (a graceful leave) and waits for its exit.
    fn leave(&mut self, n: usize) {
        signal(self.pid(n), "TERM");
        let mut proc = self.procs[n].take().unwrap();
        let status = proc.0.wait().unwrap();
        assert!(status.success(), "consumer {n} left with {status}");
    }

    /// SIGKILLs consumer `n`.
    fn kill(&mut self, n: usize) {
        signal(self.pid(n), "KILL");
        let mut proc = self.procs[n].take().unwrap();
        let _ = proc.0.wait();
        self.killed.push(n);
    }

    /// The producer's run of [`BATCHES`] of [`SIZE`], in the background:
    /// the batch lines it printed.
    fn produce(&self) -> std::thread::JoinHandle<Vec<String>> {
        self.produce_of(BATCHES, SIZE)
    }

    /// The producer's run of `batches` of `size`.
    fn produce_of(&self, batches: u64, size: u64) -> std::thread::JoinHandle<Vec<String>> {
        let mut child = Command::new(support::example_binary("flows"))
            .args(["produce", "--redis", &self.url, "--name", &self.name])
            .args(["--partitions", self.partitions, "--batches"])
            .arg(batches.to_string())
            .arg("--size")
            .arg(size.to_string())
            .args(["--rate", "1000"])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the producer");
        std::thread::spawn(move || {
            let stdout = child.stdout.take().unwrap();
            let printed = BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
                .collect();
            assert!(child.wait().unwrap().success(), "the producer failed");
            printed
        })
    }

    fn callbacks_seen(&self) -> usize {
        let lines = self.lines.lock().unwrap();
        let batches = lines.iter().filter_map(|(_, l)| match l {
            Line::Callback { b, .. } => Some(*b),
            _ => None,
        });
        batches.collect::<std::collections::BTreeSet<_>>().len()
    }

    /// Waits until every batch's callback ran (within `within`), then a
    /// second for a second run to show.
    fn wait_callbacks(&self, within: Duration) {
        let deadline = Instant::now() + within;
        while self.callbacks_seen() < BATCHES as usize {
            assert!(
                Instant::now() < deadline,
                "{} callbacks of {BATCHES} ran",
                self.callbacks_seen()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        std::thread::sleep(Duration::from_secs(1));
    }

    /// Checks the lines: the counts each callback got, and who ran what
    /// more than once (allowed only for `killed` processes' earlier runs).
    fn check(&self) {
        let lines = self.lines.lock().unwrap().clone();
        let fails = |b: u64, m: u64| (b * SIZE + m).is_multiple_of(self.fail_every);
        let mut members: BTreeMap<(u64, u64), Vec<(usize, bool)>> = BTreeMap::new();
        let mut callbacks: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
        for (by, line) in &lines {
            match *line {
                Line::Member { b, m } => members.entry((b, m)).or_default().push((*by, true)),
                Line::Dead { b, m } => members.entry((b, m)).or_default().push((*by, false)),
                Line::Callback { b, total, ok, dead } => {
                    let died = (0..SIZE).filter(|&m| fails(b, m)).count() as u64;
                    assert_eq!((total, ok, dead), (SIZE, SIZE - died, died), "batch {b}");
                    callbacks.entry(b).or_default().push(*by);
                }
            }
        }
        let once = |what: &str, runs: &[usize]| {
            // Every run but the last was on a process killed afterwards.
            for by in &runs[..runs.len() - 1] {
                assert!(
                    self.killed.contains(by),
                    "{what} ran {} times, once on consumer {by}, which was not killed",
                    runs.len()
                );
            }
        };
        assert_eq!(callbacks.len(), BATCHES as usize);
        for (b, runs) in &callbacks {
            once(&format!("batch {b}'s callback"), runs);
        }
        assert_eq!(members.len(), (BATCHES * SIZE) as usize, "every member ran");
        for ((b, m), runs) in &members {
            let by: Vec<usize> = runs.iter().map(|(by, _)| *by).collect();
            once(&format!("member {m} of batch {b}"), &by);
            let succeeded = runs.last().unwrap().1;
            assert_eq!(succeeded, !fails(*b, *m), "member {m} of batch {b}");
        }
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for proc in self.procs.iter_mut().flatten() {
            signal(proc.0.id(), "KILL");
        }
        if std::thread::panicking() {
            for n in 0..self.procs.len() {
                let log = std::fs::read_to_string(self.logs.join(n.to_string()));
                for line in log.unwrap_or_default().lines() {
                    eprintln!("consumer {n}: {line}");
                }
            }
        }
        let _ = std::fs::remove_dir_all(&self.logs);
    }
}

#[test]
fn under_graceful_churn_every_callback_runs_once_with_its_counts() {
    let server = RedisServer::start();
    let (mut fleet, produced) = Fleet::producing(&server);
    std::thread::sleep(Duration::from_millis(1500));
    fleet.start(false);
    fleet.start(false);
    std::thread::sleep(Duration::from_millis(2500));
    for n in 0..3 {
        fleet.leave(n);
    }
    let batches = produced.join().unwrap();
    assert_eq!(batches.len(), BATCHES as usize, "{batches:?}");
    fleet.wait_callbacks(Duration::from_secs(60));
    assert!(fleet.killed.is_empty());
    fleet.check();
}

#[test]
fn under_sigkill_churn_every_callback_is_enqueued_once_with_its_counts() {
    let server = RedisServer::start();
    let (mut fleet, produced) = Fleet::producing(&server);
    // One consumer aborts right after its first ack of members; the
    // others are SIGKILLed one at a time, each replaced.
    let crasher = fleet.start(true);
    let started = Instant::now();
    let mut next = 0;
    while started.elapsed() < Duration::from_secs(6) {
        std::thread::sleep(Duration::from_millis(1500));
        while fleet.procs[next].is_none() {
            next += 1;
        }
        fleet.kill(next);
        fleet.start(false);
    }
    let batches = produced.join().unwrap();
    assert_eq!(batches.len(), BATCHES as usize);
    fleet.wait_callbacks(Duration::from_secs(90));
    // The hook's consumer crashed (and so ran nothing twice by itself).
    if let Some(proc) = fleet.procs[crasher].as_mut() {
        let ended = proc.0.try_wait().unwrap();
        assert!(ended.is_some(), "the hook's consumer did not crash");
        fleet.procs[crasher] = None;
        fleet.killed.push(crasher);
    }
    fleet.check();
}

#[test]
fn a_callback_is_enqueued_when_the_last_members_owner_crashes_right_after_its_ack() {
    // One partition, one member: nothing but the next owner's look at the
    // completion records left behind can count it.
    let server = RedisServer::start();
    let mut fleet = Fleet::new(&server);
    fleet.partitions = "1";
    fleet.fail_every = 0;
    let crasher = fleet.start(true);
    std::thread::sleep(Duration::from_millis(1500));
    let batches = fleet.produce_of(1, 1).join().unwrap();
    assert_eq!(batches.len(), 1);
    let deadline = Instant::now() + Duration::from_secs(20);
    let proc = fleet.procs[crasher].as_mut().unwrap();
    while proc.0.try_wait().unwrap().is_none() {
        assert!(
            Instant::now() < deadline,
            "the hook's consumer did not crash"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    fleet.procs[crasher] = None;
    fleet.killed.push(crasher);
    let seen = fleet.lines.clone();
    let lines = || seen.lock().unwrap().clone();
    assert_eq!(lines(), [(crasher, Line::Member { b: 0, m: 0 })]);
    let next = fleet.start(false);
    let deadline = Instant::now() + Duration::from_secs(20);
    while lines().len() < 2 {
        assert!(Instant::now() < deadline, "no callback: {:?}", lines());
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_secs(1));
    let callback = Line::Callback {
        b: 0,
        total: 1,
        ok: 1,
        dead: 0,
    };
    // The member's ack landed before the crash: it does not run again.
    assert_eq!(lines()[1..], [(next, callback)]);
}
