//! A Redis Cluster over TLS, on a cluster of its own whose nodes serve
//! only TLS (no plain port at all, `tls-cluster yes`: `CLUSTER SLOTS`
//! names their TLS ports) and require a client certificate from the test
//! CA: every connection peerq makes there (its cluster client, the
//! pipelines' connections to each master, the idle partitions' blocking
//! reads) must be TLS with the CA and the certificate given, or nothing
//! runs.

use peerq::Tls;
use support::{ServerTls, TestPki};

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_cluster_runs_every_task_once_and_the_cli_and_dead_letters_read_it() {
    let cluster = RedisCluster::start_tls(3, 0, ServerTls::new(true));
    let seeds = cluster.seed_urls();
    assert!(
        seeds.iter().all(|url| url.starts_with("rediss://")),
        "{seeds:?}"
    );
    let pki = TestPki::shared();
    let trusted = Tls::new()
        .ca_file(&pki.ca_cert)
        .client_cert(&pki.client.cert, &pki.client.key);
    let name = unique_name("tls");
    let record = Recorder {
        fail: true,
        ..Recorder::default()
    };
    let instance = Instance::start_with(&cluster, &name, record.for_instance(0), |builder| {
        builder.redis(peerq::Redis::cluster(seeds.clone()).tls(trusted.clone()))
    });
    let instances = std::slice::from_ref(&instance);
    let producer = Producer::builder()
        .redis(peerq::Redis::cluster(seeds.clone()).tls(trusted.clone()))
        .name(&name)
        .connect()
        .await
        .unwrap();
    // The first tasks wait for the consumer's first assignment. Once they
    // ran, every partition waits for new entries in a blocking read of its
    // own, on a connection to its master: the only way the later tasks
    // reach the consumer. Each batch is a pipeline to every master.
    enqueue(&producer, 0, 100, 100, MS).await;
    wait_until(Duration::from_secs(30), "the first tasks ran", || {
        assert!(running(instances), "the consumer stopped");
        record.distinct() == 100
    })
    .await;
    let count = 1100;
    enqueue(&producer, 100, count, 100, 20 * MS).await;
    wait_all_ran(&record, instances, count).await;
    record.assert_each_once(count);
    tokio::task::block_in_place(|| assert_partitions_on_every_master(&cluster, &name));

    // Every failed task is a dead letter, read over TLS from every master.
    let failed = (0..count)
        .filter(|seq| seq % FAILING == FAILING - 1)
        .count();
    let dead = peerq::dead_letters::DeadLetters::connect(
        peerq::Redis::cluster(seeds.clone()).tls(trusted),
        &name,
    )
    .await
    .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let letters = dead.list(10_000).await.unwrap().len();
        if letters == failed {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{letters} dead letters, not {failed}"
        );
        tokio::time::sleep(50 * MS).await;
    }

    // `peerq status --cluster` over TLS counts them on every master.
    let path = |p: &std::path::Path| p.to_str().expect("a UTF-8 temp path").to_owned();
    let (ca, cert, key) = (
        path(&pki.ca_cert),
        path(&pki.client.cert),
        path(&pki.client.key),
    );
    let status = ["status", "--name", &name, "--json"];
    let tls = ["--tls-ca", &ca, "--tls-cert", &cert, "--tls-key", &key];
    let args: Vec<&str> = tls.iter().chain(&status).copied().collect();
    let shown = tokio::task::block_in_place(|| peerq(&cluster, &args));
    let partitions = shown["partitions"].as_array().unwrap();
    assert_eq!(partitions.len(), 64, "{shown}");
    let dead_counted: u64 = partitions.iter().map(|p| p["dead"].as_u64().unwrap()).sum();
    assert_eq!(dead_counted, failed as u64, "{shown}");
    // Without its client certificate the nodes refuse the CLI, and it says
    // what to give.
    let args: Vec<&str> = tls[..2].iter().chain(&status).copied().collect();
    let refused = tokio::task::block_in_place(|| peerq_output(&cluster, &args));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("refused this client's TLS certificate"),
        "{stderr}"
    );
    instance.shutdown().await;
}
