//! The reshard action on a service's page (issue 47, docs/design.md §21):
//! a POST with the CSRF token starts one, which the page's `#layout` then
//! shows with its progress; without the token it is refused, and a reshard
//! Redis refuses (the count in use) is a 409 naming why.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reshard_starts_from_the_services_page_with_the_token() {
    let world = World::start("dash-reshard").await;
    let addr = dashboard(&world, "", Settings::new()).await;
    let admin = Admin::connect(&world.server.url()).await.unwrap();
    // The consumer's record first: a reshard needs a running consumer.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while admin
        .service(&world.name)
        .await
        .unwrap()
        .status()
        .await
        .unwrap()
        .members
        .is_empty()
    {
        assert!(tokio::time::Instant::now() < deadline, "no member");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let service = admin.service(&world.name).await.unwrap();
    let path = format!("/services/{}/reshard", world.name);
    let page = get(addr, &format!("/services/{}", world.name)).await;
    assert!(page.body.contains(r#"id="layout""#), "{}", page.body);
    assert!(
        page.body
            .contains(&format!("Partitions: {P} (generation 0)")),
        "{}",
        page.body
    );
    let missing = post(addr, &path, &format!("partitions={}", P * 2)).await;
    assert_eq!(missing.status, 403, "{}", missing.body);
    let csrf = token(&page.body);
    let same = post(addr, &path, &format!("csrf={csrf}&partitions={P}")).await;
    assert_eq!(same.status, 409, "{}", same.body);
    assert!(
        same.body.contains("reshard refused (`partitions`)"),
        "{}",
        same.body
    );
    let layout = service.layout().await.unwrap();
    assert_eq!(layout.generation, 0, "refused, and nothing written");

    let twice = P * 2;
    let started = post(addr, &path, &format!("csrf={csrf}&partitions={twice}")).await;
    assert_eq!(started.status, 303, "{}", started.body);
    let layout = service.layout().await.unwrap();
    assert_eq!((layout.generation, layout.partitions), (1, twice));
    let page = get(addr, &format!("/services/{}", world.name)).await;
    assert!(
        page.body
            .contains(&format!("Partitions: {twice} (generation 1)"))
            && page.body.contains(&format!("from {P}")),
        "{}",
        page.body
    );
    world.shutdown().await;
}
