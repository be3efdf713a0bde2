//! A batch across a reshard (docs/design.md §19, §21): members enqueued
//! before it (some delayed past the cut-over, so they move), during it and
//! after it each count once, a member that died in the old layout counts
//! as dead, and the callback runs once with those counts.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_whose_members_span_a_reshard_calls_back_once_with_every_count() {
    let t = setup(&[5], false).await;
    let admin = Admin::connect(t.server.url()).await.unwrap();
    let service = admin.service(&t.name).await.unwrap();
    // A reshard needs its consumer's membership record.
    let deadline = tokio::time::Instant::now() + 20 * 1000 * MS;
    while service.status().await.unwrap().members.is_empty() {
        assert!(tokio::time::Instant::now() < deadline, "never a member");
        tokio::time::sleep(50 * MS).await;
    }
    let open = t.producer.batch().callback(&callback("spanned")).open();
    let open = open.await.unwrap();
    // Before: ten at once (one of them dies), ten delayed past the open.
    let now: Vec<Job> = (0..10).map(|m| member(m, m == 5)).collect();
    let mut ids = open.add(&now).await.unwrap();
    let later: Vec<(Job, Options)> = (10..20)
        .map(|m| {
            let options = Options::new().key(format!("k{m}")).delay(4000 * MS);
            (member(m, false), options)
        })
        .collect();
    ids.extend(open.add_with(&later).await.unwrap());
    service.reshard(8).await.unwrap();
    // During the drain, and after the open: the new layout's.
    let during: Vec<Job> = (20..30).map(|m| member(m, false)).collect();
    ids.extend(open.add(&during).await.unwrap());
    let deadline = tokio::time::Instant::now() + 20 * 1000 * MS;
    while service.layout().await.unwrap().state != "open" {
        assert!(tokio::time::Instant::now() < deadline, "never opened");
        tokio::time::sleep(50 * MS).await;
    }
    let after: Vec<Job> = (30..40).map(|m| member(m, false)).collect();
    ids.extend(open.add(&after).await.unwrap());
    let id = open.seal().await.unwrap();

    let record = &t.record;
    let deadline = tokio::time::Instant::now() + 20 * 1000 * MS;
    while callbacks(record).is_empty() {
        if tokio::time::Instant::now() > deadline {
            let v = view(&t.server.url(), &t.name, &id).await;
            let ran: Vec<u64> = record.lock().unwrap().members.keys().copied().collect();
            panic!("no callback: {v:?}, ran {ran:?}");
        }
        tokio::time::sleep(50 * MS).await;
    }
    tokio::time::sleep(1000 * MS).await;
    let ran = callbacks(record);
    assert_eq!(ran.len(), 1, "{ran:?}");
    let (tag, summary) = &ran[0];
    assert_eq!((tag.as_str(), &summary.batch), ("spanned", &id));
    assert_eq!(counts(summary), (40, 39, 1, 0));
    assert_eq!(summary.dead_ids, vec![ids[5].clone()]);
    let members = t.record.lock().unwrap().members.clone();
    assert_eq!(members.len(), 40);
    for (m, runs) in &members {
        assert_eq!(runs, &vec![Some(id.clone())], "member {m}");
    }
    t.instance.leave().await;
}
