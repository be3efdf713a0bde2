//! The dashboard (feature `dashboard`) against a real Redis with a running
//! consumer: over plain HTTP (mounted under a prefix, actions refused
//! without the CSRF token or when read-only, credentials, the search's
//! bound), a tracked task's page (`dashboard/task.rs`), the limits in
//! force (`dashboard/limits.rs`), the service page at P = 1,024
//! (`dashboard/scale.rs`), a partition's waiting entries
//! (`dashboard/waiting.rs`), and in a real browser (`dashboard/browser.rs`:
//! headless Chromium through ChromeDriver).

mod batch;
mod browser;
mod headers;
mod limits;
mod reshard;
mod scale;
mod singleton;
mod task;
mod unique;
mod waiting;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::http::{Method, Request, header};
use deadpool_redis::redis;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use peerq::admin::Admin;
use peerq::dashboard::{self, Access, Settings};
use peerq::dead_letters::Query;
use peerq::producer::Producer;
use peerq::{Consumer, Handler, HandlerError, TaskContext};
use peerq::{Headers, Json};
use serde::{Deserialize, Serialize};
use support::{RedisServer, unique_name, wait_until};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const P: u32 = 8;

/// An order to ship: JSON, so the dashboard can search its text.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Order {
    order: String,
}

/// Ships orders, and keeps the headers of each order's last run; while
/// `failing` is set, every order fails for good (a dead letter at once).
#[derive(Clone, Default)]
struct Ship {
    failing: Arc<AtomicBool>,
    shipped: Arc<AtomicU64>,
    headers: Arc<Mutex<HashMap<String, Headers>>>,
}

impl Handler for Ship {
    type Task = Order;
    async fn handle(&self, order: Order, cx: TaskContext) -> Result<(), HandlerError> {
        let headers = cx.headers().clone();
        self.headers
            .lock()
            .unwrap()
            .insert(order.order.clone(), headers);
        if self.failing.load(Ordering::SeqCst) {
            return Err(
                HandlerError::msg(format!("warehouse closed for {}", order.order)).permanent(),
            );
        }
        self.shipped.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

/// A Redis, a running consumer of service `name` and its producer.
struct World {
    server: RedisServer,
    name: String,
    ship: Ship,
    producer: Producer<Json>,
    stop: CancellationToken,
    consumer: JoinHandle<peerq::Result<()>>,
}

impl World {
    async fn start(prefix: &str) -> World {
        support::init_tracing();
        let server = RedisServer::start();
        let name = unique_name(prefix);
        let ship = Ship::default();
        let stop = CancellationToken::new();
        let consumer = tokio::spawn(
            Consumer::builder()
                .name(&name)
                .redis(server.url())
                .partitions(P)
                .interval(Duration::from_millis(500))
                .drain_timeout(Duration::from_millis(100))
                .codec(Json)
                // Held until the consumer leaves: the service page's
                // `#singletons` (`dashboard/singleton.rs`).
                .singleton(
                    "sweeper",
                    |cx: peerq::singleton::SingletonContext| async move {
                        cx.cancelled().await;
                        Ok::<_, std::io::Error>(())
                    },
                )
                .handler(ship.clone())
                .run_until(stop.clone().cancelled_owned()),
        );
        let producer = Producer::builder()
            .name(&name)
            .redis(server.url())
            .partitions(P)
            .codec(Json)
            .connect()
            .await
            .unwrap();
        World {
            server,
            name,
            ship,
            producer,
            stop,
            consumer,
        }
    }

    /// Enqueues orders `order-<i>` for `range`, which die at once.
    async fn dead_orders(&self, range: std::ops::Range<u32>) {
        self.ship.failing.store(true, Ordering::SeqCst);
        for i in range.clone() {
            let order = Order {
                order: format!("order-{i}"),
            };
            self.producer.enqueue(&order).await.unwrap();
        }
        let want = range.len() as u64;
        let admin = Admin::connect(&self.server.url()).await.unwrap();
        let service = admin.service(&self.name).await.unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let dead = service.status().await.unwrap().totals.dead;
            if dead >= want {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{dead} of {want} dead letters"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        self.ship.failing.store(false, Ordering::SeqCst);
    }

    async fn paused(&self) -> bool {
        let mut conn = self.server.pool().get().await.unwrap();
        let exists: bool = redis::cmd("EXISTS")
            .arg(format!("{{{}}}:paused", self.name))
            .query_async(&mut *conn)
            .await
            .unwrap();
        exists
    }

    async fn shutdown(self) {
        self.stop.cancel();
        self.consumer.await.unwrap().unwrap();
    }
}

/// Serves `app` on a free loopback port.
async fn serve(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

/// The dashboard of `world`'s Redis with `settings`, nested under `prefix`
/// (`""`: the whole site).
async fn dashboard(world: &World, prefix: &str, settings: Settings) -> SocketAddr {
    let admin = Admin::connect(&world.server.url()).await.unwrap();
    let router = dashboard::router(admin, settings);
    let app = if prefix.is_empty() {
        router
    } else {
        Router::new().nest(prefix, router)
    };
    serve(app).await
}

#[derive(Debug)]
struct Reply {
    status: u16,
    location: Option<String>,
    body: String,
}

async fn request(
    addr: SocketAddr,
    method: Method,
    path: &str,
    form: &str,
    auth: Option<&str>,
) -> Reply {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let mut request = Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"))
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded");
    if let Some(auth) = auth {
        request = request.header(header::AUTHORIZATION, auth);
    }
    let request = request
        .body(Full::new(Bytes::from(form.to_owned())))
        .unwrap();
    let response = tokio::time::timeout(Duration::from_secs(10), client.request(request))
        .await
        .expect("a reply within 10 s")
        .unwrap();
    let status = response.status().as_u16();
    let location = response
        .headers()
        .get(header::LOCATION)
        .map(|l| l.to_str().unwrap().to_owned());
    let body = response.into_body().collect().await.unwrap().to_bytes();
    Reply {
        status,
        location,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

async fn get(addr: SocketAddr, path: &str) -> Reply {
    request(addr, Method::GET, path, "", None).await
}

async fn post(addr: SocketAddr, path: &str, form: &str) -> Reply {
    request(addr, Method::POST, path, form, None).await
}

/// The CSRF token in a page's forms.
fn token(page: &str) -> String {
    let at = page
        .find(r#"name="csrf" value=""#)
        .expect("a form with the token")
        + 19;
    page[at..at + 64].to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mounted_under_a_prefix_its_links_and_assets_follow_it() {
    let world = World::start("dash-prefix").await;
    world.dead_orders(0..2).await;
    let addr = dashboard(&world, "/admin/queues", Settings::new()).await;

    let overview = get(addr, "/admin/queues").await;
    assert_eq!(overview.status, 200, "{}", overview.body);
    let link = format!(r#"href="/admin/queues/services/{}""#, world.name);
    assert!(overview.body.contains(&link), "{}", overview.body);
    assert!(
        overview
            .body
            .contains(r#"class="brand" href="/admin/queues""#),
        "{}",
        overview.body
    );
    assert!(
        overview
            .body
            .contains(r#"href="/admin/queues/assets/style.css""#)
    );
    assert!(overview.body.contains("<svg"), "the per-minute chart");
    let css = get(addr, "/admin/queues/assets/style.css").await;
    assert_eq!(css.status, 200);
    assert!(css.body.contains("prefers-color-scheme: dark"));
    let service = get(addr, &format!("/admin/queues/services/{}", world.name)).await;
    assert_eq!(service.status, 200);
    assert_eq!(
        scale::cells(&service.body),
        P as usize,
        "a heatmap cell per partition: {}",
        service.body
    );
    let dead = get(addr, &format!("/admin/queues/services/{}/dead", world.name)).await;
    assert!(
        dead.body.contains("warehouse closed for order-1"),
        "{}",
        dead.body
    );
    // Nothing is loaded from another site.
    for page in [&overview.body, &service.body, &dead.body] {
        assert!(
            !page.contains("http://") && !page.contains("https://"),
            "{page}"
        );
    }
    let unknown = get(addr, "/admin/queues/services/no-such-service").await;
    assert_eq!(unknown.status, 404, "{}", unknown.body);
    world.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_action_needs_the_csrf_token() {
    let world = World::start("dash-csrf").await;
    let addr = dashboard(&world, "", Settings::new()).await;
    let path = format!("/services/{}/pause", world.name);
    let missing = post(addr, &path, "").await;
    assert_eq!(missing.status, 403, "{}", missing.body);
    assert!(missing.body.contains("CSRF"), "{}", missing.body);
    let forged = post(addr, &path, &format!("csrf={}", "0".repeat(64))).await;
    assert_eq!(forged.status, 403);
    assert!(!world.paused().await, "paused without the token");

    let page = get(addr, &format!("/services/{}", world.name)).await;
    let paused = post(addr, &path, &format!("csrf={}", token(&page.body))).await;
    assert_eq!(paused.status, 303, "{}", paused.body);
    assert_eq!(
        paused.location.as_deref(),
        Some(format!("/services/{}", world.name).as_str())
    );
    assert!(world.paused().await);
    let page = get(addr, &format!("/services/{}", world.name)).await;
    assert!(page.body.contains("Paused by dashboard"), "{}", page.body);
    world.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_only_shows_no_action_and_refuses_every_one() {
    let world = World::start("dash-ro").await;
    world.dead_orders(0..1).await;
    let writable = dashboard(&world, "", Settings::new()).await;
    let token = token(
        &get(writable, &format!("/services/{}", world.name))
            .await
            .body,
    );
    let addr = dashboard(&world, "", Settings::new().read_only(true)).await;
    for page in ["", "/dead", "/delayed", "/periodic"] {
        let reply = get(addr, &format!("/services/{}{page}", world.name)).await;
        assert_eq!(reply.status, 200);
        assert!(
            !reply.body.contains(r#"method="post""#),
            "an action on {page}: {}",
            reply.body
        );
        assert!(reply.body.contains("read-only"));
    }
    // Even with a token (of another dashboard, or guessed), nothing runs.
    let refused = post(
        addr,
        &format!("/services/{}/pause", world.name),
        &format!("csrf={token}"),
    )
    .await;
    assert_eq!(refused.status, 403);
    assert!(refused.body.contains("read-only"), "{}", refused.body);
    assert!(!world.paused().await);
    world.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_are_asked_for_when_set() {
    let world = World::start("dash-auth").await;
    let access = Access::Basic {
        user: "ops".into(),
        password: "s3cret".into(),
    };
    let addr = dashboard(&world, "", Settings::new().access(access)).await;
    let without = get(addr, "/").await;
    assert_eq!(without.status, 401);
    // base64("ops:s3cret")
    let with = request(addr, Method::GET, "/", "", Some("Basic b3BzOnMzY3JldA==")).await;
    assert_eq!(with.status, 200);
    assert!(!with.body.contains("s3cret"));
    let wrong = request(addr, Method::GET, "/", "", Some("Basic b3BzOndyb25n")).await;
    assert_eq!(wrong.status, 401);
    // No other site may frame it (a click on "Purge all" through a frame).
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let response = client
        .get(format!("http://{addr}/assets/style.css").parse().unwrap())
        .await
        .unwrap();
    assert_eq!(response.status(), 401, "assets need the credentials too");
    let headers = response.headers();
    assert_eq!(headers["x-frame-options"], "DENY");
    assert!(
        headers["content-security-policy"]
            .to_str()
            .unwrap()
            .contains("frame-ancestors 'none'")
    );
    assert_eq!(headers["x-content-type-options"], "nosniff");
    world.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_search_finds_a_letter_by_payload_text_and_says_how_far_it_read() {
    let world = World::start("dash-search").await;
    world.dead_orders(0..30).await;
    let addr = dashboard(&world, "", Settings::new()).await;
    let page = get(addr, &format!("/services/{}/dead?q=ORDER-17", world.name)).await;
    assert_eq!(page.status, 200);
    assert_eq!(
        page.body.matches("warehouse closed for order-17").count(),
        1,
        "{}",
        page.body
    );
    assert!(!page.body.contains("order-16<"), "{}", page.body);
    assert!(
        page.body.contains("Searched 30 letters, to the last one."),
        "{}",
        page.body
    );
    let none = get(
        addr,
        &format!("/services/{}/dead?q=nothing-like-this", world.name),
    )
    .await;
    assert!(none.body.contains("No dead letter matches."));
    // Replay every match of a search: only that one runs again.
    let token = token(&page.body);
    let form = format!("csrf={token}&action=replay&reason=&q=order-17");
    let replayed = post(
        addr,
        &format!("/services/{}/dead/matching", world.name),
        &form,
    )
    .await;
    assert_eq!(replayed.status, 303, "{}", replayed.body);
    wait_until(
        Duration::from_secs(15),
        "the replayed order shipped",
        || world.ship.shipped.load(Ordering::SeqCst) == 1,
    )
    .await;
    let after = get(addr, replayed.location.as_deref().unwrap()).await;
    assert!(
        after.body.contains("Replayed 1 dead letters."),
        "{}",
        after.body
    );
    world.shutdown().await;
}

/// The search's reader: every letter once, in calls of at most 500
/// letters, across empty partitions and a cursor inside a long one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scan_reads_every_letter_once_in_bounded_calls() {
    let server = RedisServer::start();
    let name = unique_name("dash-scan");
    recorded(&server, &name, 4).await;
    let mut conn = server.pool().get().await.unwrap();
    let sizes = [600usize, 0, 3, 501];
    for (p, size) in sizes.iter().enumerate().filter(|(_, size)| **size > 0) {
        bare_letters(&mut conn, &name, p as u32, *size, "failed").await;
    }
    let dead = peerq::dead_letters::DeadLetters::connect(&server.url(), &name)
        .await
        .unwrap();
    let mut seen = std::collections::BTreeSet::new();
    let mut after = None;
    let mut calls = 0;
    loop {
        let scan = dead.scan(after.as_ref(), 500).await.unwrap();
        calls += 1;
        assert!(scan.letters.len() <= 500);
        for letter in scan.letters {
            let id = letter.task_id.unwrap().as_str().to_owned();
            assert!(seen.insert(id.clone()), "{id} read twice");
        }
        match scan.next {
            Some(next) => after = Some(next),
            None => break,
        }
        assert!(calls < 10, "the scan does not end");
    }
    assert_eq!(seen.len(), sizes.iter().sum::<usize>());
    // 1,104 letters: three calls of up to 500, and one more when the last
    // call's budget ends exactly where a partition does.
    assert!(calls <= 4, "{calls} calls");
}

/// Records service `name` on `server` with `partitions` partitions, as its
/// first producer does; no consumer runs.
async fn recorded(server: &RedisServer, name: &str, partitions: u32) {
    let _producer: Producer<Json> = Producer::builder()
        .name(name)
        .redis(server.url())
        .partitions(partitions)
        .codec(Json)
        .connect()
        .await
        .unwrap();
}

/// Adds `count` dead letters of `reason` with nothing but a task id
/// (`t-<p>-<i>`) to partition `p` of `name`, in one pipeline.
async fn bare_letters(
    conn: &mut deadpool_redis::Connection,
    name: &str,
    p: u32,
    count: usize,
    reason: &str,
) {
    let mut pipe = redis::pipe();
    for i in 0..count {
        pipe.cmd("XADD")
            .arg(format!("{{{name}/{p}}}:dead"))
            .arg("*")
            .arg("id")
            .arg(format!("t-{p}-{i}"))
            .arg("reason")
            .arg(reason)
            .ignore();
    }
    let () = pipe.query_async(&mut **conn).await.unwrap();
}

/// Adds a dead letter of task `id` to partition `p` of `name`, as a
/// consumer whose clock reads `dead_at_ms` would write it.
async fn dead_letter(
    conn: &mut deadpool_redis::Connection,
    name: &str,
    p: u32,
    id: &str,
    reason: &str,
    dead_at_ms: u64,
) {
    let () = redis::cmd("XADD")
        .arg(format!("{{{name}/{p}}}:dead"))
        .arg("*")
        .arg("id")
        .arg(id)
        .arg("attempt")
        .arg("5")
        .arg("enqueued_at")
        .arg(dead_at_ms)
        .arg("codec")
        .arg("json")
        .arg("payload")
        .arg(format!(r#"{{"order":"{id}"}}"#))
        .arg("reason")
        .arg(reason)
        .arg("error")
        .arg(format!("warehouse closed for {id}"))
        .arg("stream_id")
        .arg("1-0")
        .arg("dead_at")
        .arg(dead_at_ms)
        .query_async(&mut **conn)
        .await
        .unwrap();
}

/// The task ids in partition `p`'s stream of `name`: the replayed ones.
async fn replayed(conn: &mut deadpool_redis::Connection, name: &str, p: u32) -> Vec<String> {
    let reply: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
        .arg(format!("{{{name}/{p}}}:stream"))
        .arg("-")
        .arg("+")
        .query_async(&mut **conn)
        .await
        .unwrap();
    reply
        .ids
        .iter()
        .map(|entry| entry.get::<String>("id").unwrap())
        .collect()
}

/// A bulk replay acts on the letters that were dead when it began, told by
/// their place in each partition's dead letters, not by clocks: a letter
/// whose `dead_at` lies an hour in the dashboard's future (its consumer's
/// clock runs ahead) but that was dead before is replayed; one added while
/// the action runs, with a `dead_at` an hour in the past (its consumer's
/// clock runs behind), is not. Both of a search's matches (the scan) and of
/// a reason (`replay_all`). The dashboard reaches Redis through a proxy
/// that holds its connection from its first `XRANGE` on (the action has
/// begun, and read nothing yet) while the test adds the late letter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bulk_replay_takes_the_letters_dead_when_it_began_whatever_their_clocks() {
    support::init_tracing();
    let server = RedisServer::start();
    let proxy = support::Proxy::start(server.port());
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let hour_ms = 3_600_000;
    // A search's matches, then every letter of one reason.
    for shape in ["reason=&q=skewed", "reason=failed&q="] {
        let name = unique_name("dash-bound");
        recorded(&server, &name, 2).await;
        let mut conn = server.pool().get().await.unwrap();
        // Partition 0: the letter of a consumer whose clock runs an hour
        // ahead, behind it 1,200 letters the action passes over (of another
        // reason, not matching the search), so it reads partition 0 in
        // several calls; partition 1: a letter dead an hour ago.
        dead_letter(
            &mut conn,
            &name,
            0,
            "skewed-ahead",
            "failed",
            now_ms + hour_ms,
        )
        .await;
        bare_letters(&mut conn, &name, 0, 1_200, "decode").await;
        dead_letter(
            &mut conn,
            &name,
            1,
            "skewed-before",
            "failed",
            now_ms - hour_ms,
        )
        .await;

        let admin = Admin::connect(&proxy.url()).await.unwrap();
        let addr = serve(dashboard::router(admin, Settings::new())).await;
        let page = get(addr, &format!("/services/{name}/dead")).await;
        assert_eq!(page.status, 200, "{}", page.body);
        let form = format!("csrf={}&action=replay&{shape}", token(&page.body));
        let path = format!("/services/{name}/dead/matching");
        proxy.hold_on(b"XRANGE");
        let action = tokio::spawn(async move { post(addr, &path, &form).await });
        wait_until(Duration::from_secs(10), "the action's first read", || {
            proxy.held() > 0
        })
        .await;
        // While the action runs: a letter of a consumer whose clock runs an
        // hour behind.
        dead_letter(
            &mut conn,
            &name,
            1,
            "skewed-during",
            "failed",
            now_ms - hour_ms,
        )
        .await;
        proxy.restore();
        let replied = action.await.unwrap();
        assert_eq!(replied.status, 303, "{}", replied.body);

        let mut runs = replayed(&mut conn, &name, 0).await;
        runs.extend(replayed(&mut conn, &name, 1).await);
        runs.sort();
        assert_eq!(
            runs,
            ["skewed-ahead", "skewed-before"],
            "{shape}: replayed what was dead when the action began, and nothing else"
        );
        let dead = peerq::dead_letters::DeadLetters::connect(&server.url(), &name)
            .await
            .unwrap();
        let failed = dead.page(&Query::new(10).reason("failed")).await.unwrap();
        let left: Vec<&str> = failed
            .letters
            .iter()
            .map(|l| l.task_id.as_ref().unwrap().as_str())
            .collect();
        assert_eq!(left, ["skewed-during"], "{shape}");
        let location = replied.location.unwrap();
        let done = get(addr, &location).await;
        assert!(
            done.body.contains("Replayed 2 dead letters."),
            "{shape}: {}",
            done.body
        );
    }
}
