//! Child processes for the tests that run the examples as a person would:
//! where the example binary is, a handle that kills its process if the test
//! ends early, signals, and a test of this binary run as a child process
//! (for tests that kill a process holding something).

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

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

/// Runs this test binary's test `test` (its full name) alone as a child
/// process, with the environment variable `env` set (the test does its
/// part only then), and returns it with the first line of its stdout that
/// starts with `prefix`, that prefix cut off. Blocking.
pub fn child_test(test: &str, env: (&str, &str), prefix: &str) -> (Proc, String) {
    let mut child = Proc(
        Command::new(std::env::current_exe().unwrap())
            .args(["--exact", test, "--nocapture"])
            .env(env.0, env.1)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let stdout = child.0.stdout.take().unwrap();
    let line = BufReader::new(stdout)
        .lines()
        .map(Result::unwrap)
        .find_map(|line| line.strip_prefix(prefix).map(str::to_owned))
        .unwrap_or_else(|| panic!("the child test {test} printed no line `{prefix}…`"));
    (child, line)
}

/// Sends `sig` (`TERM`, `KILL`, `STOP`, `CONT`, …) to process `pid`.
pub fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status();
}
