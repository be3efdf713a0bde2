//! The connection value's settings: what each kind takes and refuses,
//! and that no password shows.

use super::*;

#[test]
fn a_url_converts_and_shows_without_its_password() {
    let redis = Redis::from("redis://app:s3cret@db:6379/2");
    assert!(matches!(&redis.target, Target::Url(url) if url == "redis://app:s3cret@db:6379/2"));
    assert_eq!(redis.to_string(), "redis://app:***@db:6379/2");
    let debug = format!("{redis:?}");
    assert_eq!(
        debug,
        "Redis { at: redis://app:***@db:6379/2, tls: None, wait_for_replicas: None }"
    );
    let owned = String::from("redis://:s3cret@db/");
    for redis in [Redis::from(&owned), Redis::from(owned.clone())] {
        assert_eq!(redis.to_string(), "redis://:***@db/");
    }
}

#[test]
fn a_cluster_shows_every_seed_without_its_password() {
    let redis = Redis::cluster(["redis://:s3cret@a:7000/", "redis://app:s3cret@b:7001/"])
        .tls(Tls::new())
        .wait_for_replicas(1, Duration::from_millis(100));
    let shown = redis.to_string();
    assert_eq!(
        shown,
        "the Redis Cluster at redis://:***@a:7000/, redis://app:***@b:7001/"
    );
    let debug = format!("{redis:?}");
    assert!(debug.contains(&shown), "{debug}");
    assert!(debug.contains("replicas: 1"), "{debug}");
    assert!(!debug.contains("s3cret"), "{debug}");
}

#[test]
fn a_sentinel_master_shows_without_passwords_and_takes_master_auth_alone() {
    let redis = Redis::sentinel(
        "mymaster",
        ["redis://:s3cret@s1:26379/", "redis://s2:26380/"],
    )
    .master_auth("app", "m4ster");
    let shown = format!("{redis} {redis:?}");
    assert!(
        shown.contains(
            "the Redis Sentinel master `mymaster` at redis://:***@s1:26379/, redis://s2:26380/"
        ),
        "{shown}"
    );
    assert!(
        !shown.contains("s3cret") && !shown.contains("m4ster"),
        "{shown}"
    );
    let backend = redis.backend().unwrap();
    assert!(matches!(backend.servers, Servers::Sentinel(_)));
    assert!(matches!(backend.pubsub, Some(Source::Sentinel(_))));
    let err = Redis::url("redis://db/")
        .master_auth("", "m4ster")
        .backend()
        .unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("invalid setting `master_auth`"), "{msg}");
    assert!(!msg.contains("m4ster"), "{msg}");
    let err = Redis::sentinel("mymaster", Vec::<String>::new())
        .backend()
        .unwrap_err();
    assert!(
        err.to_string().contains("invalid setting `redis_sentinel`"),
        "{err}"
    );
}

#[test]
fn a_pool_shows_nothing_of_its_url_and_refuses_tls_files() {
    let pool = deadpool_redis::Config::from_url("redis://app:s3cret@db/")
        .create_pool(Some(deadpool_redis::Runtime::Tokio1))
        .unwrap();
    let redis = Redis::pool(pool).tls(Tls::new());
    assert_eq!(redis.to_string(), "the given pool");
    let debug = format!("{redis:?}");
    assert!(!debug.contains("s3cret"), "{debug}");
    let msg = redis.backend().unwrap_err().to_string();
    assert!(msg.contains("invalid setting `tls`"), "{msg}");
}

#[test]
fn a_malformed_url_is_refused_without_its_password() {
    let err = Redis::url("redis//:s3cret@db").backend().unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("invalid setting `redis`"), "{msg}");
    assert!(msg.contains(":***@db"), "{msg}");
    assert!(!msg.contains("s3cret"), "{msg}");
}

#[test]
fn tls_settings_with_a_plain_seed_node_are_refused_without_its_password() {
    let redis = Redis::cluster([
        "rediss://:s3cret@127.0.0.1:7000/",
        "redis://:s3cret@127.0.0.1:7001/",
    ])
    .tls(Tls::new());
    let msg = redis.backend().unwrap_err().to_string();
    assert!(msg.contains("invalid setting `tls`"), "{msg}");
    #[cfg(feature = "tls")]
    assert!(
        msg.contains("rediss:// seed URLs; `redis://:***@127.0.0.1:7001/`"),
        "{msg}"
    );
    assert!(!msg.contains("s3cret"), "{msg}");
}

#[test]
fn invalid_values_are_refused_naming_the_setting() {
    let no_seeds = Redis::cluster(Vec::<String>::new()).backend().unwrap_err();
    assert!(
        no_seeds
            .to_string()
            .contains("invalid setting `redis_cluster`"),
        "{no_seeds}"
    );
    let waits = [
        (0, Duration::from_millis(10)),
        (1, Duration::from_micros(500)),
    ];
    for (replicas, timeout) in waits {
        let err = Redis::url("redis://db/")
            .wait_for_replicas(replicas, timeout)
            .backend()
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("invalid setting `wait_for_replicas`"),
            "{err}"
        );
    }
    let err = given(None).unwrap_err();
    assert!(err.to_string().contains("invalid setting `redis`"), "{err}");
}
