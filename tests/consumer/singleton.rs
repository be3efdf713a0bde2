//! Singletons (docs/design.md §20) with in-process consumers against a real
//! redis-server: a job slow to stop ends before the next holder's starts
//! (rule 1), and `peerq status`'s holders follow; a pause stops the job and
//! a resume starts it again; a standalone singleton runs on one instance
//! at a time, moves when its holder leaves, and is refused a consumer's
//! name. (Churn, kills and freezes with processes: the `scenarios`
//! binary; restarts and metrics: the `operating` binary.)

use std::sync::{Arc, Mutex};
use std::time::Duration;

use peerq::admin::Admin;
use peerq::singleton::{Singleton, SingletonContext};
use peerq::{Consumer, Handler, HandlerError, TaskContext};
use support::{RedisServer, unique_name, wait_until};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::Instance;

/// A handler with nothing to do: these services enqueue no task.
struct Nothing;

impl Handler for Nothing {
    type Task = String;
    async fn handle(&self, _: String, _: TaskContext) -> Result<(), HandlerError> {
        Ok(())
    }
}

/// One run of a job: where, with which token, from when to when.
#[derive(Debug, Clone)]
struct Run {
    label: &'static str,
    instance: String,
    token: u64,
    started: Instant,
    ended: Option<Instant>,
}

type Runs = Arc<Mutex<Vec<Run>>>;

/// A job that records its run and, told to stop, takes `linger` more
/// before it returns (a job finishing its step).
fn recording(
    label: &'static str,
    runs: &Runs,
    linger: Duration,
) -> impl Fn(
    SingletonContext,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = std::io::Result<()>> + Send>>
+ Send
+ Sync
+ 'static {
    let runs = runs.clone();
    move |cx: SingletonContext| {
        let runs = runs.clone();
        Box::pin(async move {
            let at = {
                let mut runs = runs.lock().unwrap();
                runs.push(Run {
                    label,
                    instance: cx.instance_id().to_string(),
                    token: cx.fencing_token(),
                    started: Instant::now(),
                    ended: None,
                });
                runs.len() - 1
            };
            cx.cancelled().await;
            tokio::time::sleep(linger).await;
            runs.lock().unwrap()[at].ended = Some(Instant::now());
            Ok(())
        })
    }
}

fn consumer(url: &str, name: &str, label: &'static str, runs: &Runs, linger: Duration) -> Instance {
    support::init_tracing();
    let builder = Consumer::builder()
        .name(name)
        .redis(url)
        .partitions(4)
        .singleton("one", recording(label, runs, linger))
        .handler(Nothing);
    let stop = CancellationToken::new();
    let task = tokio::spawn(builder.run_until(stop.clone().cancelled_owned()));
    Instance { stop, task }
}

/// Waits until a first run has started.
async fn started(runs: &Runs, what: &str) {
    wait_until(Duration::from_secs(10), what, || {
        !runs.lock().unwrap().is_empty()
    })
    .await;
}

/// The admin handle of service `name`.
async fn service(url: &str, name: &str) -> peerq::admin::Service {
    Admin::connect(url)
        .await
        .unwrap()
        .service(name)
        .await
        .unwrap()
}

/// Every run of another instance starts only after the run before it
/// ended; returns the runs in order.
fn one_at_a_time(runs: &Runs) -> Vec<Run> {
    let mut runs = runs.lock().unwrap().clone();
    runs.sort_by_key(|r| r.started);
    for pair in runs.windows(2) {
        let ended = pair[0].ended.unwrap_or_else(|| {
            panic!(
                "{} still runs while {} started: {runs:?}",
                pair[0].label, pair[1].label
            )
        });
        assert!(
            pair[1].started > ended,
            "{} (token {}) started before {} (token {}) ended: {runs:?}",
            pair[1].label,
            pair[1].token,
            pair[0].label,
            pair[0].token
        );
        assert!(pair[1].token > pair[0].token, "tokens go back: {runs:?}");
    }
    runs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_job_slow_to_stop_ends_before_the_next_holder_starts() {
    let server = RedisServer::start();
    let url = server.url();
    let name = unique_name("singleton-move");
    let runs: Runs = Arc::default();
    // 250 ms of the 300 ms drain timeout: started at the cancel, the next
    // holder would overlap it.
    let linger = Duration::from_millis(250);
    let a = consumer(&url, &name, "a", &runs, linger);
    started(&runs, "a runs the job").await;
    let b = consumer(&url, &name, "b", &runs, linger);
    tokio::time::sleep(Duration::from_secs(4)).await;
    let service = service(&url, &name).await;
    // The holder `peerq status` shows is the one running.
    let running = runs
        .lock()
        .unwrap()
        .iter()
        .find(|r| r.ended.is_none())
        .cloned()
        .expect("one instance runs the job");
    let held = service.singletons().await.unwrap();
    assert_eq!(held.len(), 1, "{held:?}");
    assert_eq!(
        (
            held[0].name.as_str(),
            held[0].instance.as_str(),
            held[0].token
        ),
        ("one", running.instance.as_str(), running.token)
    );
    assert!(!held[0].released);
    // The holder leaves: the job moves to the other.
    let (leaving, staying) = match running.label {
        "a" => (a, b),
        _ => (b, a),
    };
    leaving.leave().await;
    wait_until(Duration::from_secs(10), "the job moved", || {
        runs.lock()
            .unwrap()
            .iter()
            .any(|r| r.label != running.label && r.ended.is_none())
    })
    .await;
    staying.leave().await;
    let runs = one_at_a_time(&runs);
    assert!(runs.len() >= 2, "{runs:?}");
    let held = service.singletons().await.unwrap();
    assert!(held[0].released, "the last holder left: {held:?}");
    assert_eq!(held[0].token, runs.last().unwrap().token);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_stops_the_job_and_a_resume_starts_it_again() {
    let server = RedisServer::start();
    let url = server.url();
    let name = unique_name("singleton-pause");
    let runs: Runs = Arc::default();
    let a = consumer(&url, &name, "a", &runs, Duration::ZERO);
    started(&runs, "the job runs").await;
    let service = service(&url, &name).await;
    service.pause("test").await.unwrap();
    wait_until(Duration::from_secs(5), "the pause stops the job", || {
        runs.lock().unwrap()[0].ended.is_some()
    })
    .await;
    // Nothing runs while paused.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(runs.lock().unwrap().len(), 1, "a job started while paused");
    service.resume().await.unwrap();
    wait_until(Duration::from_secs(5), "the resume starts it again", || {
        runs.lock().unwrap().len() == 2
    })
    .await;
    let again = runs.lock().unwrap()[1].clone();
    // Held all along: the same token.
    assert_eq!(again.token, runs.lock().unwrap()[0].token);
    a.leave().await;
}

/// Why a standalone singleton of `name` does not start.
async fn refused(url: &str, name: &str) -> peerq::Error {
    Singleton::builder()
        .name(name)
        .redis(url)
        .run_until(
            |_cx: SingletonContext| async { Ok::<_, std::io::Error>(()) },
            std::future::pending(),
        )
        .await
        .unwrap_err()
}

/// A running standalone singleton: what stops it, and its task.
type Standalone = (
    CancellationToken,
    tokio::task::JoinHandle<peerq::Result<()>>,
);

/// A standalone singleton of `name` until `stop`, its rounds on Redis.
fn standalone(url: &str, name: &str, label: &'static str, runs: &Runs) -> Standalone {
    standalone_on(url, name, label, runs, peerq::Membership::Redis)
}

/// A standalone singleton of `name` until `stop`, its rounds on `membership`.
fn standalone_on(
    url: &str,
    name: &str,
    label: &'static str,
    runs: &Runs,
    membership: peerq::Membership,
) -> Standalone {
    let stop = CancellationToken::new();
    let builder = Singleton::builder().name(name).redis(url);
    let run = builder.membership(membership).run_until(
        recording(label, runs, Duration::ZERO),
        stop.clone().cancelled_owned(),
    );
    (stop, tokio::spawn(run))
}

/// Stops the instance labelled `holder` of `instances`, waits until
/// another runs the job, stops the rest, and checks the job never ran on
/// two at once.
async fn the_job_moves_when_its_holder_leaves(
    runs: &Runs,
    mut instances: Vec<(&'static str, Standalone)>,
    holder: &'static str,
) {
    let at = instances.iter().position(|(l, _)| *l == holder).unwrap();
    let (_, (stop, task)) = instances.remove(at);
    stop.cancel();
    task.await.unwrap().unwrap();
    wait_until(Duration::from_secs(10), "the job moved", || {
        runs.lock()
            .unwrap()
            .iter()
            .any(|r| r.label != holder && r.ended.is_none())
    })
    .await;
    for (_, (stop, task)) in instances {
        stop.cancel();
        task.await.unwrap().unwrap();
    }
    one_at_a_time(runs);
}

/// Singletons whose rounds are on etcd (docs/design.md §2.2): one holder
/// at a time, and the job moves when it leaves.
#[cfg(feature = "etcd")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_singleton_on_etcd_runs_once_and_moves_when_its_holder_leaves() {
    let etcd = support::EtcdCluster::start();
    let server = RedisServer::start();
    let (url, name) = (server.url(), unique_name("etcd-singleton"));
    let runs: Runs = Arc::default();
    let on_etcd = || peerq::Membership::etcd(etcd.endpoints());
    let instances = vec![
        ("a", standalone_on(&url, &name, "a", &runs, on_etcd())),
        ("b", standalone_on(&url, &name, "b", &runs, on_etcd())),
    ];
    started(&runs, "one instance runs the job").await;
    let holder = runs.lock().unwrap()[0].label;
    the_job_moves_when_its_holder_leaves(&runs, instances, holder).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_standalone_singleton_runs_once_and_moves_when_its_holder_leaves() {
    support::init_tracing();
    let server = RedisServer::start();
    let url = server.url();
    let name = unique_name("standalone");
    let runs: Runs = Arc::default();
    let instances = vec![
        ("a", standalone(&url, &name, "a", &runs)),
        ("b", standalone(&url, &name, "b", &runs)),
    ];
    started(&runs, "one instance runs the job").await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let holder = {
        let runs = runs.lock().unwrap();
        let live: Vec<&Run> = runs.iter().filter(|r| r.ended.is_none()).collect();
        assert_eq!(live.len(), 1, "{runs:?}");
        live[0].label
    };
    the_job_moves_when_its_holder_leaves(&runs, instances, holder).await;

    // A consumer's name is refused, naming the setting.
    let taken = unique_name("taken");
    let others: Runs = Arc::default();
    let consumer = consumer(&url, &taken, "c", &others, Duration::ZERO);
    started(&others, "the consumer runs").await;
    let err = refused(&url, &taken).await;
    assert!(
        matches!(&err, peerq::Error::SettingsMismatch(m) if m.settings.iter().any(|d| d.setting == "kind")),
        "{err}"
    );
    consumer.leave().await;

    // A name only producers used is refused too, and nothing is written
    // into its meta (no `kind` that would then refuse its consumers).
    let queue = unique_name("queue");
    let producer = peerq::Producer::connect(url.as_str(), &queue)
        .await
        .unwrap();
    drop(producer);
    let err = refused(&url, &queue).await;
    assert!(
        matches!(
            &err,
            peerq::Error::InvalidSetting {
                setting: "name",
                ..
            }
        ),
        "{err}"
    );
    let mut conn = server.client().get_connection().unwrap();
    let kind: Option<String> = deadpool_redis::redis::cmd("HGET")
        .arg(format!("{{{queue}}}:meta"))
        .arg("kind")
        .query(&mut conn)
        .unwrap();
    assert_eq!(kind, None);
}
