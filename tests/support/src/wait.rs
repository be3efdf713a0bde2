//! Waiting for a condition in an async test (the one async helper here: it
//! needs a tokio runtime, which every test that calls it has).

use std::time::{Duration, Instant};

/// Waits until `done` holds, polling every 20 ms; panics after `within`,
/// naming `what`.
pub async fn wait_until(within: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
