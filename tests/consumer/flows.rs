//! Chains and flows (docs/design.md §19) with an in-process instance
//! against a real redis-server: a chain's steps run one after the other,
//! each with the result of the one before; a dead step stops the chain; a
//! two-level flow runs each parent after all its children, with their
//! results; a cancelled flow, chain or cancellable batch stops: its
//! members not final are cancelled, its parent (or next step) never runs.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use peerq::admin::{Admin, Service};
use peerq::handler::HandlerWithResult;
use peerq::producer::Flow;
use peerq::tracking::Tracking;
use peerq::{Bincode, Codec, Consumer, HandlerError, TaskContext};
use serde::{Deserialize, Serialize};
use support::{RedisServer, unique_name};
use tokio_util::sync::CancellationToken;

use crate::Instance;

const P: u32 = 4;

#[derive(Debug, Clone, Serialize, Deserialize)]
enum Job {
    /// Returns `n`; fails for good when `fail`.
    Step { n: u64, fail: bool },
    /// A parent or a callback: records what it was given.
    Parent { name: String },
    /// Runs until cancelled (a minute at most), then fails.
    Block { n: u64 },
}

/// What ran, in order.
#[derive(Debug, Clone, PartialEq)]
enum Ran {
    /// A step or a child: its `n`, and the step before's result.
    Step { n: u64, previous: Option<u64> },
    /// A parent: its name, its children's results (sorted), its summary's
    /// total and succeeded.
    Parent {
        name: String,
        results: Vec<u64>,
        total: u64,
        succeeded: u64,
    },
    /// A blocking task started: its `n`.
    Blocked { n: u64 },
}

#[derive(Clone, Default)]
struct Recorder(Arc<Mutex<Vec<Ran>>>);

impl HandlerWithResult for Recorder {
    type Task = Job;
    type Output = u64;
    async fn handle(&self, job: Job, cx: TaskContext) -> Result<u64, HandlerError> {
        let decode = |bytes: &[u8]| Bincode.decode::<u64>(bytes).unwrap();
        match job {
            Job::Step { n, fail } => {
                let previous = cx.previous_result().map(decode);
                self.0.lock().unwrap().push(Ran::Step { n, previous });
                if fail {
                    return Err(HandlerError::msg("this step fails").permanent());
                }
                Ok(n)
            }
            Job::Block { n } => {
                self.0.lock().unwrap().push(Ran::Blocked { n });
                let _ = tokio::time::timeout(Duration::from_secs(60), cx.cancelled()).await;
                Err(HandlerError::msg("stopped"))
            }
            Job::Parent { name } => {
                let mut results: Vec<u64> =
                    cx.batch_results().iter().map(|(_, r)| decode(r)).collect();
                results.sort();
                let summary = cx.batch_summary().expect("a parent has its summary");
                let (total, succeeded) = (summary.total, summary.succeeded);
                let ran = Ran::Parent {
                    name: name.clone(),
                    results: results.clone(),
                    total,
                    succeeded,
                };
                self.0.lock().unwrap().push(ran);
                // A parent's result: the sum of its children's.
                Ok(results.iter().sum::<u64>() + 1000)
            }
        }
    }
}

struct Setup {
    server: RedisServer,
    name: String,
    ran: Recorder,
    instance: Instance,
    producer: peerq::Producer,
}

async fn setup() -> Setup {
    setup_with(false).await
}

/// A service with tracking on when `tracked` (cancels need it), its
/// instance running two tasks at a time.
async fn setup_with(tracked: bool) -> Setup {
    support::init_tracing();
    let server = RedisServer::start();
    let name = unique_name("flows");
    let ran = Recorder::default();
    let mut builder = Consumer::builder()
        .name(&name)
        .redis(server.url())
        .partitions(P)
        .interval(Duration::from_millis(500))
        .drain_timeout(Duration::from_millis(200))
        .concurrency(2);
    if tracked {
        builder = builder.tracking(Tracking::on());
    }
    let builder = builder.handler(ran.clone());
    let stop = CancellationToken::new();
    let task = tokio::spawn(builder.run_until(stop.clone().cancelled_owned()));
    if tracked {
        // The instance writes the tracking it starts with; a producer that
        // enqueued before would enqueue untracked tasks (no records).
        let admin = Admin::connect(&server.url()).await.unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let service = admin.service(&name).await;
            if let Ok(service) = service
                && service.tracking().await.is_ok_and(|t| t.is_on())
            {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "tracking never on");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let producer = crate::producer(&server.url(), &name, P).await;
    Setup {
        server,
        name,
        ran,
        instance: Instance { stop, task },
        producer,
    }
}

impl Setup {
    fn ran(&self) -> Vec<Ran> {
        self.ran.0.lock().unwrap().clone()
    }

    async fn wait_for(&self, what: &str, until: impl Fn(&[Ran]) -> bool) -> Vec<Ran> {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !until(&self.ran()) {
            assert!(
                std::time::Instant::now() < deadline,
                "{what}: {:?}",
                self.ran()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        self.ran()
    }
}

/// Steps `ns` as a chain runs them: each with the one before's result.
fn ran_in_order(ns: std::ops::RangeInclusive<u64>) -> Vec<Ran> {
    ns.map(|n| Ran::Step {
        n,
        previous: (n > 1).then(|| n - 1),
    })
    .collect()
}

fn step(n: u64) -> Job {
    Job::Step { n, fail: false }
}

fn parent(name: &str) -> Job {
    Job::Parent { name: name.into() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chains_steps_run_in_order_each_with_the_result_before() {
    let t = setup().await;
    let chain = t
        .producer
        .chain()
        .step(&step(1))
        .step(&step(2))
        .step(&step(3));
    let id = chain.callback(&parent("done")).enqueue().await.unwrap();
    let ran = t
        .wait_for("the chain's callback", |r| {
            r.iter().any(|r| matches!(r, Ran::Parent { .. }))
        })
        .await;
    let mut expected = ran_in_order(1..=3);
    expected.push(Ran::Parent {
        name: "done".into(),
        results: vec![1, 2, 3],
        total: 3,
        succeeded: 3,
    });
    assert_eq!(ran, expected);
    let admin = Admin::connect(&t.server.url()).await.unwrap();
    let view = admin
        .service(&t.name)
        .await
        .unwrap()
        .batch(&id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (view.steps, view.step, view.stopped),
        (Some(3), Some(3), false)
    );
    t.instance.leave().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_step_stops_the_chain_and_its_state_says_so() {
    let t = setup().await;
    let failing = Job::Step { n: 2, fail: true };
    let chain = t
        .producer
        .chain()
        .step(&step(1))
        .step(&failing)
        .step(&step(3));
    let id = chain.enqueue().await.unwrap();
    let admin = Admin::connect(&t.server.url()).await.unwrap();
    let service = admin.service(&t.name).await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let view = loop {
        let view = service.batch(&id).await.unwrap().unwrap();
        if view.done {
            break view;
        }
        assert!(std::time::Instant::now() < deadline, "{view:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(view.stopped, "{view:?}");
    assert_eq!((view.step, view.succeeded, view.dead), (Some(2), 1, 1));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(t.ran(), ran_in_order(1..=2), "step 3 never runs");
    t.instance.leave().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_two_level_flow_runs_each_parent_after_its_children_with_their_results() {
    let t = setup().await;
    let index = Flow::new(parent("index")).children((1..=5).map(step));
    let flow = Flow::new(parent("report")).subflow(index).child(step(100));
    t.producer.enqueue_flow(&flow).await.unwrap();
    let ran = t
        .wait_for("the top parent", |r| {
            r.iter()
                .any(|r| matches!(r, Ran::Parent { name, .. } if name == "report"))
        })
        .await;
    let at = |want: &dyn Fn(&Ran) -> bool| ran.iter().position(want).unwrap();
    let index_at = at(&|r| matches!(r, Ran::Parent { name, .. } if name == "index"));
    for n in 1..=5 {
        assert!(
            at(&|r| *r == Ran::Step { n, previous: None }) < index_at,
            "chunk {n}"
        );
    }
    assert_eq!(
        ran[index_at],
        Ran::Parent {
            name: "index".into(),
            results: vec![1, 2, 3, 4, 5],
            total: 5,
            succeeded: 5,
        }
    );
    // The report gets the index's result (its children's sum + 1000) and
    // chunk 100's, and runs last.
    assert_eq!(
        ran.last().unwrap(),
        &Ran::Parent {
            name: "report".into(),
            results: vec![100, 1015],
            total: 2,
            succeeded: 2,
        }
    );
    assert_eq!(ran.len(), 8, "each ran once: {ran:?}");
    t.instance.leave().await;
}

fn block(n: u64) -> Job {
    Job::Block { n }
}

impl Setup {
    async fn service(&self) -> Service {
        let admin = Admin::connect(&self.server.url()).await.unwrap();
        admin.service(&self.name).await.unwrap()
    }

    /// The blocking tasks started, sorted.
    fn blocked(&self) -> Vec<u64> {
        let mut ns: Vec<u64> = self
            .ran()
            .iter()
            .filter_map(|r| match r {
                Ran::Blocked { n } => Some(*n),
                _ => None,
            })
            .collect();
        ns.sort();
        ns
    }
}

/// Waits until batch `id` is done; its view.
async fn done(service: &Service, id: &peerq::workflow::BatchId) -> peerq::workflow::BatchView {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let view = service.batch(id).await.unwrap().unwrap();
        if view.done {
            return view;
        }
        assert!(std::time::Instant::now() < deadline, "{view:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Cancelling a flow (its parent) while two of its children run: the
/// running ones stop, every child ends `cancelled` (each ran at most once:
/// one read before the cancel may still start, its `cancelled()` fired),
/// the subflow's parent and the top parent never run, and both batches end
/// done with every member cancelled (the subflow's parent counted
/// `cancelled` in the top batch).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_flow_cancels_its_children_and_subflows_and_its_parent_never_runs() {
    let t = setup_with(true).await;
    let sub = Flow::new(parent("sub")).children((10..=12).map(block));
    let flow = Flow::new(parent("top"))
        .children((1..=6).map(block))
        .subflow(sub);
    let id = t.producer.enqueue_flow(&flow).await.unwrap();
    t.wait_for("two children running", |r| r.len() >= 2).await;
    let service = t.service().await;
    let cancelled = service.cancel_batch(&id).await.unwrap();
    assert!(cancelled.found && !cancelled.was_done, "{cancelled:?}");
    assert_eq!(cancelled.subflows.len(), 1, "{cancelled:?}");
    // Those an instance read (they count as running: its owner stops
    // them) and those still in their streams: all 9.
    let children = cancelled.requested + cancelled.cancelled;
    assert_eq!(children, 9, "{cancelled:?}");
    let top = done(&service, &id).await;
    assert!(top.cancelled_at.is_some(), "{top:?}");
    assert_eq!(
        (top.total, top.cancelled, top.succeeded),
        (7, 7, 0),
        "{top:?}"
    );
    assert_eq!(top.callback, peerq::workflow::CallbackState::None);
    let sub = done(&service, &cancelled.subflows[0]).await;
    assert_eq!((sub.total, sub.cancelled), (3, 3), "{sub:?}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let blocked = t.blocked();
    let mut once = blocked.clone();
    once.dedup();
    assert_eq!(blocked, once, "each child ran at most once");
    assert!(
        !t.ran().iter().any(|r| matches!(r, Ran::Parent { .. })),
        "no parent ran: {:?}",
        t.ran()
    );
    // Cancelling again changes nothing.
    let again = service.cancel_batch(&id).await.unwrap();
    assert_eq!((again.cancelled, again.requested), (0, 0), "{again:?}");
    t.instance.leave().await;
}

/// A flow cancelled before any instance read it (the service paused):
/// once resumed, none of its children, subflows or parents runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flow_cancelled_before_it_started_never_runs() {
    let t = setup_with(true).await;
    let admin = Admin::connect(&t.server.url()).await.unwrap();
    admin
        .service(&t.name)
        .await
        .unwrap()
        .pause("test")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let sub = Flow::new(parent("sub")).children((10..=12).map(step));
    let flow = Flow::new(parent("top"))
        .children((1..=3).map(step))
        .subflow(sub);
    let id = t.producer.enqueue_flow(&flow).await.unwrap();
    let service = t.service().await;
    let cancelled = service.cancel_batch(&id).await.unwrap();
    assert_eq!(
        (cancelled.cancelled, cancelled.requested),
        (6, 0),
        "{cancelled:?}"
    );
    service.resume().await.unwrap();
    let top = done(&service, &id).await;
    assert_eq!((top.total, top.cancelled), (4, 4), "{top:?}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(t.ran(), Vec::new(), "nothing ran");
    t.instance.leave().await;
}

/// A chain cancelled at its second step: that step stops, the third never
/// runs; a cancellable batch's members are cancelled and it takes no more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_chain_stops_at_its_step_and_a_cancelled_batch_takes_no_member() {
    let t = setup_with(true).await;
    let chain = t.producer.chain().step(&step(1)).step(&block(2));
    let id = chain.step(&step(3)).enqueue().await.unwrap();
    t.wait_for("step 2 running", |r| r.contains(&Ran::Blocked { n: 2 }))
        .await;
    let service = t.service().await;
    let cancelled = service.cancel_batch(&id).await.unwrap();
    // Step 2 (running, in the home partition) and step 1 (final).
    assert_eq!((cancelled.requested, cancelled.already_final), (1, 1));
    let view = done(&service, &id).await;
    assert!(view.cancelled_at.is_some() && view.stopped, "{view:?}");
    assert_eq!((view.step, view.succeeded, view.cancelled), (Some(2), 1, 1));

    let open = t.producer.batch().cancellable().open().await.unwrap();
    open.add(&[block(20), block(21), block(22)]).await.unwrap();
    t.wait_for("two members running", |r| {
        r.iter()
            .filter(|r| matches!(r, Ran::Blocked { n } if *n >= 20))
            .count()
            == 2
    })
    .await;
    let cancelled = service.cancel_batch(open.id()).await.unwrap();
    let members = cancelled.requested + cancelled.cancelled;
    assert_eq!(members, 3, "{cancelled:?}");
    let refused = open.add(&[step(23)]).await.unwrap_err();
    assert!(refused.to_string().contains("cancelled"), "{refused}");
    let view = done(&service, open.id()).await;
    assert_eq!((view.total, view.cancelled), (3, 3), "{view:?}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!t.ran().contains(&Ran::Step {
        n: 3,
        previous: None
    }));
    assert!(!t.ran().iter().any(|r| matches!(r, Ran::Step { n: 3, .. })));
    t.instance.leave().await;
}

/// A flow cancelled once its parent was enqueued (every child done): the
/// parent, running, is cancelled as a task and ends `cancelled`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flow_cancelled_after_its_parent_was_enqueued_cancels_the_parent() {
    let t = setup_with(true).await;
    let flow = Flow::new(block(99)).children((1..=3).map(step));
    let id = t.producer.enqueue_flow(&flow).await.unwrap();
    t.wait_for("the parent running", |r| {
        r.contains(&Ran::Blocked { n: 99 })
    })
    .await;
    let service = t.service().await;
    let cancelled = service.cancel_batch(&id).await.unwrap();
    assert!(cancelled.was_done, "{cancelled:?}");
    assert_eq!(cancelled.requested, 1, "the parent: {cancelled:?}");
    let view = service.batch(&id).await.unwrap().unwrap();
    let parent = view.callback_id.expect("the parent was enqueued");
    let handle: peerq::tracking::TaskHandle = format!("{}/{parent}", id.home()).parse().unwrap();
    let ended = service
        .wait(&handle, Duration::from_secs(10))
        .await
        .unwrap();
    let peerq::tracking::Waited::Final(record) = ended else {
        panic!("the parent did not end: {ended:?}");
    };
    assert_eq!(record.state, Some(peerq::tracking::TaskState::Cancelled));
    t.instance.leave().await;
}
