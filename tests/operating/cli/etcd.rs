//! `peerq status` of a service whose rounds are on etcd (docs/design.md
//! §2.2): the backend among the settings, the cluster's members and leader,
//! and the newest closed round's instances, in text and JSON, also with
//! the first endpoint down.

use std::time::Duration;

use peerq::Membership;
use peerq::indexer::Indexer;
use support::EtcdCluster;

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_shows_the_etcd_backend_its_members_and_the_last_round() {
    let mut etcd = EtcdCluster::start();
    let server = RedisServer::start();
    let (url, name) = (server.url(), unique_name("cli-etcd"));
    let mut indexers = Vec::new();
    for _ in 0..2 {
        let indexer = Indexer::builder()
            .name(&name)
            .redis(url.as_str())
            .interval(Duration::from_millis(500))
            .membership(Membership::etcd(etcd.endpoints()))
            .build()
            .unwrap();
        indexers.push(indexer.start().await.unwrap());
    }
    let status = until(
        "a closed round of two",
        || peerq(&url, &["status", "--name", &name, "--json"]),
        |s| {
            s["etcd"]["round"]["instances"]
                .as_array()
                .is_some_and(|i| i.len() == 2)
        },
    )
    .await;
    assert_eq!(status["settings"]["membership"], "etcd");
    assert_eq!(status["settings"]["etcd_prefix"], "/peerq");
    let etcd_status = &status["etcd"];
    assert_eq!(etcd_status["endpoints"].as_array().unwrap().len(), 3);
    let members = etcd_status["members"].as_array().unwrap();
    assert_eq!(members.len(), 3, "{etcd_status}");
    let leaders = members.iter().filter(|m| m["leader"] == true).count();
    assert_eq!(leaders, 1, "{etcd_status}");
    assert!(etcd_status["error"].is_null(), "{etcd_status}");

    let text = peerq(&url, &["status", "--name", &name]).await;
    let text = text.ok();
    assert!(text.contains("membership etcd"), "{text}");
    assert!(
        text.contains(&format!(
            "etcd: {} (prefix /peerq)",
            etcd.endpoints().join(",")
        )),
        "{text}"
    );
    assert_eq!(text.matches("  etcd member ").count(), 3, "{text}");
    assert_eq!(text.matches(" leader\n").count(), 1, "{text}");
    assert!(text.contains(": 2 instances: "), "{text}");

    // The first endpoint down: the others answer for the cluster.
    etcd.kill(0);
    etcd.wait_healthy();
    let status = peerq(&url, &["status", "--name", &name, "--json"])
        .await
        .json();
    assert!(status["etcd"]["error"].is_null(), "{}", status["etcd"]);
    assert_eq!(status["etcd"]["members"].as_array().unwrap().len(), 3);

    // A Redis service says so, and has no etcd part.
    let plain = unique_name("cli-redis");
    let on_redis = Indexer::builder()
        .name(&plain)
        .redis(url.as_str())
        .build()
        .unwrap();
    let on_redis = on_redis.start().await.unwrap();
    let status = peerq(&url, &["status", "--name", &plain, "--json"])
        .await
        .json();
    assert_eq!(status["settings"]["membership"], "redis");
    assert!(status["etcd"].is_null());
    drop((indexers, on_redis));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_reads_a_cluster_with_tls_and_a_user_given_its_flags() {
    let tls = support::ServerTls::new(true);
    let pki = tls.pki;
    let etcd = EtcdCluster::start_with(support::EtcdOptions {
        auth: Some(("peerq", "s3cret-etcd")),
        tls: Some(tls),
    });
    let server = RedisServer::start();
    let (url, name) = (server.url(), unique_name("cli-etcd-tls"));
    let membership = Membership::Etcd {
        endpoints: etcd.endpoints(),
        prefix: "/peerq".into(),
        tls: Some(
            peerq::Tls::new()
                .ca_file(&pki.ca_cert)
                .client_cert(&pki.client.cert, &pki.client.key),
        ),
        auth: Some(peerq::EtcdAuth {
            user: "peerq".into(),
            password: "s3cret-etcd".into(),
        }),
    };
    let indexer = Indexer::builder()
        .name(&name)
        .redis(url.as_str())
        .interval(Duration::from_millis(500))
        .membership(membership)
        .build()
        .unwrap();
    let indexer = indexer.start().await.unwrap();
    // Without the flags: the endpoints, and why the cluster was not read.
    let status = peerq(&url, &["status", "--name", &name, "--json"])
        .await
        .json();
    assert_eq!(status["etcd"]["endpoints"].as_array().unwrap().len(), 3);
    assert!(status["etcd"]["error"].is_string(), "{}", status["etcd"]);
    // With them (the password from the environment): the cluster.
    let with_flags = || {
        let mut cmd = Command::new(BIN);
        cmd.env_remove("PEERQ_REDIS_URL")
            .env("PEERQ_ETCD_PASSWORD", "s3cret-etcd")
            .args(["--redis", &url, "--etcd-ca"])
            .arg(&pki.ca_cert)
            .arg("--etcd-cert")
            .arg(&pki.client.cert)
            .arg("--etcd-key")
            .arg(&pki.client.key)
            .args(["--etcd-user", "peerq", "status", "--name", &name, "--json"]);
        run(cmd)
    };
    let status = until(
        "the secured cluster read, with a closed round",
        with_flags,
        |s| {
            s["etcd"]["round"]["instances"]
                .as_array()
                .is_some_and(|i| i.len() == 1)
        },
    )
    .await;
    assert!(status["etcd"]["error"].is_null(), "{}", status["etcd"]);
    assert_eq!(status["etcd"]["members"].as_array().unwrap().len(), 3);
    assert!(!status.to_string().contains("s3cret"));
    drop(indexer);
}
