//! Kills the test process's `redis-server`s (and `postgres` servers) and
//! removes their dirs once the
//! test process is gone, however it ends: normal exit with servers kept in
//! a `static` (which Rust never drops, such as
//! [`RedisCluster::shared`](super::RedisCluster::shared)), a panic that
//! aborts, or a SIGKILL from a test runner's timeout.
//!
//! Without `unsafe` (so no `prctl(PR_SET_PDEATHSIG)`) a child cannot be tied
//! to its parent's life, so the test process keeps a helper `awk` process
//! whose stdin is a pipe only the test process holds (Rust opens every fd
//! with `O_CLOEXEC`, so no `redis-server` inherits it). The test process
//! tells it which pids and dirs are live; when the test process dies the
//! kernel closes the pipe, `awk` reads end-of-file and kills what is still
//! registered.
//!
//! Pids are released as soon as the harness has reaped them, so a pid the
//! kernel hands to an unrelated process later is never killed.

use std::io::Write;
use std::path::Path;
use std::process::{ChildStdin, Command, Stdio};
use std::sync::{Mutex, PoisonError};

/// Keeps sets of live pids and dirs; at end of input SIGQUITs the pids
/// that asked for it (Postgres's immediate shutdown, which ends its
/// backends and frees its shared memory) and gives them a second, then
/// SIGCONTs and SIGKILLs every pid, gives them a moment to die, and removes
/// the dirs. A dir holding a quote is skipped rather than quoted for the
/// shell.
const PROGRAM: &str = r#"
$1 == "+pid" { pids[$2] = 1; next }
$1 == "+qpid" { pids[$2] = 1; quits[$2] = 1; next }
$1 == "-pid" { delete pids[$2]; delete quits[$2]; next }
$1 == "+dir" { dirs[substr($0, 6)] = 1; next }
$1 == "-dir" { delete dirs[substr($0, 6)]; next }
END {
    quit = 0
    for (p in quits) { system("kill -QUIT " p " 2>/dev/null"); quit = 1 }
    if (quit) system("sleep 1")
    killed = 0
    for (p in pids) { system("kill -CONT " p " 2>/dev/null; kill -KILL " p " 2>/dev/null"); killed = 1 }
    if (killed) system("sleep 0.2")
    for (d in dirs) if (index(d, "'") == 0) system("rm -rf '" d "'")
}
"#;

/// The write end of the reaper's stdin; `None` until the first
/// registration, and after a write failed (no reaper, nothing to do).
static REAPER: Mutex<Option<Option<ChildStdin>>> = Mutex::new(None);

/// Registers a `redis-server` pid to kill if the test process dies first.
pub(super) fn adopt_pid(pid: u32) {
    send(&format!("+pid {pid}"));
}

/// Registers a `postgres` server's pid to shut down (SIGQUIT, then SIGKILL)
/// if the test process dies first.
pub(super) fn adopt_quit_pid(pid: u32) {
    send(&format!("+qpid {pid}"));
}

/// Forgets a pid the harness has reaped itself.
pub(super) fn release_pid(pid: u32) {
    if pid != 0 {
        send(&format!("-pid {pid}"));
    }
}

/// Registers a server dir to remove if the test process dies first.
pub(super) fn adopt_dir(dir: &Path) {
    send(&format!("+dir {}", dir.display()));
}

/// Forgets a dir the harness has removed itself.
pub(super) fn release_dir(dir: &Path) {
    send(&format!("-dir {}", dir.display()));
}

/// Writes one line to the reaper, starting it on first use. Never panics:
/// it runs from `Drop`. Without `awk` the harness works as before, only
/// without the clean-up after a crash.
fn send(line: &str) {
    let mut reaper = REAPER.lock().unwrap_or_else(PoisonError::into_inner);
    let stdin = reaper.get_or_insert_with(spawn);
    if let Some(pipe) = stdin
        && writeln!(pipe, "{line}")
            .and_then(|()| pipe.flush())
            .is_err()
    {
        *stdin = None;
    }
}

/// Starts the reaper; `None` if `sh` or `awk` cannot be run.
///
/// It ignores SIGINT, SIGTERM and SIGHUP, which a terminal or a test runner
/// sends to the whole process group: it must outlive the test process to
/// see the end of its input. (`redis-server` shuts itself down on SIGINT
/// and SIGTERM; the reaper then still removes the dirs.)
fn spawn() -> Option<ChildStdin> {
    Command::new("sh")
        .args([
            "-c",
            r#"trap '' INT TERM HUP; exec awk "$1""#,
            "peerq-reaper",
            PROGRAM,
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()
        .and_then(|mut child| child.stdin.take())
}
