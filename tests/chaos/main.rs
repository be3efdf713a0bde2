//! The chaos run (docs/design.md §5; RELIABILITY.md): a service run for a
//! set time at a set rate by 4–8 consumer processes and 2 producer
//! processes, with faults injected at random from a printed seed (graceful
//! leaves and joins, SIGKILLs, SIGSTOP past the lease, network cuts and
//! delays through per-consumer proxies, Redis restarts with AOF, pauses,
//! dead-letter replays), and a checker that reads the whole history after
//! the run and fails it when a guarantee broke.
//!
//! `run` is the CI version (3 minutes at 300 tasks/s); `scripts/chaos`
//! runs the hour at 2,000 tasks/s (a release build) through the same test
//! with `PEERQ_CHAOS_*` set ([`plan::Plan`]). The processes of the run are
//! this binary's `role` test, started with `PEERQ_CHAOS_ROLE` set: it does
//! nothing without it.

// The harness crate, named `support` in every module of this binary.
extern crate peerq_test_support as support;

mod check;
#[cfg(test)]
mod check_tests;
mod consume;
mod faults;
mod fleet;
mod history;
mod plan;
mod produce;
mod report;
mod run;

/// The run's tracing: warnings and errors to stderr (the process's log
/// file), without colours.
fn logs() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_env_filter(filter)
        .init();
}

/// Calls `f` until it succeeds, 200 ms apart, printing each error after
/// `what`: the run's admin calls, whose first command after a Redis
/// restart may find the connection gone (the next one reconnects).
async fn again<T, E: std::fmt::Display, F: std::future::Future<Output = Result<T, E>>>(
    what: &str,
    mut f: impl FnMut() -> F,
) -> T {
    loop {
        match f().await {
            Ok(value) => return value,
            Err(e) => eprintln!("{what}: {e}; again in 200 ms"),
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

/// The chaos run and its check.
#[test]
fn run() {
    run::main();
}

/// A process of a run: `PEERQ_CHAOS_ROLE` is `consume` or `produce`.
#[test]
fn role() {
    match std::env::var("PEERQ_CHAOS_ROLE").as_deref() {
        Ok("consume") => consume::main(),
        Ok("produce") => produce::main(),
        Ok(other) => panic!("PEERQ_CHAOS_ROLE=`{other}`: give consume or produce"),
        Err(_) => {}
    }
}
