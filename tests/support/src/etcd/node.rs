//! One `etcd` process of an [`EtcdCluster`](super::EtcdCluster): its
//! ports, its dir (data and log), spawning and killing it, and the
//! plain-HTTP `/health` probe the harness waits on.

use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use super::etcdctl;
use crate::reaper;

/// Timeout of one `/health` probe. etcd 3.4 answers it after a quorum read
/// through raft with a timeout of 1 s of its own, so a node that still
/// believes in a lost leader says `false` after a second; the rest is room
/// for two loaded cores.
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);
/// Lines of a node's log quoted in a panic message.
const LOG_TAIL_LINES: usize = 30;

/// A node's three loopback ports.
#[derive(Debug, Clone, Copy)]
pub(super) struct Ports {
    /// Clients: gRPC and the JSON gateway, TLS with
    /// [`EtcdOptions::tls`](super::EtcdOptions::tls).
    pub(super) client: u16,
    /// Raft between the nodes, plain HTTP.
    pub(super) peer: u16,
    /// `/health` and `/metrics` (`--listen-metrics-urls`), plain HTTP
    /// whatever the client port speaks, so the harness probes a TLS
    /// cluster without a TLS client of its own.
    pub(super) metrics: u16,
}

/// One `etcd` process, running or not.
#[derive(Debug)]
pub(super) struct Node {
    /// `n0`, `n1`, `n2`: its `--name` in the cluster.
    pub(super) name: String,
    pub(super) ports: Ports,
    /// `<cluster dir>/<name>`: `data/` (etcd's `--data-dir`) and
    /// `etcd.log` (its stderr, where it logs).
    dir: PathBuf,
    /// etcd's whole command line, the same on every start: with a member
    /// in its data dir, etcd ignores the `--initial-cluster*` flags and
    /// rejoins as itself.
    args: Vec<OsString>,
    /// Where this process's part of `etcd.log` starts, so a restart's
    /// failure is not read from an earlier start's lines.
    log_start: u64,
    /// `None` while down.
    child: Option<Child>,
}

impl Node {
    /// A node that is not started yet; `args` are all but `--data-dir`.
    pub(super) fn new(name: String, ports: Ports, dir: PathBuf, mut args: Vec<OsString>) -> Node {
        fs::create_dir(&dir).unwrap_or_else(|err| panic!("create {}: {err}", dir.display()));
        // etcd creates the data dir itself, with the 0700 it wants.
        args.push("--data-dir".into());
        args.push(dir.join("data").into_os_string());
        Node {
            name,
            ports,
            dir,
            args,
            log_start: 0,
            child: None,
        }
    }

    /// Spawns the process and returns at once.
    pub(super) fn spawn(&mut self) {
        assert!(
            self.child.is_none(),
            "etcd {} is running already",
            self.name
        );
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .expect("open etcd.log");
        self.log_start = log.seek(SeekFrom::End(0)).unwrap_or(0);
        let mut cmd = Command::new("etcd");
        etcdctl::clean_env(&mut cmd);
        let child = cmd
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|err| panic!("spawn etcd: {err}"));
        reaper::adopt_pid(child.id());
        self.child = Some(child);
    }

    /// Whether the process is up (as far as the harness knows: it may have
    /// exited since; see [`reap`](Self::reap)).
    pub(super) fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// The exit status if the process has exited by itself; the node is
    /// down then.
    pub(super) fn reap(&mut self) -> Option<ExitStatus> {
        let status = self.child.as_mut()?.try_wait().ok()??;
        if let Some(child) = self.child.take() {
            reaper::release_pid(child.id());
        }
        Some(status)
    }

    /// Sends `sig` (`STOP`, `CONT`) to the running process.
    pub(super) fn signal(&self, sig: &str) {
        if let Some(child) = &self.child {
            crate::process::signal(child.id(), sig);
        }
    }

    /// SIGKILLs the process and reaps it; nothing if it is down. Never
    /// panics: it runs in `Drop`.
    pub(super) fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
            reaper::release_pid(child.id());
        }
    }

    /// What `GET /health` says: `Some(true)` when the node has a leader and
    /// a quorum read through raft succeeded, `Some(false)` when not (no
    /// leader, no quorum, an alarm), `None` when nothing answers.
    pub(super) fn health(&self) -> Option<bool> {
        let body = http_get(self.ports.metrics, "/health")?;
        Some(body.contains(r#""health":"true""#))
    }

    /// Its Prometheus metrics; `None` when nothing answers.
    pub(super) fn metrics(&self) -> Option<String> {
        http_get(self.ports.metrics, "/metrics")
    }

    /// Whether the node says it is the leader now
    /// (`etcd_server_is_leader` in its metrics); `None` when nothing
    /// answers.
    pub(super) fn is_leader(&self) -> Option<bool> {
        let metrics = self.metrics()?;
        Some(
            metrics
                .lines()
                .any(|line| line == "etcd_server_is_leader 1"),
        )
    }

    /// Whether this process's start failed because another process holds
    /// one of its ports.
    pub(super) fn bind_failed(&self) -> bool {
        self.log_since_start().contains("address already in use")
    }

    /// The last lines of its log, for panic messages.
    pub(super) fn log_tail(&self) -> String {
        let log = read_lossy(&self.log_path(), 0);
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n")
    }

    fn log_since_start(&self) -> String {
        read_lossy(&self.log_path(), self.log_start)
    }

    fn log_path(&self) -> PathBuf {
        self.dir.join("etcd.log")
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `path` from byte `offset` on, empty if it does not read.
fn read_lossy(path: &Path, offset: u64) -> String {
    let mut bytes = Vec::new();
    if let Ok(mut file) = File::open(path) {
        let _ = file
            .seek(SeekFrom::Start(offset))
            .and_then(|_| file.read_to_end(&mut bytes));
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The body of `GET <path>` on `127.0.0.1:<port>`, with HTTP/1.0 so the
/// server closes the connection after its answer (no chunks, no
/// keep-alive); `None` if it does not answer within [`PROBE_TIMEOUT`].
///
/// Plain std sockets, not an `etcdctl` per probe: the harness polls every
/// few milliseconds while it waits. (std retries reads and writes that a
/// SIGCHLD interrupts, which `read_to_string` and `write_all` do here.)
fn http_get(port: u16, path: &str) -> Option<String> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let mut stream = TcpStream::connect_timeout(&addr, PROBE_TIMEOUT).ok()?;
    stream.set_read_timeout(Some(PROBE_TIMEOUT)).ok()?;
    stream.set_write_timeout(Some(PROBE_TIMEOUT)).ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\r\n"
    )
    .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let (_head, body) = response.split_once("\r\n\r\n")?;
    Some(body.to_owned())
}
