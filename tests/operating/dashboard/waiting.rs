//! A partition's waiting entries (issue 42): the entries no instance was
//! given yet, oldest first, 50 to a page with a link to the next, each
//! with its payload shown as a dead letter's is; what the consumer group
//! was given is not listed; a partition the service lacks is a 404. Over
//! HTTP, and in Chromium from a click on the service page's heatmap.

use fantoccini::Locator;
use support::ChromeDriver;

use super::browser::{open, shot, text, until_count};
use super::scale::Fleet;
use super::*;

/// Reads `count` entries of partition `p` as consumer `reader` of the
/// service's group would: they are delivered, no longer waiting.
async fn deliver(fleet: &Fleet, p: u32, count: usize) {
    let mut conn = fleet.server.pool().get().await.unwrap();
    let stream = format!("{{{}/{p}}}:stream", fleet.name);
    let created: redis::RedisResult<()> = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(&stream)
        .arg("peerq")
        .arg("0")
        .arg("MKSTREAM")
        .query_async(&mut *conn)
        .await;
    if let Err(e) = created {
        assert_eq!(e.code(), Some("BUSYGROUP"), "{e}");
    }
    let _: redis::Value = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg("peerq")
        .arg("reader")
        .arg("COUNT")
        .arg(count)
        .arg("STREAMS")
        .arg(&stream)
        .arg(">")
        .query_async(&mut *conn)
        .await
        .unwrap();
}

/// The `<key>-<i>` order numbers of a waiting page's rows, in order.
fn orders(page: &str, key: &str) -> Vec<u32> {
    let table = &page[page.find(r#"<table id="waiting""#).expect("the table")..];
    let table = &table[..table.find("</table>").unwrap()];
    let marker = format!("&quot;order&quot;: &quot;{key}-");
    table
        .match_indices(&marker)
        .map(|(at, _)| {
            let digits: String = table[at + marker.len()..]
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            digits.parse().unwrap()
        })
        .collect()
}

/// The `href` of the link with `id` in `page`, its `&amp;` read back.
fn link(page: &str, id: &str) -> Option<String> {
    let at = page.find(&format!(r#"id="{id}" href=""#))? + id.len() + 12;
    Some(page[at..at + page[at..].find('"')?].replace("&amp;", "&"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitions_waiting_entries_are_paged_oldest_first_with_their_payloads() {
    // No instance runs: every entry waits until the test delivers some.
    let fleet = Fleet::new("dash-waiting", 8).await;
    let p = fleet.backlog("cart", 120).await;
    deliver(&fleet, p, 5).await;
    let addr = fleet.dashboard().await;
    let path = format!("/services/{}/partitions/{p}/waiting", fleet.name);

    let first = get(addr, &path).await;
    assert_eq!(first.status, 200, "{}", first.body);
    // Entries 0 to 4 were delivered: the page starts at the sixth.
    assert_eq!(
        orders(&first.body, "cart"),
        (5..55).collect::<Vec<_>>(),
        "{}",
        first.body
    );
    assert!(
        first.body.contains("Backlog 120, of which 5 delivered"),
        "{}",
        first.body
    );
    // The payload as a dead letter's (pretty JSON), the key and headers,
    // and the task's link.
    assert!(
        first
            .body
            .contains("{\n  &quot;order&quot;: &quot;cart-5&quot;\n}"),
        "{}",
        first.body
    );
    assert!(first.body.contains("source: scale-test"), "{}", first.body);
    assert!(first.body.contains("<td>cart</td>"), "{}", first.body);
    assert!(
        first
            .body
            .contains(&format!(r#"href="/services/{}/task?id={p}%2F"#, fleet.name)),
        "{}",
        first.body
    );
    assert!(!first.body.contains(r#"method="post""#), "read-only");

    let next = link(&first.body, "next").expect("a next page");
    assert!(next.starts_with(&format!("{path}?after=")), "{next}");
    let second = get(addr, &next).await;
    assert_eq!(orders(&second.body, "cart"), (55..105).collect::<Vec<_>>());
    let third = get(addr, &link(&second.body, "next").unwrap()).await;
    assert_eq!(orders(&third.body, "cart"), (105..120).collect::<Vec<_>>());
    assert_eq!(link(&third.body, "next"), None, "the last page");
    assert_eq!(link(&third.body, "first").as_deref(), Some(path.as_str()));

    // Delivered meanwhile: gone from the page that starts before them.
    deliver(&fleet, p, 100).await;
    let again = get(addr, &next).await;
    assert_eq!(orders(&again.body, "cart"), (105..120).collect::<Vec<_>>());

    // Another partition: nothing waits.
    let other = (p + 1) % 8;
    let empty = get(
        addr,
        &format!("/services/{}/partitions/{other}/waiting", fleet.name),
    )
    .await;
    assert_eq!(empty.status, 200);
    assert!(
        empty.body.contains("Nothing waits in this partition."),
        "{}",
        empty.body
    );

    // Partitions the service lacks (of a later generation too), one that
    // is no partition, and an `after` that is no stream id.
    let service = format!("/services/{}/partitions", fleet.name);
    for (page, status) in [
        ("8/waiting", 404),
        ("1.3/waiting", 404),
        ("x/waiting", 404),
        ("3/waiting?after=nope", 400),
    ] {
        let reply = get(addr, &format!("{service}/{page}")).await;
        assert_eq!(reply.status, status, "{page}: {}", reply.body);
    }
    let unknown = get(addr, "/services/no-such-service/partitions/0/waiting").await;
    assert_eq!(unknown.status, 404);
    fleet.shutdown().await;
}

/// Three instances, 64 partitions and a backlog: a click on the heatmap's
/// cell of the largest backlog leads to its waiting entries, oldest first,
/// their payloads shown, 50 to a page, then the next 50.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_clicks_a_cell_and_reads_its_waiting_entries() {
    let mut fleet = Fleet::new("dash-click", 64).await;
    fleet.spawn(3).await;
    fleet.run(30, 0).await;
    // Paused, and instances that start paused read nothing: every entry
    // enqueued now waits, none is held at the gate (delivered).
    fleet.pause().await;
    fleet.stop().await;
    fleet.spawn(3).await;
    let hot = fleet.backlog("hot", 180).await;
    fleet.backlog("warm", 40).await;
    fleet.until_backlog(220).await;
    let addr = fleet.dashboard().await;
    let driver = ChromeDriver::start();
    let c = open(&driver, 1280, 900).await;
    c.goto(&format!("http://{addr}/services/{}", fleet.name))
        .await
        .unwrap();
    until_count(&c, "#partitions a", 64, "a cell per partition").await;
    let selector = format!(r#"#partitions a[href$="/partitions/{hot}/waiting"]"#);
    c.find(Locator::Css(&selector))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let rows = until_count(&c, "#waiting tr", 51, "a page of 50 entries").await;
    let first = rows[1].text().await.unwrap();
    assert!(first.contains("\"order\": \"hot-0\""), "{first}");
    assert!(first.contains("source: scale-test"), "{first}");
    let last = rows[50].text().await.unwrap();
    assert!(last.contains("\"order\": \"hot-49\""), "{last}");
    assert!(
        text(&c, "#partition-state")
            .await
            .contains("Backlog 180, of which 0"),
        "the partition's figures"
    );
    shot(&c, "waiting").await;
    c.find(Locator::Id("next"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let rows = c.find_all(Locator::Css("#waiting tr")).await.unwrap();
        if let Some(row) = rows.get(1)
            && row.text().await.unwrap_or_default().contains("\"hot-50\"")
        {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no second page");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    c.close().await.unwrap();
    fleet.shutdown().await;
}
