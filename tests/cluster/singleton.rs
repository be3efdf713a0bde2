//! Singletons on the shared Cluster (docs/design.md §20): their records and
//! marks live in the service's slot (`{N}:singletons`, `{N}:transition`),
//! wherever its partitions are; two instances hold one singleton one at a
//! time, it moves when its holder leaves, and the admin's holders follow.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use peerq::Redis;
use peerq::admin::Admin;
use peerq::singleton::SingletonContext;
use support::{RedisCluster, unique_name, wait_until};
use tokio::time::Instant;

use super::{Instance, Recorder};

/// Each run of the job: its instance, token, start and end.
type Runs = Arc<Mutex<Vec<(usize, u64, Instant, Option<Instant>)>>>;

fn start(cluster: &RedisCluster, name: &str, instance: usize, runs: &Runs) -> Instance {
    let runs = runs.clone();
    Instance::start_with(cluster, name, Recorder::default(), move |builder| {
        builder.singleton("compactor", move |cx: SingletonContext| {
            let runs = runs.clone();
            async move {
                let at = {
                    let mut runs = runs.lock().unwrap();
                    runs.push((instance, cx.fencing_token(), Instant::now(), None));
                    runs.len() - 1
                };
                cx.cancelled().await;
                runs.lock().unwrap()[at].3 = Some(Instant::now());
                Ok::<_, std::io::Error>(())
            }
        })
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_singleton_moves_between_instances_on_a_cluster() {
    let cluster = RedisCluster::shared();
    let name = unique_name("cluster-singleton");
    let runs: Runs = Arc::default();
    let first = start(cluster, &name, 1, &runs);
    let second = start(cluster, &name, 2, &runs);
    wait_until(Duration::from_secs(15), "the singleton runs", || {
        !runs.lock().unwrap().is_empty()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (holder, token) = {
        let runs = runs.lock().unwrap();
        let live: Vec<_> = runs.iter().filter(|r| r.3.is_none()).collect();
        assert_eq!(live.len(), 1, "{runs:?}");
        (live[0].0, live[0].1)
    };
    let admin = Admin::connect(Redis::cluster(cluster.seed_urls()))
        .await
        .unwrap();
    let service = admin.service(&name).await.unwrap();
    let held = service.singletons().await.unwrap();
    assert_eq!((held.len(), held[0].token), (1, token), "{held:?}");
    let (leaving, staying) = match holder {
        1 => (first, second),
        _ => (second, first),
    };
    leaving.shutdown().await;
    wait_until(Duration::from_secs(15), "the singleton moved", || {
        runs.lock()
            .unwrap()
            .iter()
            .any(|r| r.0 != holder && r.3.is_none())
    })
    .await;
    staying.shutdown().await;
    let mut runs = runs.lock().unwrap().clone();
    runs.sort_by_key(|r| r.2);
    for pair in runs.windows(2) {
        let ended = pair[0].3.expect("every run ended");
        assert!(pair[1].2 > ended && pair[1].1 > pair[0].1, "{runs:?}");
    }
    let held = service.singletons().await.unwrap();
    assert!(held[0].released, "{held:?}");
}
