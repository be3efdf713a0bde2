//! The deployable examples, run as a person (or Kubernetes) would: the
//! `worker` with its settings from the environment, its probes and metrics
//! over HTTP and its graceful leave on SIGTERM, and the axum
//! `web_service` beside it, enqueueing from its requests and answering the
//! tasks' states.
//!
//! The client is a few lines of HTTP/1.1 over a `TcpStream`
//! (`Connection: close`): the examples' replies are small and whole.
//!
//! Built with the `http` feature only: the worker example needs it.
#![cfg(feature = "http")]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

use peerq::admin::Admin;
use peerq::producer::Producer;
use peerq::tracking::TaskHandle;
use peerq::{Json, TaskId};
use serde::Serialize;
use serde_json::Value;
use support::{Proc, RedisServer, ServerOptions, unique_name, unused_port};

/// How long a process may take to print its first line.
const START: Duration = Duration::from_secs(30);
/// The worker's leave timeout in these tests: a graceful leave takes one
/// to two round intervals (1 s each) and the drain.
const LEAVE: Duration = Duration::from_secs(15);

/// The worker's task, as any producer writes it (JSON).
#[derive(Serialize)]
struct Mail {
    to: String,
    subject: String,
}

/// Starts the worker example for service `name` on `url`, serving HTTP on
/// 127.0.0.1:`port`; returns it with its stdout's lines (its logs go to
/// the test's stderr).
fn worker(url: &str, name: &str, port: u16) -> (Proc, Receiver<String>) {
    let mut child = Command::new(support::example_binary("worker"))
        .env("PEERQ_REDIS_URL", url)
        .env("PEERQ_SERVICE", name)
        .env("PEERQ_HTTP_ADDR", format!("127.0.0.1:{port}"))
        .env("PEERQ_LEAVE_TIMEOUT_SECS", LEAVE.as_secs().to_string())
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the worker");
    let printed = lines(child.stdout.take().unwrap());
    (Proc(child), printed)
}

/// Starts the worker and waits for its ready line.
fn ready_worker(url: &str, name: &str, port: u16) -> Proc {
    let (worker, printed) = worker(url, name, port);
    let line = printed
        .recv_timeout(START)
        .expect("the worker's ready line");
    assert_eq!(
        line,
        format!("worker ready service={name} http=127.0.0.1:{port}")
    );
    worker
}

/// The lines `out` prints, as they come.
fn lines(out: impl Read + Send + 'static) -> Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// Waits for `process` to exit, at most `within`; its status.
fn exit_within(process: &mut Proc, within: Duration) -> ExitStatus {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = process.0.try_wait().unwrap() {
            return status;
        }
        assert!(Instant::now() < deadline, "still running after {within:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// What `read` gives once it gives something, tried for at most 30 s.
fn eventually<T>(what: &str, mut read: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(value) = read() {
            return value;
        }
        assert!(Instant::now() < deadline, "never: {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// An HTTP reply.
#[derive(Debug)]
struct Reply {
    status: u16,
    /// The status line and headers.
    head: String,
    body: String,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {self:?}"))
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().skip(1).find_map(|line| {
            let (n, v) = line.split_once(':')?;
            n.trim().eq_ignore_ascii_case(name).then(|| v.trim())
        })
    }
}

/// `method path` at 127.0.0.1:`port`, with a JSON body if given.
fn request(port: u16, method: &str, path: &str, json: Option<&str>) -> Reply {
    let mut tcp = TcpStream::connect(("127.0.0.1", port))
        .unwrap_or_else(|e| panic!("{method} {path} on port {port}: {e}"));
    // Above the web service's own 5 s wait for Redis.
    tcp.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    let mut request =
        format!("{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n");
    match json {
        Some(body) => request.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )),
        None => request.push_str("\r\n"),
    }
    tcp.write_all(request.as_bytes()).unwrap();
    let mut reply = String::new();
    tcp.read_to_string(&mut reply)
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
    let (head, body) = reply.split_once("\r\n\r\n").unwrap_or((&reply, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{method} {path}: no HTTP reply: {reply:?}"));
    Reply {
        status,
        head: head.to_owned(),
        body: body.to_owned(),
    }
}

fn get(port: u16, path: &str) -> Reply {
    request(port, "GET", path, None)
}

fn post(port: u16, path: &str, json: &str) -> Reply {
    request(port, "POST", path, Some(json))
}

/// The tasks of service `name` the worker's `/metrics` counts as handled
/// (`peerq_tasks_total{outcome="ok"}`).
fn handled(port: u16, name: &str) -> f64 {
    let reply = get(port, "/metrics");
    assert_eq!(reply.status, 200, "{reply:?}");
    let service = format!("service=\"{name}\"");
    reply
        .body
        .lines()
        .filter(|l| l.starts_with("peerq_tasks_total{"))
        .filter(|l| l.contains(&service) && l.contains("outcome=\"ok\""))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

#[test]
fn the_worker_serves_its_probes_handles_every_task_and_leaves_gracefully_on_sigterm() {
    let server = RedisServer::start();
    let name = unique_name("worker");
    let port = unused_port();
    let mut worker = ready_worker(&server.url(), &name, port);

    let live = get(port, "/health/live");
    assert_eq!(live.status, 200, "{live:?}");
    // Ready once it owns its partitions: it printed its line then, and the
    // probe follows the same standing.
    eventually("/health/ready answers 200", || {
        (get(port, "/health/ready").status == 200).then_some(())
    });

    let rt = tokio::runtime::Runtime::new().unwrap();
    let producer = Producer::builder()
        .redis(server.url())
        .name(&name)
        .codec(Json)
        .connect();
    let producer = rt.block_on(producer).unwrap();
    let mails: Vec<Mail> = (0..100)
        .map(|i| Mail {
            to: format!("user{i}@example.com"),
            subject: format!("mail {i}"),
        })
        .collect();
    rt.block_on(producer.enqueue_batch(&mails)).unwrap();

    // Every task handled, as its metrics count them, and none left in the
    // queue, as the service's status says.
    let admin = rt.block_on(Admin::connect(server.url())).unwrap();
    let service = rt.block_on(admin.service(&name)).unwrap();
    eventually("100 tasks handled", || {
        (handled(port, &name) >= 100.0).then_some(())
    });
    let status = eventually("an empty queue", || {
        let status = rt.block_on(service.status()).unwrap();
        (status.totals.backlog == 0 && status.totals.pending == 0).then_some(status)
    });
    assert_eq!(status.totals.dead, 0, "{:?}", status.totals);
    assert_eq!(status.members.len(), 1, "{:?}", status.members);

    let signalled = Instant::now();
    support::signal(worker.0.id(), "TERM");
    let exit = exit_within(&mut worker, LEAVE + Duration::from_secs(5));
    let took = signalled.elapsed();
    assert!(exit.success(), "the worker exited with {exit}");
    assert!(
        took < LEAVE,
        "a graceful leave took {took:?}, not within the leave timeout {LEAVE:?}"
    );
    let members = rt.block_on(service.status()).unwrap().members;
    assert!(members.is_empty(), "still members: {members:?}");
}

#[test]
fn the_worker_without_peerq_redis_url_stops_naming_it() {
    let out = Command::new(support::example_binary("worker"))
        .env_remove("PEERQ_REDIS_URL")
        .output()
        .expect("run the worker");
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("PEERQ_REDIS_URL"), "{err}");
}

/// A Redis that refuses the worker (a wrong password) stops it with an
/// error that names the Redis but not the password.
#[test]
fn the_worker_refused_by_redis_stops_without_printing_the_password() {
    let server = RedisServer::start_with(ServerOptions {
        requirepass: Some("the-right-one"),
        ..ServerOptions::default()
    });
    let password = "wrong-s3cret-7f3a";
    let url = format!("redis://:{password}@127.0.0.1:{}/", server.port());
    let out = Command::new(support::example_binary("worker"))
        .env("PEERQ_REDIS_URL", &url)
        .env("PEERQ_SERVICE", unique_name("refused"))
        .env("PEERQ_HTTP_ADDR", format!("127.0.0.1:{}", unused_port()))
        .env("RUST_LOG", "info")
        .output()
        .expect("run the worker");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        stderr.contains(&format!("127.0.0.1:{}", server.port())),
        "{stderr}"
    );
    assert!(
        !stdout.contains(password) && !stderr.contains(password),
        "the password was printed:\n{stdout}\n{stderr}"
    );
}

#[test]
fn the_web_service_enqueues_a_mail_and_answers_its_state_until_it_succeeded() {
    let mut server = RedisServer::start();
    let name = unique_name("web");
    let mut worker = ready_worker(&server.url(), &name, unused_port());
    let port = unused_port();
    let mut web = Command::new(support::example_binary("web_service"))
        .env("PEERQ_REDIS_URL", server.url())
        .env("PEERQ_SERVICE", &name)
        .env("LISTEN_ADDR", format!("127.0.0.1:{port}"))
        .stdout(Stdio::piped())
        .spawn()
        .map(Proc)
        .expect("start the web service");
    let printed = lines(web.0.stdout.take().unwrap());
    let line = printed.recv_timeout(START).expect("its listening line");
    assert_eq!(line, format!("listening on 127.0.0.1:{port}"));

    // Accepted at once, with the handle that finds its record.
    let sent = post(
        port,
        "/mails",
        r#"{"to": "ada@example.com", "subject": "hello"}"#,
    );
    assert_eq!(sent.status, 202, "{sent:?}");
    let body = sent.json();
    let given = body["handle"].as_str().expect("a handle").to_owned();
    let handle: TaskHandle = given.parse().unwrap();
    assert_eq!(Some(handle.id().as_str()), body["task_id"].as_str());
    assert!(handle.partition().is_some(), "{given}");
    let at = format!("/mails/{given}");
    assert_eq!(sent.header("location"), Some(at.as_str()));

    // Its state, as the worker moves it, until it succeeded.
    let done = eventually("the mail succeeded", || {
        let reply = get(port, &at);
        assert_eq!(reply.status, 200, "{reply:?}");
        let state = reply.json();
        assert!(
            matches!(
                state["state"].as_str(),
                Some("waiting" | "running" | "succeeded")
            ),
            "{state}"
        );
        (state["state"] == "succeeded").then_some(state)
    });
    assert_eq!(done["attempt"], 1, "{done}");
    assert!(done["error"].is_null(), "{done}");
    let message_id = done["result"]["message_id"].as_str().unwrap_or_default();
    assert!(message_id.contains(handle.id().as_str()), "{done}");

    // A body that is not a mail: 400, saying why.
    for (body, why) in [
        ("{not json", "parse"),
        (r#"{"to": "ada@example.com"}"#, "subject"),
        (r#"{"to": "nobody", "subject": "hello"}"#, "address"),
    ] {
        let reply = post(port, "/mails", body);
        assert_eq!(reply.status, 400, "{body}: {reply:?}");
        let error = reply.json()["error"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        assert!(error.contains(why), "{body}: {error}");
    }

    // A mail nothing is known of: 404.
    let unknown = format!(
        "/mails/{}/{}",
        handle.partition().unwrap(),
        TaskId::generate()
    );
    let reply = get(port, &unknown);
    assert_eq!(reply.status, 404, "{reply:?}");

    support::signal(worker.0.id(), "TERM");
    let exit = exit_within(&mut worker, LEAVE + Duration::from_secs(5));
    assert!(exit.success(), "the worker exited with {exit}");

    // Redis down: 503, try again later.
    server.stop();
    let reply = post(
        port,
        "/mails",
        r#"{"to": "ada@example.com", "subject": "again"}"#,
    );
    assert_eq!(reply.status, 503, "{reply:?}");
    assert_eq!(reply.header("retry-after"), Some("1"), "{reply:?}");

    support::signal(web.0.id(), "TERM");
    let exit = exit_within(&mut web, Duration::from_secs(10));
    assert!(exit.success(), "the web service exited with {exit}");
}
