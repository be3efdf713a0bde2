//! `peerq task show`'s headers (docs/design.md §18), read from the task's
//! entry wherever it is: a waiting task's in its stream, a delayed one's
//! in the delayed set, a dead one's letter; `{}` for a task without any,
//! and `null` once a task succeeded (its entry is gone).

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_show_reads_the_headers_from_the_tasks_entry_wherever_it_is() {
    let server = RedisServer::start();
    let (url, name) = (server.url(), unique_name("cli-task-headers"));
    let handler = SendMail::default();
    let consumers = vec![consumer(&url, &name, handler.clone(), false)];
    let on = || peerq(&url, &["tracking", "on", "--name", &name, "--json"]);
    until("the service", on, |_| true).await;
    let _ = peerq(&url, &["pause", "--name", &name]).await.ok();
    // The instances read the pause, and the tracking, within a second.
    tokio::time::sleep(Duration::from_millis(1500)).await;

    let enqueue = |extra: &[&str]| {
        let mut args = vec!["enqueue", "--name", &name];
        args.extend_from_slice(extra);
        let run = peerq(&url, &args);
        async move { run.await.ok().trim().to_owned() }
    };
    let headed = ["--header", "tenant=acme", "--header", "request-id=r-1"];
    let waiting = enqueue(&[&headed[..], &["--json", r#"{"to":"a"}"#]].concat()).await;
    let plain = enqueue(&["--json", r#"{"to":"b"}"#]).await;
    let delayed =
        enqueue(&[&headed[..], &["--delay", "1h", "--json", r#"{"to":"c"}"#]].concat()).await;
    let show = |id: &str| {
        peerq(
            &url,
            &["task", "show", "--name", &name, "--id", id, "--json"],
        )
    };
    let both = serde_json::json!({"tenant": "acme", "request-id": "r-1"});

    let shown = show(&waiting).await.json();
    assert_eq!(shown["state"], "waiting");
    assert_eq!(shown["headers"], both, "from the stream: {shown}");
    let shown = show(&plain).await.json();
    assert_eq!(shown["headers"], serde_json::json!({}), "none: {shown}");
    let shown = show(&delayed).await.json();
    assert_eq!(shown["state"], "delayed");
    assert_eq!(shown["headers"], both, "from the delayed set: {shown}");
    let table = peerq(&url, &["task", "show", "--name", &name, "--id", &waiting]).await;
    let table = table.ok();
    assert!(
        table.contains("headers              2\n") && table.contains("h:tenant             acme\n"),
        "{table}"
    );

    // Refused for good: the letter holds them.
    handler.refuse.store(true, Ordering::SeqCst);
    let _ = peerq(&url, &["resume", "--name", &name]).await.ok();
    let dead = until(
        "the task to die",
        || show(&waiting),
        |s| s["state"] == "dead",
    )
    .await;
    assert_eq!(dead["headers"], both, "from the dead letter: {dead}");

    // Succeeded: its entry is acked and trimmed; none is read.
    handler.refuse.store(false, Ordering::SeqCst);
    let done = enqueue(&[&headed[..], &["--json", r#"{"to":"d"}"#]].concat()).await;
    let args = ["task", "wait", "--name", &name, "--id", &done, "--json"];
    let done = peerq(&url, &args).await.json();
    assert_eq!(done["state"], "succeeded");
    assert_eq!(done["headers"], Value::Null, "{done}");
    stop(consumers).await;
}
