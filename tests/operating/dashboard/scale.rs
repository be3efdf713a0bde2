//! The service page at scale (issue 42): at P = 1,024 the partitions are
//! one heatmap of 1,024 cells, not a wall of cards, and the page stays
//! small; the last hour's tasks per minute are charted and the backlog is
//! a figure. `Fleet` runs several instances of one service, for this file,
//! `dashboard/waiting.rs` and the browser's walk from a cell to its
//! waiting entries (`dashboard/browser.rs`).

use peerq::Options;

use super::*;

/// Handles orders: `broken-…` ones fail for good (a dead letter at once),
/// the others succeed.
#[derive(Clone, Default)]
pub(super) struct Sort {
    ok: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
}

impl Handler for Sort {
    type Task = Order;
    async fn handle(&self, order: Order, _cx: TaskContext) -> Result<(), HandlerError> {
        if order.order.starts_with("broken") {
            self.failed.fetch_add(1, Ordering::SeqCst);
            return Err(HandlerError::msg("broken order").permanent());
        }
        self.ok.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

/// Instances of one service on a Redis of their own, and its producer.
pub(super) struct Fleet {
    pub(super) server: RedisServer,
    pub(super) name: String,
    pub(super) partitions: u32,
    pub(super) producer: Producer<Json>,
    pub(super) admin: Admin,
    sort: Sort,
    stop: CancellationToken,
    consumers: Vec<JoinHandle<peerq::Result<()>>>,
}

impl Fleet {
    /// Service `prefix-…` of `partitions` partitions, recorded by its
    /// producer; no instance runs yet.
    pub(super) async fn new(prefix: &str, partitions: u32) -> Fleet {
        support::init_tracing();
        let server = RedisServer::start();
        let name = unique_name(prefix);
        let producer = Producer::builder()
            .name(&name)
            .redis(server.url())
            .partitions(partitions)
            .codec(Json)
            .connect()
            .await
            .unwrap();
        let admin = Admin::connect(&server.url()).await.unwrap();
        Fleet {
            server,
            name,
            partitions,
            producer,
            admin,
            sort: Sort::default(),
            stop: CancellationToken::new(),
            consumers: Vec::new(),
        }
    }

    /// Starts `instances` instances, and waits until every partition has a
    /// live owner.
    pub(super) async fn spawn(&mut self, instances: usize) {
        for _ in 0..instances {
            self.consumers.push(tokio::spawn(
                Consumer::builder()
                    .name(&self.name)
                    .redis(self.server.url())
                    .partitions(self.partitions)
                    .interval(Duration::from_millis(500))
                    .drain_timeout(Duration::from_millis(100))
                    .codec(Json)
                    .handler(self.sort.clone())
                    .run_until(self.stop.clone().cancelled_owned()),
            ));
        }
        let service = self.admin.service(&self.name).await.unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            let status = service.status().await.unwrap();
            let owned = status.totals.owned_partitions;
            if owned as usize == status.partitions.len() && status.totals.live_members == instances
            {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{owned} of {} partitions owned",
                status.partitions.len()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Stops every instance, gracefully.
    pub(super) async fn stop(&mut self) {
        self.stop.cancel();
        for consumer in self.consumers.drain(..) {
            consumer.await.unwrap().unwrap();
        }
        self.stop = CancellationToken::new();
    }

    /// Runs `ok` orders that succeed and `broken` that fail, and waits until
    /// the instances counted them in the minute stats.
    pub(super) async fn run(&self, ok: u32, broken: u32) {
        let orders: Vec<Order> = (0..ok)
            .map(|i| format!("order-{i}"))
            .chain((0..broken).map(|i| format!("broken-{i}")))
            .map(|order| Order { order })
            .collect();
        self.producer.enqueue_batch(&orders).await.unwrap();
        let service = self.admin.service(&self.name).await.unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let minutes = service.minutes(60).await.unwrap();
            let counted = (
                minutes.iter().map(|m| m.ok).sum::<u64>(),
                minutes.iter().map(|m| m.failed).sum::<u64>(),
            );
            if counted == (u64::from(ok), u64::from(broken)) {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "counted {counted:?} of ({ok}, {broken}); handled {} and {}",
                self.sort.ok.load(Ordering::SeqCst),
                self.sort.failed.load(Ordering::SeqCst)
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Pauses the service, and waits until every instance saw it: entries
    /// enqueued from then on wait (a read already blocked may still take
    /// some, and hold them at the gate: delivered, in the backlog still).
    pub(super) async fn pause(&self) {
        let service = self.admin.service(&self.name).await.unwrap();
        service.pause("scale-test").await.unwrap();
        // Instances read the pause every interval (500 ms here) or every
        // second, whichever is shorter (docs/design.md, "Pause"): four
        // intervals.
        tokio::time::sleep(Duration::from_secs(2)).await;
    }

    /// Enqueues `count` orders `<key>-<i>` with partition key `key`, in one
    /// batch; returns the partition they went to.
    pub(super) async fn backlog(&self, key: &str, count: u32) -> u32 {
        let orders: Vec<(Order, Options)> = (0..count)
            .map(|i| {
                let order = Order {
                    order: format!("{key}-{i}"),
                };
                (
                    order,
                    Options::new().key(key).header("source", "scale-test"),
                )
            })
            .collect();
        self.producer.enqueue_batch_with(&orders).await.unwrap();
        peerq::partition_of(key.as_bytes(), self.partitions)
    }

    /// Waits until the service's backlog is `total`.
    pub(super) async fn until_backlog(&self, total: u64) {
        let service = self.admin.service(&self.name).await.unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let backlog = service.status().await.unwrap().totals.backlog;
            if backlog == total {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "backlog {backlog}, not {total}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The dashboard of the fleet's Redis, as the whole site.
    pub(super) async fn dashboard(&self) -> SocketAddr {
        let admin = Admin::connect(&self.server.url()).await.unwrap();
        serve(dashboard::router(admin, Settings::new())).await
    }

    pub(super) async fn shutdown(mut self) {
        self.stop().await;
    }
}

/// The heatmap cells in `page`.
pub(super) fn cells(page: &str) -> usize {
    page.matches(r#"/waiting" title="partition "#).count()
}

/// The heatmap cell of partition `p` of service `name` in `page`: its tag.
fn cell(page: &str, name: &str, p: u32) -> String {
    let link = format!(r#"href="/services/{name}/partitions/{p}/waiting" title="partition "#);
    let at = page
        .find(&link)
        .unwrap_or_else(|| panic!("no cell of partition {p}"));
    let start = page[..at].rfind('<').unwrap();
    let end = at + page[at..].find('>').unwrap();
    page[start..=end].to_owned()
}

/// Three instances, 1,024 partitions, a backlog of every size: a cell per
/// partition coloured by its backlog, the largest named, every partition in
/// the collapsed table, the chart of the minutes' counts, and a page well
/// under 400 KB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_partitions_are_one_heatmap_and_the_page_stays_small() {
    let mut fleet = Fleet::new("dash-scale", 1_024).await;
    fleet.spawn(3).await;
    fleet.run(40, 6).await;
    fleet.pause().await;
    let hot = fleet.backlog("hot", 1_200).await;
    let warm = fleet.backlog("warm", 150).await;
    let mild = fleet.backlog("mild", 20).await;
    assert!(
        hot != warm && warm != mild && hot != mild,
        "three partitions"
    );
    fleet.until_backlog(1_370).await;
    let addr = fleet.dashboard().await;

    let page = get(addr, &format!("/services/{}", fleet.name)).await;
    assert_eq!(page.status, 200, "{}", page.body);
    let body = &page.body;
    let size = body.len();
    assert!(size < 400_000, "the page is {size} bytes");
    eprintln!("the service page at P = 1,024 is {size} bytes");
    assert_eq!(cells(body), 1_024, "a cell each");
    assert!(!body.contains(r#"class="tile"#), "no card per partition");
    assert!(!body.contains(r#" u" href"#), "every partition owned");
    let hot_cell = cell(body, &fleet.name, hot);
    assert!(hot_cell.starts_with(r#"<a class="b4""#), "{hot_cell}");
    assert!(hot_cell.contains("\nbacklog 1200\n"), "{hot_cell}");
    assert!(hot_cell.contains("\ntoken "), "{hot_cell}");
    assert!(cell(body, &fleet.name, warm).starts_with(r#"<a class="b3""#));
    assert!(cell(body, &fleet.name, mild).starts_with(r#"<a class="b2""#));
    assert!(
        body.contains("1,000–9,999 (1)") && body.contains("100–999 (1)"),
        "the legend counts: {body}"
    );
    assert!(
        body.contains(&format!("partition {hot}</a> (1200), ")),
        "the largest backlog named first"
    );
    let table = &body[body.find(r#"<details id="partition-table""#).unwrap()..];
    let table = &table[..table.find("</details>").unwrap()];
    assert_eq!(table.matches("<tr>").count(), 1 + 1_024, "a row each");
    // The last hour: the minutes' counts, and the backlog as it is now.
    assert!(
        body.contains("40 ok and 6 failed in the last 60 minutes"),
        "the chart: {body}"
    );
    assert!(body.contains("Backlog now: 1370"), "{body}");
    assert!(body.contains(r#"data-every="10000""#), "a slower refresh");
    // The backlog over the minutes, as the three instances recorded it
    // with their presence (their sums add up to the service's).
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let page = get(addr, &format!("/services/{}", fleet.name)).await;
        if page
            .body
            .contains("backlog 1370 now, at most 1370 in the last 60 minutes")
        {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the backlog chart: {}",
            page.body
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The refreshed part carries the same cells.
    let live = get(addr, &format!("/services/{}/live", fleet.name)).await;
    assert_eq!(cells(&live.body), 1_024);
    fleet.shutdown().await;
}
