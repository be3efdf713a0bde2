//! The dashboard's replay of a dead letter whose unique key another task
//! holds (docs/design.md §16): said on the page it goes back to, the letter
//! kept; once the key is free, replayed.

use peerq::Error;
use peerq::producer::Options;

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_whose_unique_key_is_held_is_refused_saying_so() {
    let world = World::start("dash-unique").await;
    let addr = dashboard(&world, "", Settings::new()).await;
    // The holder waits in the delayed set for a minute.
    let hold = Options::new()
        .unique("order-1")
        .delay(Duration::from_secs(60));
    let order = Order {
        order: "order-1".into(),
    };
    let holder = world.producer.enqueue_with(&order, hold).await.unwrap();
    // A dead letter of an earlier task with the key, as a consumer writes
    // one.
    let p = peerq::partition_of(b"order-1", P);
    let dead = format!("{{{}/{p}}}:dead", world.name);
    let mut conn = world.server.pool().get().await.unwrap();
    let letter: String = redis::cmd("XADD")
        .arg(&dead)
        .arg("*")
        .arg(&[
            ("id", "earlier-task"),
            ("key", "order-1"),
            ("unique", "order-1"),
            ("attempt", "5"),
            ("enqueued_at", "1"),
            ("codec", "json"),
            ("payload", r#"{"order":"order-1"}"#),
            ("reason", "failed"),
            ("error", "warehouse closed"),
            ("stream_id", "1-0"),
            ("dead_at", "2"),
        ])
        .query_async(&mut *conn)
        .await
        .unwrap();
    let page = get(addr, &format!("/services/{}/dead", world.name)).await;
    let form = format!("csrf={}&at={p}%2F{letter}", token(&page.body));
    let path = format!("/services/{}/dead/replay", world.name);
    let refused = post(addr, &path, &form).await;
    assert_eq!(refused.status, 303, "{}", refused.body);
    let back = get(addr, refused.location.as_deref().unwrap()).await;
    let said = format!("unique key `order-1` is held by task {holder}");
    assert!(
        back.body.contains("Not replayed") && back.body.contains(&said),
        "{}",
        back.body
    );
    let kept: usize = redis::cmd("XLEN")
        .arg(&dead)
        .query_async(&mut *conn)
        .await
        .unwrap();
    assert_eq!(kept, 1, "the letter stays");
    // The holder's delayed entry goes (the lock is stale): replayed.
    let _: () = redis::cmd("DEL")
        .arg(format!("{{{}/{p}}}:delayed", world.name))
        .query_async(&mut *conn)
        .await
        .unwrap();
    let replayed = post(addr, &path, &form).await;
    let back = get(addr, replayed.location.as_deref().unwrap()).await;
    assert!(back.body.contains("Replayed"), "{}", back.body);
    let again = Options::new().unique("order-1");
    match world.producer.enqueue_with(&order, again).await {
        Err(Error::Duplicate(held)) => assert_eq!(held.existing.as_str(), "earlier-task"),
        // Or the replayed task ran and freed the key already.
        Ok(_) => {}
        other => panic!("{other:?}"),
    }
    world.shutdown().await;
}
