//! The outbox relay through a reshard (docs/design.md §21): rows committed
//! before, during and after a reshard 4 → 8 of an ordered service each run
//! once, each key's in commit order; the relay follows the new layout
//! (its sends into a sealed partition are refused and sent again, its
//! records asked for in the replaced layout).

use peerq::admin::Admin;

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rows_relayed_through_a_reshard_each_run_once_in_commit_order() {
    let world = World::new("outbox-reshard").await;
    let record = Record::default();
    let consumers: Vec<Instance> = (0..2)
        .map(|_| {
            world.consumer(&record, |b| {
                b.partitions(4)
                    .ordered(true)
                    .interval(Duration::from_millis(300))
                    .drain_timeout(Duration::from_millis(100))
            })
        })
        .collect();
    let admin = Admin::connect(world.redis.url().as_str()).await.unwrap();
    let began = std::time::Instant::now();
    let service = loop {
        if let Ok(service) = admin.service(&world.name).await
            && service.status().await.unwrap().members.len() == 2
        {
            break service;
        }
        assert!(began.elapsed() < Duration::from_secs(30), "no consumers");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let relay = world.relay(|r| r.batch(20));
    const KEYS: [&str; 4] = ["user-1", "user-2", "user-3", "user-4"];
    const PER_KEY: u64 = 60;
    for seq in 0..PER_KEY {
        for key in KEYS {
            world.commit(&mail(key, seq), Options::new().key(key)).await;
        }
        if seq == 20 {
            service.reshard(8).await.unwrap();
        }
        // Rows keep coming for about two seconds after the start.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let total = KEYS.len() * PER_KEY as usize;
    wait_until(Duration::from_secs(60), "every task to run", || {
        record.runs().len() >= total
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let runs = record.runs();
    assert_eq!(runs.len(), total, "each once");
    in_commit_order(&runs, &KEYS, PER_KEY);
    let later = runs.iter().filter(|r| r.generation == 1).count();
    assert!(later > 0, "the relay never wrote the new layout");
    let layout = service.layout().await.unwrap();
    assert_eq!((layout.generation, layout.state.as_str()), (1, "open"));
    assert_eq!(world.outbox_rows().await, 0, "relayed rows are deleted");
    relay.stop().await;
    for consumer in consumers {
        consumer.stop().await;
    }
}
