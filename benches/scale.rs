//! How far one Redis carries a service (issue 22), in this process, against
//! a private `redis-server`; not part of CI (minutes, and the machine's
//! whole CPU).
//!
//! - `cargo bench --bench scale -- indexers`: 1,000 peer indexers (Ranked,
//!   I = 1 s), once with each assignor: the time until every one holds a
//!   distinct index in `1..=1000`; 30 intervals of stability (index changes
//!   and fences counted) with Redis's commands per second, its CPU and its
//!   connections; then 100 leave and 100 join at once, and the intervals
//!   until the 1,000 are settled again. `PEERQ_SCALE_INDEXERS` sets the
//!   number (default 1,000).
//! - `cargo bench --bench scale -- consumers`: 200 consumers with P = 1,024
//!   and tasks flowing, once with each assignor: every task exactly once
//!   while 20 leave gracefully, with the pause figures.
//!   `PEERQ_SCALE_CONSUMERS` sets the number (default 200).
//!
//! `PEERQ_SCALE_ASSIGNOR=modulo` (or `rendezvous`) runs one assignor only.
//!
//! Each instance has its own connections, as in a fleet of processes; the
//! process's open-file limit must allow them (it is raised to its hard
//! limit at start), and Redis's `maxclients` (10,000 by default) too.
//! `RUST_LOG` (say `peerq=warn`) logs to stderr.

// The test harness crate (`tests/support`), named `support` here.
extern crate peerq_test_support as support;

#[path = "scale/consumers.rs"]
mod consumers;
#[path = "scale/indexers.rs"]
mod indexers;
#[path = "scale/redis_load.rs"]
mod redis_load;

use peerq::Assignor;
use support::RedisServer;

fn count(var: &str, default: usize) -> usize {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .init();
    }
    // `cargo bench` passes `--bench`; the first other argument picks the run.
    let which: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let runs = |name: &str| which.is_empty() || which.iter().any(|w| w == name);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let only: Option<Assignor> = std::env::var("PEERQ_SCALE_ASSIGNOR").ok().map(|a| {
            a.parse()
                .expect("PEERQ_SCALE_ASSIGNOR: modulo or rendezvous")
        });
        for assignor in [Assignor::Modulo, Assignor::Rendezvous] {
            if only.is_some_and(|only| only != assignor) {
                continue;
            }
            if runs("indexers") {
                let server = RedisServer::start();
                indexers::run(&server, count("PEERQ_SCALE_INDEXERS", 1000), assignor).await;
            }
            if runs("consumers") {
                let server = RedisServer::start();
                consumers::run(&server, count("PEERQ_SCALE_CONSUMERS", 200), assignor).await;
            }
        }
    });
}
