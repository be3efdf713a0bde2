//! Trace context through the Postgres outbox (features `otel` and
//! `postgres`, docs/design.md §18): a row written inside a span carries
//! that span's context, and the task its relay sends runs in a `task` span
//! that is a child of it, in its trace.

use peerq::postgres::Outbox;
use sqlx::PgPool;
use support::PostgresServer;

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_enqueued_through_the_outbox_runs_in_a_child_of_the_span_that_wrote_it() {
    let (exporter, provider) = install();
    let db = tokio::task::spawn_blocking(|| PostgresServer::shared().database())
        .await
        .unwrap();
    let pool = PgPool::connect_with(db.options()).await.unwrap();
    peerq::postgres::migrate(&pool).await.unwrap();
    let server = RedisServer::start();
    let name = unique_name("otel-outbox");
    let service = tower::service_fn(|_: Task<Job>| async { Ok::<(), HandlerError>(()) });
    let stop = CancellationToken::new();
    let running = tokio::spawn(
        Consumer::builder()
            .name(&name)
            .redis(server.url())
            .partitions(2)
            .outbox_relay(pool.clone())
            .service(service)
            .run_until(stop.clone().cancelled_owned()),
    );

    let request = tracing::info_span!("checkout");
    let id = async {
        let mut tx = pool.begin().await.unwrap();
        let id = Outbox::enqueue(&mut tx, &name, &Job { seq: 5 }, Options::new())
            .await
            .unwrap();
        tx.commit().await.unwrap();
        id.to_string()
    }
    .instrument(request.clone())
    .await;
    drop(request);
    let ids = [(5, id)];
    wait_until(Duration::from_secs(30), "the relayed task's span", || {
        task_spans(&exporter, &ids, 5).len() == 1
    })
    .await;
    stop.cancel();
    running.await.unwrap().unwrap();
    let _ = provider.force_flush();
    let (trace, parent) = span_ids(&exporter, "checkout");
    let task = &task_spans(&exporter, &ids, 5)[0];
    assert_eq!(task.span_context.trace_id(), trace, "the writer's trace");
    assert_eq!(task.parent_span_id, parent, "a child of the writer's span");
    assert!(
        task.parent_span_is_remote,
        "across the outbox and the queue"
    );
}
