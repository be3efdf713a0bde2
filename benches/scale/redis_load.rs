//! What Redis spends over a window: commands (as Redis counts them, those
//! inside scripts one by one), CPU and connections, from `INFO`.

use std::time::Instant;

use support::RedisServer;

/// One reading of Redis's counters.
pub(crate) struct Reading {
    at: Instant,
    commands: u64,
    cpu: f64,
}

/// Redis's load between two readings.
#[derive(Debug)]
pub(crate) struct Load {
    pub(crate) commands_per_sec: f64,
    /// Of one core.
    pub(crate) cpu_percent: f64,
    pub(crate) clients: u64,
}

fn field(info: &str, name: &str) -> f64 {
    info.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("INFO has no {name}"))
}

async fn info(server: &RedisServer) -> String {
    let mut conn = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    redis::cmd("INFO")
        .arg("everything")
        .query_async(&mut conn)
        .await
        .unwrap()
}

/// Reads the counters now.
pub(crate) async fn read(server: &RedisServer) -> Reading {
    let info = info(server).await;
    Reading {
        at: Instant::now(),
        // This reading's own INFO counts one.
        commands: field(&info, "total_commands_processed") as u64,
        cpu: field(&info, "used_cpu_sys") + field(&info, "used_cpu_user"),
    }
}

/// The load since `before`.
pub(crate) async fn since(server: &RedisServer, before: &Reading) -> Load {
    let info = info(server).await;
    let secs = before.at.elapsed().as_secs_f64();
    let commands = field(&info, "total_commands_processed") as u64 - before.commands;
    let cpu = field(&info, "used_cpu_sys") + field(&info, "used_cpu_user") - before.cpu;
    Load {
        commands_per_sec: commands as f64 / secs,
        cpu_percent: 100.0 * cpu / secs,
        // Less this reading's connection.
        clients: field(&info, "connected_clients") as u64 - 1,
    }
}
