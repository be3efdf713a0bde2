//! Test harness shared by the integration tests: private `redis-server`
//! processes on free ports ([`RedisServer`]), over TLS if asked
//! ([`ServerTls`], with a [`TestPki`] made at run time), and private Redis
//! Clusters of them ([`RedisCluster`]), a master with two replicas and
//! three sentinels ([`SentinelSet`]), private PostgreSQL servers with a
//! fresh database per test ([`PostgresServer`]), private 3-node etcd
//! clusters whose nodes can be killed and restarted ([`EtcdCluster`]), a
//! TCP proxy that can cut,
//! blackhole, hold or delay (jitter) its clients' links to Redis
//! ([`Proxy`]), unique service
//! names, a metrics recorder that keeps its values ([`recorder`]), a
//! headless Chromium through ChromeDriver ([`ChromeDriver`], for the
//! dashboard) and tracing setup.
//!
//! Everything here but [`wait_until`] is synchronous and owns its threads
//! and processes, so it works the same from a plain `#[test]` and from a
//! multi-thread `#[tokio::test]`, and never depends on the caller's runtime.
//!
//! It does not own the tests' assertions or any peerq type: it only provides
//! the Redis side of the world and ways to break it.

mod browser;
mod etcd;
mod netns;
mod postgres;
mod process;
mod proxy;
mod reaper;
pub mod recorder;
mod redis_cluster;
mod redis_server;
mod sentinel;
mod tls;
mod wait;

use std::collections::HashSet;
use std::io;
use std::sync::{Arc, Mutex, Once, PoisonError};
use std::time::Duration;

use deadpool_redis::redis;

pub use browser::ChromeDriver;
pub use etcd::{EtcdCluster, EtcdOptions};
pub use netns::{Netns, Side, SplitNet};
pub use postgres::{PostgresServer, TestDatabase, URL_ENV as POSTGRES_URL_ENV};
pub use process::{Proc, child_test, example_binary, signal};
pub use proxy::Proxy;
pub use redis_cluster::{Migration, NodeInfo, RedisCluster, SLOTS, slot_of};
pub use redis_server::{RedisServer, ServerOptions, process_exists, unused_port};
pub use sentinel::{MASTER_NAME, MinReplicas, SentinelOptions, SentinelSet};
pub use tls::{CertFiles, ServerTls, TestPki};
pub use wait::wait_until;

/// A service name unique per test and run, such as `t-orders-1a2b3c4d`.
///
/// `prefix` is lowercased and every character outside `[a-z0-9-]` becomes
/// `-`, so the name never contains a Redis hash tag (`{`, `}`), a key
/// separator (`:`) or a path separator. The random suffix makes names differ
/// between runs against the same server; within one process a name is never
/// handed out twice.
pub fn unique_name(prefix: &str) -> String {
    static ISSUED: Mutex<Option<HashSet<String>>> = Mutex::new(None);

    let prefix: String = prefix
        .chars()
        .map(|c| c.to_ascii_lowercase())
        .map(|c| {
            if c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect();
    let mut issued = ISSUED.lock().unwrap_or_else(PoisonError::into_inner);
    let issued = issued.get_or_insert_with(HashSet::new);
    loop {
        let name = format!("t-{prefix}-{:08x}", rand::random::<u32>());
        if issued.insert(name.clone()) {
            return name;
        }
    }
}

/// Installs a `tracing_subscriber` fmt subscriber that writes through the
/// test harness's capture, filtered by `RUST_LOG` (default `warn`).
///
/// Idempotent: every test may call it; only the first call installs, and a
/// subscriber installed by someone else is left in place.
pub fn init_tracing() {
    static INIT: Once = Once::new();
    INIT.call_once(|| {
        let filter = tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
        // An error only means a global subscriber is already set, which is fine.
        let _ = tracing_subscriber::fmt()
            .with_test_writer()
            .with_env_filter(filter)
            .try_init();
    });
}

/// Opens a synchronous redis-rs connection to `url` whose connect, read and
/// write all give up after `timeout`, so a harness check or a test probe can
/// never hang on a paused server or a blackholed proxy.
///
/// Retries when the setup is interrupted by a signal (see
/// [`retry_interrupted`]); calls on the returned connection are not
/// protected, so wrap them in [`retry_interrupted`] too.
pub fn connect(url: &str, timeout: Duration) -> redis::RedisResult<redis::Connection> {
    connect_client(&redis::Client::open(url)?, timeout)
}

/// [`connect`] with a client made beforehand, such as a TLS one from
/// [`RedisServer::client`].
pub fn connect_client(
    client: &redis::Client,
    timeout: Duration,
) -> redis::RedisResult<redis::Connection> {
    retry_interrupted(|| {
        let con = client.get_connection_with_timeout(timeout)?;
        con.set_read_timeout(Some(timeout))?;
        con.set_write_timeout(Some(timeout))?;
        Ok(con)
    })
}

/// Runs `op` again while it fails because a system call was interrupted
/// (EINTR), up to a bound, and returns its last result.
///
/// A blocking socket read with a timeout (`SO_RCVTIMEO`, which the sync
/// redis-rs API uses for its read timeout) is not restarted after a signal:
/// it fails with EINTR. A test binary gets SIGCHLD whenever one of its child
/// processes exits — every `redis-server` the harness kills and every `kill`
/// it runs — so under parallel tests a sync call with a timeout fails now
/// and then for no reason of its own. Async redis-rs (tokio) retries EINTR
/// itself and needs none of this. Retrying a command on the same connection
/// is safe: redis-rs skips the reply of the interrupted one.
pub fn retry_interrupted<T>(
    mut op: impl FnMut() -> redis::RedisResult<T>,
) -> redis::RedisResult<T> {
    // A bound, so a broken assumption fails the test instead of spinning.
    const MAX_RETRIES: usize = 100;
    let mut result = op();
    for _ in 0..MAX_RETRIES {
        match &result {
            Err(err) if is_interrupted(err) => result = op(),
            _ => break,
        }
    }
    result
}

/// Whether a redis-rs error is an I/O error of kind
/// [`Interrupted`](io::ErrorKind::Interrupted) (EINTR).
pub fn is_interrupted(err: &redis::RedisError) -> bool {
    // redis-rs keeps the I/O error as `Arc<dyn Error + Send + Sync>` and
    // reports that `Arc` as the source; `tests/harness/servers.rs` checks this still
    // holds.
    std::error::Error::source(err)
        .and_then(|source| source.downcast_ref::<Arc<dyn std::error::Error + Send + Sync>>())
        .and_then(|inner| inner.downcast_ref::<io::Error>())
        .is_some_and(|io_err| io_err.kind() == io::ErrorKind::Interrupted)
}
