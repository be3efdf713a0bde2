//! The dashboard in a real browser: headless Chromium, driven through
//! ChromeDriver with fantoccini, as an operator would use it. Screenshots
//! go to `target/tmp/dashboard/` (`scripts/screenshots` copies four of
//! them to `docs/` for the guide; tests never change tracked files).

use std::path::PathBuf;
use std::time::Instant;

use fantoccini::actions::{InputSource, MouseActions, PointerAction};
use fantoccini::elements::Element;
use fantoccini::{Client, ClientBuilder, Locator};
use hyper_util::client::legacy::connect::HttpConnector;
use support::ChromeDriver;

use super::scale::Fleet;
use super::*;

/// A browser session with a `width` x `height` window.
pub(super) async fn open(driver: &ChromeDriver, width: u32, height: u32) -> Client {
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

pub(super) async fn shot(c: &Client, name: &str) {
    let png = c.screenshot().await.unwrap();
    std::fs::write(shots().join(format!("{name}.png")), png).unwrap();
}

/// Waits until `css` finds `count` elements (the page refreshes itself).
pub(super) async fn until_count(c: &Client, css: &str, count: usize, what: &str) -> Vec<Element> {
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
pub(super) async fn text(c: &Client, css: &str) -> String {
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
    // The partition heatmap, refreshed in place until every partition has
    // an owner (the consumer acquires them within an interval or two).
    until_count(&c, "#partitions a", P as usize, "the partition heatmap").await;
    until_count(&c, "#partitions a.u", 0, "owners for every partition").await;
    let members = text(&c, "#members").await;
    assert!(members.contains("assigned"), "{members}");
    shot(&c, "service-small").await;

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

/// Evaluates `script` in the page (its last statement a `return`).
pub(super) async fn eval(c: &Client, script: &str) -> serde_json::Value {
    c.execute(script, Vec::new()).await.unwrap()
}

/// Three instances, 64 partitions and a backlog, as the issue tried it:
/// the heatmap shows where the backlog is, a hover tells a cell's owner,
/// token and figures, and the table stays open through a refresh.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_sees_where_the_backlog_is_and_who_owns_it() {
    let mut fleet = Fleet::new("dash-heat", 64).await;
    fleet.spawn(3).await;
    fleet.run(300, 12).await;
    fleet.pause().await;
    let hot = fleet.backlog("hot", 180).await;
    fleet.backlog("warm", 40).await;
    fleet.backlog("mild", 5).await;
    fleet.until_backlog(225).await;
    let members: Vec<String> = fleet
        .admin
        .service(&fleet.name)
        .await
        .unwrap()
        .status()
        .await
        .unwrap()
        .members
        .into_iter()
        .filter(|m| m.live)
        .map(|m| m.id)
        .collect();
    let addr = fleet.dashboard().await;
    let driver = ChromeDriver::start();
    let c = open(&driver, 1280, 900).await;
    c.goto(&format!("http://{addr}/services/{}", fleet.name))
        .await
        .unwrap();
    until_count(&c, "#partitions a", 64, "a cell per partition").await;
    until_count(&c, "#partitions a.u", 0, "owners for every partition").await;
    assert!(text(&c, "#paused").await.contains("Paused by scale-test"));
    assert!(
        text(&c, "#last-hour")
            .await
            .contains("300 ok, 12 failed in the last 60 minutes"),
        "the chart's legend"
    );

    // Hover: the cell is outlined, and its title names owner and token. The
    // window is as high as the page, for the screenshot of it all.
    c.set_window_size(1280, 1500).await.unwrap();
    let selector = format!(r#"#partitions a[href$="/partitions/{hot}/waiting"]"#);
    let cell = c.find(Locator::Css(&selector)).await.unwrap();
    assert_eq!(cell.attr("class").await.unwrap().as_deref(), Some("b3"));
    let hover = MouseActions::new("mouse".into()).then(PointerAction::MoveToElement {
        element: cell.clone(),
        duration: None,
        x: 0.0,
        y: 0.0,
    });
    c.perform_actions(hover).await.unwrap();
    assert_eq!(cell.css_value("outline-style").await.unwrap(), "solid");
    let title = cell.attr("title").await.unwrap().unwrap();
    assert!(
        title.starts_with(&format!("partition {hot}\nowner ")),
        "{title}"
    );
    assert!(
        members
            .iter()
            .any(|m| title.contains(&format!("owner {m}\n"))),
        "{title} names one of {members:?}"
    );
    assert!(
        title.contains("\ntoken ") && title.contains("\nbacklog 180\n"),
        "{title}"
    );
    shot(&c, "service").await;

    // The table, opened, stays open when the page refreshes itself.
    c.find(Locator::Css("#partition-table summary"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    eval(
        &c,
        "document.getElementById('partitions').dataset.old = '1'; return null",
    )
    .await;
    let swapped = "return document.querySelector('#partitions[data-old]') === null";
    let deadline = Instant::now() + Duration::from_secs(20);
    while eval(&c, swapped).await != serde_json::Value::Bool(true) {
        assert!(Instant::now() < deadline, "no refresh");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let open = eval(&c, "return document.getElementById('partition-table').open").await;
    assert_eq!(open, serde_json::Value::Bool(true), "closed by the refresh");

    c.close().await.unwrap();
    fleet.shutdown().await;
}

/// A thousand partitions fit one laptop screen: the heatmap of 1,024 cells
/// is shorter than the window is high.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_partitions_fit_one_screen() {
    let mut fleet = Fleet::new("dash-thousand", 1_024).await;
    fleet.spawn(3).await;
    fleet.run(500, 20).await;
    fleet.pause().await;
    for (key, count) in [("hot", 2_000), ("warm", 300), ("mild", 40)] {
        fleet.backlog(key, count).await;
    }
    let spread: Vec<Order> = (0..600)
        .map(|i| Order {
            order: format!("spread-{i}"),
        })
        .collect();
    fleet.producer.enqueue_batch(&spread).await.unwrap();
    fleet.until_backlog(2_940).await;
    let addr = fleet.dashboard().await;
    let driver = ChromeDriver::start();
    let c = open(&driver, 1280, 900).await;
    c.goto(&format!("http://{addr}/services/{}", fleet.name))
        .await
        .unwrap();
    until_count(&c, "#partitions a", 1_024, "a cell per partition").await;
    let height = eval(
        &c,
        "return document.getElementById('partitions').getBoundingClientRect().height",
    )
    .await;
    let height = height.as_f64().unwrap();
    assert!(height < 400.0, "the heatmap is {height} px high");
    // Scrolled to the heatmap's heading, its legend and cells are on screen.
    eval(
        &c,
        "document.getElementById('heat-legend').previousElementSibling.scrollIntoView(); return null",
    )
    .await;
    shot(&c, "partitions").await;
    c.close().await.unwrap();
    fleet.shutdown().await;
}
