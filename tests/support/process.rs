//! Child processes for the tests that run the examples as a person would:
//! where the example binary is, a handle that kills its process if the test
//! ends early, and signals.

use std::path::PathBuf;
use std::process::{Child, Command};

/// The `name` example's binary, built by `cargo test` next to the test
/// binaries.
pub fn example_binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap();
    let path = dir.join("examples").join(name);
    assert!(
        path.exists(),
        "{} is missing: run the tests with `cargo test` (it builds the examples)",
        path.display()
    );
    path
}

/// A child process that is killed if the test ends early.
#[derive(Debug)]
pub struct Proc(pub Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Sends `sig` (`TERM`, `KILL`, `STOP`, `CONT`, …) to process `pid`.
pub fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status();
}
