//! The batch page (issue 40) against a real Redis and a running consumer:
//! a batch found by its id with its members by state, its callback and its
//! state (done, with a dead member), an open batch's count, a chain's step,
//! and the 404 and 400 of an unknown batch and a mistyped id.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_page_shows_its_members_by_state_and_its_callback() {
    let world = World::start("dash-batch").await;
    let addr = dashboard(&world, "", Settings::default()).await;
    let order = |o: &str| Order {
        order: o.to_owned(),
    };
    let orders = [order("a"), order("b"), order("c")];
    let batch = world.producer.batch().callback(&order("report"));
    let done = batch.enqueue(&orders).await.unwrap();
    let open = world.producer.batch().open().await.unwrap();
    open.add(&[order("d")]).await.unwrap();
    let page = |id: &str| format!("/services/{}/batch?id={id}", world.name);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let body = loop {
        let reply = get(addr, &page(done.as_str())).await;
        assert_eq!(reply.status, 200, "{}", reply.body);
        if reply.body.contains(r#"id="state" class="ok">done"#) {
            break reply.body;
        }
        assert!(tokio::time::Instant::now() < deadline, "{}", reply.body);
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(body.contains(r#"id="total">3<"#), "{body}");
    assert!(body.contains(r#"id="succeeded" class="ok">3<"#), "{body}");
    assert!(body.contains(r#"id="callback">callback<"#), "{body}");
    assert!(body.contains(r#"id="callback-id""#), "{body}");
    assert!(body.contains("3 of 3 members final"), "{body}");
    let open = get(addr, &page(open.id().as_str())).await;
    assert!(open.body.contains(r#"id="state">open<"#), "{}", open.body);
    assert!(
        open.body.contains(r#"id="callback">none<"#),
        "{}",
        open.body
    );
    let chain = world.producer.chain().step(&order("e")).step(&order("f"));
    let chain = chain.enqueue().await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let reply = get(addr, &page(chain.as_str())).await;
        if reply.body.contains(r#"id="step">2 of 2<"#) && reply.body.contains(">done<") {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{}", reply.body);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let unknown = get(addr, &page("3/no-such-batch")).await;
    assert_eq!(unknown.status, 404);
    assert!(unknown.body.contains("No such batch"), "{}", unknown.body);
    let mistyped = get(addr, &page("not-a-batch")).await;
    assert_eq!(mistyped.status, 400);
    world.shutdown().await;
}
