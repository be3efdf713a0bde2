//! A reshard's move against a real redis-server: a user's cancel that
//! lands between the two steps keeps the source, and the next move carries
//! it.

use super::*;
use crate::instance::InstanceId;

#[tokio::test]
async fn a_cancel_between_the_steps_is_carried_by_the_next_move() {
    let (server, conn, name) = super::super::tests::setup().await;
    let store = PartitionStore::new(conn.clone(), &name, 0, 1, &InstanceId::generate(), 1 << 20);
    let mut raw = server.pool().get().await.unwrap();
    // A delayed task of partition 0 with its record, no cancel request.
    let _: () = redis::cmd("EVAL")
        .arg("redis.call('ZADD', KEYS[1], 100, cmsgpack.pack({'id', 't1', 'p', 'x'}))")
        .arg(1)
        .arg(keys::delayed(&name, 0))
        .query_async(&mut raw)
        .await
        .unwrap();
    let tasks = keys::tasks(&name, 0);
    let _: () = redis::cmd("HSET")
        .arg(&tasks)
        .arg("t1")
        .arg("delayed-record")
        .query_async(&mut raw)
        .await
        .unwrap();
    let from = Generation {
        number: 0,
        partitions: 1,
    };
    let to = Generation {
        number: 1,
        partitions: 1,
    };
    let dest = 1 << 16;
    let member: Vec<Vec<u8>> = redis::cmd("ZRANGE")
        .arg(keys::delayed(&name, 0))
        .arg(0)
        .arg(-1)
        .query_async(&mut raw)
        .await
        .unwrap();
    let fields = crate::entry::unpack_strings(&member[0]).unwrap();
    let mut moving = [(Moving::new("delayed", &member[0], fields), 100)];
    store.read_records(&mut moving).await.unwrap();
    store.move_in(&moving[0].0, dest, 100).await.unwrap();
    // The cancel lands in the source between the steps.
    let _: () = redis::cmd("HSET")
        .arg(&tasks)
        .arg("t1")
        .arg("cancelled-record")
        .query_async(&mut raw)
        .await
        .unwrap();
    let _: () = redis::cmd("ZADD")
        .arg(keys::cancel_requests(&name, 0))
        .arg(5)
        .arg("t1")
        .query_async(&mut raw)
        .await
        .unwrap();
    assert!(
        !store.let_go(&moving[0].0).await.unwrap(),
        "the source changed: kept"
    );
    let kept: usize = redis::cmd("ZCARD")
        .arg(keys::delayed(&name, 0))
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(kept, 1);
    // The next look moves it again, with the cancel.
    assert_eq!(store.move_out(from, to).await.unwrap(), 1);
    let record: Option<String> = redis::cmd("HGET")
        .arg(keys::tasks(&name, dest))
        .arg("t1")
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(record.as_deref(), Some("cancelled-record"));
    let request: Option<u64> = redis::cmd("ZSCORE")
        .arg(keys::cancel_requests(&name, dest))
        .arg("t1")
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(request, Some(5));
    let (left, record): (usize, Option<String>) = redis::pipe()
        .cmd("ZCARD")
        .arg(keys::delayed(&name, 0))
        .cmd("HGET")
        .arg(&tasks)
        .arg("t1")
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!((left, record), (0, None), "the source let go");
}
