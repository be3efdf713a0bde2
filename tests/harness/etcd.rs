//! The etcd harness itself (`tests/support/src/etcd.rs`): three nodes
//! start on loopback ports that are not etcd's own and serve writes; two
//! of them still do with one killed, one alone does not; killed nodes come
//! back on their ports with their data; auth and TLS are as asked.

use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use support::{EtcdCluster, EtcdOptions, ServerTls};

/// The bound a write gets when it is expected to fail: etcdctl's own
/// default is 5 s.
const NO_QUORUM_TIMEOUT: &str = "--command-timeout=1s";

/// `etcdctl put` through node `node` alone.
fn put(etcd: &EtcdCluster, node: usize, key: &str, value: &str) -> Result<String, String> {
    let endpoint = format!("--endpoints={}", etcd.endpoint(node));
    etcd.etcdctl(&[&endpoint, "put", key, value])
}

/// The value of `key` read through node `node` alone (a linearizable
/// read, so through the leader).
fn get(etcd: &EtcdCluster, node: usize, key: &str) -> String {
    let endpoint = format!("--endpoints={}", etcd.endpoint(node));
    let out = etcd
        .etcdctl(&[&endpoint, "get", "--print-value-only", key])
        .unwrap_or_else(|err| panic!("get {key} through n{node}: {err}"));
    out.trim_end().to_owned()
}

/// The value of `key` in node `node`'s own store (a serializable read,
/// answered by that node alone): what it has applied so far.
fn local_get(etcd: &EtcdCluster, node: usize, key: &str) -> String {
    let endpoint = format!("--endpoints={}", etcd.endpoint(node));
    let out = etcd
        .etcdctl(&[
            &endpoint,
            "get",
            "--consistency=s",
            "--print-value-only",
            key,
        ])
        .unwrap_or_else(|err| panic!("local get {key} on n{node}: {err}"));
    out.trim_end().to_owned()
}

#[test]
fn three_nodes_serve_on_loopback_ports_that_are_not_etcds_own() {
    let etcd = EtcdCluster::start();
    let endpoints = etcd.endpoints();
    assert_eq!(endpoints.len(), 3);
    for (node, endpoint) in endpoints.iter().enumerate() {
        assert_eq!(*endpoint, etcd.endpoint(node));
        let port: u16 = endpoint
            .strip_prefix("http://127.0.0.1:")
            .and_then(|port| port.parse().ok())
            .unwrap_or_else(|| panic!("{endpoint} is not http://127.0.0.1:<port>"));
        assert!(
            ![2379, 2380].contains(&port),
            "{endpoint} is etcd's own port"
        );
    }
    assert!(etcd.has_quorum());
    put(&etcd, 0, "greeting", "hello").unwrap();
    assert_eq!(get(&etcd, 2, "greeting"), "hello");

    drop(etcd);
    for endpoint in endpoints {
        let addr = endpoint.strip_prefix("http://").unwrap();
        let refused = TcpStream::connect(addr);
        assert!(refused.is_err(), "{endpoint} still answers after drop");
    }
}

#[test]
fn two_nodes_keep_a_quorum_one_does_not_and_restarted_nodes_rejoin() {
    let mut etcd = EtcdCluster::start();
    // The leader goes first, the worst case.
    let leader = etcd.leader().expect("a healthy cluster has a leader");
    let (a, b) = ((leader + 1) % 3, (leader + 2) % 3);
    put(&etcd, a, "k", "1").unwrap();

    etcd.kill(leader);
    // Writes sent before the survivors elect a new leader would be lost.
    etcd.wait_healthy();
    assert!(etcd.leader().is_some_and(|new| new != leader));
    put(&etcd, a, "k", "2").expect("two of three nodes still write");
    assert!(etcd.has_quorum());

    etcd.kill(a);
    let asked = Instant::now();
    let refused = etcd.etcdctl(&[
        NO_QUORUM_TIMEOUT,
        &format!("--endpoints={}", etcd.endpoint(b)),
        "put",
        "refused",
        "3",
    ]);
    assert!(refused.is_err(), "one node alone wrote: {refused:?}");
    assert!(
        asked.elapsed() < Duration::from_secs(5),
        "the refused write took {:?}",
        asked.elapsed()
    );
    assert!(!etcd.has_quorum());

    etcd.restart(leader);
    etcd.restart(a);
    // The old leader was down for the second write: a healthy node has
    // caught up (its `/health` is a quorum read it applied itself).
    assert_eq!(local_get(&etcd, leader, "k"), "2");
    put(&etcd, leader, "k", "4").expect("the restarted cluster writes");
    assert_eq!(get(&etcd, a, "k"), "4");
}

#[test]
fn a_fully_stopped_cluster_comes_back_one_node_at_a_time_with_its_data() {
    let mut etcd = EtcdCluster::start();
    put(&etcd, 0, "kept", "yes").unwrap();
    for node in 0..3 {
        etcd.kill(node);
    }
    // The first one back answers alone, without a quorum.
    etcd.restart(2);
    assert!(!etcd.has_quorum());
    etcd.restart(0);
    etcd.wait_healthy();
    etcd.restart(1);
    for node in 0..3 {
        assert_eq!(local_get(&etcd, node, "kept"), "yes");
    }
}

#[test]
fn with_auth_the_user_writes_and_no_one_else_does() {
    let etcd = EtcdCluster::start_with(EtcdOptions {
        auth: Some(("peerq", "secret")),
        ..EtcdOptions::default()
    });
    etcd.etcdctl(&["--user=peerq:secret", "put", "k", "v"])
        .expect("the user writes");
    let anonymous = etcd.etcdctl(&["--user=", "put", "k", "v"]);
    assert!(
        anonymous.is_err(),
        "an anonymous write passed: {anonymous:?}"
    );
    let wrong = etcd.etcdctl(&["--user=peerq:wrong", "put", "k", "v"]);
    assert!(wrong.is_err(), "a wrong password passed: {wrong:?}");
    // The harness's own etcdctl logs in as root.
    assert_eq!(
        etcd.etcdctl(&["get", "--print-value-only", "k"])
            .unwrap()
            .trim_end(),
        "v"
    );
}

#[test]
fn with_tls_clients_need_the_test_ca_and_a_client_certificate() {
    let tls = ServerTls::new(true);
    let etcd = EtcdCluster::start_with(EtcdOptions {
        tls: Some(tls),
        ..EtcdOptions::default()
    });
    let endpoint = etcd.endpoint(0);
    assert!(endpoint.starts_with("https://127.0.0.1:"), "{endpoint}");
    let put = |with_cert: bool| {
        let mut cmd = Command::new("etcdctl");
        cmd.arg(format!("--endpoints={endpoint}"))
            .arg("--cacert")
            .arg(&tls.pki.ca_cert)
            .args(["--dial-timeout=1s", "--command-timeout=1s"]);
        if with_cert {
            cmd.arg("--cert")
                .arg(&tls.pki.client.cert)
                .arg("--key")
                .arg(&tls.pki.client.key);
        }
        let out = cmd.args(["put", "k", "v"]).output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (wrote, stderr) = put(true);
    assert!(wrote, "a client with the test certificate failed: {stderr}");
    let (wrote, _) = put(false);
    assert!(!wrote, "a client without a certificate wrote");
    // The harness's own etcdctl speaks TLS by itself.
    assert_eq!(
        etcd.etcdctl(&["get", "--print-value-only", "k"])
            .unwrap()
            .trim_end(),
        "v"
    );
}
