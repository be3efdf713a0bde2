//! Singletons (docs/design.md §20) with `mail_sender` consumers as
//! processes, each running singleton jobs `alpha` and `beta` that print a
//! tick every 100 ms while `still_owned()` holds: graceful churn
//! 3 → 6 → 2 → 5, a holder killed with SIGKILL, and a holder frozen with
//! SIGSTOP past its lease and resumed. Checked from the ticks' own
//! timestamps: at every moment at most one instance ticks for a name, each
//! token's ticks come from one instance, a newer token's first check comes
//! after the older token's last tick, and the pause from one holder's last
//! tick to the next holder's first is within the bound docs/design.md §20
//! states (plus the 100 ms between two ticks).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use support::{Proc, RedisServer, signal, unique_name};

const NAMES: [&str; 2] = ["alpha", "beta"];
/// The interval, drain timeout, skew and lease margin the consumers run
/// with (the defaults), in µs.
const I: u128 = 1_000_000;
const DRAIN: u128 = 300_000;
const SKEW: u128 = 50_000;
const MARGIN: u128 = 20_000;
/// `S_allow = 2S + lease margin + 50 ms`.
const S_ALLOW: u128 = 2 * SKEW + MARGIN + 50_000;
/// docs/design.md §20: a graceful move pauses a singleton at most until
/// the handover deadline, `I/2 + drain + S_allow` after its epoch begins.
const GRACEFUL_BOUND: u128 = I / 2 + DRAIN + S_ALLOW;
/// docs/design.md §20: after a crash or a freeze, `2I + I/2 + drain +
/// S_allow` from the last moment the holder acted.
const CRASH_BOUND: u128 = 2 * I + GRACEFUL_BOUND;
/// Between two ticks of a holder.
const TICK: u128 = 100_000;

/// A `singleton …` line, with the process that printed it.
#[derive(Debug, Clone)]
struct Line {
    process: usize,
    kind: String,
    name: String,
    token: u64,
    epoch: Option<u64>,
    checked_at: Option<u128>,
    at: u128,
}

fn parse(process: usize, line: &str) -> Option<Line> {
    let rest = line.strip_prefix("singleton ")?;
    let (kind, rest) = rest.split_once(' ')?;
    let fields: BTreeMap<&str, &str> = rest
        .split(' ')
        .filter_map(|kv| kv.split_once('='))
        .collect();
    Some(Line {
        process,
        kind: kind.to_owned(),
        name: (*fields.get("name")?).to_owned(),
        token: fields.get("token")?.parse().ok()?,
        epoch: fields.get("epoch").and_then(|e| e.parse().ok()),
        checked_at: fields.get("checked_at").and_then(|c| c.parse().ok()),
        at: fields.get("at")?.parse().ok()?,
    })
}

fn now_us() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros()
}

/// The consumers started so far and every line they printed.
struct Fleet {
    url: String,
    name: String,
    lines: Arc<Mutex<Vec<Line>>>,
    started: usize,
}

impl Fleet {
    fn new(url: String, name: String) -> Fleet {
        Fleet {
            url,
            name,
            lines: Arc::default(),
            started: 0,
        }
    }

    /// Starts one consumer running both singletons; its number is its
    /// place in the order of starts.
    fn start(&mut self) -> (usize, Proc) {
        let process = self.started;
        self.started += 1;
        let mut child = Command::new(support::example_binary("mail_sender"))
            .args(["consume", "--redis", &self.url, "--name", &self.name])
            .args(["--partitions", "8", "--print-events"])
            .args(["--singleton", NAMES[0], "--singleton", NAMES[1]])
            .env("NO_COLOR", "1")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start a consumer");
        let stdout = child.stdout.take().unwrap();
        let lines = self.lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(line) = parse(process, &line) {
                    lines.lock().unwrap().push(line);
                }
            }
        });
        (process, Proc(child))
    }

    fn lines(&self) -> Vec<Line> {
        self.lines.lock().unwrap().clone()
    }

    /// The process whose tick for `name` came last, once one came within
    /// the last 300 ms.
    fn holder(&self, name: &str) -> usize {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let last = self
                .lines()
                .into_iter()
                .filter(|l| l.kind == "tick" && l.name == name)
                .max_by_key(|l| l.at);
            if let Some(last) = last.filter(|l| now_us() - l.at < 300_000) {
                return last.process;
            }
            assert!(Instant::now() < deadline, "nobody ticks for {name}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// One holder's run of ticks: its token and process, its first and last
/// checks of `still_owned()` that passed (a tick's moment: a freeze may
/// fall between the check and the print, which only the token closes), and
/// the newest epoch it named.
#[derive(Debug, Clone, Copy)]
struct Tenure {
    token: u64,
    process: usize,
    first_check: u128,
    last_check: u128,
    last_epoch: u64,
}

/// Checks `name`'s ticks: each token's from one process, one holder at a
/// time, tokens growing, and returns the tenures in order.
fn tenures(lines: &[Line], name: &str) -> Vec<Tenure> {
    let mut by_token: BTreeMap<u64, Tenure> = BTreeMap::new();
    for l in lines.iter().filter(|l| l.kind == "tick" && l.name == name) {
        let checked = l.checked_at.expect("a tick names its check");
        let tenure = by_token.entry(l.token).or_insert(Tenure {
            token: l.token,
            process: l.process,
            first_check: checked,
            last_check: checked,
            last_epoch: 0,
        });
        assert_eq!(
            tenure.process, l.process,
            "{name}: token {} ticked on two instances",
            l.token
        );
        tenure.first_check = tenure.first_check.min(checked);
        tenure.last_check = tenure.last_check.max(checked);
        tenure.last_epoch = tenure.last_epoch.max(l.epoch.unwrap_or(0));
    }
    let tenures: Vec<Tenure> = by_token.into_values().collect();
    assert!(!tenures.is_empty(), "{name} never ran");
    for pair in tenures.windows(2) {
        let (older, newer) = (pair[0], pair[1]);
        assert!(
            newer.first_check > older.last_check,
            "{name}: token {} (instance {}) checked at {} before token {} (instance {}) \
             checked for the last time at {}: two holders at once",
            newer.token,
            newer.process,
            newer.first_check,
            older.token,
            older.process,
            older.last_check
        );
    }
    tenures
}

/// The pauses between consecutive tenures, µs, with the tenures' tokens.
fn pauses(tenures: &[Tenure]) -> Vec<(u64, u64, u128)> {
    tenures
        .windows(2)
        .map(|p| (p[0].token, p[1].token, p[1].first_check - p[0].last_check))
        .collect()
}

#[test]
fn graceful_churn_keeps_one_holder_at_a_time_with_short_pauses() {
    let server = RedisServer::start();
    let mut fleet = Fleet::new(server.url(), unique_name("singleton-churn"));
    let mut running: Vec<Proc> = (0..3).map(|_| fleet.start().1).collect();
    std::thread::sleep(Duration::from_secs(5));
    running.extend((0..3).map(|_| fleet.start().1));
    std::thread::sleep(Duration::from_secs(5));
    // 6 → 2: four leave gracefully at once.
    let leaving: Vec<Proc> = running.drain(..4).collect();
    for p in &leaving {
        signal(p.0.id(), "TERM");
    }
    for mut p in leaving {
        let status = p.0.wait().unwrap();
        assert!(status.success(), "a leaving consumer exited with {status}");
    }
    std::thread::sleep(Duration::from_secs(4));
    running.extend((0..3).map(|_| fleet.start().1));
    std::thread::sleep(Duration::from_secs(5));
    let end = now_us();
    for p in &running {
        signal(p.0.id(), "TERM");
    }
    for mut p in running {
        assert!(p.0.wait().unwrap().success());
    }
    let lines = fleet.lines();
    for name in NAMES {
        let tenures = tenures(&lines, name);
        assert!(
            tenures.len() >= 2,
            "{name} never moved through the churn: {tenures:?}"
        );
        let before_end: Vec<Tenure> = tenures
            .iter()
            .copied()
            .filter(|t| t.first_check < end)
            .collect();
        for (from, to, pause) in pauses(&before_end) {
            assert!(
                pause <= GRACEFUL_BOUND + TICK,
                "{name}: {pause} µs from token {from}'s last tick to token {to}'s first \
                 (bound {} µs): {tenures:?}",
                GRACEFUL_BOUND + TICK
            );
        }
        // Every start and stop line pairs with the ticks: each holder said
        // it stopped.
        for t in &tenures {
            assert!(
                lines
                    .iter()
                    .any(|l| l.kind == "stop" && l.name == name && l.token == t.token),
                "{name}: token {} never printed its stop",
                t.token
            );
        }
        eprintln!(
            "{name}: {} holders, pauses (µs): {:?}",
            tenures.len(),
            pauses(&before_end).iter().map(|p| p.2).collect::<Vec<_>>()
        );
    }
}

#[test]
fn a_killed_or_frozen_holder_is_replaced_within_the_crash_bound() {
    let server = RedisServer::start();
    let mut fleet = Fleet::new(server.url(), unique_name("singleton-crash"));
    let mut running: BTreeMap<usize, Proc> = (0..3).map(|_| fleet.start()).collect();
    std::thread::sleep(Duration::from_secs(5));

    // SIGKILL alpha's holder; a replacement joins.
    let victim = fleet.holder(NAMES[0]);
    let killed = running.remove(&victim).unwrap();
    signal(killed.0.id(), "KILL");
    drop(killed);
    let (p, proc) = fleet.start();
    running.insert(p, proc);
    std::thread::sleep(Duration::from_secs(6));
    let lines = fleet.lines();
    let killed_tenures = tenures(&lines, NAMES[0]);
    let at = killed_tenures
        .iter()
        .position(|t| t.process == victim)
        .expect("the victim held alpha");
    let next = killed_tenures
        .get(at + 1)
        .expect("alpha moved after its holder was killed");
    let pause = next.first_check - killed_tenures[at].last_check;
    assert!(
        pause <= CRASH_BOUND + TICK,
        "alpha paused {pause} µs after its holder was killed (bound {} µs)",
        CRASH_BOUND + TICK
    );
    eprintln!("killed holder: alpha paused {pause} µs");

    // SIGSTOP beta's holder for 4 intervals, past its lease, then SIGCONT.
    let frozen = fleet.holder(NAMES[1]);
    let pid = running[&frozen].0.id();
    signal(pid, "STOP");
    let stopped_at = now_us();
    std::thread::sleep(Duration::from_secs(4));
    signal(pid, "CONT");
    std::thread::sleep(Duration::from_secs(4));
    let lines = fleet.lines();
    let beta = tenures(&lines, NAMES[1]);
    let at = beta
        .iter()
        .rposition(|t| t.process == frozen && t.first_check < stopped_at)
        .expect("the frozen instance held beta");
    let old = beta[at];
    // Its lease: that of the newest epoch it ticked in, by the epoch
    // arithmetic of docs/design.md §4 rule 6.
    let lease_end = (u128::from(old.last_epoch) - 1) * I + I + I / 2 + MARGIN;
    assert!(
        old.last_check <= lease_end,
        "the frozen holder's check passed at {} after its lease ended at {lease_end}",
        old.last_check
    );
    // A check that passed before the freeze may print after it (the
    // window only the token closes); none passes after it.
    assert!(
        !lines.iter().any(|l| l.kind == "tick"
            && l.token == old.token
            && l.name == NAMES[1]
            && l.checked_at.is_some_and(|c| c > stopped_at)),
        "the frozen holder's check passed again after SIGCONT"
    );
    assert!(
        lines.iter().any(|l| l.kind == "stop"
            && l.name == NAMES[1]
            && l.token == old.token
            && l.at > stopped_at),
        "the frozen holder's job did not stop after SIGCONT"
    );
    let next = beta.get(at + 1).expect("beta moved while its holder froze");
    assert_ne!(next.process, frozen, "beta stayed on the frozen instance");
    let pause = next.first_check - old.last_check;
    assert!(
        pause <= CRASH_BOUND + TICK,
        "beta paused {pause} µs after its holder froze (bound {} µs)",
        CRASH_BOUND + TICK
    );
    eprintln!("frozen holder: beta paused {pause} µs");
    for (_, p) in running {
        signal(p.0.id(), "TERM");
    }
}
