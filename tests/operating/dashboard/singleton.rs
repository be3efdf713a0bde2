//! A service's page shows who holds each singleton (issue 41,
//! `#singletons`): the name, the holder's instance id and its token, as
//! `Service::singletons` reads them.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_services_page_shows_the_holder_of_each_singleton() {
    let world = World::start("dash-singleton").await;
    let admin = Admin::connect(&world.server.url()).await.unwrap();
    let service = admin.service(&world.name).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let held = loop {
        let held = service.singletons().await.unwrap();
        if !held.is_empty() {
            break held;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the singleton never ran"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let addr = dashboard(&world, "", Settings::new()).await;
    let page = get(addr, &format!("/services/{}", world.name)).await;
    assert_eq!(page.status, 200, "{}", page.body);
    let at = page.body.find(r#"id="singletons""#).expect("#singletons");
    let end = at + page.body[at..].find("</table>").unwrap();
    let table = &page.body[at..end];
    assert!(table.contains(r#"data-singleton="sweeper""#), "{table}");
    assert!(table.contains(&held[0].instance), "{table}");
    assert!(table.contains(&held[0].token.to_string()), "{table}");
    world.shutdown().await;
}
