//! `peerq limit show|set|clear` against a consumer in this process: a rate
//! limit and a limit per key set on a running service, one cleared while
//! the other stays, its documented JSON fields, `status`
//! showing it with what waits on it, a bad rate refused as a usage error,
//! and a clear.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limit_sets_shows_and_clears_a_rate_limit_on_a_running_service() {
    let server = RedisServer::start();
    let (url, name) = (server.url(), unique_name("cli-limit"));
    let handler = SendMail::default();
    let consumers = vec![consumer(&url, &name, handler.clone(), false)];
    let shown = until(
        "the service",
        || peerq(&url, &["limit", "show", "--name", &name, "--json"]),
        |_| true,
    )
    .await;
    assert_eq!(
        fields(&shown),
        set(&["name", "rate", "rate_per_key", "concurrency_per_key"])
    );
    assert_eq!(shown["rate_per_key"], Value::Null);
    assert_eq!(shown["rate"], Value::Null);
    assert_eq!(shown["concurrency_per_key"], Value::Null);
    let none = peerq(&url, &["limit", "show", "--name", &name]).await;
    assert_eq!(none.ok(), format!("service {name}: no limits\n"));

    let limited = peerq(
        &url,
        &["limit", "set", "--name", &name, "--rate", "4/1s", "--json"],
    )
    .await
    .json();
    assert_eq!(
        fields(&limited["rate"]),
        set(&["count", "per_ms", "per_second"])
    );
    assert_eq!(limited["rate"]["count"], 4);
    assert_eq!(limited["rate"]["per_ms"], 1000);
    assert_eq!(limited["rate"]["per_second"], 4.0);
    let table = peerq(&url, &["limit", "show", "--name", &name]).await;
    assert_eq!(
        table.ok(),
        format!("service {name}: rate limit 4/1s (4 starts a second, service-wide)\n")
    );
    let both = peerq(
        &url,
        &[
            "limit",
            "set",
            "--name",
            &name,
            "--concurrency-per-key",
            "3",
        ],
    )
    .await;
    assert_eq!(
        both.ok(),
        format!(
            "service {name}: rate limit 4/1s (4 starts a second, service-wide); at most 3 tasks of one key at once\n"
        )
    );
    let per_key = peerq(&url, &["limit", "show", "--name", &name, "--json"])
        .await
        .json();
    assert_eq!(per_key["concurrency_per_key"], 3);
    assert_eq!(per_key["rate"]["count"], 4, "set one, the other stays");
    let keyed = peerq(
        &url,
        &[
            "limit",
            "set",
            "--name",
            &name,
            "--rate-per-key",
            "7/1s",
            "--json",
        ],
    )
    .await
    .json();
    assert_eq!(keyed["rate_per_key"]["count"], 7);
    let unkeyed = peerq(
        &url,
        &[
            "limit",
            "clear",
            "--name",
            &name,
            "--rate-per-key",
            "--json",
        ],
    )
    .await
    .json();
    assert_eq!(unkeyed["rate_per_key"], Value::Null);
    let nothing = peerq(&url, &["limit", "set", "--name", &name]).await;
    assert_eq!(nothing.code, Some(2), "a set names a limit: {nothing:?}");

    // Every instance follows within a second: 20 tasks take about 5 s.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for i in 0..20 {
        let task = format!(r#"{{"to":"m{i}"}}"#);
        peerq(&url, &["enqueue", "--name", &name, "--json", &task])
            .await
            .ok();
    }
    tokio::time::sleep(Duration::from_millis(2000)).await;
    let status = peerq(&url, &["status", "--name", &name, "--json"])
        .await
        .json();
    let rate = &status["limits"]["rate"];
    assert_eq!(
        fields(rate),
        set(&["count", "per_ms", "per_second", "waiting"])
    );
    assert_eq!(rate["count"], 4);
    assert_eq!(status["limits"]["concurrency_per_key"], 3);
    let waiting = rate["waiting"].as_u64().unwrap();
    assert!((5..=19).contains(&waiting), "{waiting} waiting: {status}");
    let sent = handler.sent.load(Ordering::SeqCst);
    assert!(sent <= 14, "{sent} sent within about 2 s at 4/s");
    let table = peerq(&url, &["status", "--name", &name]).await;
    assert!(
        table.ok().contains("limits: rate 4/1000ms service-wide ("),
        "{table:?}"
    );
    assert!(
        table.ok().contains("; at most 3 tasks of one key at once"),
        "{table:?}"
    );

    // A rate that does not read is a usage error, naming what it takes.
    let bad = peerq(&url, &["limit", "set", "--name", &name, "--rate", "fast"]).await;
    assert_eq!(bad.code, Some(2), "{bad:?}");
    assert!(bad.stderr.contains("N/PERIOD"), "{bad:?}");
    let zero = peerq(&url, &["limit", "set", "--name", &name, "--rate", "0/1s"]).await;
    assert!(zero.failure().contains("rate_limit"), "{zero:?}");

    let one = peerq(
        &url,
        &[
            "limit",
            "clear",
            "--name",
            &name,
            "--concurrency-per-key",
            "--json",
        ],
    )
    .await
    .json();
    assert_eq!(one["concurrency_per_key"], Value::Null);
    assert_eq!(one["rate"]["count"], 4, "clear one, the other stays");
    let cleared = peerq(&url, &["limit", "clear", "--name", &name, "--json"])
        .await
        .json();
    assert_eq!(cleared["rate"], Value::Null);
    // The rest run at once.
    let began = Instant::now();
    while handler.sent.load(Ordering::SeqCst) < 20 {
        assert!(began.elapsed() < Duration::from_secs(4), "the rest waited");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop(consumers).await;
}
