//! A service's page shows the limits in force (issue 38, `#limits`): a
//! rate limit and a concurrency per key as an operator set them, and a
//! limit no more once it is cleared.

use peerq::limits::{Limits, RateLimit};

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_services_page_shows_its_limits_and_not_a_cleared_one() {
    let world = World::start("dash-limits").await;
    let admin = Admin::connect(&world.server.url()).await.unwrap();
    let service = admin.service(&world.name).await.unwrap();
    let addr = dashboard(&world, "", Settings::new()).await;
    let path = format!("/services/{}", world.name);
    // The page's `#limits` paragraph, once `done` holds of it (the page
    // keeps what it read for 2 s), or as it is after 10 s.
    let limits_once = async |done: &dyn Fn(&str) -> bool| {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let page = get(addr, &path).await;
            assert_eq!(page.status, 200, "{}", page.body);
            let at = page.body.find(r#"<p id="limits">"#).expect("#limits");
            let end = at + page.body[at..].find("</p>").unwrap();
            let limits = page.body[at..end].to_owned();
            if done(&limits) || tokio::time::Instant::now() > deadline {
                return limits;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    let rate = "Rate limit: 50 per 1000 ms, service-wide";
    let per_key = "At most 3 tasks of one key at once.";
    let none = |l: &str| l.contains("No limits.");
    assert!(none(&limits_once(&none).await));

    let both = Limits::none()
        .rate(RateLimit::new(50, Duration::from_secs(1)))
        .concurrency_per_key(3);
    service.set_limits(both).await.unwrap();
    let shown = limits_once(&|l| l.contains(per_key)).await;
    assert!(shown.contains(rate) && shown.contains(per_key), "{shown}");
    assert!(shown.contains("peerq limit set|clear"), "{shown}");

    // The rate cleared: only the concurrency per key is left.
    service.set_limits(both.without_rate()).await.unwrap();
    let shown = limits_once(&|l| !l.contains("Rate limit")).await;
    assert!(
        !shown.contains("Rate limit") && shown.contains(per_key),
        "{shown}"
    );

    service.set_limits(Limits::none()).await.unwrap();
    let shown = limits_once(&none).await;
    assert!(
        shown.contains("No limits.") && !shown.contains("At most"),
        "{shown}"
    );
    world.shutdown().await;
}
