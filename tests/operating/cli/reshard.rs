//! `peerq reshard` (docs/design.md §21): refused by name while a consumer
//! that takes no part in a reshard runs (every consumer, until the
//! consumers' part is built), when no consumer runs, when the count is out
//! of range or the one in use, and while another reshard drains; a start
//! writes the next generation, and `status` shows the layout in its table
//! and in its JSON's `layout`.

use super::*;

/// A members record as a consumer that follows reshards writes it, seen
/// now by Redis's clock.
fn capable_member(conn: &mut redis::Connection, name: &str, id: &str) {
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query(conn).unwrap();
    let record = serde_json::json!({
        "id": id, "version": "next", "standing": "assigned",
        "seen_at_ms": secs * 1000 + micros / 1000, "reshard": 1,
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
            "opened_ms"
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
    let old = reshard("8").await;
    assert!(
        old.failure().contains("reshard refused (`member`)") && old.failure().contains(&member),
        "{old:?}"
    );
    stop(consumers).await;
    let idle = reshard("8").await;
    assert!(
        idle.failure().contains("reshard refused (`idle`)"),
        "{idle:?}"
    );

    // A consumer that follows reshards (its record says so): the start
    // writes generation 1, and a second one is refused while it drains.
    let mut conn = server.client().get_connection().unwrap();
    capable_member(&mut conn, &name, "next-1");
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
            && running.failure().contains("generation 1 is still draining"),
        "{running:?}"
    );
    let status = peerq(&url, &["status", "--name", &name, "--json"])
        .await
        .json();
    assert_eq!(status["layout"]["generation"], 1);
    assert_eq!(status["layout"]["state"], "draining");
    assert_eq!(status["layout"]["from_partitions"], P);
    assert!(status["layout"]["started_ms"].as_u64().is_some());
    let table = peerq(&url, &["status", "--name", &name]).await;
    assert!(
        table.ok().contains(&format!(
            "layout: generation 1 (8 partitions), draining from generation 0 ({P} partitions)"
        )),
        "{table:?}"
    );
}
