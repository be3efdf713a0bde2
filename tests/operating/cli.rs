//! The `peerq` admin CLI (feature `cli`), run as a process the way an
//! operator runs it, against private redis-servers with consumers running
//! in this process: `status` names every member and an owner for every
//! partition, `enqueue` of a JSON task is handled and a bincode service is
//! refused naming its codec, `dead replay` runs a task again, `pause` and
//! `resume` write and remove `{N}:paused`, the `--json` output has its
//! documented fields, and the failures (an unknown service, an unreachable
//! Redis, a wrong password, a usage error) exit 1 or 2 with one line that
//! never holds the password. `migrate`, which needs a PostgreSQL instead:
//! `cli/migrate.rs`; `ids`, which needs three servers of its own:
//! `cli/ids.rs`; `status` of a membership on etcd: `cli/etcd.rs`.

#[cfg(feature = "etcd")]
mod etcd;
mod exporter;
mod ids;
mod limit;
mod migrate;
mod reshard;
mod task;
mod task_headers;
mod unique;
use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use deadpool_redis::redis;
use peerq::Periodic;
use peerq::producer::Producer;
use peerq::{Consumer, Handler, HandlerError, TaskContext};
use peerq::{Headers, Json};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use support::{RedisServer, ServerOptions, unique_name, unused_port, wait_until};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const BIN: &str = env!("CARGO_BIN_EXE_peerq");
const P: u32 = 4;
/// A short interval, so instances are assigned within a second or so.
const INTERVAL: Duration = Duration::from_millis(300);
/// Below `INTERVAL / 2`, as the drain timeout must be.
const DRAIN: Duration = Duration::from_millis(100);
/// Generous bound for anything that takes a few rounds.
const WITHIN: Duration = Duration::from_secs(20);

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Mail {
    to: String,
}

/// Counts the mails it sent, and keeps the headers each recipient's last
/// run saw; while `refuse` is set, refuses them for good (they go to the
/// dead letters).
#[derive(Clone, Default)]
struct SendMail {
    sent: Arc<AtomicU64>,
    refuse: Arc<AtomicBool>,
    headers: Arc<Mutex<HashMap<String, Headers>>>,
}

impl Handler for SendMail {
    type Task = Mail;
    async fn handle(&self, mail: Mail, cx: TaskContext) -> Result<(), HandlerError> {
        let headers = cx.headers().clone();
        self.headers
            .lock()
            .unwrap()
            .insert(mail.to.clone(), headers);
        if self.refuse.load(Ordering::SeqCst) {
            return Err(HandlerError::msg(format!("mailbox of {} is full", mail.to)).permanent());
        }
        self.sent.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

/// A consumer of `name` (JSON codec, `P` partitions; with `tick`, a
/// periodic job `tick` once a second) running in this process until its
/// token is cancelled.
fn consumer(
    url: &str,
    name: &str,
    handler: SendMail,
    tick: bool,
) -> (CancellationToken, JoinHandle<peerq::Result<()>>) {
    support::init_tracing();
    // The codec first: a periodic job's task is encoded with the codec the
    // builder has when the job is registered.
    let builder = Consumer::builder()
        .name(name)
        .redis(url)
        .partitions(P)
        .interval(INTERVAL)
        .drain_timeout(DRAIN)
        .codec(Json);
    let builder = match tick {
        true => builder.periodic(
            Periodic::every("tick", Duration::from_secs(1)),
            &Mail { to: "tick".into() },
        ),
        false => builder,
    };
    let stop = CancellationToken::new();
    let run = builder
        .handler(handler)
        .run_until(stop.clone().cancelled_owned());
    (stop, tokio::spawn(run))
}

async fn stop(consumers: Vec<(CancellationToken, JoinHandle<peerq::Result<()>>)>) {
    for (stop, _) in &consumers {
        stop.cancel();
    }
    for (_, run) in consumers {
        run.await.unwrap().unwrap();
    }
}

/// What a `peerq` run said.
#[derive(Debug)]
struct Ran {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Ran {
    /// Its stdout as JSON, after checking it succeeded.
    fn json(&self) -> Value {
        assert_eq!(self.code, Some(0), "{self:?}");
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {self:?}"))
    }

    /// Its stdout, after checking it succeeded.
    fn ok(&self) -> &str {
        assert_eq!(self.code, Some(0), "{self:?}");
        &self.stdout
    }

    /// Its one line on stderr, after checking it failed with exit code 1.
    fn failure(&self) -> &str {
        assert_eq!(self.code, Some(1), "{self:?}");
        assert!(self.stdout.is_empty(), "{self:?}");
        assert_eq!(self.stderr.lines().count(), 1, "one line: {self:?}");
        self.stderr.trim_end()
    }
}

/// Runs `peerq --redis url args…` (without `PEERQ_REDIS_URL`).
fn peerq(url: &str, args: &[&str]) -> impl Future<Output = Ran> + use<> {
    let mut cmd = Command::new(BIN);
    cmd.env_remove("PEERQ_REDIS_URL")
        .arg("--redis")
        .arg(url)
        .args(args);
    run(cmd)
}

async fn run(mut cmd: Command) -> Ran {
    let out = tokio::task::spawn_blocking(move || cmd.output())
        .await
        .unwrap()
        .expect("run peerq");
    Ran {
        code: out.status.code(),
        stdout: String::from_utf8(out.stdout).unwrap(),
        stderr: String::from_utf8(out.stderr).unwrap(),
    }
}

/// Runs `read` until it succeeds with a JSON answer that satisfies `done`
/// (a service whose consumers are starting may not exist yet); returns that
/// answer.
async fn until<F, Fut>(what: &str, mut read: F, done: impl Fn(&Value) -> bool) -> Value
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Ran>,
{
    let deadline = Instant::now() + WITHIN;
    loop {
        let ran = read().await;
        if ran.code == Some(0) {
            let answer = ran.json();
            if done(&answer) {
                return answer;
            }
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {ran:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The keys of a JSON object.
fn fields(value: &Value) -> BTreeSet<&str> {
    value
        .as_object()
        .unwrap_or_else(|| panic!("not an object: {value}"))
        .keys()
        .map(String::as_str)
        .collect()
}

fn set<'a>(names: &[&'a str]) -> BTreeSet<&'a str> {
    names.iter().copied().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_names_every_member_and_an_owner_for_every_partition() {
    let server = RedisServer::start();
    let (url, name) = (server.url(), unique_name("cli-status"));
    let consumers = vec![
        consumer(&url, &name, SendMail::default(), true),
        consumer(&url, &name, SendMail::default(), true),
    ];
    let status = || peerq(&url, &["status", "--name", &name, "--json"]);
    // Both assigned as one of two, and owning partitions: the first alone
    // (as one of one) owns every partition until the handover, and a
    // member's record can say replicas 1 for a round after the other's
    // says 2 (a wait on owners alone ended there, now and then).
    let status = until("two members owning every partition", status, |s| {
        let members: Vec<&str> = s["members"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["standing"] == "assigned" && m["live"] == true)
            .filter(|m| m["replicas"] == 2)
            .filter_map(|m| m["id"].as_str())
            .collect();
        let owners: BTreeSet<&str> = s["partitions"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|p| p["owner"].as_str())
            .collect();
        members.len() == 2
            && s["partitions"].as_array().unwrap().len() == P as usize
            && owners == members.iter().copied().collect()
    })
    .await;

    // The documented JSON fields.
    assert_eq!(
        fields(&status),
        set(&[
            "name",
            "redis",
            "at_ms",
            "settings",
            "paused",
            "limits",
            "layout",
            "members",
            "partitions",
            "singletons",
            "totals",
            "rates",
            "etcd"
        ])
    );
    assert_eq!(status["name"], name.as_str());
    assert_eq!(status["etcd"], Value::Null, "rounds on redis");
    assert_eq!(status["paused"], Value::Null);
    assert_eq!(
        fields(&status["limits"]),
        set(&[
            "rate",
            "rate_per_key",
            "concurrency_per_key",
            "waiting_per_key"
        ])
    );
    assert_eq!(status["limits"]["rate"], Value::Null);
    assert_eq!(
        fields(&status["settings"]),
        set(&[
            "kind",
            "partitions",
            "codec",
            "interval",
            "skew",
            "lease_margin",
            "indexing",
            "assignor",
            "drain_timeout",
            "ordered",
            "priorities",
            "limit_key",
            "membership",
            "etcd_prefix"
        ])
    );
    assert_eq!(status["settings"]["membership"], "redis");
    assert_eq!(status["settings"]["etcd_prefix"], Value::Null);
    assert_eq!(status["settings"]["partitions"], P);
    assert_eq!(status["settings"]["priorities"], "normal");
    assert_eq!(status["settings"]["limit_key"], "partition");
    assert_eq!(status["settings"]["codec"], "json");
    assert_eq!(status["settings"]["kind"], "consumer");
    assert_eq!(status["settings"]["interval"], "300ms");
    let member = &status["members"][0];
    assert_eq!(
        fields(member),
        set(&[
            "id",
            "host",
            "pid",
            "version",
            "started_at_ms",
            "standing",
            "index",
            "replicas",
            "epoch",
            "owned",
            "in_flight",
            "handled",
            "aside",
            "seen_at_ms",
            "seen_ago_ms",
            "live"
        ])
    );
    assert_eq!(
        (member["index"].as_u64(), member["replicas"].as_u64()),
        (Some(1), Some(2))
    );
    assert_eq!(
        fields(&status["partitions"][0]),
        set(&[
            "partition",
            "owner",
            "token",
            "length",
            "pending",
            "backlog",
            "oldest_pending_age_ms",
            "delayed",
            "dead"
        ])
    );
    assert!(status["partitions"][0]["token"].as_u64().is_some());
    assert_eq!(
        fields(&status["totals"]),
        set(&[
            "length",
            "pending",
            "backlog",
            "delayed",
            "dead",
            "owned_partitions",
            "live_members",
            "in_flight",
            "handled"
        ])
    );
    assert_eq!(status["totals"]["owned_partitions"], P);
    assert_eq!(
        fields(&status["rates"]),
        set(&[
            "window_s",
            "ok",
            "failed",
            "dead",
            "retried",
            "ok_per_s",
            "failed_per_s",
            "dead_per_s",
            "retried_per_s",
            "minutes"
        ])
    );
    assert_eq!(status["rates"]["minutes"].as_array().unwrap().len(), 5);

    // The table: each member, and each partition's row names a member.
    let ids: Vec<&str> = status["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    let table = peerq(&url, &["status", "--name", &name]).await;
    let table = table.ok();
    for id in &ids {
        assert!(table.contains(id), "{id} missing:\n{table}");
    }
    let owned: BTreeSet<u32> = table
        .lines()
        .filter_map(|line| {
            let mut cells = line.split_whitespace();
            let p: u32 = cells.next()?.parse().ok()?;
            ids.contains(&cells.next()?).then_some(p)
        })
        .collect();
    assert_eq!(
        owned,
        (0..P).collect(),
        "a partition without a live owner:\n{table}"
    );

    // `services` lists it with its two instances.
    let services = peerq(&url, &["services", "--json"]).await.json();
    let ours = services
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == name.as_str())
        .unwrap_or_else(|| panic!("{name} not listed: {services}"));
    assert_eq!(
        fields(ours),
        set(&[
            "name",
            "partitions",
            "codec",
            "instances",
            "backlog",
            "delayed",
            "dead",
            "paused"
        ])
    );
    assert_eq!(
        (ours["instances"].as_u64(), ours["paused"].as_bool()),
        (Some(2), Some(false))
    );
    assert!(peerq(&url, &["services"]).await.ok().contains(&name));

    // `periodic list`: the job, triggered once a second.
    let periodic = || peerq(&url, &["periodic", "list", "--name", &name, "--json"]);
    let jobs = until("the tick to trigger", periodic, |jobs| {
        jobs[0]["last_due_ms"].as_u64().is_some()
    })
    .await;
    let tick = &jobs[0];
    assert_eq!(
        fields(tick),
        set(&[
            "name",
            "every_ms",
            "cron",
            "missed",
            "partition",
            "generation",
            "last_due_ms",
            "next_due_ms"
        ])
    );
    assert_eq!(
        (tick["name"].as_str(), tick["every_ms"].as_u64()),
        (Some("tick"), Some(1000))
    );
    assert!(
        tick["next_due_ms"].as_u64() > tick["last_due_ms"].as_u64(),
        "{tick}"
    );
    stop(consumers).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueued_tasks_are_handled_and_dead_letters_replayed_and_purged() {
    let server = RedisServer::start();
    let (url, name) = (server.url(), unique_name("cli-dead"));
    let mail = SendMail::default();
    let consumers = vec![consumer(&url, &name, mail.clone(), false)];
    let (sent, refuse) = (mail.sent.clone(), mail.refuse.clone());
    let status = || peerq(&url, &["status", "--name", &name, "--json"]);
    until("the consumer to own every partition", status, |s| {
        s["totals"]["owned_partitions"] == P
    })
    .await;

    // `enqueue` prints the task's id, and the task is handled.
    let id = peerq(
        &url,
        &[
            "enqueue",
            "--name",
            &name,
            "--json",
            r#"{"to":"a@example.com"}"#,
        ],
    )
    .await;
    assert_eq!(id.ok().lines().count(), 1, "{id:?}");
    wait_until(WITHIN, "the enqueued task to be handled", || {
        sent.load(Ordering::SeqCst) == 1
    })
    .await;

    // A task refused for good becomes a dead letter, with its fields.
    // With headers (`--header`), which the letter keeps.
    refuse.store(true, Ordering::SeqCst);
    peerq(
        &url,
        &[
            "enqueue",
            "--name",
            &name,
            "--header",
            "tenant=acme",
            "--header",
            "request-id=r-1",
            "--json",
            r#"{"to":"b@example.com"}"#,
        ],
    )
    .await
    .ok();
    let list = || peerq(&url, &["dead", "list", "--name", &name, "--json"]);
    let page = until("a dead letter", list, |page| {
        page["letters"].as_array().unwrap().len() == 1
    })
    .await;
    assert_eq!(fields(&page), set(&["letters", "next"]));
    assert_eq!(page["next"], Value::Null);
    let letter = &page["letters"][0];
    assert_eq!(
        fields(letter),
        set(&[
            "partition",
            "id",
            "ref",
            "task_id",
            "reason",
            "error",
            "attempts",
            "failures",
            "dead_at_ms",
            "key",
            "headers",
            "codec",
            "enqueued_at_ms",
            "stream_id",
            "payload_bytes",
            "payload",
            "payload_hex"
        ])
    );
    assert_eq!(
        letter["headers"],
        serde_json::json!({"tenant": "acme", "request-id": "r-1"})
    );
    assert_eq!(letter["reason"], "permanent");
    assert_eq!(letter["error"], "mailbox of b@example.com is full");
    assert_eq!(
        letter["payload"],
        serde_json::json!({"to": "b@example.com"})
    );
    let reference = letter["ref"].as_str().unwrap().to_owned();
    let bare_id = letter["id"].as_str().unwrap().to_owned();

    // `dead show` finds it by its bare id too.
    let shown = peerq(
        &url,
        &["dead", "show", "--name", &name, "--id", &bare_id, "--json"],
    )
    .await;
    assert_eq!(shown.json()["ref"], reference.as_str());
    let shown = peerq(&url, &["dead", "show", "--name", &name, "--id", &reference]).await;
    assert!(
        shown.ok().contains("permanent")
            && shown.ok().contains("b@example.com")
            && shown.ok().contains("h:tenant     acme"),
        "{shown:?}"
    );
    let listed = peerq(
        &url,
        &["dead", "list", "--name", &name, "--reason", "permanent"],
    )
    .await;
    assert!(listed.ok().contains(&reference), "{listed:?}");

    // `dead replay` runs it again: the handler, and the member's count.
    refuse.store(false, Ordering::SeqCst);
    let replayed = peerq(
        &url,
        &[
            "dead", "replay", "--name", &name, "--id", &reference, "--json",
        ],
    )
    .await;
    assert_eq!(
        replayed.json(),
        serde_json::json!({"name": name, "replayed": 1})
    );
    wait_until(WITHIN, "the replayed task to be handled", || {
        sent.load(Ordering::SeqCst) == 2
    })
    .await;
    let mut expected = Headers::new();
    expected.insert("tenant", "acme");
    expected.insert("request-id", "r-1");
    let seen = mail.headers.lock().unwrap()["b@example.com"].clone();
    assert_eq!(seen, expected, "the replayed run's headers");
    until("the member to count the replayed task", status, |s| {
        s["members"][0]["handled"].as_u64() >= Some(2)
    })
    .await;
    let page = peerq(&url, &["dead", "list", "--name", &name, "--json"])
        .await
        .json();
    assert_eq!(page["letters"], serde_json::json!([]));
    let again = peerq(
        &url,
        &["dead", "replay", "--name", &name, "--id", &reference],
    )
    .await;
    assert!(again.failure().contains("no dead letter"), "{again:?}");

    // `dead purge --all` removes them for good.
    refuse.store(true, Ordering::SeqCst);
    for to in ["c", "d"] {
        let task = format!(r#"{{"to":"{to}"}}"#);
        peerq(&url, &["enqueue", "--name", &name, "--json", &task])
            .await
            .ok();
    }
    let list = || peerq(&url, &["dead", "list", "--name", &name, "--json"]);
    until("two dead letters", list, |page| {
        page["letters"].as_array().unwrap().len() == 2
    })
    .await;
    let purged = peerq(&url, &["dead", "purge", "--name", &name, "--all", "--json"]).await;
    assert_eq!(purged.json()["purged"], 2);
    let page = peerq(&url, &["dead", "list", "--name", &name, "--json"])
        .await
        .json();
    assert_eq!(page["letters"], serde_json::json!([]));

    // A delayed enqueue waits in `delayed list`.
    let task = r#"{"to":"e"}"#;
    let args: [&str; 9] = [
        "enqueue", "--name", &name, "--delay", "1h", "--key", "later", "--json", task,
    ];
    peerq(&url, &args).await.ok();
    let delayed = peerq(&url, &["delayed", "list", "--name", &name, "--json"])
        .await
        .json();
    assert_eq!(fields(&delayed), set(&["total", "tasks"]));
    assert_eq!(delayed["total"], 1);
    let task = &delayed["tasks"][0];
    assert_eq!(
        fields(task),
        set(&[
            "partition",
            "due_at_ms",
            "due_in_ms",
            "task_id",
            "key",
            "attempt",
            "codec",
            "enqueued_at_ms",
            "payload_bytes",
            "payload",
            "payload_hex"
        ])
    );
    assert_eq!(
        (task["key"].as_str(), task["attempt"].as_u64()),
        (Some("later"), Some(1))
    );
    assert_eq!(task["payload"], serde_json::json!({"to": "e"}));
    assert!(task["due_in_ms"].as_u64() > Some(3_500_000), "{task}");
    let table = peerq(&url, &["delayed", "list", "--name", &name]).await;
    assert!(table.ok().starts_with("1 delayed tasks"), "{table:?}");

    // Input that is not a task, or not a duration.
    let not_json = peerq(&url, &["enqueue", "--name", &name, "--json", "{to:"]).await;
    assert!(not_json.failure().contains("not JSON"), "{not_json:?}");
    let args = [
        "enqueue", "--name", &name, "--header", "tenant", "--json", "{}",
    ];
    let no_value = peerq(&url, &args).await;
    assert_eq!(no_value.code, Some(2), "{no_value:?}");
    assert!(no_value.stderr.contains("NAME=VALUE"), "{no_value:?}");
    let args = [
        "enqueue", "--name", &name, "--header", "a b=c", "--json", "{}",
    ];
    let odd = peerq(&url, &args).await;
    assert!(odd.failure().contains("`header`"), "{odd:?}");
    let soon = peerq(
        &url,
        &[
            "enqueue", "--name", &name, "--delay", "soon", "--json", "{}",
        ],
    )
    .await;
    assert_eq!(soon.code, Some(2), "{soon:?}");
    stop(consumers).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_writes_the_key_and_resume_removes_it() {
    let server = RedisServer::start();
    let (url, name) = (server.url(), unique_name("cli-pause"));
    // A bincode service, recorded by its producer.
    Producer::builder()
        .redis(&url)
        .name(&name)
        .partitions(P)
        .connect()
        .await
        .unwrap();
    let mut conn = server.connection().await;
    let key = format!("{{{name}}}:paused");

    let paused = peerq(
        &url,
        &["pause", "--name", &name, "--by", "deploy-42", "--json"],
    )
    .await;
    let paused = paused.json();
    assert_eq!(fields(&paused), set(&["name", "paused"]));
    assert_eq!(fields(&paused["paused"]), set(&["at_ms", "by"]));
    assert_eq!(paused["paused"]["by"], "deploy-42");
    let record: Option<String> = redis::cmd("GET")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .unwrap();
    let record: Value = serde_json::from_str(&record.expect("{N}:paused exists")).unwrap();
    assert_eq!(record["by"], "deploy-42");

    // Pausing again keeps the first pause.
    let again = peerq(
        &url,
        &["pause", "--name", &name, "--by", "someone-else", "--json"],
    )
    .await;
    assert_eq!(again.json()["paused"]["by"], "deploy-42");
    let status = peerq(&url, &["status", "--name", &name]).await;
    assert!(status.ok().contains("PAUSED by deploy-42"), "{status:?}");
    let status = peerq(&url, &["status", "--name", &name, "--json"])
        .await
        .json();
    assert_eq!(status["paused"]["by"], "deploy-42");
    let services = peerq(&url, &["services", "--json"]).await.json();
    assert_eq!(services[0]["paused"], true, "{services}");

    let resumed = peerq(&url, &["resume", "--name", &name, "--json"]).await;
    assert_eq!(
        resumed.json(),
        serde_json::json!({"name": name, "resumed": true})
    );
    let exists: bool = redis::cmd("EXISTS")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(!exists, "{key} is gone");
    let status = peerq(&url, &["status", "--name", &name]).await;
    assert!(status.ok().contains("paused: no"), "{status:?}");
    let again = peerq(&url, &["resume", "--name", &name]).await;
    assert!(again.ok().contains("was not paused"), "{again:?}");

    // By default, the pause names user@host.
    let paused = peerq(&url, &["pause", "--name", &name, "--json"])
        .await
        .json();
    assert!(
        paused["paused"]["by"].as_str().unwrap().contains('@'),
        "{paused}"
    );

    // A bincode service takes no JSON task, and the refusal names the codec.
    let refused = peerq(
        &url,
        &["enqueue", "--name", &name, "--json", r#"{"to":"a"}"#],
    )
    .await;
    let line = refused.failure();
    assert!(line.contains("bincode") && line.contains("codec"), "{line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_exit_1_with_one_line_and_usage_errors_exit_2() {
    const PASSWORD: &str = "s3cret-pw";
    let server = RedisServer::start_with(ServerOptions {
        requirepass: Some(PASSWORD),
        ..ServerOptions::default()
    });
    let url = server.url();
    assert!(
        url.contains(PASSWORD),
        "the harness puts the password in the URL"
    );

    // The right password works, from the environment too.
    peerq(&url, &["services", "--json"]).await.json();
    let mut from_env = Command::new(BIN);
    from_env.env("PEERQ_REDIS_URL", &url).args(["services"]);
    let from_env = run(from_env).await;
    assert!(
        from_env.ok().starts_with("no peerq services"),
        "{from_env:?}"
    );

    // An unknown service.
    let unknown = peerq(&url, &["status", "--name", "no-such-service"]).await;
    let line = unknown.failure();
    assert!(line.contains("no service `no-such-service`"), "{line}");
    assert!(!line.contains(PASSWORD), "{line}");

    // A wrong password, and none.
    let port = server.port();
    for wrong in [
        format!("redis://:wrong-pw@127.0.0.1:{port}/"),
        format!("redis://127.0.0.1:{port}/"),
    ] {
        let refused = peerq(&wrong, &["services"]).await;
        let line = refused.failure();
        assert!(line.contains(&format!("127.0.0.1:{port}")), "{line}");
        assert!(
            line.contains("password") || line.contains("NOAUTH"),
            "{line}"
        );
        assert!(
            !line.contains("wrong-pw") && !line.contains(PASSWORD),
            "{line}"
        );
    }

    // An unreachable Redis.
    let nowhere = format!("redis://:{PASSWORD}@127.0.0.1:{}/", unused_port());
    let unreachable = peerq(&nowhere, &["status", "--name", "x"]).await;
    let line = unreachable.failure();
    assert!(
        line.contains("cannot use redis at redis://:***@127.0.0.1:"),
        "{line}"
    );
    assert!(!line.contains(PASSWORD), "{line}");

    // Usage errors: clap's exit code 2.
    for args in [
        &["status"][..],
        &["dead", "replay", "--name", "x"],
        &["dead", "purge", "--name", "x", "--id", "1-0", "--all"],
        &[
            "dead", "replay", "--name", "x", "--id", "1-0", "--reason", "failed",
        ],
        &["no-such-command"],
    ] {
        let ran = peerq(&url, args).await;
        assert_eq!(ran.code, Some(2), "{args:?}: {ran:?}");
    }
    let mut no_redis = Command::new(BIN);
    no_redis.env_remove("PEERQ_REDIS_URL").args(["services"]);
    let no_redis = run(no_redis).await;
    assert_eq!(no_redis.code, Some(2), "{no_redis:?}");
    assert!(no_redis.stderr.contains("PEERQ_REDIS_URL"), "{no_redis:?}");
}

/// `peerq dashboard` serves the dashboard alone, read-only on request, and
/// stops on SIGTERM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_serves_alone_until_sigterm() {
    let server = RedisServer::start();
    let port = support::unused_port();
    let child = std::process::Command::new(BIN)
        .args(["--redis", &server.url(), "dashboard", "--read-only"])
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut proc = support::Proc(child);
    // A raw request with the given Host header, once the dashboard listens.
    let ask = move |host: String| {
        tokio::task::spawn_blocking(move || {
            let deadline = std::time::Instant::now() + Duration::from_secs(20);
            loop {
                if let Ok(mut tcp) = std::net::TcpStream::connect(("127.0.0.1", port)) {
                    use std::io::{Read as _, Write as _};
                    let request =
                        format!("GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
                    tcp.write_all(request.as_bytes()).unwrap();
                    let mut page = String::new();
                    tcp.read_to_string(&mut page).unwrap();
                    return page;
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "the dashboard never listened"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        })
    };
    let page = ask(format!("127.0.0.1:{port}")).await.unwrap();
    // On loopback it answers only for this machine's names: a page of
    // another site whose name points at 127.0.0.1 gets nothing.
    let rebound = ask(format!("evil.example:{port}")).await.unwrap();
    assert!(rebound.starts_with("HTTP/1.1 421"), "{rebound}");
    assert!(page.starts_with("HTTP/1.1 200"), "{page}");
    assert!(page.contains("read-only"), "{page}");
    support::signal(proc.0.id(), "TERM");
    let status = tokio::task::spawn_blocking(move || {
        let status = proc.0.wait().unwrap();
        let mut err = String::new();
        use std::io::Read as _;
        proc.0
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        (status, err)
    })
    .await
    .unwrap();
    assert!(status.0.success(), "{status:?}");
    assert!(
        status.1.contains(&format!("http://127.0.0.1:{port}/")),
        "{}",
        status.1
    );
}
