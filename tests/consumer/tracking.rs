//! Task tracking against a real redis-server (docs/design.md §14): each
//! state a task reaches is in its record, written by the script that moves
//! it; results, progress, `wait`, and a user's cancel of a waiting, delayed
//! or running task.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use peerq::admin::{Admin, Service};
use peerq::handler::{CancelReason, Task};
use peerq::producer::{Options, Producer};
use peerq::tracking::{CancelOutcome, TaskHandle, TaskRecord, TaskState, Tracking, Waited};
use peerq::{Consumer, HandlerError, Json, Periodic};
use serde::{Deserialize, Serialize};
use support::{RedisServer, unique_name};
use tokio_util::sync::CancellationToken;

const P: u32 = 4;
const PATIENCE: Duration = Duration::from_secs(20);
/// The seq of the task that shows an instance runs tasks.
const PROBE: u64 = 999_999;

/// What a task asks its handler to do.
#[derive(Debug, Clone, Serialize, Deserialize)]
enum Job {
    /// Return `{"seq": n}`.
    Succeed(u64),
    /// Fail every attempt.
    Fail(u64),
    /// Succeed after `ms`.
    Work(u64, u64),
    /// Fail its first run, asking for a retry after 1.5 s; then succeed.
    RetryLater(u64),
    /// Fail its first two runs (ever), then succeed.
    FailTwice(u64),
    /// Fail its first run (ever) after `ms`, then succeed after `ms`.
    FailOnce(u64, u64),
    /// Report progress 1, 2, 3, then wait for a cancel; record the reason.
    Hang(u64),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Done {
    seq: u64,
}

/// Each seq's runs: (attempt, cancel reason seen).
type Runs = Arc<Mutex<BTreeMap<u64, Vec<(u32, Option<CancelReason>)>>>>;

fn start(
    url: &str,
    name: &str,
    runs: &Runs,
    ordered: bool,
) -> (
    CancellationToken,
    tokio::task::JoinHandle<peerq::Result<()>>,
) {
    support::init_tracing();
    let runs = runs.clone();
    let service = tower::service_fn(move |task: Task<Job>| {
        let runs = runs.clone();
        async move {
            let cx = task.cx;
            let seq = match task.payload {
                Job::Succeed(seq)
                | Job::Fail(seq)
                | Job::FailTwice(seq)
                | Job::FailOnce(seq, _)
                | Job::Work(seq, _)
                | Job::RetryLater(seq)
                | Job::Hang(seq) => seq,
            };
            let ran = {
                let mut runs = runs.lock().unwrap();
                let seq_runs = runs.entry(seq).or_default();
                seq_runs.push((cx.attempt(), None));
                seq_runs.len()
            };
            match task.payload {
                Job::Succeed(seq) => Ok(Done { seq }),
                Job::Fail(_) => Err(HandlerError::msg("boom")),
                Job::FailTwice(_) if ran <= 2 => Err(HandlerError::msg("not yet")),
                Job::FailOnce(_, ms) => {
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                    match ran {
                        1 => Err(HandlerError::msg("not yet")),
                        _ => Ok(Done { seq }),
                    }
                }
                Job::FailTwice(seq) => Ok(Done { seq }),
                Job::RetryLater(_) if ran == 1 => {
                    Err(HandlerError::msg("later").retry_after(Duration::from_millis(1500)))
                }
                Job::RetryLater(seq) => Ok(Done { seq }),
                Job::Work(seq, ms) => {
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                    Ok(Done { seq })
                }
                Job::Hang(seq) => {
                    for step in 1..=3u8 {
                        cx.progress(&step);
                    }
                    cx.cancelled().await;
                    let reason = cx.cancel_reason();
                    runs.lock()
                        .unwrap()
                        .get_mut(&seq)
                        .unwrap()
                        .last_mut()
                        .unwrap()
                        .1 = reason;
                    Err(HandlerError::msg("stopped"))
                }
            }
        }
    });
    let builder = Consumer::builder()
        .name(name)
        .redis(url)
        .partitions(P)
        .codec(Json)
        .max_attempts(2)
        .backoff(peerq::Backoff::exponential(
            Duration::from_millis(50),
            Duration::from_millis(50),
        ))
        .tracking(Tracking::on())
        .ordered(ordered)
        .periodic(
            Periodic::every("tick", Duration::from_secs(1)),
            &Job::Succeed(1_000),
        )
        .service(service);
    let stop = CancellationToken::new();
    let task = tokio::spawn(builder.run_until(stop.clone().cancelled_owned()));
    (stop, task)
}

mod ordered;
mod races;
mod reshard;
mod retention;

async fn setup() -> (
    RedisServer,
    String,
    Runs,
    CancellationToken,
    tokio::task::JoinHandle<peerq::Result<()>>,
    Producer<Json>,
    Service,
) {
    setup_with(false).await
}

/// With `ordered` partitions (retries in place).
async fn setup_with(
    ordered: bool,
) -> (
    RedisServer,
    String,
    Runs,
    CancellationToken,
    tokio::task::JoinHandle<peerq::Result<()>>,
    Producer<Json>,
    Service,
) {
    let server = RedisServer::start();
    let name = unique_name("tracking");
    let runs = Runs::default();
    let (stop, task) = start(&server.url(), &name, &runs, ordered);
    let admin = Admin::connect(server.url()).await.unwrap();
    // The consumer's start writes `{N}:tracking`; a producer reads it on
    // its first enqueue.
    let mut service = None;
    for _ in 0..200 {
        if let Ok(s) = admin.service(&name).await
            && s.tracking().await.unwrap().is_on()
        {
            service = Some(s);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let service = service.expect("the consumer switched tracking on");
    let producer = producer(&server, &name).await;
    // The instance owns its partitions once a first task ran.
    let probe = producer.enqueue(&Job::Succeed(PROBE)).await.unwrap();
    let probe = producer.handle_of(&probe, None);
    let waited = service.wait(&probe, PATIENCE).await.unwrap();
    assert!(matches!(waited, Waited::Final(_)), "{waited:?}");
    (server, name, runs, stop, task, producer, service)
}

/// A producer of service `name` with the tests' codec.
async fn producer(server: &RedisServer, name: &str) -> Producer<Json> {
    Producer::builder()
        .name(name)
        .redis(server.url())
        .codec(Json)
        .connect()
        .await
        .unwrap()
}

async fn state(service: &Service, handle: &TaskHandle) -> Option<TaskState> {
    service.task(handle).await.unwrap().and_then(|r| r.state)
}

/// The items of list `{N/p}:<list>` of service `name` (`ended`, `ended_at`).
async fn list(
    conn: &mut deadpool_redis::redis::aio::MultiplexedConnection,
    name: &str,
    p: u32,
    list: &str,
) -> Vec<String> {
    deadpool_redis::redis::cmd("LRANGE")
        .arg(format!("{{{name}/{p}}}:{list}"))
        .arg(0)
        .arg(-1)
        .query_async(conn)
        .await
        .unwrap()
}

/// Pauses the service, and waits until its instances have read the pause
/// (within a second): no task starts from then on.
async fn paused(service: &Service) {
    service.pause("test").await.unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
}

async fn wait_for_state(service: &Service, handle: &TaskHandle, want: TaskState) {
    until_record(service, handle, |r| r.state == Some(want)).await;
}

/// Waits until `handle`'s record satisfies `done`.
async fn until_record(service: &Service, handle: &TaskHandle, done: impl Fn(&TaskRecord) -> bool) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let record = service.task(handle).await.unwrap();
        if record.as_ref().is_some_and(&done) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{handle}: {record:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_task_goes_from_waiting_to_succeeded_with_its_result_and_wait_returns_it() {
    let (_server, _name, runs, stop, task, producer, service) = setup().await;
    service.pause("test").await.unwrap();
    // The instance reads the pause within a second.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let id = producer.enqueue(&Job::Succeed(7)).await.unwrap();
    let handle = producer.handle_of(&id, None);
    let record = service
        .task(&handle)
        .await
        .unwrap()
        .expect("a record from the enqueue");
    assert_eq!(record.state, Some(TaskState::Waiting));
    assert_eq!(record.attempt, Some(1));
    // A bare id finds it too.
    let bare = TaskHandle::bare(id.clone());
    assert_eq!(service.task(&bare).await.unwrap().unwrap().handle, handle);
    let waiter = {
        let (service, handle) = (service.clone(), handle.clone());
        tokio::spawn(async move { service.wait(&handle, PATIENCE).await.unwrap() })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    service.resume().await.unwrap();
    let Waited::Final(record) = waiter.await.unwrap() else {
        panic!("wait timed out");
    };
    assert_eq!(record.state, Some(TaskState::Succeeded));
    assert_eq!(
        record.result_as::<Done, _>(&Json).unwrap().unwrap(),
        Done { seq: 7 }
    );
    assert!(record.started_at.is_some() && record.finished_at.is_some());
    assert!(record.instance.is_some() && record.token.is_some());
    assert_eq!(runs.lock().unwrap()[&7].len(), 1);
    stop.cancel();
    task.await.unwrap().unwrap();
}

#[tokio::test]
async fn a_failing_task_is_retrying_then_dead_with_its_reason_and_dead_letter() {
    let (_server, _name, _runs, stop, task, producer, service) = setup().await;
    let id = producer.enqueue(&Job::Fail(1)).await.unwrap();
    let handle = producer.handle_of(&id, None);
    let Waited::Final(record) = service.wait(&handle, PATIENCE).await.unwrap() else {
        panic!("wait timed out");
    };
    assert_eq!(record.state, Some(TaskState::Dead));
    assert_eq!(record.reason.as_deref(), Some("failed"));
    assert_eq!(record.error.as_deref(), Some("boom"));
    let dead_id = record.dead_id.expect("linked to its dead letter");
    let cursor = peerq::dead_letters::Cursor {
        partition: handle.partition().unwrap(),
        id: dead_id,
    };
    let letter = service.dead_letters().get(&cursor).await.unwrap();
    assert!(letter.is_some(), "the dead letter it names exists");
    stop.cancel();
    task.await.unwrap().unwrap();
}

#[tokio::test]
async fn a_delayed_task_is_delayed_until_due_and_a_cancelled_one_never_runs() {
    let (_server, _name, runs, stop, task, producer, service) = setup().await;
    let options = Options::new().delay(Duration::from_secs(2));
    let id = producer
        .enqueue_with(&Job::Succeed(1), options.clone())
        .await
        .unwrap();
    let handle = producer.handle_of(&id, None);
    let record = service.task(&handle).await.unwrap().unwrap();
    assert_eq!(record.state, Some(TaskState::Delayed));
    assert!(record.due_at.is_some());
    let other = producer
        .enqueue_with(&Job::Succeed(2), options)
        .await
        .unwrap();
    let other = producer.handle_of(&other, None);
    assert_eq!(
        service.cancel(&other).await.unwrap(),
        CancelOutcome::Cancelled
    );
    assert_eq!(state(&service, &other).await, Some(TaskState::Cancelled));
    wait_for_state(&service, &handle, TaskState::Succeeded).await;
    // Its due time passed long ago: the cancelled one was promoted and
    // acked without running.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(state(&service, &other).await, Some(TaskState::Cancelled));
    assert!(
        !runs.lock().unwrap().contains_key(&2),
        "a cancelled task never starts"
    );
    // Final: a second cancel leaves it as it is.
    assert_eq!(
        service.cancel(&handle).await.unwrap(),
        CancelOutcome::AlreadyFinal(TaskState::Succeeded)
    );
    stop.cancel();
    task.await.unwrap().unwrap();
}

#[tokio::test]
async fn a_running_task_hears_a_users_cancel_and_ends_cancelled_not_retried() {
    let (server, name, runs, stop, task, producer, service) = setup().await;
    let id = producer.enqueue(&Job::Hang(5)).await.unwrap();
    let handle = producer.handle_of(&id, None);
    wait_for_state(&service, &handle, TaskState::Running).await;
    // Its progress lands (the last value always).
    until_record(&service, &handle, |r| {
        r.progress_as::<u8, _>(&Json)
            .is_some_and(|p| p.unwrap() == 3)
    })
    .await;
    // A message on `{N}:cancels` without a cancel request (anyone who may
    // publish there can send one) stops nothing: the task still runs.
    let record = service.task(&handle).await.unwrap().unwrap();
    let mut conn = server.connection().await;
    let heard: u64 = deadpool_redis::redis::cmd("PUBLISH")
        .arg(format!("{{{name}}}:cancels"))
        .arg(record.handle.to_string())
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(heard, 1, "the instance listens");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(runs.lock().unwrap()[&5], [(1, None)], "not told to stop");
    let record = service.task(&handle).await.unwrap().unwrap();
    assert_eq!(record.state, Some(TaskState::Running));
    let outcome = service.cancel(&handle).await.unwrap();
    assert!(
        matches!(outcome, CancelOutcome::Requested { .. }),
        "{outcome:?}"
    );
    let Waited::Final(record) = service.wait(&handle, PATIENCE).await.unwrap() else {
        panic!("wait timed out");
    };
    assert_eq!(record.state, Some(TaskState::Cancelled));
    assert_eq!(record.reason.as_deref(), Some("user"));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        runs.lock().unwrap()[&5],
        [(1, Some(CancelReason::User))],
        "ran once, told it was a user's cancel, never retried"
    );
    stop.cancel();
    task.await.unwrap().unwrap();
}

#[tokio::test]
async fn a_replayed_task_follows_its_new_run_and_a_periodic_task_has_a_record() {
    let (server, name, _runs, stop, task, producer, service) = setup().await;
    let id = producer.enqueue(&Job::FailTwice(9)).await.unwrap();
    let handle = producer.handle_of(&id, None);
    let Waited::Final(record) = service.wait(&handle, PATIENCE).await.unwrap() else {
        panic!("wait timed out");
    };
    assert_eq!(record.state, Some(TaskState::Dead));
    let letters = service.dead_letters().list(10).await.unwrap();
    assert_eq!(letters.len(), 1);
    assert!(service.dead_letters().replay(&letters[0]).await.unwrap());
    // Its record follows the new run: waiting (or already further), then
    // succeeded at attempt 1 with its result.
    let Waited::Final(record) = service.wait(&handle, PATIENCE).await.unwrap() else {
        panic!("the replayed task did not end");
    };
    assert_eq!(record.state, Some(TaskState::Succeeded));
    assert_eq!(record.attempt, Some(1));
    assert_eq!(record.dead_id, None, "its dead letter is gone");
    assert_eq!(
        record.result_as::<Done, _>(&Json).unwrap().unwrap(),
        Done { seq: 9 }
    );

    // A periodic job's task: its handle is `<p>/cron:<job>:<due ms>`, in
    // the job's partition; find one among the finished records.
    let p = peerq::partition_of(b"tick", P);
    let mut conn = server.connection().await;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let cron = loop {
        // The ended tasks' ids, oldest first.
        let ended = list(&mut conn, &name, p, "ended").await;
        if let Some(id) = ended.into_iter().find(|id| id.starts_with("cron:tick:")) {
            break id;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no periodic task ended"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let record = service
        .task(&format!("{p}/{cron}").parse().unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.state, Some(TaskState::Succeeded));
    assert!(
        record.enqueued_at.is_some(),
        "written by the trigger, not only at the start"
    );
    stop.cancel();
    task.await.unwrap().unwrap();
}

#[tokio::test]
async fn a_failed_attempt_is_retrying_with_its_due_time_and_error_until_its_retry_runs() {
    let (_server, _name, runs, stop, task, producer, service) = setup().await;
    let id = producer.enqueue(&Job::RetryLater(11)).await.unwrap();
    let handle = producer.handle_of(&id, None);
    until_record(&service, &handle, |r| r.state == Some(TaskState::Retrying)).await;
    let record = service.task(&handle).await.unwrap().unwrap();
    assert_eq!(record.attempt, Some(2), "the attempt it runs next");
    assert_eq!(record.error.as_deref(), Some("later"));
    let due = record.due_at.expect("its due time");
    let enqueued = record.enqueued_at.unwrap();
    assert!(
        due > enqueued + Duration::from_secs(1),
        "{due:?} after {enqueued:?}"
    );
    let Waited::Final(record) = service.wait(&handle, PATIENCE).await.unwrap() else {
        panic!("the retried task did not end");
    };
    assert_eq!(record.state, Some(TaskState::Succeeded));
    assert_eq!(record.attempt, Some(2));
    assert_eq!(runs.lock().unwrap()[&11].len(), 2);
    stop.cancel();
    task.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_waits_share_one_pubsub_connection_and_each_hears_its_task() {
    let (server, _name, _runs, stop, task, producer, service) = setup().await;
    paused(&service).await;
    let mut handles = Vec::new();
    for seq in 0..50 {
        let id = producer.enqueue(&Job::Succeed(2_000 + seq)).await.unwrap();
        handles.push(producer.handle_of(&id, None));
    }
    let waits: Vec<_> = handles
        .iter()
        .map(|handle| {
            let (service, handle) = (service.clone(), handle.clone());
            tokio::spawn(async move { service.wait(&handle, PATIENCE).await.unwrap() })
        })
        .collect();
    // Every wait subscribed (the tasks wait: the service is paused).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut conn = server.connection().await;
    let pubsub: String = deadpool_redis::redis::cmd("CLIENT")
        .arg("LIST")
        .arg("TYPE")
        .arg("pubsub")
        .query_async(&mut conn)
        .await
        .unwrap();
    // The consumer's subscription to its cancels, and the waits' one.
    assert_eq!(pubsub.lines().count(), 2, "{pubsub}");
    service.resume().await.unwrap();
    for (wait, handle) in waits.into_iter().zip(&handles) {
        let Waited::Final(record) = wait.await.unwrap() else {
            panic!("{handle} did not end");
        };
        assert_eq!(record.state, Some(TaskState::Succeeded), "{handle}");
    }
    stop.cancel();
    task.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_hears_its_task_end_after_its_pubsub_connection_was_cut() {
    let (server, name, _runs, stop, task, producer, service) = setup().await;
    paused(&service).await;
    let id = producer.enqueue(&Job::Succeed(3_000)).await.unwrap();
    let handle = producer.handle_of(&id, None);
    // The waiter's connections go through a proxy that will cut them.
    let proxy = support::Proxy::start(server.port());
    let through = Admin::connect(proxy.url()).await.unwrap();
    let waiting = through.service(&name).await.unwrap();
    let wait = {
        let handle = handle.clone();
        tokio::spawn(async move { waiting.wait(&handle, PATIENCE).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    proxy.cut();
    tokio::time::sleep(Duration::from_millis(300)).await;
    proxy.restore();
    // Subscribed again (with backoff); then the task runs and ends.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    service.resume().await.unwrap();
    let waited = wait.await.unwrap().unwrap();
    let Waited::Final(record) = waited else {
        panic!("the wait did not hear the end: {waited:?}");
    };
    assert_eq!(record.state, Some(TaskState::Succeeded));
    stop.cancel();
    task.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_enqueued_while_tracking_was_off_has_a_record_from_its_start() {
    let (_server, _name, _runs, stop, task, producer, service) = setup().await;
    service.set_tracking(Tracking::off()).await.unwrap();
    service.pause("test").await.unwrap();
    // The producer and the instance read the switch within a second.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let id = producer.enqueue(&Job::Succeed(4_000)).await.unwrap();
    let handle = producer.handle_of(&id, None);
    assert_eq!(service.task(&handle).await.unwrap(), None, "no record yet");
    service.set_tracking(Tracking::on()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    service.resume().await.unwrap();
    // Its record appears at its start, and ends succeeded.
    until_record(&service, &handle, |r| r.state == Some(TaskState::Succeeded)).await;
    let record = service.task(&handle).await.unwrap().unwrap();
    // Its final record, written whole by the instance that ran it, has
    // its enqueue time from its entry.
    let (enqueued, started) = (record.enqueued_at.unwrap(), record.started_at.unwrap());
    assert!(enqueued <= started, "{enqueued:?} then {started:?}");
    assert!(record.instance.is_some());
    stop.cancel();
    task.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_larger_than_max_result_bytes_is_a_failed_attempt_that_says_so() {
    support::init_tracing();
    let server = RedisServer::start();
    let name = unique_name("big-result");
    let service = tower::service_fn(|_: Task<Job>| async {
        Ok::<String, HandlerError>("a result of more than sixteen bytes".into())
    });
    let stop = CancellationToken::new();
    let run = Consumer::builder()
        .name(&name)
        .redis(server.url())
        .partitions(P)
        .codec(Json)
        .max_attempts(1)
        .max_result_bytes(16)
        .tracking(Tracking::on())
        .service(service)
        .run_until(stop.clone().cancelled_owned());
    let run = tokio::spawn(run);
    let admin = Admin::connect(server.url()).await.unwrap();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let service = loop {
        if let Ok(s) = admin.service(&name).await
            && s.tracking().await.unwrap().is_on()
        {
            break s;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the consumer never started"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let producer = Producer::builder()
        .name(&name)
        .redis(server.url())
        .codec(Json)
        .connect()
        .await
        .unwrap();
    let id = producer.enqueue(&Job::Succeed(1)).await.unwrap();
    let handle = producer.handle_of(&id, None);
    let Waited::Final(record) = service.wait(&handle, PATIENCE).await.unwrap() else {
        panic!("the task did not end");
    };
    assert_eq!(record.state, Some(TaskState::Dead));
    let error = record.error.unwrap_or_default();
    assert!(error.contains("max_result_bytes"), "{error}");
    assert_eq!(record.result, None);
    stop.cancel();
    run.await.unwrap().unwrap();
}
