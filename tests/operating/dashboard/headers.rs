//! A dead letter's page shows the task's headers (docs/design.md §18), and
//! none when it has none.

use peerq::dead_letters::DeadLetters;
use peerq::producer::Options;

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letters_page_shows_its_headers() {
    let world = World::start("dash-headers").await;
    world.ship.failing.store(true, Ordering::SeqCst);
    let order = Order {
        order: "order-1".into(),
    };
    let traced = Options::new()
        .header(
            "traceparent",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        )
        .header("tenant", "acme");
    world.producer.enqueue_with(&order, traced).await.unwrap();
    let plain = Order {
        order: "order-2".into(),
    };
    world.producer.enqueue(&plain).await.unwrap();
    let dead = DeadLetters::connect(&world.server.url(), &world.name)
        .await
        .unwrap();
    let mut letters = Vec::new();
    for _ in 0..200 {
        letters = dead.list(10).await.unwrap();
        if letters.len() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(letters.len(), 2);
    let addr = dashboard(&world, "", Settings::new()).await;
    for letter in &letters {
        let path = format!(
            "/services/{}/dead/letter?at={}%2F{}",
            world.name, letter.partition, letter.id
        );
        let page = get(addr, &path).await;
        assert_eq!(page.status, 200, "{}", page.body);
        if letter.headers.is_empty() {
            assert!(!page.body.contains(r#"id="headers""#), "{}", page.body);
        } else {
            assert!(
                page.body
                    .contains(r#"<tr><th>tenant</th><td class="wrap">acme</td></tr>"#)
                    && page.body.contains("00-4bf92f3577b34da6a3ce929d0e0e4736"),
                "{}",
                page.body
            );
        }
    }
    world.shutdown().await;
}
