//! What tracking costs Redis per task: the commands Redis counted (inside
//! scripts too, [`meter`](crate::meter)), the bytes it read and wrote on
//! the network (`INFO stats`), and the bytes a task's record and its item
//! in `{N/p}:ended` hold (`MEMORY USAGE ... SAMPLES 0`).
//!
//! It knows the records' layout (docs/design.md §14) as the throughput
//! bench knows the streams': a field per task of `{N/p}:tasks`, and the
//! list `{N/p}:ended`.

use std::time::Duration;

use deadpool_redis::redis::{self, aio::MultiplexedConnection};
use peerq::DEFAULT_PARTITIONS;

use crate::meter::{self, Cost};

/// Commands listed per task, at least this many calls per task in a run.
const LISTED: f64 = 0.005;

/// Counters read at one moment: Redis's commands and CPU, this process's
/// CPU, and Redis's network bytes.
pub(crate) struct Reading {
    counters: meter::Counters,
    net_in: u64,
    net_out: u64,
}

/// What happened between two [`Reading`]s, for how many tasks.
pub(crate) struct Spent {
    pub(crate) cost: Cost,
    net_in: u64,
    net_out: u64,
    tasks: u64,
}

impl Reading {
    /// `INFO stats`, then `INFO cpu commandstats`, on `conn`.
    pub(crate) async fn take(conn: &mut MultiplexedConnection) -> Reading {
        let info: String = redis::cmd("INFO")
            .arg("stats")
            .query_async(conn)
            .await
            .expect("INFO stats");
        let field = |name: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                .and_then(|v| v.trim().parse::<u64>().ok())
                .unwrap_or(0)
        };
        let (net_in, net_out) = (
            field("total_net_input_bytes"),
            field("total_net_output_bytes"),
        );
        Reading {
            counters: meter::read(conn).await,
            net_in,
            net_out,
        }
    }

    /// What `tasks` tasks cost since `before`.
    pub(crate) fn since(&self, before: &Reading, tasks: u64) -> Spent {
        let mut cost = self.counters.since(&before.counters);
        // `meter` takes out the `INFO` that read `before`'s counters; this
        // reading's `INFO stats` ran before its counters were read.
        cost.take_out("info", 1);
        Spent {
            cost,
            net_in: self.net_in.saturating_sub(before.net_in),
            net_out: self.net_out.saturating_sub(before.net_out),
            tasks,
        }
    }
}

/// Per task, for each run: the commands Redis counted, each command's
/// calls, Redis's and this process's CPU, and the network bytes.
pub(crate) fn print_spent(runs: &[(&str, &Spent)]) {
    let per_task = |s: &Spent, x: f64| x / s.tasks as f64;
    let header: Vec<&str> = runs.iter().map(|(label, _)| *label).collect();
    println!("| per task (first repeat) | {} |", header.join(" | "));
    println!("|---|{}", "---|".repeat(runs.len()));
    let row = |what: &str, value: &dyn Fn(&Spent) -> String| {
        let cells: Vec<String> = runs.iter().map(|(_, s)| value(s)).collect();
        println!("| {what} | {} |", cells.join(" | "));
    };
    row("Redis commands (inside scripts too)", &|s| {
        format!("{:.2}", per_task(s, s.cost.calls() as f64))
    });
    row("bytes Redis read (requests)", &|s| {
        format!("{:.0}", per_task(s, s.net_in as f64))
    });
    row("bytes Redis wrote (replies, messages)", &|s| {
        format!("{:.0}", per_task(s, s.net_out as f64))
    });
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    row("Redis CPU", &|s| {
        format!("{:.1} µs", per_task(s, us(s.cost.redis_cpu)))
    });
    row(
        "Redis time in commands (commandstats; scripts' commands twice)",
        &|s| {
            let usec: u64 = s.cost.commands.values().map(|c| c.usec).sum();
            format!("{:.1} µs", per_task(s, usec as f64))
        },
    );
    row("bench process CPU", &|s| {
        format!("{:.1} µs", per_task(s, us(s.cost.process_cpu)))
    });
    // Every command some run calls at least `LISTED` times per task, in
    // the order of the last run's calls.
    let mut commands: Vec<&str> = Vec::new();
    for (_, s) in runs.iter().rev() {
        for (command, calls) in s.cost.by_calls() {
            if per_task(s, calls.calls as f64) >= LISTED && !commands.contains(&command) {
                commands.push(command);
            }
        }
    }
    // A script's time includes the commands it ran, which count again.
    for command in commands {
        row(
            &format!("`{command}`: calls (Redis µs)"),
            &|s| match s.cost.commands.get(command) {
                Some(c) => format!(
                    "{:.2} ({:.1})",
                    per_task(s, c.calls as f64),
                    per_task(s, c.usec as f64)
                ),
                None => String::new(),
            },
        );
    }
    println!();
}

/// Bytes per record: the mean of the partitions' (their `{N/p}:tasks`'s
/// bytes over the records it holds), least and most, over `n` partitions.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Bytes {
    n: usize,
    mean: f64,
    min: u64,
    max: u64,
}

impl Bytes {
    fn of(sizes: &[u64]) -> Bytes {
        if sizes.is_empty() {
            return Bytes::default();
        }
        Bytes {
            n: sizes.len(),
            mean: sizes.iter().sum::<u64>() as f64 / sizes.len() as f64,
            min: *sizes.iter().min().unwrap(),
            max: *sizes.iter().max().unwrap(),
        }
    }
}

impl std::fmt::Display for Bytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:.0} ({}–{}, {} partitions)",
            self.mean, self.min, self.max, self.n
        )
    }
}

/// The records' bytes one repeat sampled.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Records {
    /// As a tracked enqueue writes them.
    pub(crate) waiting: Bytes,
    /// Final, `succeeded` without a result.
    pub(crate) succeeded: Bytes,
    /// Final, `succeeded` with the result `Done { seq }`.
    pub(crate) with_result: Bytes,
    /// An item of `{N/p}:ended`: the lists' bytes (with `{N/p}:ended_at`)
    /// over their items.
    pub(crate) member: f64,
    /// Final records kept once a consume run ended.
    pub(crate) kept: u64,
}

impl Records {
    pub(crate) fn print(&self, tasks: u64) {
        println!(
            "| bytes in Redis per tracked task (`MEMORY USAGE` of `{{N/p}}:tasks` over its records) | mean (least–most over the partitions) |"
        );
        println!("|---|---|");
        println!(
            "| `waiting` record, as the enqueue writes it | {} |",
            self.waiting
        );
        println!(
            "| final record, `succeeded`, no result | {} |",
            self.succeeded
        );
        println!(
            "| final record, `succeeded`, with the result `Done {{ seq }}` | {} |",
            self.with_result
        );
        println!(
            "| its id in `{{N/p}}:ended` (the lists' bytes, `ended_at` too, / their ids) | {:.0} |",
            self.member
        );
        println!(
            "| final records kept after consuming {tasks} tasks (default `keep_count` 1,000 × 64 partitions) | {} |",
            self.kept
        );
        println!();
    }
}

/// `MEMORY USAGE` of each of `keys` (`SAMPLES 0`: every element counted);
/// keys that are gone are left out.
async fn memory(conn: &mut MultiplexedConnection, keys: &[String]) -> Vec<u64> {
    let mut pipe = redis::pipe();
    for key in keys {
        pipe.cmd("MEMORY")
            .arg("USAGE")
            .arg(key)
            .arg("SAMPLES")
            .arg(0);
    }
    let sizes: Vec<Option<u64>> = pipe.query_async(conn).await.unwrap();
    sizes.into_iter().flatten().collect()
}

/// Per partition of service `name`: its records' bytes (`{N/p}:tasks`)
/// over how many records it holds (its fields).
async fn per_record(conn: &mut MultiplexedConnection, name: &str) -> Bytes {
    let hashes: Vec<String> = (0..DEFAULT_PARTITIONS)
        .map(|p| format!("{{{name}/{p}}}:tasks"))
        .collect();
    let bytes = memory(conn, &hashes).await;
    let mut pipe = redis::pipe();
    for hash in &hashes {
        pipe.cmd("HLEN").arg(hash);
    }
    let records: Vec<u64> = pipe.query_async(conn).await.unwrap();
    let per: Vec<u64> = bytes
        .iter()
        .zip(records.iter().filter(|n| **n > 0))
        .map(|(bytes, records)| bytes / records)
        .collect();
    Bytes::of(&per)
}

/// The bytes per record of service `name`'s records (as its enqueue left
/// them).
pub(crate) async fn records_of(conn: &mut MultiplexedConnection, name: &str) -> Bytes {
    per_record(conn, name).await
}

/// The bytes per record of service `name`'s final records, of an item of
/// its `{N/p}:ended` lists, and how many final records it keeps.
pub(crate) async fn finished(conn: &mut MultiplexedConnection, name: &str) -> (Bytes, f64, u64) {
    let lists: Vec<String> = (0..DEFAULT_PARTITIONS)
        .map(|p| format!("{{{name}/{p}}}:ended"))
        .collect();
    let mut pipe = redis::pipe();
    for list in &lists {
        pipe.cmd("LLEN").arg(list);
    }
    let lengths: Vec<u64> = pipe.query_async(conn).await.unwrap();
    let kept: u64 = lengths.iter().sum();
    // With their runs' times (`{N/p}:ended_at`).
    let both: Vec<String> = lists
        .iter()
        .flat_map(|l| [l.clone(), format!("{l}_at")])
        .collect();
    let list_bytes: u64 = memory(conn, &both).await.iter().sum();
    let records = per_record(conn, name).await;
    (records, list_bytes as f64 / kept.max(1) as f64, kept)
}

/// The 1-minute load average, as `/proc/loadavg` says (`?` without it).
pub(crate) fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "?".to_owned())
}
