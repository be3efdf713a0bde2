//! What a stretch of a benchmark costs, as Redis and this process count
//! it: Redis's command calls (`INFO commandstats`, commands run inside
//! scripts included) with the time Redis spent in each, Redis's CPU time
//! (`INFO cpu`), and this process's CPU time (`/proc/self/stat`, Linux).
//!
//! Shared by the throughput, idle, tracking, limits and priority benchmarks (`mod
//! meter;`); it knows no
//! peerq type.

// Each benchmark uses part of it.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::time::Duration;

use deadpool_redis::redis::{self, aio::MultiplexedConnection};

/// Calls of one command and the time Redis spent in them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Calls {
    pub(crate) calls: u64,
    pub(crate) usec: u64,
}

/// Counters read at one moment.
#[derive(Debug, Clone, Default)]
pub(crate) struct Counters {
    /// Per command as `INFO commandstats` names it (`xreadgroup`,
    /// `xinfo|groups`).
    commands: BTreeMap<String, Calls>,
    /// Redis's CPU time, user and system, all threads.
    redis_cpu: Duration,
    /// This process's CPU time, user and system, all threads.
    process_cpu: Duration,
}

/// What happened between two [`Counters`].
#[derive(Debug, Clone, Default)]
pub(crate) struct Cost {
    /// Per command, without the `INFO` that read the first counters.
    pub(crate) commands: BTreeMap<String, Calls>,
    pub(crate) redis_cpu: Duration,
    pub(crate) process_cpu: Duration,
}

impl Cost {
    /// Every command call Redis counted.
    pub(crate) fn calls(&self) -> u64 {
        self.commands.values().map(|c| c.calls).sum()
    }

    /// The calls of `command` (0 if none).
    pub(crate) fn calls_of(&self, command: &str) -> u64 {
        self.commands.get(command).map_or(0, |c| c.calls)
    }

    /// Takes out `calls` of `command` the bench itself sent.
    pub(crate) fn take_out(&mut self, command: &str, calls: u64) {
        if let Some(c) = self.commands.get_mut(command) {
            c.calls = c.calls.saturating_sub(calls);
        }
    }

    /// The commands, most called first.
    pub(crate) fn by_calls(&self) -> Vec<(&str, Calls)> {
        let mut v: Vec<(&str, Calls)> = self
            .commands
            .iter()
            .map(|(name, calls)| (name.as_str(), *calls))
            .collect();
        v.sort_by(|a, b| b.1.calls.cmp(&a.1.calls).then(a.0.cmp(b.0)));
        v
    }
}

/// Reads the counters now: one `INFO cpu commandstats` on `conn`.
pub(crate) async fn read(conn: &mut MultiplexedConnection) -> Counters {
    let process_cpu = process_cpu();
    let info: String = redis::cmd("INFO")
        .arg("cpu")
        .arg("commandstats")
        .query_async(conn)
        .await
        .expect("INFO cpu commandstats");
    let mut counters = parse_info(&info);
    counters.process_cpu = process_cpu;
    counters
}

impl Counters {
    /// What happened since `earlier`. The `INFO` that read `earlier` is
    /// counted here (Redis counts a command once it has run) and taken out.
    pub(crate) fn since(&self, earlier: &Counters) -> Cost {
        let mut commands = BTreeMap::new();
        for (name, now) in &self.commands {
            let before = earlier.commands.get(name).copied().unwrap_or_default();
            let mut delta = Calls {
                calls: now.calls.saturating_sub(before.calls),
                usec: now.usec.saturating_sub(before.usec),
            };
            if name == "info" {
                delta.calls = delta.calls.saturating_sub(1);
            }
            if delta.calls > 0 {
                commands.insert(name.clone(), delta);
            }
        }
        Cost {
            commands,
            redis_cpu: self.redis_cpu.saturating_sub(earlier.redis_cpu),
            process_cpu: self.process_cpu.saturating_sub(earlier.process_cpu),
        }
    }
}

/// `INFO cpu commandstats`'s reply: `cmdstat_<name>:calls=N,usec=N,…` and
/// `used_cpu_sys:…`, `used_cpu_user:…` (seconds).
fn parse_info(info: &str) -> Counters {
    let mut counters = Counters::default();
    let mut cpu = 0.0;
    for line in info.lines() {
        if let Some(rest) = line.strip_prefix("cmdstat_") {
            let Some((name, fields)) = rest.split_once(':') else {
                continue;
            };
            let mut calls = Calls::default();
            for field in fields.split(',') {
                match field.split_once('=') {
                    Some(("calls", n)) => calls.calls = n.trim().parse().unwrap_or(0),
                    Some(("usec", n)) => calls.usec = n.trim().parse().unwrap_or(0),
                    _ => {}
                }
            }
            counters.commands.insert(name.to_owned(), calls);
        } else if let Some(secs) = line
            .strip_prefix("used_cpu_sys:")
            .or_else(|| line.strip_prefix("used_cpu_user:"))
        {
            cpu += secs.trim().parse::<f64>().unwrap_or(0.0);
        }
    }
    counters.redis_cpu = Duration::from_secs_f64(cpu);
    counters
}

/// This process's CPU time so far, user and system, from `/proc/self/stat`
/// (in clock ticks of 10 ms, Linux's `USER_HZ` on every common platform);
/// zero where there is no `/proc`.
pub(crate) fn process_cpu() -> Duration {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return Duration::ZERO;
    };
    // After the command name in parentheses (which may hold spaces): the
    // state is field 3, utime field 14, stime field 15.
    let Some((_, rest)) = stat.rsplit_once(") ") else {
        return Duration::ZERO;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok());
    match (ticks(11), ticks(12)) {
        (Some(user), Some(system)) => Duration::from_millis((user + system) * 10),
        _ => Duration::ZERO,
    }
}

/// The most memory this process has held so far (`VmHWM` in
/// `/proc/self/status`), in bytes; zero where there is no `/proc`.
pub(crate) fn peak_rss() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
            let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(kb * 1024)
        })
        .unwrap_or(0)
}

/// One client as `CLIENT LIST` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Client {
    pub(crate) id: u64,
    /// Its address, `127.0.0.1:port`.
    pub(crate) addr: String,
    /// The last command it ran (`xreadgroup`, `evalsha`, …).
    pub(crate) cmd: String,
}

/// Every client connected to Redis now (the caller's own included).
pub(crate) async fn clients(conn: &mut MultiplexedConnection) -> Vec<Client> {
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(conn)
        .await
        .expect("CLIENT LIST");
    list.lines()
        .filter_map(|line| {
            let field = |name: &str| {
                line.split(' ')
                    .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
                    .map(str::to_owned)
            };
            Some(Client {
                id: field("id")?.parse().ok()?,
                addr: field("addr")?,
                cmd: field("cmd").unwrap_or_default(),
            })
        })
        .collect()
}

/// `conn`'s id on the server.
pub(crate) async fn client_id(conn: &mut MultiplexedConnection) -> u64 {
    redis::cmd("CLIENT")
        .arg("ID")
        .query_async(conn)
        .await
        .expect("CLIENT ID")
}

/// How many entries of service `name` (of `partitions` partitions) are
/// delivered and not acked: one `XPENDING` summary per partition, in one
/// pipeline.
pub(crate) async fn pending(conn: &mut MultiplexedConnection, name: &str, partitions: u32) -> u64 {
    let mut pipe = redis::pipe();
    for p in 0..partitions {
        pipe.cmd("XPENDING")
            .arg(format!("{{{name}/{p}}}:stream"))
            .arg("peerq");
    }
    let summaries: Vec<(u64, redis::Value, redis::Value, redis::Value)> =
        pipe.query_async(conn).await.unwrap();
    summaries.iter().map(|s| s.0).sum()
}

/// The median of some rates.
pub(crate) fn median(rates: &[f64]) -> f64 {
    let mut sorted = rates.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted[sorted.len() / 2]
}

/// Rates as `a / b / c`, in run order.
pub(crate) fn listed(rates: &[f64]) -> String {
    let each: Vec<String> = rates.iter().map(|r| format!("{r:.0}")).collect();
    each.join(" / ")
}

/// A markdown table row comparing runs `with` against runs `without`, in
/// run order: `| label | without | with | with / without, each run |
/// medians | median of the runs' ratios |`. The last is the steadier on a
/// machine whose speed drifts between repeats (each run's pair ran back to
/// back; the medians compare runs minutes apart).
pub(crate) fn ratio_row(label: &str, without: &[f64], with: &[f64]) -> String {
    let ratios: Vec<f64> = without.iter().zip(with).map(|(a, b)| b / a).collect();
    let each: Vec<String> = ratios.iter().map(|r| format!("{r:.2}")).collect();
    format!(
        "| {label} | {} | {} | {} | **{:.2}** | **{:.2}** |",
        listed(without),
        listed(with),
        each.join(" / "),
        median(with) / median(without),
        median(&ratios)
    )
}
