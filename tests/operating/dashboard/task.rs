//! The task page (issue 37) against a real Redis and a tracked consumer of
//! the JSON codec: a waiting task found by its handle, its cancel refused
//! without the CSRF token or when read-only and done with it, a finished
//! task's progress bar and result, a dead one's link to its letter, a
//! task's headers (read from its entry), and the 404 and 400 of an unknown
//! task and a mistyped handle.

use peerq::admin::Service;
use peerq::handler::HandlerWithResult;
use peerq::producer::Options;
use peerq::tracking::{TaskHandle, TaskState, Tracking};

use super::*;

/// Packs orders: reports 40 % done, then returns the parcel; the order
/// `broken` fails for good (a dead letter at once).
struct Pack;

#[derive(Debug, Serialize)]
struct Parcel {
    parcel: String,
}

impl HandlerWithResult for Pack {
    type Task = Order;
    type Output = Parcel;

    async fn handle(&self, order: Order, cx: TaskContext) -> Result<Parcel, HandlerError> {
        cx.progress(&40u8);
        if order.order == "broken" {
            return Err(HandlerError::msg("box torn").permanent());
        }
        Ok(Parcel {
            parcel: order.order,
        })
    }
}

/// A Redis and a running, tracked consumer of service `name`, with its
/// producer and the admin's view of it.
struct Tracked {
    server: RedisServer,
    name: String,
    producer: Producer<Json>,
    service: Service,
    stop: CancellationToken,
    consumer: JoinHandle<peerq::Result<()>>,
}

impl Tracked {
    async fn start(prefix: &str) -> Tracked {
        support::init_tracing();
        let server = RedisServer::start();
        let name = unique_name(prefix);
        let stop = CancellationToken::new();
        let consumer = tokio::spawn(
            Consumer::builder()
                .name(&name)
                .redis(server.url())
                .partitions(P)
                .interval(Duration::from_millis(500))
                .drain_timeout(Duration::from_millis(100))
                .codec(Json)
                .tracking(Tracking::on())
                .handler(Pack)
                .run_until(stop.clone().cancelled_owned()),
        );
        // The consumer's start records the service and writes
        // `{N}:tracking`; a producer reads it on its first enqueue.
        let admin = Admin::connect(server.url()).await.unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        let service = loop {
            if let Ok(s) = admin.service(&name).await
                && s.tracking().await.unwrap().is_on()
            {
                break s;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the consumer switched tracking on"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let producer = Producer::builder()
            .name(&name)
            .redis(server.url())
            .partitions(P)
            .codec(Json)
            .connect()
            .await
            .unwrap();
        Tracked {
            server,
            name,
            producer,
            service,
            stop,
            consumer,
        }
    }

    /// Enqueues order `order`; its handle.
    async fn enqueue(&self, order: &str) -> TaskHandle {
        self.enqueue_with(order, Options::new()).await
    }

    /// Enqueues order `order` with `options` (no key); its handle.
    async fn enqueue_with(&self, order: &str, options: Options) -> TaskHandle {
        let order = Order {
            order: order.to_owned(),
        };
        let id = self.producer.enqueue_with(&order, options).await.unwrap();
        self.producer.handle_of(&id, None)
    }

    async fn state(&self, handle: &TaskHandle) -> Option<TaskState> {
        let record = self.service.task(handle).await.unwrap();
        record.and_then(|r| r.state)
    }

    /// Waits until `handle` is in `state`.
    async fn until(&self, handle: &TaskHandle, state: TaskState) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let now = self.state(handle).await;
            if now == Some(state) {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{handle} is {now:?}, not {state}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn dashboard(&self, settings: Settings) -> SocketAddr {
        let admin = Admin::connect(&self.server.url()).await.unwrap();
        serve(dashboard::router(admin, settings)).await
    }

    /// The task page of `id` (a handle or whatever the user typed).
    fn page(&self, id: &str) -> String {
        format!("/services/{}/task?id={id}", self.name)
    }

    fn cancel(&self) -> String {
        format!("/services/{}/task/cancel", self.name)
    }

    async fn shutdown(self) {
        self.stop.cancel();
        self.consumer.await.unwrap().unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_task_is_found_by_its_handle_and_cancelled_with_the_token() {
    let world = Tracked::start("dash-task").await;
    // Paused, no handler starts: the task stays waiting.
    world.service.pause("test").await.unwrap();
    let handle = world.enqueue("parcel-1").await;
    let addr = world.dashboard(Settings::new()).await;

    let page = get(addr, &world.page(&handle.to_string())).await;
    assert_eq!(page.status, 200, "{}", page.body);
    assert!(
        page.body.contains(&format!("Task {handle}")),
        "{}",
        page.body
    );
    assert!(
        page.body.contains(r#"id="state">waiting<"#),
        "{}",
        page.body
    );
    assert!(page.body.contains(r#"id="cancel""#), "{}", page.body);
    // The bare id finds it too, over every partition.
    let bare = get(addr, &world.page(handle.id().as_str())).await;
    assert_eq!(bare.status, 200, "{}", bare.body);
    assert!(bare.body.contains(&format!("Task {handle}")));

    let form = |csrf: &str| format!("csrf={csrf}&id={}", handle.to_string().replace('/', "%2F"));
    let missing = post(addr, &world.cancel(), &form("")).await;
    assert_eq!(missing.status, 403, "{}", missing.body);
    assert!(missing.body.contains("CSRF"), "{}", missing.body);
    let forged = post(addr, &world.cancel(), &form(&"0".repeat(64))).await;
    assert_eq!(forged.status, 403, "{}", forged.body);
    assert_eq!(
        world.state(&handle).await,
        Some(TaskState::Waiting),
        "cancelled without the token"
    );

    let cancelled = post(addr, &world.cancel(), &form(&token(&page.body))).await;
    assert_eq!(cancelled.status, 303, "{}", cancelled.body);
    assert_eq!(world.state(&handle).await, Some(TaskState::Cancelled));
    let location = cancelled.location.unwrap();
    assert!(
        location.starts_with(&format!("/services/{}/task?id=", world.name)),
        "{location}"
    );
    let after = get(addr, &location).await;
    assert_eq!(after.status, 200, "{}", after.body);
    assert!(
        after.body.contains(&format!("Cancelled {handle}")),
        "{}",
        after.body
    );
    assert!(after.body.contains(">cancelled<"), "{}", after.body);
    assert!(
        !after.body.contains(r#"id="cancel""#),
        "a final task has no cancel: {}",
        after.body
    );
    // A second cancel (a stale page) changes nothing, and says so.
    let again = post(addr, &world.cancel(), &form(&token(&page.body))).await;
    let again = get(addr, &again.location.unwrap()).await;
    assert!(
        again.body.contains("is already final (cancelled)"),
        "{}",
        again.body
    );
    world.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_only_shows_no_cancel_and_refuses_it() {
    let world = Tracked::start("dash-task-ro").await;
    world.service.pause("test").await.unwrap();
    let handle = world.enqueue("parcel-2").await;
    let writable = world.dashboard(Settings::new()).await;
    let token = token(&get(writable, &world.page(&handle.to_string())).await.body);

    let addr = world.dashboard(Settings::new().read_only(true)).await;
    let page = get(addr, &world.page(&handle.to_string())).await;
    assert_eq!(page.status, 200, "{}", page.body);
    assert!(page.body.contains(">waiting<"), "{}", page.body);
    assert!(!page.body.contains(r#"method="post""#), "{}", page.body);
    assert!(!page.body.contains(r#"id="cancel""#), "{}", page.body);
    // Even with a token (of another dashboard, or guessed), nothing runs.
    let form = format!("csrf={token}&id={}", handle.to_string().replace('/', "%2F"));
    let refused = post(addr, &world.cancel(), &form).await;
    assert_eq!(refused.status, 403, "{}", refused.body);
    assert!(refused.body.contains("read-only"), "{}", refused.body);
    assert_eq!(world.state(&handle).await, Some(TaskState::Waiting));
    world.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_task_is_a_404_and_a_mistyped_handle_a_400() {
    let world = Tracked::start("dash-task-404").await;
    let addr = world.dashboard(Settings::new()).await;
    // The service page leads to the task page's search.
    let service = get(addr, &format!("/services/{}", world.name)).await;
    assert!(
        service.body.contains(&format!(
            r#"method="get" action="/services/{}/task""#,
            world.name
        )),
        "{}",
        service.body
    );
    let empty = get(addr, &format!("/services/{}/task", world.name)).await;
    assert_eq!(empty.status, 200, "{}", empty.body);
    assert!(empty.body.contains(r#"name="id""#), "{}", empty.body);

    let unknown = get(addr, &world.page("3/no-such-task")).await;
    assert_eq!(unknown.status, 404, "{}", unknown.body);
    assert!(
        unknown.body.contains("No such task: 3/no-such-task"),
        "{}",
        unknown.body
    );
    // The search form stays, with what was typed, to fix it there.
    assert!(
        unknown.body.contains(r#"value="3/no-such-task""#),
        "{}",
        unknown.body
    );
    let mistyped = get(addr, &world.page("three/abc")).await;
    assert_eq!(mistyped.status, 400, "{}", mistyped.body);
    assert!(
        mistyped.body.contains("is no task handle"),
        "{}",
        mistyped.body
    );
    let elsewhere = get(addr, "/services/no-such-service/task?id=1/a").await;
    assert_eq!(elsewhere.status, 404, "{}", elsewhere.body);
    world.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_task_shows_its_progress_and_result_and_a_dead_one_its_letter() {
    let world = Tracked::start("dash-task-done").await;
    let packed = world.enqueue("parcel-3").await;
    let broken = world.enqueue("broken").await;
    world.until(&packed, TaskState::Succeeded).await;
    world.until(&broken, TaskState::Dead).await;
    let addr = world.dashboard(Settings::new()).await;

    let page = get(addr, &world.page(&packed.to_string())).await;
    assert_eq!(page.status, 200, "{}", page.body);
    assert!(
        page.body
            .contains(r#"<progress class="bar" max="100" value="40"></progress> 40 %"#),
        "{}",
        page.body
    );
    assert!(
        page.body
            .contains("&quot;parcel&quot;: &quot;parcel-3&quot;"),
        "the result, as JSON: {}",
        page.body
    );
    assert!(
        page.body.contains(r#"class="ok">succeeded<"#),
        "{}",
        page.body
    );
    assert!(!page.body.contains(r#"id="cancel""#), "{}", page.body);

    let dead = get(addr, &world.page(&broken.to_string())).await;
    assert_eq!(dead.status, 200, "{}", dead.body);
    assert!(dead.body.contains("box torn"), "{}", dead.body);
    let record = world.service.task(&broken).await.unwrap().unwrap();
    let letter = format!(
        "/services/{}/dead/letter?at={}%2F{}",
        world.name,
        broken.partition().unwrap(),
        record.dead_id.expect("a dead letter id")
    );
    assert!(
        dead.body.contains(&format!(r#"href="{letter}""#)),
        "{}",
        dead.body
    );
    let shown = get(addr, &letter).await;
    assert_eq!(shown.status, 200, "{}", shown.body);
    assert!(shown.body.contains("box torn"), "{}", shown.body);
    world.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tasks_page_shows_the_headers_of_its_entry() {
    let world = Tracked::start("dash-task-headers").await;
    world.service.pause("test").await.unwrap();
    let headed = Options::new()
        .header("tenant", "acme")
        .header("request-id", "r-1");
    let waiting = world.enqueue_with("parcel-7", headed.clone()).await;
    let later = headed.delay(Duration::from_secs(3600));
    let delayed = world.enqueue_with("parcel-8", later).await;
    let plain = world.enqueue("parcel-9").await;
    let addr = world.dashboard(Settings::new()).await;
    // The count in the record's table, and the headers' own table.
    let shows = async |handle: &TaskHandle, count: &str, table: bool| {
        let page = get(addr, &world.page(&handle.to_string())).await;
        assert_eq!(page.status, 200, "{}", page.body);
        let counted = format!(r#"<td id="header-count">{count}</td>"#);
        let row = r#"<tr><th>tenant</th><td class="wrap">acme</td></tr>"#;
        assert!(
            page.body.contains(&counted) && page.body.contains(row) == table,
            "{handle}: {}",
            page.body
        );
    };
    shows(&waiting, "2", true).await;
    shows(&delayed, "2", true).await;
    shows(&plain, "none", false).await;
    // Succeeded, its entry is gone: not known any more.
    world.service.resume().await.unwrap();
    world.until(&waiting, TaskState::Succeeded).await;
    shows(&waiting, "–", false).await;
    world.shutdown().await;
}
