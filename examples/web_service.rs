//! An axum web service that enqueues a task from its request handler and
//! answers with the task's handle at once, then answers the task's state
//! from its tracked record: the web side of `examples/worker.rs`, which
//! sends the mails.
//!
//! ```text
//! PEERQ_REDIS_URL=redis://127.0.0.1:6379/ cargo run --example web_service
//! PEERQ_REDIS_URL=redis://127.0.0.1:6379/ cargo run --features http --example worker
//!
//! curl -i localhost:3000/mails -H 'content-type: application/json' \
//!      -d '{"to": "ada@example.com", "subject": "hello"}'
//! curl localhost:3000/mails/<handle>
//! ```
//!
//! | variable | default | what it sets |
//! |---|---|---|
//! | `PEERQ_REDIS_URL` | (required) | the service's Redis: `redis://[:PASSWORD@]HOST:PORT[/DB]` |
//! | `PEERQ_SERVICE` | `mail-sender` | the service the mails are enqueued to (the worker's) |
//! | `LISTEN_ADDR` | `127.0.0.1:3000` | where it listens |
//! | `RUST_LOG` | `info` | the logs' filter; logs go to stderr |
//!
//! - `POST /mails` with `{"to": "...", "subject": "..."}` enqueues a mail
//!   and answers `202 Accepted` with `{"task_id": "...", "handle":
//!   "<partition>/<task id>"}` (and the status URL in `Location`). A body
//!   that is not such JSON is a `400` with `{"error": "..."}` saying why;
//!   when Redis cannot be reached or does not answer within 5 s, a `503`.
//! - `GET /mails/<partition>/<task id>` (the handle as it came) answers
//!   the mail's tracked record: `{"handle": ..., "state": "waiting" |
//!   "delayed" | "running" | "retrying" | "succeeded" | "dead" |
//!   "cancelled", "attempt": .., "error": .., "result": ..}` (`result`:
//!   what the worker's handler returned). A handle nothing is known of is a
//!   `404`: a task is tracked only while its service's tracking is on,
//!   which the worker switches on as the service's first instance (or
//!   `peerq tracking on --name mail-sender`).
//!
//! Every request shares one [`Producer`] (behind an `Arc`: it multiplexes
//! one connection, so concurrent requests do not wait for each other) and
//! one [`Admin`] connection for the reads. It prints `listening on <addr>`
//! once it accepts requests; `SIGTERM` or ctrl-c stops it once the requests
//! in progress are answered, and it exits 0.

use std::future::Future;
use std::io::IsTerminal;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use peerq::Json as JsonCodec;
use peerq::admin::{Admin, Service};
use peerq::error::Error;
use peerq::producer::Producer;
use peerq::tracking::TaskHandle;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tracing::{error, warn};

/// How long a request waits for Redis before it answers 503.
const REDIS_TIMEOUT: Duration = Duration::from_secs(5);

/// One mail to send: the task. Its JSON is the contract with the worker
/// that handles it (`examples/worker.rs` declares the same fields), and
/// the request's body as well.
#[derive(Debug, Serialize, Deserialize)]
struct Mail {
    /// The recipient's address.
    to: String,
    /// The subject line.
    subject: String,
}

/// What every handler shares.
struct App {
    /// Enqueues to the service, in its codec (the worker's: JSON).
    producer: Producer<JsonCodec>,
    /// The service's task records.
    tasks: Service,
}

/// The routes.
fn routes(app: Arc<App>) -> Router {
    Router::new()
        .route("/mails", post(send_mail))
        // A handle holds a `/` (`<partition>/<task id>`): the rest of the
        // path is the handle.
        .route("/mails/{*handle}", get(mail_status))
        .with_state(app)
}

/// `POST /mails`: enqueues the mail; `202` with its id and handle.
async fn send_mail(
    State(app): State<Arc<App>>,
    body: Result<Json<Mail>, JsonRejection>,
) -> Response {
    // axum's own answer to a bad body is a 400, 415 or 422 in plain text;
    // one status and a JSON error are easier on the clients.
    let mail = match body {
        Ok(Json(mail)) => mail,
        Err(rejected) => return problem(StatusCode::BAD_REQUEST, rejected.body_text()),
    };
    if !mail.to.contains('@') {
        let message = format!("`to` is no mail address: {:?}", mail.to);
        return problem(StatusCode::BAD_REQUEST, message);
    }
    let id = match tokio::time::timeout(REDIS_TIMEOUT, app.producer.enqueue(&mail)).await {
        Ok(Ok(id)) => id,
        Ok(Err(e)) => return failure(&e),
        Err(_) => return failure(&Error::Timeout(REDIS_TIMEOUT)),
    };
    // Its partition and id: what finds its record in one read.
    let handle = app.producer.handle_of(&id, None);
    let body = json!({ "task_id": id.as_str(), "handle": handle.to_string() });
    let location = [(header::LOCATION, format!("/mails/{handle}"))];
    (StatusCode::ACCEPTED, location, Json(body)).into_response()
}

/// `GET /mails/{handle}`: the mail's tracked state; `404` when unknown.
async fn mail_status(State(app): State<Arc<App>>, Path(given): Path<String>) -> Response {
    let Ok(handle) = given.parse::<TaskHandle>() else {
        let message = format!(
            "`{given}` is no mail handle: use the `handle` that POST /mails answered, \
             <partition>/<task id>"
        );
        return problem(StatusCode::BAD_REQUEST, message);
    };
    let record = match tokio::time::timeout(REDIS_TIMEOUT, app.tasks.task(&handle)).await {
        Ok(Ok(Some(record))) => record,
        Ok(Ok(None)) => {
            let message = format!(
                "no mail {handle}: it was never enqueued here, its record expired, or it was \
                 enqueued while tracking was off and has not started yet"
            );
            return problem(StatusCode::NOT_FOUND, message);
        }
        Ok(Err(e)) => return failure(&e),
        Err(_) => return failure(&Error::Timeout(REDIS_TIMEOUT)),
    };
    // The worker's result, in the service's codec; `null` until it succeeded.
    let result = record
        .result_as::<serde_json::Value, _>(&JsonCodec)
        .and_then(Result::ok);
    Json(json!({
        "handle": record.handle.to_string(),
        "state": record.state.map(|s| s.as_str()),
        "attempt": record.attempt,
        "error": record.error,
        "result": result,
    }))
    .into_response()
}

/// peerq's error as an answer: `503` (try again) when Redis cannot be
/// reached or did not answer, `413` for a mail over the producer's size
/// limit, else `500`. The details go to the log, not to the client.
fn failure(e: &Error) -> Response {
    match e {
        Error::Redis(_)
        | Error::Pool(_)
        | Error::Timeout(_)
        | Error::Connect { .. }
        | Error::NotReplicated { .. } => {
            warn!(error = %e, "redis is unavailable");
            let message = "the mail queue is unavailable; try again later";
            let mut reply = problem(StatusCode::SERVICE_UNAVAILABLE, message);
            let again = header::HeaderValue::from_static("1");
            reply.headers_mut().insert(header::RETRY_AFTER, again);
            reply
        }
        Error::PayloadTooLarge { .. } => problem(StatusCode::PAYLOAD_TOO_LARGE, e.to_string()),
        _ => {
            error!(error = %e, "request failed");
            problem(StatusCode::INTERNAL_SERVER_ERROR, "internal error")
        }
    }
}

/// An error answer: `{"error": message}`.
fn problem(status: StatusCode, message: impl Into<String>) -> Response {
    (status, Json(json!({ "error": message.into() }))).into_response()
}

/// The service's settings, from the environment.
/// No `Debug`: the Redis URL may carry a password.
struct Settings {
    /// Never printed: it may carry a password.
    redis: String,
    service: String,
    listen: SocketAddr,
}

impl Settings {
    /// Reads the variables of the module's table; the error names the one
    /// that is missing or does not parse.
    fn from_env() -> Result<Settings, String> {
        let redis = var("PEERQ_REDIS_URL").ok_or(
            "PEERQ_REDIS_URL is not set: give the service's Redis URL, such as \
             PEERQ_REDIS_URL=redis://127.0.0.1:6379/",
        )?;
        let service = var("PEERQ_SERVICE").unwrap_or_else(|| "mail-sender".to_owned());
        let listen = match var("LISTEN_ADDR") {
            None => SocketAddr::from(([127, 0, 0, 1], 3000)),
            Some(addr) => addr.parse().map_err(|_| {
                format!(
                    "LISTEN_ADDR=`{addr}` is not an address to listen on: give IP:PORT, such \
                     as 127.0.0.1:3000"
                )
            })?,
        };
        Ok(Settings {
            redis,
            service,
            listen,
        })
    }
}

/// Environment variable `name`; unset, empty or not UTF-8 is `None`.
fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// Resolves on SIGTERM or ctrl-c. The handlers are installed by this call,
/// before the service says it listens: a SIGTERM from then on stops it
/// gracefully rather than killing it.
fn stop_signal() -> impl Future<Output = ()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate()).expect("install a SIGTERM handler");
        let mut interrupt = signal(SignalKind::interrupt()).expect("install a SIGINT handler");
        async move {
            tokio::select! {
                _ = term.recv() => {}
                _ = interrupt.recv() => {}
            }
        }
    }
    #[cfg(not(unix))]
    async {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// Connects to the service and serves until the stop signal.
async fn serve(settings: Settings) -> Result<(), String> {
    let producer = Producer::builder()
        .redis(settings.redis.as_str())
        .name(&settings.service)
        .codec(JsonCodec)
        .connect()
        .await
        .map_err(|e| e.to_string())?;
    let admin = Admin::connect(settings.redis.as_str())
        .await
        .map_err(|e| e.to_string())?;
    // Known: the producer recorded the service's settings if nothing had.
    let tasks = admin
        .service(&settings.service)
        .await
        .map_err(|e| e.to_string())?;
    if !tasks.tracking().await.is_ok_and(|t| t.is_on()) {
        warn!(
            service = %settings.service,
            "task tracking is off: GET /mails/<handle> answers 404 until a mail starts; the \
             worker switches it on as the service's first instance, or run `peerq tracking on \
             --name {}`",
            settings.service
        );
    }
    let stop = stop_signal();
    let listener = tokio::net::TcpListener::bind(settings.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", settings.listen))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    println!("listening on {addr}");
    let app = Arc::new(App { producer, tasks });
    axum::serve(listener, routes(app))
        .with_graceful_shutdown(stop)
        .await
        .map_err(|e| format!("serving on {addr}: {e}"))
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let settings = match Settings::from_env() {
        Ok(settings) => settings,
        Err(message) => {
            eprintln!("web_service: {message}");
            return ExitCode::from(2);
        }
    };
    // Its errors name the Redis URL without its password.
    match serve(settings).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("web_service: {message}");
            ExitCode::FAILURE
        }
    }
}
