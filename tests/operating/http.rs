//! The HTTP endpoint (feature `http`) over real HTTP against real Redis
//! processes: `/metrics` counts the tasks a consumer handled, `/health/ready`
//! follows the instance's access to Redis (a proxy cuts it and lets it
//! through again), `/health/live` answers while the consumer runs and the
//! listener closes when `run` returns, two consumers of one process share
//! the recorder, an address in use is refused, and a paused instance is
//! ready and says it is paused.
//!
//! The client is hyper-util's (the HTTP/1.1 client under reqwest), over a
//! TCP connection to the consumer's listener. Every test of this binary
//! shares the process's one recorder, so each counts only its own service's
//! samples.

use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::http::Uri;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use peerq::producer::Producer;
use peerq::{Consumer, Error, Handler, HandlerError, TaskContext};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use support::{Proxy, RedisServer, unique_name, unused_port, wait_until};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const MS: Duration = Duration::from_millis(1);
/// A short interval, so readiness follows Redis within a second or two.
const INTERVAL: Duration = Duration::from_millis(300);
/// Below `INTERVAL / 2`, as the drain timeout must be.
const DRAIN: Duration = Duration::from_millis(100);
/// How long a request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Job {
    seq: u64,
}

/// Counts the tasks it handled.
#[derive(Clone, Default)]
struct Count(Arc<AtomicU64>);

impl Handler for Count {
    type Task = Job;
    async fn handle(&self, _job: Job, _cx: TaskContext) -> Result<(), HandlerError> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

/// A consumer with an endpoint, running in this process until `shutdown`.
struct Instance {
    /// The endpoint's address.
    addr: SocketAddr,
    stop: CancellationToken,
    task: JoinHandle<peerq::Result<()>>,
}

impl Instance {
    fn start(url: &str, name: &str, count: Count) -> Instance {
        support::init_tracing();
        let addr = SocketAddr::from(([127, 0, 0, 1], unused_port()));
        let stop = CancellationToken::new();
        let run = Consumer::builder()
            .name(name)
            .redis(url)
            .interval(INTERVAL)
            .drain_timeout(DRAIN)
            .http(addr)
            .handler(count)
            .run_until(stop.clone().cancelled_owned());
        Instance {
            addr,
            stop,
            task: tokio::spawn(run),
        }
    }

    /// Leaves gracefully; `run` must return `Ok`.
    async fn shutdown(self) {
        self.stop.cancel();
        self.task.await.unwrap().unwrap();
    }
}

/// A reply: its status and body.
#[derive(Debug)]
struct Reply {
    status: u16,
    body: String,
}

impl Reply {
    /// The body as JSON.
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }
}

/// `GET http://<addr><path>`; `Err` when the request fails (nothing
/// listens, say).
async fn get(addr: SocketAddr, path: &str) -> Result<Reply, String> {
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let uri: Uri = format!("http://{addr}{path}").parse().unwrap();
    let request = async {
        let response = client.get(uri).await.map_err(|e| format!("{e:?}"))?;
        let status = response.status().as_u16();
        let body = response.into_body().collect().await;
        let body = body.map_err(|e| e.to_string())?.to_bytes();
        let body = String::from_utf8(body.to_vec()).map_err(|e| e.to_string())?;
        Ok::<_, String>(Reply { status, body })
    };
    tokio::time::timeout(REQUEST_TIMEOUT, request)
        .await
        .map_err(|_| format!("GET {path}: no reply within {REQUEST_TIMEOUT:?}"))?
}

/// Asks `GET <path>` until a reply passes `done`, and returns it; panics
/// after `within`, with the last reply.
async fn until(
    addr: SocketAddr,
    path: &str,
    within: Duration,
    done: impl Fn(&Reply) -> bool,
) -> Reply {
    let deadline = Instant::now() + within;
    loop {
        match get(addr, path).await {
            Ok(reply) if done(&reply) => return reply,
            last => assert!(
                Instant::now() < deadline,
                "GET {path}: no awaited reply within {within:?}; last: {last:?}"
            ),
        }
        tokio::time::sleep(50 * MS).await;
    }
}

/// [`until`] the reply's status is `status`.
async fn until_status(addr: SocketAddr, path: &str, status: u16, within: Duration) -> Reply {
    until(addr, path, within, |reply| reply.status == status).await
}

/// The value of the sample of metric `name` with exactly the labels
/// `labels`, in Prometheus's text format, whatever order the exporter
/// prints the labels in.
fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let mut want: Vec<(String, String)> = labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    want.sort();
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .find_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (metric, rest) = series.split_once('{').unwrap_or((series, "}"));
            let mut found: Vec<(String, String)> = rest
                .strip_suffix('}')?
                .split(',')
                .filter(|pair| !pair.is_empty())
                .filter_map(|pair| pair.split_once('='))
                .map(|(k, v)| (k.to_owned(), v.trim_matches('"').to_owned()))
                .collect();
            found.sort();
            (metric == name && found == want)
                .then(|| value.parse().ok())
                .flatten()
        })
}

#[test]
fn samples_are_found_whatever_the_label_order() {
    let text = "# TYPE peerq_tasks_total counter\n\
                peerq_tasks_total{service=\"s\",outcome=\"ok\"} 12\n\
                peerq_tasks_total{service=\"s\",outcome=\"failed\"} 1\n\
                peerq_tasks_total{service=\"t\",outcome=\"ok\"} 3\n";
    let ok = [("outcome", "ok"), ("service", "s")];
    assert_eq!(sample(text, "peerq_tasks_total", &ok), Some(12.0));
    assert_eq!(sample(text, "peerq_tasks", &ok), None);
    assert_eq!(sample(text, "peerq_tasks_total", &[("service", "s")]), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_the_tasks_a_consumer_handled() {
    const N: u64 = 200;
    let server = RedisServer::start();
    let name = unique_name("http-metrics");
    let count = Count::default();
    let instance = Instance::start(&server.url(), &name, count.clone());
    let producer = Producer::connect(&server.url(), &name).await.unwrap();
    let jobs: Vec<Job> = (0..N).map(|seq| Job { seq }).collect();
    producer.enqueue_batch(&jobs).await.unwrap();
    wait_until(Duration::from_secs(30), "every task handled", || {
        count.0.load(Ordering::SeqCst) >= N
    })
    .await;

    let reply = get(instance.addr, "/metrics").await.unwrap();
    assert_eq!(reply.status, 200);
    let assigned = [("outcome", "assigned"), ("service", name.as_str())];
    let rounds = sample(&reply.body, peerq::metrics::ROUNDS_TOTAL, &assigned);
    assert!(rounds.is_some_and(|n| n >= 1.0), "{}", reply.body);
    assert!(
        reply.body.contains("# TYPE peerq_rounds_total counter"),
        "{}",
        reply.body
    );
    // An outcome is counted once the handler returned: scrape until it is.
    // (A run whose ack was lost runs again: compare with the handler's own
    // count, N or, rarely, a little more.)
    let ok = [("outcome", "ok"), ("service", name.as_str())];
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = get(instance.addr, "/metrics").await.unwrap().body;
        let counted = sample(&text, peerq::metrics::TASKS_TOTAL, &ok);
        let handled = count.0.load(Ordering::SeqCst);
        if counted == Some(handled as f64) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "peerq_tasks_total{{outcome=\"ok\",service=\"{name}\"}} is {counted:?}, \
             but the handler ran {handled} times:\n{text}"
        );
        tokio::time::sleep(100 * MS).await;
    }
    instance.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_follows_the_instance_s_access_to_redis() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let name = unique_name("http-ready");
    let instance = Instance::start(&proxy.url(), &name, Count::default());
    let ready = until_status(instance.addr, "/health/ready", 200, Duration::from_secs(15)).await;
    let body = ready.json();
    assert_eq!(body["ready"], true, "{body}");
    assert_eq!(
        (body["index"].as_u64(), body["replicas"].as_u64()),
        (Some(1), Some(1))
    );
    assert!(body["epoch"].as_u64().is_some_and(|e| e > 0), "{body}");

    proxy.cut();
    let cut = Instant::now();
    let unready = until_status(instance.addr, "/health/ready", 503, Duration::from_secs(5)).await;
    println!(
        "unready {:?} after the cut: {}",
        cut.elapsed(),
        unready.body
    );
    let body = unready.json();
    assert_eq!(body["ready"], false, "{body}");
    let reason = body["reason"].as_str().unwrap();
    assert!(
        reason.starts_with("fenced: ") || reason == "lease expired",
        "{reason}"
    );
    // The rounds go on, failing: the instance is still live.
    let live = get(instance.addr, "/health/live").await.unwrap();
    assert_eq!(
        (live.status, live.json()["live"].clone()),
        (200, Value::Bool(true))
    );

    proxy.restore();
    let again = until_status(instance.addr, "/health/ready", 200, Duration::from_secs(15)).await;
    assert_eq!(again.json()["ready"], true);
    instance.shutdown().await;
}

/// A pause stops handling, not serving: the instance stays ready (an
/// orchestrator must not restart paused instances), and `peerq_paused`
/// says it is paused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_instance_is_ready_and_its_metrics_say_paused() {
    let server = RedisServer::start();
    let name = unique_name("http-paused");
    let count = Count::default();
    let instance = Instance::start(&server.url(), &name, count.clone());
    until_status(instance.addr, "/health/ready", 200, Duration::from_secs(15)).await;
    let mut conn = server.pool().get().await.unwrap();
    let key = format!("{{{name}}}:paused");
    let () = deadpool_redis::redis::cmd("SET")
        .arg(&key)
        .arg(r#"{"at_ms":0,"by":"test"}"#)
        .query_async(&mut *conn)
        .await
        .unwrap();
    let service = [("service", name.as_str())];
    let paused = |want: f64| {
        move |reply: &Reply| sample(&reply.body, peerq::metrics::PAUSED, &service) == Some(want)
    };
    until(
        instance.addr,
        "/metrics",
        Duration::from_secs(3),
        paused(1.0),
    )
    .await;
    let producer = Producer::connect(&server.url(), &name).await.unwrap();
    let jobs: Vec<Job> = (0..20).map(|seq| Job { seq }).collect();
    producer.enqueue_batch(&jobs).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(count.0.load(Ordering::SeqCst), 0, "handled while paused");
    let ready = get(instance.addr, "/health/ready").await.unwrap();
    assert_eq!(
        (ready.status, ready.json()["ready"].clone()),
        (200, Value::Bool(true))
    );

    let _: u64 = deadpool_redis::redis::cmd("DEL")
        .arg(&key)
        .query_async(&mut *conn)
        .await
        .unwrap();
    wait_until(Duration::from_secs(5), "the tasks after the resume", || {
        count.0.load(Ordering::SeqCst) >= 20
    })
    .await;
    until(
        instance.addr,
        "/metrics",
        Duration::from_secs(3),
        paused(0.0),
    )
    .await;
    instance.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_while_running_and_closed_once_run_returned() {
    let server = RedisServer::start();
    let name = unique_name("http-live");
    let instance = Instance::start(&server.url(), &name, Count::default());
    let addr = instance.addr;
    let live = until_status(addr, "/health/live", 200, Duration::from_secs(5)).await;
    assert_eq!(live.json(), serde_json::json!({ "live": true }));
    until_status(addr, "/health/ready", 200, Duration::from_secs(15)).await;
    let live = get(addr, "/health/live").await.unwrap();
    assert_eq!(live.status, 200, "{}", live.body);
    assert_eq!(get(addr, "/nothing").await.unwrap().status, 404);

    instance.shutdown().await;
    let after = get(addr, "/health/live").await;
    assert!(after.is_err(), "still served after run returned: {after:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn before_redis_is_reached_the_instance_is_live_but_not_ready() {
    let url = format!("redis://127.0.0.1:{}/", unused_port());
    let instance = Instance::start(&url, &unique_name("http-start"), Count::default());
    let live = until_status(instance.addr, "/health/live", 200, Duration::from_secs(5)).await;
    assert_eq!(live.json()["live"], true);
    let ready = get(instance.addr, "/health/ready").await.unwrap();
    assert_eq!(ready.status, 503);
    assert_eq!(
        ready.json(),
        serde_json::json!({ "ready": false, "reason": "starting" })
    );
    // A stop while Redis cannot be reached ends the run with `Ok`.
    instance.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_consumers_in_one_process_share_the_recorder() {
    let server = RedisServer::start();
    let name = unique_name("http-two");
    let first = Instance::start(&server.url(), &name, Count::default());
    let second = Instance::start(&server.url(), &name, Count::default());
    for instance in [&first, &second] {
        until(
            instance.addr,
            "/health/ready",
            Duration::from_secs(15),
            |reply| reply.status == 200 && reply.json()["replicas"] == 2,
        )
        .await;
    }
    let assigned = [("outcome", "assigned"), ("service", name.as_str())];
    for instance in [&first, &second] {
        let reply = get(instance.addr, "/metrics").await.unwrap();
        assert_eq!(reply.status, 200);
        // The second endpoint found the first one's recorder and serves it:
        // the two instances count into the same series.
        let rounds = sample(&reply.body, peerq::metrics::ROUNDS_TOTAL, &assigned);
        assert!(rounds.is_some_and(|n| n >= 2.0), "{}", reply.body);
    }
    first.shutdown().await;
    second.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_address_in_use_is_refused_naming_http() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let result = Consumer::builder()
        .name(unique_name("http-taken"))
        .redis(format!("redis://127.0.0.1:{}/", unused_port()))
        .http(addr)
        .handler(Count::default())
        .run_until(std::future::pending())
        .await;
    match result {
        Err(Error::InvalidSetting { setting, message }) => {
            assert_eq!(setting, "http");
            assert!(message.contains(&addr.to_string()), "{message}");
        }
        other => panic!("expected an invalid `http` setting, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_serves_its_endpoint_with_http() {
    let server = RedisServer::start();
    let name = unique_name("http-example");
    let addr = SocketAddr::from(([127, 0, 0, 1], unused_port()));
    let child = std::process::Command::new(support::example_binary("mail_sender"))
        .args(["consume", "--redis", &server.url(), "--name", &name])
        .args(["--interval-ms", "300", "--drain-ms", "100"])
        .args(["--http", &addr.to_string()])
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("start the example");
    let child = support::Proc(child);
    let ready = until_status(addr, "/health/ready", 200, Duration::from_secs(15)).await;
    assert_eq!(ready.json()["replicas"], 1, "{}", ready.body);
    let metrics = get(addr, "/metrics").await.unwrap();
    let assigned = [("outcome", "assigned"), ("service", name.as_str())];
    let rounds = sample(&metrics.body, peerq::metrics::ROUNDS_TOTAL, &assigned);
    assert!(rounds.is_some_and(|n| n >= 1.0), "{}", metrics.body);
    drop(child);
}
