//! The spans a consumer opens (docs/design.md §7), seen by a tracing layer
//! installed in this test process: each handler run in a `task` span with
//! its task id, partition, attempt, epoch and fencing token, inside the
//! instance's `peerq` span with the service and the instance id; and the one
//! stderr line of a consumer started where no subscriber would see them.
//! With feature `otel`, the trace through the queue (`otel`).

// The harness crate, named `support` in every module of this binary.
extern crate peerq_test_support as support;

#[cfg(feature = "otel")]
mod otel;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use peerq::Consumer;
use peerq::handler::Task;
use peerq::producer::Producer;
use serde::{Deserialize, Serialize};
use support::{RedisServer, unique_name, wait_until};
use tokio_util::sync::CancellationToken;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id};
use tracing::{Subscriber, span};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Job {
    seq: u64,
}

/// A span as the layer saw it open: its name and fields, and its
/// ancestors' names and fields, innermost first.
#[derive(Debug, Clone)]
struct Seen {
    name: String,
    fields: BTreeMap<String, String>,
    ancestors: Vec<(String, BTreeMap<String, String>)>,
}

/// Every span opened, with its fields.
#[derive(Default, Clone)]
struct Spans(Arc<Mutex<Vec<Seen>>>);

struct Fields(BTreeMap<String, String>);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
}

/// The fields a span was opened with, kept in its extensions.
struct Opened(BTreeMap<String, String>);

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Spans {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut fields = Fields(BTreeMap::new());
        attrs.record(&mut fields);
        let span = ctx.span(id).expect("just opened");
        let ancestors = span
            .scope()
            .skip(1)
            .map(|s| {
                let fields = s
                    .extensions()
                    .get::<Opened>()
                    .map(|o| o.0.clone())
                    .unwrap_or_default();
                (s.name().to_owned(), fields)
            })
            .collect();
        span.extensions_mut().insert(Opened(fields.0.clone()));
        self.0.lock().unwrap().push(Seen {
            name: attrs.metadata().name().to_owned(),
            fields: fields.0,
            ancestors,
        });
    }

    fn on_record(&self, _: &Id, _: &span::Record<'_>, _: Context<'_, S>) {}
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_runs_in_its_span_inside_the_instances_span() {
    let spans = Spans::default();
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(spans.clone()))
        .expect("the only subscriber of this test process");
    let server = RedisServer::start();
    let name = unique_name("tracing");
    let producer = Producer::connect(&server.url(), &name).await.unwrap();
    let task_id = producer.enqueue(&Job { seq: 7 }).await.unwrap();
    let done = Arc::new(Mutex::new(false));
    let d = done.clone();
    let service = tower::service_fn(move |_task: Task<Job>| {
        let d = d.clone();
        async move {
            *d.lock().unwrap() = true;
            Ok::<(), peerq::HandlerError>(())
        }
    });
    let builder = Consumer::builder()
        .name(&name)
        .redis(server.url())
        .service(service);
    let stop = CancellationToken::new();
    let run = tokio::spawn(builder.run_until(stop.clone().cancelled_owned()));
    wait_until(Duration::from_secs(20), "the task to run", || {
        *done.lock().unwrap()
    })
    .await;
    stop.cancel();
    run.await.unwrap().unwrap();

    let seen = spans.0.lock().unwrap().clone();
    let task = seen
        .iter()
        .find(|s| s.name == "task")
        .unwrap_or_else(|| panic!("no task span among {seen:?}"));
    assert_eq!(task.fields["task_id"], task_id.to_string());
    for field in ["partition", "attempt", "epoch", "token"] {
        let value: u64 = task.fields[field].parse().unwrap();
        assert!(field == "partition" || value > 0, "{field} = {value}");
    }
    assert_eq!(task.fields["attempt"], "1");
    let (_, instance) = task
        .ancestors
        .iter()
        .find(|(name, _)| name == "peerq")
        .unwrap_or_else(|| panic!("the task span is not in the instance's: {task:?}"));
    assert_eq!(instance["service"], name);
    assert!(!instance["instance"].is_empty());
}

/// Set in a child process of this test binary: `none` runs two consumers
/// with no tracing subscriber, `fmt` with one, then the child exits.
const CHILD: &str = "PEERQ_TEST_SUBSCRIBER";

/// What a consumer prints when no subscriber would see its logs.
const HINT: &str = "peerq: no tracing subscriber is installed";

#[test]
fn a_consumer_without_a_subscriber_says_once_how_to_see_its_logs() {
    if let Ok(mode) = std::env::var(CHILD) {
        return consumers_without_redis(&mode);
    }
    // Each mode in its own process: a global subscriber cannot be removed.
    let stderr_of = |mode: &str| {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "a_consumer_without_a_subscriber_says_once_how_to_see_its_logs",
                "--exact",
                "--nocapture",
            ])
            .env(CHILD, mode)
            .output()
            .unwrap();
        assert!(out.status.success(), "{mode}: {out:?}");
        String::from_utf8(out.stderr).unwrap()
    };
    let silent = stderr_of("none");
    let hints: Vec<&str> = silent.lines().filter(|l| l.starts_with(HINT)).collect();
    assert_eq!(hints.len(), 1, "once for two consumers: {silent}");
    assert!(
        hints[0].contains("tracing_subscriber::fmt().init()"),
        "{}",
        hints[0]
    );
    let seen = stderr_of("fmt");
    assert!(!seen.contains(HINT), "with a subscriber: {seen}");
}

/// Starts and stops two consumers on a Redis that is not there.
fn consumers_without_redis(mode: &str) {
    if mode == "fmt" {
        tracing_subscriber::fmt().with_writer(std::io::sink).init();
    }
    let url = format!("redis://127.0.0.1:{}/", support::unused_port());
    let runtime = tokio::runtime::Runtime::new().unwrap();
    for _ in 0..2 {
        let service = tower::service_fn(|_: Task<Job>| async { Ok::<(), peerq::HandlerError>(()) });
        let run = Consumer::builder()
            .name("quiet")
            .redis(&url)
            .service(service)
            .run_until(async {});
        runtime.block_on(run).unwrap();
    }
}
