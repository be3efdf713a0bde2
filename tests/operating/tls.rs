//! peerq over TLS (`rediss://`, the `tls` feature) against a TLS-only
//! `redis-server` with certificates the tests make (`support::TestPki`):
//! a consumer, a producer and the CLI trust the test CA and present a
//! client certificate; a server certificate from another CA, or no client
//! certificate where one is required, is refused at once with an error
//! that says which and what to give.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use peerq::producer::Producer;
use peerq::{Consumer, Handler, HandlerError, Redis, TaskContext, Tls};
use serde::{Deserialize, Serialize};
use support::{RedisServer, ServerOptions, ServerTls, TestPki, unique_name, wait_until};
use tokio_util::sync::CancellationToken;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Job {
    seq: u64,
}

#[derive(Clone, Default)]
struct Count(Arc<AtomicU64>);

impl Handler for Count {
    type Task = Job;
    async fn handle(&self, _job: Job, _cx: TaskContext) -> Result<(), HandlerError> {
        self.0.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

fn tls_server(require_client_cert: bool) -> RedisServer {
    RedisServer::start_with(ServerOptions {
        tls: Some(ServerTls::new(require_client_cert)),
        ..ServerOptions::default()
    })
}

/// Trusts the test CA and presents the test client certificate.
fn trusted() -> Tls {
    let pki = TestPki::shared();
    Tls::new()
        .ca_file(&pki.ca_cert)
        .client_cert(&pki.client.cert, &pki.client.key)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_and_a_producer_run_tasks_over_mutual_tls() {
    support::init_tracing();
    let server = tls_server(true);
    assert!(server.url().starts_with("rediss://"), "{}", server.url());
    let name = unique_name("tls");
    let count = Count::default();
    let consumer = Consumer::builder()
        .redis(Redis::url(server.url()).tls(trusted()))
        .name(&name)
        .handler(count.clone());
    let stop = CancellationToken::new();
    let running = tokio::spawn(consumer.run_until(stop.clone().cancelled_owned()));
    let producer = Producer::builder()
        .redis(Redis::url(server.url()).tls(trusted()))
        .name(&name)
        .connect()
        .await
        .unwrap();
    let jobs: Vec<Job> = (0..500).map(|seq| Job { seq }).collect();
    producer.enqueue_batch(&jobs).await.unwrap();
    producer.enqueue(Job { seq: 500 }).await.unwrap();
    wait_until(Duration::from_secs(30), "every task ran", || {
        assert!(!running.is_finished(), "the consumer stopped");
        count.0.load(Ordering::Relaxed) == 501
    })
    .await;
    stop.cancel();
    running.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_certificate_from_another_ca_is_refused_and_the_error_says_so() {
    let server = tls_server(false);
    let pki = TestPki::shared();
    let wrong = Tls::new().ca_file(&pki.other_ca_cert);
    let name = unique_name("tls-ca");
    let err = Producer::builder()
        .redis(Redis::url(server.url()).tls(wrong.clone()))
        .name(&name)
        .connect()
        .await
        .unwrap_err()
        .to_string();
    println!("another CA: {err}");
    assert!(err.contains("invalid peer certificate"), "{err}");
    assert!(err.contains("TLS certificate is not trusted"), "{err}");
    assert!(err.contains("Tls::ca_file"), "{err}");
    // A consumer does not wait for it as for a Redis that is down: the
    // certificate will not change by itself.
    let run = Consumer::builder()
        .redis(Redis::url(server.url()).tls(wrong))
        .name(&name)
        .handler(Count::default())
        .run_until(std::future::pending());
    let err = tokio::time::timeout(Duration::from_secs(10), run)
        .await
        .expect("refused at once, not retried")
        .unwrap_err()
        .to_string();
    assert!(err.contains("TLS certificate is not trusted"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_without_a_certificate_is_refused_where_one_is_required() {
    let server = tls_server(true);
    let pki = TestPki::shared();
    let err = Producer::builder()
        .redis(Redis::url(server.url()).tls(Tls::new().ca_file(&pki.ca_cert)))
        .name(unique_name("tls-client"))
        .connect()
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("refused this client's TLS certificate"),
        "{err}"
    );
    assert!(err.contains("--tls-cert"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_file_that_cannot_be_read_is_refused_by_name() {
    let server = tls_server(false);
    let err = Producer::builder()
        .redis(Redis::url(server.url()).tls(Tls::new().ca_file("/nonexistent/ca.pem")))
        .name(unique_name("tls-file"))
        .connect()
        .await
        .unwrap_err()
        .to_string();
    println!("a file missing: {err}");
    assert!(err.contains("invalid setting `tls`"), "{err}");
    assert!(err.contains("/nonexistent/ca.pem"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_reads_a_service_over_mutual_tls() {
    let server = tls_server(true);
    let pki = TestPki::shared();
    let name = unique_name("tls-cli");
    Producer::builder()
        .redis(Redis::url(server.url()).tls(trusted()))
        .name(&name)
        .connect()
        .await
        .unwrap()
        .enqueue(Job { seq: 0 })
        .await
        .unwrap();
    let cli = |with_cert: bool| {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_peerq"));
        cmd.env_remove("PEERQ_REDIS_URL")
            .args(["--redis", &server.url(), "--tls-ca"])
            .arg(&pki.ca_cert);
        if with_cert {
            cmd.arg("--tls-cert").arg(&pki.client.cert);
            cmd.arg("--tls-key").arg(&pki.client.key);
        }
        cmd.args(["services", "--json"])
            .output()
            .expect("run peerq")
    };
    let out = cli(true);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains(&name), "{stdout}");
    let refused = cli(false);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("refused this client's TLS certificate"),
        "{stderr}"
    );
}
