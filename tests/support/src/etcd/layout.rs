//! Where a cluster's nodes live and how each is started: a fresh dir
//! under `/dev/shm`, three distinct loopback ports per node, a token of
//! the cluster's own, each node's command line with the cluster's raft
//! timing, and whether `etcd` and `etcdctl` are there at all.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use super::node::{Node, Ports};
use super::{EtcdCluster, NODES};
use crate::redis_server::unused_port;
use crate::tls::ServerTls;

const NOT_FOUND: &str = "etcd or etcdctl not found on PATH: install etcd 3.4 or newer \
    (Debian/Ubuntu: `sudo apt-get install -y etcd-server etcd-client`), \
    or run `scripts/test`, which installs them";

/// The nodes of launch `attempt` of the cluster in `dir`, on fresh ports,
/// not started yet. `dir` holds nothing of an earlier attempt.
pub(super) fn nodes(dir: &Path, attempt: usize, tls: Option<&ServerTls>) -> Vec<Node> {
    // Below the ephemeral range, so never etcd's 2379/2380 either.
    let mut used = Vec::new();
    let mut take = || loop {
        let port = unused_port();
        if !used.contains(&port) {
            used.push(port);
            break port;
        }
    };
    let ports: Vec<Ports> = (0..NODES)
        .map(|_| Ports {
            client: take(),
            peer: take(),
            metrics: take(),
        })
        .collect();
    let initial_cluster = ports
        .iter()
        .enumerate()
        .map(|(i, p)| format!("n{i}=http://127.0.0.1:{}", p.peer))
        .collect::<Vec<_>>()
        .join(",");
    // Unique per cluster and attempt, so no node of another cluster
    // (another test's, an earlier attempt's) can ever join this one.
    let dir_name = dir.file_name().unwrap_or_default().to_string_lossy();
    let token = format!("{dir_name}-{attempt}");
    ports
        .into_iter()
        .enumerate()
        .map(|(i, ports)| {
            let name = format!("n{i}");
            let args = command_line(&name, ports, &initial_cluster, &token, tls);
            let node_dir = dir.join(&name);
            Node::new(name, ports, node_dir, args)
        })
        .collect()
}

/// A node's command line, all but `--data-dir`. The timing is explained at
/// [`EtcdCluster`].
fn command_line(
    name: &str,
    ports: Ports,
    initial_cluster: &str,
    token: &str,
    tls: Option<&ServerTls>,
) -> Vec<OsString> {
    let client = format!("{}://127.0.0.1:{}", scheme(tls), ports.client);
    let peer = format!("http://127.0.0.1:{}", ports.peer);
    let metrics = format!("http://127.0.0.1:{}", ports.metrics);
    let heartbeat = EtcdCluster::HEARTBEAT_INTERVAL.as_millis().to_string();
    let election = EtcdCluster::ELECTION_TIMEOUT.as_millis().to_string();
    let mut args: Vec<OsString> = [
        ("name", name),
        ("listen-client-urls", &client),
        ("advertise-client-urls", &client),
        ("listen-peer-urls", &peer),
        ("initial-advertise-peer-urls", &peer),
        ("listen-metrics-urls", &metrics),
        ("initial-cluster", initial_cluster),
        ("initial-cluster-state", "new"),
        ("initial-cluster-token", token),
        ("heartbeat-interval", &heartbeat),
        ("election-timeout", &election),
        ("pre-vote", "true"),
        // Structured lines on stderr, which goes to `etcd.log`. `info`
        // for the elections and lease revocations a failing test needs to
        // see: ~100 lines a node at start, then a few per election or
        // restart, nothing in a steady state.
        ("logger", "zap"),
        ("log-outputs", "stderr"),
        ("log-level", "info"),
    ]
    .into_iter()
    .map(|(name, value)| flag(name, value))
    .collect();
    if let Some(tls) = tls {
        let served = if tls.wrong_host {
            &tls.pki.wrong_host
        } else {
            &tls.pki.server
        };
        args.push(flag("cert-file", &served.cert));
        args.push(flag("key-file", &served.key));
        if tls.require_client_cert {
            args.push(flag("client-cert-auth", "true"));
            args.push(flag("trusted-ca-file", &tls.pki.ca_cert));
        }
    }
    args
}

/// `https` with TLS, `http` without: what the client port speaks.
pub(super) fn scheme(tls: Option<&ServerTls>) -> &'static str {
    if tls.is_some() { "https" } else { "http" }
}

/// `--<name>=<value>`, one argument.
fn flag(name: &str, value: impl AsRef<OsStr>) -> OsString {
    let mut arg = OsString::from(format!("--{name}="));
    arg.push(value);
    arg
}

/// A fresh dir `peerq-etcd-<pid>-…` under `/dev/shm` (RAM: etcd fsyncs
/// every write, and 3.4 cannot be told not to), or under the system temp
/// dir where there is no `/dev/shm`; the reaper removes it if the test
/// process dies first.
pub(super) fn fresh_dir() -> PathBuf {
    let shm = Path::new("/dev/shm");
    let base = if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    };
    crate::redis_server::fresh_dir_in(&base, "etcd")
}

/// Panics with one clear line when `etcd` or `etcdctl` cannot be run;
/// checked once per process.
pub(super) fn ensure_etcd() {
    static FOUND: OnceLock<bool> = OnceLock::new();
    let found = *FOUND.get_or_init(|| {
        // etcdctl (v3) has a `version` command and no `--version` flag.
        [("etcd", "--version"), ("etcdctl", "version")]
            .iter()
            .all(|(program, version)| {
                Command::new(program)
                    .arg(version)
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status()
                    .is_ok_and(|status| status.success())
            })
    });
    assert!(found, "{NOT_FOUND}");
}
