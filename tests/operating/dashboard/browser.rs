//! The dashboard in a real browser: headless Chromium, driven through
//! ChromeDriver with fantoccini, as an operator would use it. Screenshots
//! go to `target/tmp/dashboard/` (`scripts/screenshots` copies two of them
//! to `docs/` for the README; tests never change tracked files).

use std::path::PathBuf;
use std::time::Instant;

use fantoccini::elements::Element;
use fantoccini::{Client, ClientBuilder, Locator};
use hyper_util::client::legacy::connect::HttpConnector;
use support::ChromeDriver;

use super::*;

/// A browser session with a `width` x `height` window.
async fn open(driver: &ChromeDriver, width: u32, height: u32) -> Client {
    let mut builder = ClientBuilder::new(HttpConnector::new());
    builder.capabilities(driver.capabilities(width, height));
    builder
        .connect(&driver.url())
        .await
        .expect("a chromium session")
}

/// Where screenshots go.
fn shots() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("dashboard");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

async fn shot(c: &Client, name: &str) {
    let png = c.screenshot().await.unwrap();
    std::fs::write(shots().join(format!("{name}.png")), png).unwrap();
}

/// Waits until `css` finds `count` elements (the page refreshes itself).
async fn until_count(c: &Client, css: &str, count: usize, what: &str) -> Vec<Element> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let found = c.find_all(Locator::Css(css)).await.unwrap();
        if found.len() == count {
            return found;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: {} of {count} `{css}`",
            found.len()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The text of the one element `css` selects, once there is one: after a
/// click the browser may still show the page it is leaving (a `find` then
/// failed now and then, before the next page had loaded).
async fn text(c: &Client, css: &str) -> String {
    let found = until_count(c, css, 1, css).await;
    found[0].text().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_finds_a_failed_order_replays_it_and_pauses_the_service() {
    let world = World::start("dash-browser").await;
    world.dead_orders(0..3).await;
    for i in 100..120 {
        let order = Order {
            order: format!("order-{i}"),
        };
        world.producer.enqueue(&order).await.unwrap();
    }
    wait_until(Duration::from_secs(15), "20 orders shipped", || {
        world.ship.shipped.load(Ordering::SeqCst) == 20
    })
    .await;
    let addr = dashboard(&world, "", Settings::new()).await;
    let driver = ChromeDriver::start();
    let c = open(&driver, 1280, 900).await;

    // The overview lists the service; its link leads to the service.
    c.goto(&format!("http://{addr}/")).await.unwrap();
    let link = c.find(Locator::LinkText(&world.name)).await.unwrap();
    shot(&c, "overview").await;
    link.click().await.unwrap();
    // The partition grid, refreshed in place until every partition has an
    // owner (the consumer acquires them within an interval or two).
    until_count(&c, "#partitions .tile", P as usize, "the partition grid").await;
    until_count(
        &c,
        "#partitions .tile.unowned",
        0,
        "owners for every partition",
    )
    .await;
    let members = text(&c, "#members").await;
    assert!(members.contains("assigned"), "{members}");
    shot(&c, "service").await;

    // Dead letters: search for one, replay it, see it run.
    c.find(Locator::LinkText("Dead letters"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    c.find(Locator::Css("input[name=q]"))
        .await
        .unwrap()
        .send_keys("order-1")
        .await
        .unwrap();
    c.find(Locator::Id("search"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let rows = until_count(&c, "#letters tr", 2, "one match and the header").await;
    assert!(
        rows[1]
            .text()
            .await
            .unwrap()
            .contains("warehouse closed for order-1")
    );
    shot(&c, "dead-letters").await;
    c.find(Locator::Css("#letters button.replay"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    assert!(text(&c, "#done").await.starts_with("Replayed"));
    wait_until(
        Duration::from_secs(15),
        "the replayed order shipped",
        || world.ship.shipped.load(Ordering::SeqCst) == 21,
    )
    .await;

    // Pause and resume.
    c.goto(&format!("http://{addr}/services/{}", world.name))
        .await
        .unwrap();
    c.find(Locator::Id("pause"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    assert!(text(&c, "#paused").await.contains("Paused by dashboard"));
    assert!(world.paused().await);
    c.find(Locator::Id("resume"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    until_count(&c, "#paused", 0, "the pause banner gone").await;
    assert!(!world.paused().await);

    // At phone width the same page still reads.
    c.set_window_size(390, 844).await.unwrap();
    shot(&c, "service-phone").await;

    // A read-only dashboard shows no action anywhere.
    let read_only = dashboard(&world, "", Settings::new().read_only(true)).await;
    for page in ["", "/dead", "/delayed", "/periodic"] {
        c.goto(&format!("http://{read_only}/services/{}{page}", world.name))
            .await
            .unwrap();
        let buttons = c.find_all(Locator::Css("button")).await.unwrap();
        let forms = c.find_all(Locator::Css("form[method=post]")).await.unwrap();
        assert!(
            buttons.len() <= 1 && forms.is_empty(),
            "actions on {page}: {} buttons",
            buttons.len()
        );
    }
    c.close().await.unwrap();
    world.shutdown().await;
}
