//! The run's processes: consumer slots (each behind its own proxy to
//! Redis, so that its network can be cut or delayed alone) and producers,
//! started as this test binary's `role` test with `PEERQ_CHAOS_ROLE` set.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use support::{Proc, Proxy, signal};

/// One process of the run.
#[derive(Debug)]
pub(crate) struct Process {
    /// `c<slot>.<incarnation>` or `p<n>`: its history file's name.
    pub(crate) label: String,
    pub(crate) proc: Proc,
}

impl Process {
    pub(crate) fn pid(&self) -> u32 {
        self.proc.0.id()
    }

    /// Whether it has exited (reaped if so).
    pub(crate) fn exited(&mut self) -> bool {
        matches!(self.proc.0.try_wait(), Ok(Some(_)))
    }

    pub(crate) fn signal(&self, sig: &str) {
        signal(self.pid(), sig);
    }
}

/// The binary the run's processes are started from.
static BINARY: OnceLock<PathBuf> = OnceLock::new();

/// Keeps this binary as the run's, in `dir` (a hard link, else a copy):
/// a build during the run replaces the file at its path, and the
/// processes started later must still find it.
pub(crate) fn keep_binary(dir: &Path) {
    let exe = std::env::current_exe().expect("this binary");
    let kept = dir.join("chaos-binary");
    if std::fs::hard_link(&exe, &kept).is_err() {
        std::fs::copy(&exe, &kept).expect("a copy of this binary");
    }
    BINARY.set(kept).expect("one run per process");
}

/// Starts role `role` with `env`, its history at `<dir>/<label>.ev` and
/// its log at `<dir>/<label>.log`.
pub(crate) fn spawn(dir: &Path, label: &str, role: &str, env: &[(&str, String)]) -> Process {
    let log = File::create(dir.join(format!("{label}.log"))).expect("a log file");
    let mut cmd = Command::new(BINARY.get().expect("keep_binary first"));
    cmd.args(["--exact", "role", "--nocapture"])
        .env("PEERQ_CHAOS_ROLE", role)
        .env("PEERQ_CHAOS_EVENTS", events_path(dir, label))
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log);
    for (k, v) in env {
        cmd.env(k, v);
    }
    Process {
        label: label.to_owned(),
        proc: Proc(cmd.spawn().expect("start a process of the run")),
    }
}

/// Where process `label` writes its history.
pub(crate) fn events_path(dir: &Path, label: &str) -> PathBuf {
    dir.join(format!("{label}.ev"))
}

/// A place for one consumer process at a time, and its link to Redis.
#[derive(Debug)]
pub(crate) struct Slot {
    pub(crate) index: usize,
    pub(crate) proxy: Proxy,
    pub(crate) process: Option<Process>,
    pub(crate) incarnations: u32,
    /// A fault of its own is under way (a freeze, a cut, a delay).
    pub(crate) busy: bool,
}

impl Slot {
    pub(crate) fn new(index: usize, redis_port: u16) -> Slot {
        Slot {
            index,
            proxy: Proxy::start(redis_port),
            process: None,
            incarnations: 0,
            busy: false,
        }
    }

    /// Slots 0 and 1 are never stopped for good: their processes live the
    /// whole run, so their memory over the hour shows.
    pub(crate) fn lasting(&self) -> bool {
        self.index < 2
    }

    /// Starts a consumer in this (empty) slot.
    pub(crate) fn start(&mut self, dir: &Path, service: &str, limit: u32) -> &Process {
        assert!(self.process.is_none(), "slot {} is taken", self.index);
        self.incarnations += 1;
        let label = format!("c{}.{}", self.index, self.incarnations);
        let env = [
            ("PEERQ_CHAOS_REDIS", self.proxy.url()),
            ("PEERQ_CHAOS_SERVICE", service.to_owned()),
            ("PEERQ_CHAOS_LIMIT", limit.to_string()),
        ];
        self.process.insert(spawn(dir, &label, "consume", &env))
    }

    /// The label of its live process.
    pub(crate) fn label(&self) -> Option<&str> {
        self.process.as_ref().map(|p| p.label.as_str())
    }
}

/// The resident memory of process `pid`, in KiB.
pub(crate) fn rss_kb(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}
