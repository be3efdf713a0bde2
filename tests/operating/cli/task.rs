//! `peerq tracking` and `peerq task show|cancel|wait` against a consumer
//! in this process: tracking switched on a running service, the task's
//! documented JSON fields, a cancel of a waiting task and of a final one,
//! and the one-line failures of `wait` (a timeout, an unknown task).

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tracking_switches_on_a_running_service_and_task_commands_show_cancel_and_wait() {
    let server = RedisServer::start();
    let (url, name) = (server.url(), unique_name("cli-task"));
    let handler = SendMail::default();
    let consumers = vec![consumer(&url, &name, handler.clone(), false)];
    // Off until switched on: the builder gave no value.
    let shown = until(
        "the service",
        || peerq(&url, &["tracking", "show", "--name", &name, "--json"]),
        |_| true,
    )
    .await;
    assert_eq!(
        fields(&shown),
        set(&["name", "on", "keep_ms", "keep_count"])
    );
    assert_eq!(shown["on"], false);
    let on = peerq(
        &url,
        &[
            "tracking",
            "on",
            "--name",
            &name,
            "--keep",
            "1h",
            "--keep-count",
            "50",
            "--json",
        ],
    )
    .await
    .json();
    assert_eq!(on["on"], true);
    assert_eq!(on["keep_ms"], 3_600_000);
    assert_eq!(on["keep_count"], 50);
    // The producer inside `enqueue` reads the key anew; the instances
    // within a second.
    tokio::time::sleep(Duration::from_millis(1500)).await;

    let id = peerq(
        &url,
        &["enqueue", "--name", &name, "--json", r#"{"to":"a"}"#],
    )
    .await;
    let id = id.ok().trim().to_owned();
    let done = peerq(
        &url,
        &["task", "wait", "--name", &name, "--id", &id, "--json"],
    )
    .await
    .json();
    assert_eq!(
        fields(&done),
        set(&[
            "id",
            "state",
            "attempt",
            "partition",
            "instance",
            "token",
            "progress",
            "result",
            "error",
            "reason",
            "dead_id",
            "headers",
            "cancel_requested_at",
            "enqueued_at",
            "due_at",
            "started_at",
            "finished_at",
        ])
    );
    assert_eq!(done["state"], "succeeded");
    assert_eq!(done["attempt"], 1);
    assert_eq!(
        done["result"],
        Value::Null,
        "a handler that returns nothing"
    );
    assert_eq!(
        done["headers"],
        Value::Null,
        "a succeeded task's entry is gone"
    );
    assert!(done["finished_at"].as_u64().unwrap() >= done["started_at"].as_u64().unwrap());
    let handle = done["id"].as_str().unwrap().to_owned();
    assert_eq!(handle, format!("{}/{id}", done["partition"]));
    let shown = peerq(
        &url,
        &["task", "show", "--name", &name, "--id", &handle, "--json"],
    )
    .await
    .json();
    assert_eq!(shown, done);
    let table = peerq(&url, &["task", "show", "--name", &name, "--id", &handle]).await;
    assert!(table.ok().contains("succeeded"), "{table:?}");
    let cancel = peerq(&url, &["task", "cancel", "--name", &name, "--id", &handle]).await;
    assert!(
        cancel.ok().contains("already final (succeeded)"),
        "{cancel:?}"
    );

    // Paused: a task waits; `wait` times out with one line; `cancel` ends it.
    let _ = peerq(&url, &["pause", "--name", &name]).await.ok();
    // The instances read the pause within an interval.
    tokio::time::sleep(INTERVAL * 3).await;
    let waiting = peerq(
        &url,
        &["enqueue", "--name", &name, "--json", r#"{"to":"b"}"#],
    )
    .await;
    let waiting = waiting.ok().trim().to_owned();
    let timed_out = peerq(
        &url,
        &[
            "task",
            "wait",
            "--name",
            &name,
            "--id",
            &waiting,
            "--timeout",
            "300ms",
        ],
    )
    .await;
    let line = timed_out.failure();
    assert!(
        line.contains("still waiting") && line.contains("300ms"),
        "{line}"
    );
    let cancel = peerq(
        &url,
        &[
            "task", "cancel", "--name", &name, "--id", &waiting, "--json",
        ],
    )
    .await
    .json();
    assert_eq!(cancel["outcome"], "cancelled");
    let _ = peerq(&url, &["resume", "--name", &name]).await.ok();
    let ended = peerq(
        &url,
        &["task", "wait", "--name", &name, "--id", &waiting, "--json"],
    )
    .await
    .json();
    assert_eq!(ended["state"], "cancelled");
    assert_eq!(ended["reason"], "user");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        handler.sent.load(Ordering::SeqCst),
        1,
        "the cancelled task never ran"
    );

    // An unknown task: one line, exit 1, for each command.
    for command in ["show", "wait", "cancel"] {
        let ran = peerq(
            &url,
            &["task", command, "--name", &name, "--id", "0/no-such-task"],
        )
        .await;
        assert!(ran.failure().contains("no task 0/no-such-task"), "{ran:?}");
    }
    let off = peerq(&url, &["tracking", "off", "--name", &name, "--json"])
        .await
        .json();
    assert_eq!(
        (off["on"].clone(), off["keep_count"].clone()),
        (Value::Bool(false), Value::from(50))
    );
    stop(consumers).await;
}
