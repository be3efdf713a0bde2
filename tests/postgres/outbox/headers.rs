//! A task's headers through the outbox (docs/design.md §18, migration
//! 0005): a row written with `Options::header`, and one another tool wrote
//! with a JSON object in `headers`, run with them; a row whose `headers`
//! is not an object of strings is dead-lettered (reason `relay`), and the
//! rows behind it flow.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rows_headers_reach_the_handler_and_bad_ones_are_dead_lettered() {
    let world = World::new("outbox-headers").await;
    let record = Record::default();
    let consumer = world.consumer(&record, |b| {
        b.ordered(true).outbox_relay(world.pool.clone())
    });
    let key = Options::new().key("user-3");
    let with = world
        .commit(
            &mail("user-3", 1),
            key.clone()
                .header("traceparent", "00-abc-def-01")
                .header("tenant", "acme"),
        )
        .await;
    let insert = |task_id: &'static str, headers: &'static str, seq: u64| {
        let payload = peerq::Bincode.encode(&mail("user-3", seq)).unwrap();
        sqlx::query(
            "INSERT INTO peerq_outbox \
             (service, task_id, lane, partition_key, codec, payload, headers) \
             VALUES ($1, $2, $3, 'user-3', 'bincode', $4, $5)",
        )
        .bind(world.name.clone())
        .bind(task_id)
        .bind(peerq::postgres::lane_of("user-3") as i32)
        .bind(payload)
        .bind(headers)
        .execute(&world.pool)
    };
    use peerq::Codec;
    insert("by-another-tool", r#"{"request-id": "r-9"}"#, 2)
        .await
        .unwrap();
    insert("bad-headers", r#"{"request-id": 9}"#, 3)
        .await
        .unwrap();
    let after = world.commit(&mail("user-3", 4), key).await;
    wait_until(
        Duration::from_secs(30),
        "the rows around the bad one",
        || {
            let counts = record.counts();
            counts.contains_key(&with) && counts.contains_key(&after)
        },
    )
    .await;
    let runs = record.runs();
    let seqs: Vec<u64> = runs.iter().map(|r| r.seq).collect();
    assert_eq!(seqs, vec![1, 2, 4]);
    assert_eq!(runs[0].headers.get("traceparent"), Some("00-abc-def-01"));
    assert_eq!(runs[0].headers.get("tenant"), Some("acme"));
    assert_eq!(runs[1].headers.get("request-id"), Some("r-9"));
    assert!(runs[2].headers.is_empty());
    let letters = world.dead_letters().await;
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].reason, "relay");
    assert!(
        letters[0].error.contains("not a string"),
        "{}",
        letters[0].error
    );
    consumer.stop().await;
}
