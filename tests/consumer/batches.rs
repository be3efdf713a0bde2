//! Batches (docs/design.md §19) with in-process instances against a real
//! redis-server: a callback runs once, after every member, with the
//! members' counts; members that all end before the seal get their
//! callback at the seal; a batch never sealed expires and sends none; an
//! on-failure callback runs instead when a member died; a dead member
//! replayed after the callback changes the counts and sends no second one;
//! a member a user cancels counts as cancelled; what a batch cannot take is
//! refused by name. (Churn, kills and a Cluster: `tests/scenarios` and
//! `tests/cluster`.)

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use peerq::admin::Admin;
use peerq::dead_letters::DeadLetters;
use peerq::error::BatchRefused;
use peerq::handler::Task;
use peerq::producer::{Options, Producer};
use peerq::tracking::{TaskHandle, Tracking};
use peerq::workflow::{BatchId, BatchSummary, BatchView, CallbackState};
use peerq::{Consumer, Error, HandlerError};
use serde::{Deserialize, Serialize};
use support::{RedisServer, unique_name, wait_until};
use tokio_util::sync::CancellationToken;

use crate::Instance;

const MS: Duration = Duration::from_millis(1);
const P: u32 = 4;

#[derive(Debug, Clone, Serialize, Deserialize)]
enum Job {
    /// Member `m`; fails for good while `fail` says so, blocks until
    /// cancelled with `block`.
    Member {
        m: u64,
        fail: bool,
        block: bool,
    },
    Callback {
        tag: String,
    },
}

/// What ran: each member's runs (and their batch), each callback's runs.
#[derive(Default)]
struct Ran {
    members: BTreeMap<u64, Vec<Option<BatchId>>>,
    callbacks: Vec<(String, BatchSummary)>,
}

type Record = Arc<Mutex<Ran>>;

/// A member with `fail` set fails while `failing` holds it.
type Failing = Arc<Mutex<std::collections::BTreeSet<u64>>>;

fn instance(url: &str, name: &str, record: &Record, failing: &Failing, tracked: bool) -> Instance {
    support::init_tracing();
    let (record, failing) = (record.clone(), failing.clone());
    let service = tower::service_fn(move |task: Task<Job>| {
        let (record, failing) = (record.clone(), failing.clone());
        async move {
            match task.payload {
                Job::Member { m, fail, block } => {
                    let batch = task.cx.batch().cloned();
                    record
                        .lock()
                        .unwrap()
                        .members
                        .entry(m)
                        .or_default()
                        .push(batch);
                    if block {
                        task.cx.cancelled().await;
                    }
                    if fail && failing.lock().unwrap().contains(&m) {
                        return Err(HandlerError::msg("no such mailbox").permanent());
                    }
                }
                Job::Callback { tag } => {
                    let summary = task.cx.batch_summary().cloned().expect("a summary");
                    record.lock().unwrap().callbacks.push((tag, summary));
                }
            }
            Ok::<_, HandlerError>(())
        }
    });
    let mut builder = Consumer::builder()
        .name(name)
        .redis(url)
        .partitions(P)
        .interval(Duration::from_millis(500))
        .drain_timeout(Duration::from_millis(200));
    if tracked {
        builder = builder.tracking(Tracking::on());
    }
    let builder = builder.service(service);
    let stop = CancellationToken::new();
    let task = tokio::spawn(builder.run_until(stop.clone().cancelled_owned()));
    Instance { stop, task }
}

/// A service of its own with one instance (its members with `fail` set
/// fail while `failing` holds them), and its producer.
struct Setup {
    server: RedisServer,
    name: String,
    record: Record,
    failing: Failing,
    instance: Instance,
    producer: Producer,
}

async fn setup(failing: &[u64], tracked: bool) -> Setup {
    let server = RedisServer::start();
    let name = unique_name("batch");
    let (record, failing_now) = (Record::default(), Failing::default());
    failing_now.lock().unwrap().extend(failing);
    let instance = instance(&server.url(), &name, &record, &failing_now, tracked);
    let producer = crate::producer(&server.url(), &name, P).await;
    Setup {
        server,
        name,
        record,
        failing: failing_now,
        instance,
        producer,
    }
}

impl Setup {
    /// The batch's view once `until` holds (within 10 s).
    async fn view_until(&self, id: &BatchId, until: impl Fn(&BatchView) -> bool) -> BatchView {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let view = view(&self.server.url(), &self.name, id).await;
            if until(&view) {
                return view;
            }
            assert!(std::time::Instant::now() < deadline, "{view:?}");
            tokio::time::sleep(20 * MS).await;
        }
    }

    /// Waits for `n` callbacks, then time for one more to show; all of
    /// them.
    async fn callbacks(&self, n: usize) -> Vec<(String, BatchSummary)> {
        let record = &self.record;
        wait_until(10 * 1000 * MS, "the callbacks", || {
            callbacks(record).len() >= n
        })
        .await;
        tokio::time::sleep(500 * MS).await;
        callbacks(record)
    }
}

mod reshard;

fn member(m: u64, fail: bool) -> Job {
    Job::Member {
        m,
        fail,
        block: false,
    }
}

fn callback(tag: &str) -> Job {
    Job::Callback { tag: tag.into() }
}

async fn view(url: &str, name: &str, id: &BatchId) -> BatchView {
    let admin = Admin::connect(url).await.unwrap();
    let service = admin.service(name).await.unwrap();
    service
        .batch(id)
        .await
        .unwrap()
        .expect("the batch's record")
}

/// A summary's total, succeeded, dead and cancelled.
fn counts(s: &BatchSummary) -> (u64, u64, u64, u64) {
    (s.total, s.succeeded, s.dead, s.cancelled)
}

fn callbacks(record: &Record) -> Vec<(String, BatchSummary)> {
    record.lock().unwrap().callbacks.clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_callback_runs_once_after_every_member_with_their_counts() {
    let t = setup(&[3, 7, 11], false).await;
    let members: Vec<Job> = (0..20).map(|m| member(m, m % 4 == 3)).collect();
    let open = t.producer.batch().callback(&callback("report")).open();
    let open = open.await.unwrap();
    let ids = open.add(&members).await.unwrap();
    let id = open.seal().await.unwrap();
    let ran = t.callbacks(1).await;
    assert_eq!(ran.len(), 1, "{ran:?}");
    let (tag, summary) = &ran[0];
    assert_eq!(tag, "report");
    assert_eq!(summary.batch, id);
    let counts = counts(summary);
    assert_eq!(counts, (20, 17, 3, 0));
    let mut dead = summary.dead_ids.clone();
    dead.sort();
    let mut expected = vec![ids[3].clone(), ids[7].clone(), ids[11].clone()];
    expected.sort();
    assert_eq!(dead, expected);
    // Every member ran once, knowing its batch, before the callback.
    let members = t.record.lock().unwrap().members.clone();
    assert_eq!(members.len(), 20);
    for (m, runs) in &members {
        assert_eq!(runs, &vec![Some(id.clone())], "member {m}");
    }
    let view = t.view_until(&id, |_| true).await;
    let counts = (view.total, view.pending, view.succeeded, view.dead);
    assert_eq!((counts, view.cancelled), ((20, 0, 17, 3), 0));
    assert!(view.sealed && view.done && !view.expired, "{view:?}");
    assert_eq!(view.callback, CallbackState::Enqueued);
    assert!(view.callback_id.is_some());
    t.instance.leave().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_that_end_before_the_seal_get_their_callback_at_the_seal() {
    let t = setup(&[], false).await;
    let open = t.producer.batch().callback(&callback("late seal")).open();
    let open = open.await.unwrap();
    let members: Vec<Job> = (0..5).map(|m| member(m, false)).collect();
    open.add(&members).await.unwrap();
    let counted = t.view_until(open.id(), |v| v.succeeded == 5).await;
    assert!(!counted.sealed && !counted.done);
    assert!(
        callbacks(&t.record).is_empty(),
        "no callback before the seal"
    );
    open.seal().await.unwrap();
    let (_, summary) = &t.callbacks(1).await[0];
    assert_eq!((summary.total, summary.succeeded), (5, 5));
    t.instance.leave().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_never_sealed_expires_and_sends_no_callback() {
    let t = setup(&[], false).await;
    let open = t.producer.batch().callback(&callback("never"));
    let open = open.expire_after(Duration::from_secs(1)).open();
    let open = open.await.unwrap();
    open.add(&[member(0, false), member(1, false)])
        .await
        .unwrap();
    // Its members run and count whether it is sealed or not; past its
    // time it is expired (a slow start may come after that: either way).
    let counted = t.view_until(open.id(), |v| v.succeeded == 2).await;
    assert!(!counted.sealed && !counted.done, "{counted:?}");
    let view = t.view_until(open.id(), |v| v.expired).await;
    assert!(!view.sealed && !view.done, "{view:?}");
    let added = open.add(&[member(2, false)]).await;
    let expired = |e: Option<&Error>| matches!(e, Some(Error::Batch(BatchRefused::Expired(_))));
    assert!(expired(added.as_ref().err()), "{added:?}");
    let sealed = open.seal().await;
    assert!(expired(sealed.as_ref().err()), "{sealed:?}");
    tokio::time::sleep(500 * MS).await;
    assert!(callbacks(&t.record).is_empty());
    t.instance.leave().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_on_failure_callback_runs_instead_when_a_member_died() {
    let t = setup(&[1], false).await;
    let builder = || {
        let batch = t.producer.batch().callback(&callback("all ok"));
        batch.on_failure(&callback("some died"))
    };
    let (one_dies, none_dies) = (
        [member(0, true), member(1, true)],
        [member(2, true), member(3, true)],
    );
    let failed = builder().enqueue(&one_dies).await.unwrap();
    let succeeded = builder().enqueue(&none_dies).await.unwrap();
    let ran: BTreeMap<String, (String, u64)> = t
        .callbacks(2)
        .await
        .into_iter()
        .map(|(tag, s)| (s.batch.to_string(), (tag, s.dead)))
        .collect();
    assert_eq!(ran.len(), 2);
    assert_eq!(ran[failed.as_str()], ("some died".to_owned(), 1));
    assert_eq!(ran[succeeded.as_str()], ("all ok".to_owned(), 0));
    t.instance.leave().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_member_replayed_after_the_callback_counts_anew_and_sends_no_second_callback() {
    let t = setup(&[0], false).await;
    let batch = t.producer.batch().callback(&callback("once"));
    let id = batch.enqueue(&[member(0, true), member(1, true)]).await;
    let id = id.unwrap();
    assert_eq!(t.callbacks(1).await.len(), 1);
    let before = t.view_until(&id, |_| true).await;
    assert_eq!((before.succeeded, before.dead), (1, 1));
    // The mailbox exists now: the replayed member succeeds.
    t.failing.lock().unwrap().clear();
    let dead = DeadLetters::connect(&t.server.url(), &t.name)
        .await
        .unwrap();
    let letters = dead.list(10).await.unwrap();
    assert_eq!(letters.len(), 1);
    assert!(dead.replay(&letters[0]).await.unwrap());
    let after = t.view_until(&id, |v| v.succeeded == 2).await;
    assert_eq!((after.pending, after.dead), (0, 0));
    assert_eq!(t.record.lock().unwrap().members[&0].len(), 2, "ran again");
    tokio::time::sleep(500 * MS).await;
    assert_eq!(t.callbacks(1).await.len(), 1, "no second callback");
    t.instance.leave().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_a_user_cancels_counts_as_cancelled() {
    let t = setup(&[], true).await;
    let blocking = Job::Member {
        m: 0,
        fail: false,
        block: true,
    };
    let open = t
        .producer
        .batch()
        .callback(&callback("after cancel"))
        .open();
    let open = open.await.unwrap();
    let ids = open.add(&[blocking, member(1, false)]).await.unwrap();
    open.seal().await.unwrap();
    let record = &t.record;
    wait_until(10 * 1000 * MS, "the blocking member runs", || {
        record.lock().unwrap().members.contains_key(&0)
    })
    .await;
    let admin = Admin::connect(&t.server.url()).await.unwrap();
    let service = admin.service(&t.name).await.unwrap();
    let handle: TaskHandle = ids[0].as_str().parse().unwrap();
    service.cancel(&handle).await.unwrap();
    let (_, summary) = &t.callbacks(1).await[0];
    let counts = counts(summary);
    assert_eq!(counts, (2, 1, 0, 1));
    t.instance.leave().await;
}

#[tokio::test]
async fn what_a_batch_cannot_take_is_refused_by_name() {
    let server = RedisServer::start();
    let name = unique_name("batch");
    let producer = crate::producer(&server.url(), &name, P).await;
    let setting = |e: Error| match e {
        Error::InvalidSetting { setting, .. } => setting,
        other => panic!("{other}"),
    };
    let keyed = producer
        .batch()
        .callback_with(&callback("c"), Options::new().key("k"))
        .open()
        .await
        .unwrap_err();
    assert_eq!(setting(keyed), "key");
    let short = producer
        .batch()
        .expire_after(Duration::ZERO)
        .open()
        .await
        .unwrap_err();
    assert_eq!(setting(short), "expire_after");
    let open = producer.batch().open().await.unwrap();
    for (options, expected) in [
        (Options::new().idempotency_key("i"), "idempotency_key"),
        (Options::new().unique("u"), "unique"),
    ] {
        let added = open.add_with(&[(member(0, false), options)]).await;
        assert_eq!(setting(added.unwrap_err()), expected);
    }
    let id = open.seal().await.unwrap();
    let sealed = producer.batch().open().await.unwrap();
    let sealed_id = sealed.id().clone();
    sealed.seal().await.unwrap();
    assert_ne!(id, sealed_id);
    let bad = "not-a-batch".parse::<BatchId>().unwrap_err();
    assert_eq!(setting(bad), "batch");
}
