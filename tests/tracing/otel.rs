//! Trace context through the queue (feature `otel`, docs/design.md §18),
//! with the OpenTelemetry SDK's in-memory exporter as the application's
//! (no collector): a task enqueued inside a span (alone, in a batch) runs
//! in a `task` span of the same trace, a child of that span; a retried task
//! has a span per attempt in that trace, each with its `attempt`; with
//! `TraceJoin::Link`, a task's span starts a trace of its own linked to the
//! producer's; and a task's own `traceparent` header wins. Through the
//! Postgres outbox: `outbox`.

#[cfg(feature = "postgres")]
mod outbox;

use std::time::Duration;

use opentelemetry::trace::{SpanId, TraceId, TracerProvider as _};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use peerq::handler::Task;
use peerq::producer::{Options, Producer};
use peerq::{Consumer, HandlerError, TraceJoin};
use serde::{Deserialize, Serialize};
use support::{RedisServer, unique_name, wait_until};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use tracing_subscriber::layer::SubscriberExt;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Job {
    seq: u64,
}

/// The process's subscriber: a `tracing-opentelemetry` layer exporting to
/// memory. Once per test process (nextest runs each test in its own).
fn install() -> (InMemorySpanExporter, SdkTracerProvider) {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("test"));
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(layer)).unwrap();
    (exporter, provider)
}

/// A consumer whose task 1 fails its first attempt; `join`: how its
/// spans join their producer's trace.
fn consumer(
    url: &str,
    name: &str,
    join: TraceJoin,
) -> (
    CancellationToken,
    tokio::task::JoinHandle<peerq::Result<()>>,
) {
    let service = tower::service_fn(|task: Task<Job>| async move {
        if task.payload.seq == 1 && task.cx.attempt() == 1 {
            return Err(HandlerError::msg("once more").retry_after(Duration::ZERO));
        }
        Ok::<(), HandlerError>(())
    });
    let stop = CancellationToken::new();
    let run = Consumer::builder()
        .name(name)
        .redis(url)
        .partitions(2)
        .trace_join(join)
        .service(service)
        .run_until(stop.clone().cancelled_owned());
    (stop, tokio::spawn(run))
}

fn attribute(span: &SpanData, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| kv.value.to_string())
}

/// The finished `task` spans of seq `seq` (the handler's task id is its
/// only link to the seq: the spans carry `task_id`).
fn task_spans(exporter: &InMemorySpanExporter, ids: &[(u64, String)], seq: u64) -> Vec<SpanData> {
    let id = &ids.iter().find(|(s, _)| *s == seq).unwrap().1;
    exporter
        .get_finished_spans()
        .unwrap()
        .into_iter()
        .filter(|s| s.name == "task" && attribute(s, "task_id").as_ref() == Some(id))
        .collect()
}

/// The trace and the id of the finished span `name` (a producer's).
fn span_ids(exporter: &InMemorySpanExporter, name: &str) -> (TraceId, SpanId) {
    let spans = exporter.get_finished_spans().unwrap();
    let span = spans
        .iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("no span {name}"));
    (span.span_context.trace_id(), span.span_context.span_id())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_runs_in_a_child_of_the_span_that_enqueued_it_a_span_per_attempt() {
    let (exporter, provider) = install();
    let server = RedisServer::start();
    let name = unique_name("otel-child");
    let (stop, running) = consumer(&server.url(), &name, TraceJoin::Child);
    let producer = Producer::builder()
        .name(&name)
        .redis(server.url())
        .partitions(2)
        .connect()
        .await
        .unwrap();
    let request = tracing::info_span!("request");
    let ids: Vec<(u64, String)> = async {
        let mut ids = Vec::new();
        // Alone (1, retried once), and in a batch, plain and scripted (2, 3).
        let one = producer.enqueue(&Job { seq: 1 }).await.unwrap();
        ids.push((1, one.to_string()));
        let batch = vec![
            (Job { seq: 2 }, Options::new()),
            (
                Job { seq: 3 },
                Options::new().delay(Duration::from_millis(50)),
            ),
        ];
        let sent = producer.enqueue_batch_with(&batch).await.unwrap();
        ids.extend([2, 3].into_iter().zip(sent.iter().map(|i| i.to_string())));
        ids
    }
    .instrument(request.clone())
    .await;
    drop(request);
    wait_until(Duration::from_secs(15), "every task's spans", || {
        task_spans(&exporter, &ids, 1).len() == 2
            && task_spans(&exporter, &ids, 2).len() == 1
            && task_spans(&exporter, &ids, 3).len() == 1
    })
    .await;
    stop.cancel();
    running.await.unwrap().unwrap();
    let _ = provider.force_flush();
    let (trace, parent) = span_ids(&exporter, "request");
    for seq in 1..=3 {
        for span in task_spans(&exporter, &ids, seq) {
            assert_eq!(
                span.span_context.trace_id(),
                trace,
                "seq {seq}: the request's trace"
            );
            assert_eq!(
                span.parent_span_id, parent,
                "seq {seq}: a child of the request's span"
            );
            assert!(span.parent_span_is_remote, "seq {seq}: across the queue");
            assert!(
                attribute(&span, "waited_ms").is_some(),
                "seq {seq}: its wait"
            );
        }
    }
    let mut attempts: Vec<String> = task_spans(&exporter, &ids, 1)
        .iter()
        .map(|s| attribute(s, "attempt").unwrap())
        .collect();
    attempts.sort();
    assert_eq!(attempts, vec!["1", "2"], "a span per attempt");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn linked_a_tasks_span_starts_its_own_trace_and_a_tasks_own_traceparent_wins() {
    let (exporter, provider) = install();
    let server = RedisServer::start();
    let name = unique_name("otel-link");
    let (stop, running) = consumer(&server.url(), &name, TraceJoin::Link);
    let producer = Producer::builder()
        .name(&name)
        .redis(server.url())
        .partitions(2)
        .connect()
        .await
        .unwrap();
    let request = tracing::info_span!("fan-out");
    // 2: plain; 4: a traceparent of its own (another system's trace).
    let own = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let ids: Vec<(u64, String)> = async {
        let two = producer.enqueue(&Job { seq: 2 }).await.unwrap();
        let four = producer
            .enqueue_with(&Job { seq: 4 }, Options::new().header("traceparent", own))
            .await
            .unwrap();
        vec![(2, two.to_string()), (4, four.to_string())]
    }
    .instrument(request.clone())
    .await;
    drop(request);
    wait_until(Duration::from_secs(15), "both tasks' spans", || {
        task_spans(&exporter, &ids, 2).len() == 1 && task_spans(&exporter, &ids, 4).len() == 1
    })
    .await;
    stop.cancel();
    running.await.unwrap().unwrap();
    let _ = provider.force_flush();
    let spans = exporter.get_finished_spans().unwrap();
    let request = spans.iter().find(|s| s.name == "fan-out").unwrap();
    let linked = &task_spans(&exporter, &ids, 2)[0];
    assert_ne!(
        linked.span_context.trace_id(),
        request.span_context.trace_id()
    );
    let links: Vec<_> = linked
        .links
        .iter()
        .map(|l| l.span_context.clone())
        .collect();
    assert_eq!(links.len(), 1, "{links:?}");
    assert_eq!(links[0].trace_id(), request.span_context.trace_id());
    assert_eq!(links[0].span_id(), request.span_context.span_id());
    let other = &task_spans(&exporter, &ids, 4)[0];
    let linked_to: Vec<String> = other
        .links
        .iter()
        .map(|l| l.span_context.trace_id().to_string())
        .collect();
    assert_eq!(
        linked_to,
        vec!["0af7651916cd43dd8448eb211c80319c".to_owned()]
    );
}
