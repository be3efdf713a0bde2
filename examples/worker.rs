//! A worker deployed as a Kubernetes-style service: one consumer instance
//! of a service that sends mails, its settings from environment variables,
//! its health checks and metrics over HTTP, and a graceful leave on
//! `SIGTERM` (feature `http`). deploy/docker/worker.Dockerfile builds its
//! image and deploy/kubernetes/worker.yaml runs it.
//!
//! ```text
//! PEERQ_REDIS_URL=redis://127.0.0.1:6379/ cargo run --features http --example worker
//! ```
//!
//! | variable | default | what it sets |
//! |---|---|---|
//! | `PEERQ_REDIS_URL` | (required) | the service's Redis: `redis://[:PASSWORD@]HOST:PORT[/DB]`, or `rediss://` with the `tls` feature |
//! | `PEERQ_SERVICE` | `mail-sender` | the service name: every instance of one name splits one queue |
//! | `PEERQ_HTTP_ADDR` | `0.0.0.0:9000` | where `GET /health/live`, `GET /health/ready` and `GET /metrics` are served |
//! | `PEERQ_LEAVE_TIMEOUT_SECS` | `25` | how long a graceful leave may take before the instance leaves at once; keep it below the pod's `terminationGracePeriodSeconds` (30 by default) |
//! | `RUST_LOG` | `info` | the logs' filter (`warn`, `peerq=debug`, …); logs go to stderr |
//!
//! A setting that is missing or does not parse stops it before it starts,
//! with a message naming the variable (exit code 2); what waiting cannot
//! fix, such as a Redis that refuses its password or settings that differ
//! from the service's, stops it with exit code 1. The Redis URL is never
//! printed with its password. Redis need not be up yet: the consumer waits
//! for it (`/health/live` answers 200 meanwhile, `/health/ready` 503).
//!
//! Once the instance owns its share of the partitions it prints
//! `worker ready service=<name> http=<addr>` on stdout, and `/health/ready`
//! answers 200. `SIGTERM` (what Kubernetes sends to stop a pod) or ctrl-c
//! starts a graceful leave: the other instances take over its partitions
//! once its running tasks are done, and it exits 0. A second signal, or
//! the leave timeout, leaves at once (running tasks are interrupted and run
//! again elsewhere).
//!
//! The task is a [`Mail`], `{"to": "...", "subject": "..."}` in JSON (the
//! service's codec), as `examples/web_service.rs` enqueues it; another
//! language's producer writes the same JSON. Its handler stands for an
//! SMTP call: it logs the mail and takes a few milliseconds. The worker
//! switches task tracking on when it is the service's first instance
//! (`.tracking(Tracking::on())`), so each mail's state and result can be
//! looked up by its handle; an operator who switched it off since turns it
//! on again with `peerq tracking on --name <service>`.

use std::io::IsTerminal;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use peerq::Json;
use peerq::assignment::Standing;
use peerq::consumer::Consumer;
use peerq::handler::{HandlerError, HandlerWithResult, TaskContext};
use peerq::tracking::Tracking;
use serde::{Deserialize, Serialize};
use tracing::info;

/// How long "sending" a mail takes.
const SEND_TIME: Duration = Duration::from_millis(5);

/// One mail to send: the task. Its JSON is the contract with whoever
/// enqueues it (`examples/web_service.rs` declares the same fields).
#[derive(Debug, Serialize, Deserialize)]
struct Mail {
    /// The recipient's address.
    to: String,
    /// The subject line.
    subject: String,
}

/// What sending a mail returns: with tracking on, the task's result,
/// which `GET /mails/{handle}` of the web service shows.
#[derive(Debug, Serialize)]
struct Sent {
    /// The `Message-ID` the mail went out with.
    message_id: String,
}

/// Sends mails (here: logs them, after a short wait that stands for the
/// SMTP relay's answer).
struct SendMail;

impl HandlerWithResult for SendMail {
    type Task = Mail;
    type Output = Sent;

    async fn handle(&self, mail: Mail, cx: TaskContext) -> Result<Sent, HandlerError> {
        // A user's cancel, or a drain that ran out of time, stops the send
        // before it goes out; the task then ends cancelled, or runs again
        // on the partition's next owner.
        tokio::select! {
            _ = tokio::time::sleep(SEND_TIME) => {}
            _ = cx.cancelled() => return Err(HandlerError::msg("stopped before the mail was sent")),
        }
        // The task id is unique and the same on every attempt: a relay that
        // deduplicates by Message-ID sends a retried mail once.
        let message_id = format!("<{}@{}.peerq.example>", cx.task_id(), cx.service());
        // The task's span (its id, partition and attempt) is around this line.
        info!(to = %mail.to, subject = %mail.subject, %message_id, "mail sent");
        Ok(Sent { message_id })
    }
}

/// The worker's settings, from the environment.
/// No `Debug`: the Redis URL may carry a password.
struct Settings {
    /// Never printed: it may carry a password.
    redis: String,
    service: String,
    http: SocketAddr,
    leave_timeout: Duration,
}

impl Settings {
    /// Reads the variables of the module's table; the error names the one
    /// that is missing or does not parse.
    fn from_env() -> Result<Settings, String> {
        let redis = var("PEERQ_REDIS_URL").ok_or(
            "PEERQ_REDIS_URL is not set: give the service's Redis URL, such as \
             PEERQ_REDIS_URL=redis://redis:6379/ (with a password: redis://:PASSWORD@redis:6379/)",
        )?;
        let service = var("PEERQ_SERVICE").unwrap_or_else(|| "mail-sender".to_owned());
        let http = match var("PEERQ_HTTP_ADDR") {
            None => SocketAddr::from(([0, 0, 0, 0], 9000)),
            Some(addr) => addr.parse().map_err(|_| {
                format!(
                    "PEERQ_HTTP_ADDR=`{addr}` is not an address to listen on: give IP:PORT, \
                     such as 0.0.0.0:9000"
                )
            })?,
        };
        let leave_timeout = match var("PEERQ_LEAVE_TIMEOUT_SECS") {
            None => Duration::from_secs(25),
            Some(secs) => match secs.parse::<u64>() {
                Ok(secs) if secs > 0 => Duration::from_secs(secs),
                _ => {
                    return Err(format!(
                        "PEERQ_LEAVE_TIMEOUT_SECS=`{secs}` is not a number of seconds above 0: \
                         give one below the pod's termination grace period, such as 25"
                    ));
                }
            },
        };
        Ok(Settings {
            redis,
            service,
            http,
            leave_timeout,
        })
    }
}

/// Environment variable `name`; unset, empty or not UTF-8 is `None` (a
/// manifest that sets a variable to "" means "not given").
fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        // Colour codes only for a terminal: not in a container's log.
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let settings = match Settings::from_env() {
        Ok(settings) => settings,
        Err(message) => {
            eprintln!("worker: {message}");
            return ExitCode::from(2);
        }
    };
    let consumer = Consumer::builder()
        .redis(settings.redis.as_str())
        .name(&settings.service)
        .codec(Json)
        .tracking(Tracking::on())
        .leave_timeout(settings.leave_timeout)
        .http(settings.http)
        .handler(SendMail);

    // Ready once the first round assigned the instance its partitions:
    // what `/health/ready` answers 200 for.
    let mut standing = consumer.standing();
    let ready = format!(
        "worker ready service={} http={}",
        settings.service, settings.http
    );
    tokio::spawn(async move {
        if standing
            .wait_for(|s| matches!(s, Standing::Assigned(_)))
            .await
            .is_ok()
        {
            println!("{ready}");
        }
    });

    // Until SIGTERM or ctrl-c, then a graceful leave (at most the leave
    // timeout). Its errors name the Redis URL without its password.
    match consumer.run().await {
        Ok(()) => {
            info!(service = %settings.service, "left the service");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("worker: {e}");
            ExitCode::FAILURE
        }
    }
}
