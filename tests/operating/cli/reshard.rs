//! `peerq reshard` (docs/design.md §21): refused by name when the count is
//! out of range or the one in use, while a member of a previous version
//! runs (its record lacks `reshard`), while the service tracks tasks (not
//! carried across yet), while another reshard has not settled, and
//! when no consumer runs; a start on a running service writes the next
//! generation, which the consumers open, and `status` shows the layout in
//! its table and in its JSON's `layout`.

use super::*;

/// A members record `id` of a previous version (no `reshard` in it), seen
/// now by Redis's clock.
fn old_member(conn: &mut redis::Connection, name: &str, id: &str) {
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query(conn).unwrap();
    let record = serde_json::json!({
        "id": id, "version": "0.0.9", "standing": "assigned",
        "seen_at_ms": secs * 1000 + micros / 1000,
    });
    let _: () = redis::cmd("HSET")
        .arg(format!("{{{name}}}:members"))
        .arg(id)
        .arg(record.to_string())
        .query(conn)
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reshard_is_refused_by_name_and_status_shows_the_layout() {
    let server = RedisServer::start();
    let (url, name) = (server.url(), unique_name("cli-reshard"));
    let consumers = vec![consumer(&url, &name, SendMail::default(), false)];
    let status = until(
        "a member",
        || peerq(&url, &["status", "--name", &name, "--json"]),
        |s| s["members"].as_array().is_some_and(|m| !m.is_empty()),
    )
    .await;
    assert_eq!(
        fields(&status["layout"]),
        set(&[
            "generation",
            "partitions",
            "state",
            "from_generation",
            "from_partitions",
            "open_epoch",
            "started_ms",
            "opened_ms",
            "replaced",
            "sealed",
            "retired"
        ])
    );
    assert_eq!(status["layout"]["generation"], 0);
    assert_eq!(status["layout"]["partitions"], P);
    assert_eq!(status["layout"]["state"], "settled");
    let member = status["members"][0]["id"].as_str().unwrap().to_owned();

    let reshard = |p: &str| peerq(&url, &["reshard", "--name", &name, "--partitions", p]);
    for p in ["0", "5000"] {
        let ran = reshard(p).await;
        assert!(
            ran.failure().contains("reshard refused (`partitions`)")
                && ran.failure().contains("1 to 4096"),
            "{ran:?}"
        );
    }
    let same = reshard(&P.to_string()).await;
    assert!(
        same.failure().contains("reshard refused (`partitions`)"),
        "{same:?}"
    );
    let mut conn = server.client().get_connection().unwrap();
    old_member(&mut conn, &name, "old-1");
    let old = reshard("8").await;
    assert!(
        old.failure().contains("reshard refused (`member`)")
            && old.failure().contains("old-1")
            && !old.failure().contains(&member),
        "{old:?}"
    );
    let _: () = redis::cmd("HDEL")
        .arg(format!("{{{name}}}:members"))
        .arg("old-1")
        .query(&mut conn)
        .unwrap();

    // The start, on the running service: generation 1, which a second
    // start waits for.
    let started = peerq(
        &url,
        &["reshard", "--name", &name, "--partitions", "8", "--json"],
    )
    .await
    .json();
    assert_eq!(
        fields(&started),
        set(&["name", "generation", "partitions", "from_partitions"])
    );
    assert_eq!(started["generation"], 1);
    assert_eq!(started["partitions"], 8);
    assert_eq!(started["from_partitions"], P);
    let running = reshard("16").await;
    assert!(
        running.failure().contains("reshard refused (`running`)")
            && running.failure().contains("generation 1 is still"),
        "{running:?}"
    );
    let status = peerq(&url, &["status", "--name", &name, "--json"])
        .await
        .json();
    assert_eq!(status["layout"]["generation"], 1);
    assert_eq!(status["layout"]["from_partitions"], P);
    assert!(status["layout"]["started_ms"].as_u64().is_some());
    let table = peerq(&url, &["status", "--name", &name]).await;
    assert!(
        table.ok().contains(&format!(
            "layout: generation 1 (8 partitions), {} from generation 0 ({P} partitions): ",
            status["layout"]["state"].as_str().unwrap()
        )),
        "{table:?}"
    );
    // The consumer retires the old partitions and opens the new ones.
    let open = until(
        "the new layout open",
        || peerq(&url, &["status", "--name", &name, "--json"]),
        |s| s["layout"]["state"] == "open",
    )
    .await;
    assert!(open["layout"]["open_epoch"].as_u64().is_some());
    // Every old partition sealed and retired before the open.
    assert_eq!(open["layout"]["replaced"], P);
    assert_eq!(open["layout"]["sealed"], P);
    assert_eq!(open["layout"]["retired"], P);
    assert!(open["layout"]["opened_ms"].as_u64() >= open["layout"]["started_ms"].as_u64());
    stop(consumers).await;
    // No consumer runs: refused `idle` once the cut-over has settled.
    let deadline = Instant::now() + WITHIN;
    loop {
        let ran = reshard("4").await;
        if ran.failure().contains("reshard refused (`idle`)") {
            break;
        }
        assert!(
            ran.failure().contains("reshard refused (`running`)") && Instant::now() < deadline,
            "{ran:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
