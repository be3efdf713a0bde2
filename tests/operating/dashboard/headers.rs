//! A dead letter's page shows the task's headers (docs/design.md §18), and
//! none when it has none; its Replay button runs the task with them.

use peerq::dead_letters::DeadLetters;
use peerq::producer::Options;

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letters_page_shows_its_headers_and_its_replay_keeps_them() {
    let world = World::start("dash-headers").await;
    world.ship.failing.store(true, Ordering::SeqCst);
    let order = Order {
        order: "order-1".into(),
    };
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let traced = Options::new()
        .header("traceparent", traceparent)
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
    let mut traced_letter = None;
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
            traced_letter = Some((letter.cursor().to_string(), token(&page.body)));
        }
    }

    // Its Replay button: the task runs again, with its headers.
    let (at, csrf) = traced_letter.expect("the letter with headers");
    world.ship.failing.store(false, Ordering::SeqCst);
    let form = format!("csrf={csrf}&at={}", at.replace('/', "%2F"));
    let replayed = post(
        addr,
        &format!("/services/{}/dead/replay", world.name),
        &form,
    )
    .await;
    assert_eq!(replayed.status, 303, "{}", replayed.body);
    wait_until(Duration::from_secs(20), "the replayed order", || {
        world.ship.shipped.load(Ordering::SeqCst) == 1
    })
    .await;
    let seen = world.ship.headers.lock().unwrap()["order-1"].clone();
    let mut expected = peerq::Headers::new();
    expected.insert("traceparent", traceparent);
    expected.insert("tenant", "acme");
    assert_eq!(seen, expected, "the replayed run's headers");
    world.shutdown().await;
}
