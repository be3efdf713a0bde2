//! `wait` latency: from a handler's return to `Service::wait` returning
//! the task's final record, the waiter subscribed before the handler
//! returned.
//!
//! One tracked instance; its handler returns the small result `Done { seq
//! }` once the bench lets it, noting the instant just before it returns.
//! [`LANES`] lanes run side by side, each with a partition of its own (its
//! tasks are enqueued with a partition key that lands there), one task at
//! a time: enqueue; call `wait` in a task of its own; see the partition's
//! `{N/p}:final` subscribed (`PUBSUB NUMSUB` 1: every wait of one `Admin`
//! shares one pub/sub connection, and a channel stays subscribed, so only
//! a lane's first wait subscribes), and give the wait a moment to read the
//! record; let the handler return; note when `wait` returned. So the time covers the ack
//! (batched by the instance's acker), `fenced_ack.lua` writing `succeeded`
//! and publishing, the message's way to the waiter and `wait`'s read of
//! the record.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use deadpool_redis::redis::{self, aio::MultiplexedConnection};
use peerq::admin::{Admin, Service};
use peerq::handler::Task;
use peerq::producer::{Options, Producer};
use peerq::tracking::{Tracking, Waited};
use peerq::{Bincode, Consumer, HandlerError, partition_of};
use support::{RedisServer, unique_name};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use crate::{Done, PATIENCE, Quantiles, job, service_of, wait_assigned};

/// Waits underway at once.
const LANES: u64 = 4;
/// How often the bench asks whether a wait has subscribed.
const SUBSCRIBED_POLL: Duration = Duration::from_millis(1);

/// Each task's gate, which the handler waits on, by seq.
type Gates = Arc<Mutex<HashMap<u64, oneshot::Receiver<()>>>>;
/// When each task's handler returned, by seq.
type Returned = Arc<Mutex<HashMap<u64, Instant>>>;

/// What the run measured.
pub(crate) struct Waits {
    /// Handler return → `wait` returned.
    latency: Quantiles,
    /// `wait` called → seen subscribed (to the next 1-ms poll).
    subscribed: Quantiles,
}

pub(crate) async fn run(
    server: &RedisServer,
    admin: &Admin,
    conn: &mut MultiplexedConnection,
    waits: u64,
) -> Waits {
    let name = unique_name("wait");
    let gates: Gates = Arc::default();
    let returned: Returned = Arc::default();
    let handler = {
        let (gates, returned) = (gates.clone(), returned.clone());
        tower::service_fn(move |task: Task<crate::Job>| {
            let (gates, returned) = (gates.clone(), returned.clone());
            async move {
                let seq = task.payload.seq;
                let gate = gates.lock().unwrap().remove(&seq);
                if let Some(gate) = gate {
                    let _ = gate.await;
                }
                returned.lock().unwrap().insert(seq, Instant::now());
                Ok::<Done, HandlerError>(Done { seq })
            }
        })
    };
    let stop = CancellationToken::new();
    let consumer = Consumer::builder()
        .name(&name)
        .redis(server.url())
        .tracking(Tracking::on())
        .service(handler);
    let run = tokio::spawn(consumer.run_until(stop.clone().cancelled_owned()));
    let service = service_of(admin, &name).await;
    wait_assigned(&service, 1).await;
    assert!(service.tracking().await.unwrap().is_on());
    let producer = Arc::new(Producer::connect(&server.url(), &name).await.unwrap());

    // A partition key per lane, each landing in a partition of its own.
    let mut taken = HashSet::new();
    let mut keys = Vec::new();
    for lane in 0..LANES {
        let key = (0..)
            .map(|k| format!("lane-{lane}-{k}"))
            .find(|key| taken.insert(partition_of(key.as_bytes(), producer.partitions())))
            .unwrap();
        keys.push(key);
    }
    let per_lane = waits.div_ceil(LANES);
    let mut lanes = Vec::new();
    for (i, key) in keys.into_iter().enumerate() {
        let lane = Lane {
            service: service.clone(),
            producer: producer.clone(),
            conn: conn.clone(),
            gates: gates.clone(),
            returned: returned.clone(),
            key,
        };
        let first = i as u64 * per_lane;
        lanes.push(tokio::spawn(lane.run(first..first + per_lane)));
    }
    let (mut latencies, mut subscribed) = (Vec::new(), Vec::new());
    for lane in lanes {
        let (l, s) = lane.await.unwrap();
        latencies.extend(l);
        subscribed.extend(s);
    }
    stop.cancel();
    run.await.unwrap().unwrap();
    Waits {
        latency: Quantiles::of(latencies),
        subscribed: Quantiles::of(subscribed),
    }
}

/// One lane: its partition key, and what its tasks share.
struct Lane {
    service: Service,
    producer: Arc<Producer>,
    conn: MultiplexedConnection,
    gates: Gates,
    returned: Returned,
    key: String,
}

impl Lane {
    /// Tasks `seqs`, one after the other: each one's latency, and how long
    /// its `wait` took to subscribe.
    async fn run(mut self, seqs: std::ops::Range<u64>) -> (Vec<Duration>, Vec<Duration>) {
        let (mut latencies, mut subscribed) = (Vec::new(), Vec::new());
        for seq in seqs {
            let (go, gate) = oneshot::channel();
            self.gates.lock().unwrap().insert(seq, gate);
            let options = Options::new().key(&self.key);
            let id = self
                .producer
                .enqueue_with(&job(seq), options)
                .await
                .unwrap();
            let handle = self.producer.handle_of(&id, Some(&self.key));
            let channel = format!(
                "{{{}/{}}}:final",
                self.service.name(),
                handle.partition().unwrap()
            );
            let called = Instant::now();
            let waiting = {
                let service = self.service.clone();
                tokio::spawn(async move {
                    let waited = service.wait(&handle, PATIENCE).await.unwrap();
                    (waited, Instant::now())
                })
            };
            self.until_subscribers(&channel, 1).await;
            subscribed.push(called.elapsed());
            // The channel is subscribed (the shared connection's, once for
            // the lane): a moment for this wait to listen and read.
            tokio::time::sleep(Duration::from_millis(2)).await;
            go.send(()).unwrap();
            let (waited, at) = waiting.await.unwrap();
            let Waited::Final(record) = waited else {
                panic!("task {seq} did not end: {waited:?}");
            };
            let result: Done = record.result_as(&Bincode).unwrap().unwrap();
            assert_eq!(result, Done { seq });
            let returned = self.returned.lock().unwrap().remove(&seq).unwrap();
            latencies.push(at.saturating_duration_since(returned));
        }
        (latencies, subscribed)
    }

    /// Waits until `channel` has `n` subscribers.
    async fn until_subscribers(&mut self, channel: &str, n: u64) {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let (_, count): (String, u64) = redis::cmd("PUBSUB")
                .arg("NUMSUB")
                .arg(channel)
                .query_async(&mut self.conn)
                .await
                .unwrap();
            if count == n {
                return;
            }
            assert!(Instant::now() < deadline, "{channel}: {count} subscribers");
            tokio::time::sleep(SUBSCRIBED_POLL).await;
        }
    }
}

impl Waits {
    pub(crate) fn print(&self) {
        println!(
            "| `wait`: 1 instance, {LANES} waits underway at once, sharing one pub/sub connection ({} tasks) | p50 / p99 / max |",
            self.latency.n
        );
        println!("|---|---|");
        println!(
            "| handler return → `wait` returned the final record | **{}** |",
            self.latency.ms()
        );
        println!(
            "| `wait` called → its channel seen subscribed (only a lane's first wait subscribes; 1-ms polls of `PUBSUB NUMSUB`) | {} |",
            self.subscribed.ms()
        );
        println!();
    }
}
