//! `peerq dead replay` of a dead letter whose unique key another task holds
//! (docs/design.md §16): refused in one line naming the holder, the letter
//! kept; replayed once the key is free.

use peerq::producer::Options;
use peerq::{Error, partition_of};

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_replay_is_refused_while_another_task_holds_the_letters_unique_key() {
    let server = RedisServer::start();
    let (url, name) = (server.url(), unique_name("cli-unique"));
    let producer = Producer::connect(url.as_str(), &name).await.unwrap();
    let holder = producer
        .enqueue_with("a mail", Options::new().unique("invoice-9"))
        .await
        .unwrap();
    // A dead letter of an earlier task with the same key, as a consumer
    // writes one.
    let p = partition_of(b"invoice-9", producer.partitions());
    let mut conn = server.pool().get().await.unwrap();
    let letter: String = redis::cmd("XADD")
        .arg(format!("{{{name}/{p}}}:dead"))
        .arg("*")
        .arg(&[
            ("id", "earlier-task"),
            ("key", "invoice-9"),
            ("unique", "invoice-9"),
            ("attempt", "5"),
            ("enqueued_at", "1"),
            ("codec", "bincode"),
            ("payload", "x"),
            ("reason", "failed"),
            ("error", "boom"),
            ("stream_id", "1-0"),
            ("dead_at", "2"),
        ])
        .query_async(&mut conn)
        .await
        .unwrap();
    let reference = format!("{p}/{letter}");
    let replay = ["dead", "replay", "--name", &name, "--id", &reference];
    let refused = peerq(&url, &replay).await;
    let line = refused.failure();
    assert!(
        line.contains(&format!("unique key `invoice-9` is held by task {holder}")),
        "{line}"
    );
    let kept: usize = redis::cmd("XLEN")
        .arg(format!("{{{name}/{p}}}:dead"))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(kept, 1, "the letter stays");
    // The holder's entry goes (as if it ended without its lock: taken
    // over as stale), so the key is free for the replay.
    let _: () = redis::cmd("DEL")
        .arg(format!("{{{name}/{p}}}:stream"))
        .query_async(&mut conn)
        .await
        .unwrap();
    let replayed = peerq(&url, &replay).await;
    assert_eq!(replayed.code, Some(0), "{replayed:?}");
    match producer
        .enqueue_with("again", Options::new().unique("invoice-9"))
        .await
    {
        Err(Error::Duplicate(held)) => assert_eq!(held.existing.as_str(), "earlier-task"),
        other => panic!("the replayed task holds the key: {other:?}"),
    }
}
