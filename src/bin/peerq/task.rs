//! `peerq task show|cancel|wait` and `peerq tracking show|on|off`: a
//! service's tracked tasks, through the library's `Service`.

use std::fmt::Write as _;

use peerq::admin::{Admin, Service};
use peerq::tracking::{CancelOutcome, TaskHandle, TaskView, Tracking, Waited};
use serde::Serialize;

use crate::args::{Named, TaskArgs, TaskCommand, TrackingCommand};
use crate::{failed, service};

/// `peerq task …`.
pub(crate) async fn task(admin: &Admin, command: TaskCommand) -> Result<String, String> {
    match command {
        TaskCommand::Show(args) => {
            let (service, handle) = target(admin, &args).await?;
            let record = service.task(&handle).await.map_err(failed)?;
            let record = record.ok_or_else(|| unknown(&service, &handle))?;
            let view = record.view(codec(&service));
            args.named.output.show(&view, || shown(&view))
        }
        TaskCommand::Cancel(args) => {
            let (service, handle) = target(admin, &args).await?;
            let outcome = service.cancel(&handle).await.map_err(failed)?;
            let cancelled = Cancelled::of(&handle, outcome);
            if cancelled.outcome == "unknown" {
                return Err(format!(
                    "{}; a cancel request is kept for a week, so it never starts if it exists",
                    unknown(&service, &handle)
                ));
            }
            args.named.output.show(&cancelled, || cancelled.line())
        }
        TaskCommand::Wait {
            task: args,
            timeout,
        } => {
            let (service, handle) = target(admin, &args).await?;
            match service.wait(&handle, timeout).await.map_err(failed)? {
                Waited::Final(record) => {
                    let view = record.view(codec(&service));
                    args.named.output.show(&view, || shown(&view))
                }
                Waited::TimedOut(record) => Err(format!(
                    "task {handle} is still {} after {} (--timeout)",
                    record.state.map_or("unknown", |s| s.as_str()),
                    humantime(timeout)
                )),
                Waited::Unknown => Err(unknown(&service, &handle)),
                _ => Err(format!("task {handle}: the wait ended with no answer")),
            }
        }
    }
}

/// `peerq tracking …`.
pub(crate) async fn tracking(admin: &Admin, command: TrackingCommand) -> Result<String, String> {
    let (named, change): (Named, Option<Change>) = match command {
        TrackingCommand::Show(named) => (named, None),
        TrackingCommand::Off(named) => (named, Some(Box::new(|t: Tracking| off(t)))),
        TrackingCommand::On {
            named,
            keep,
            keep_count,
        } => (
            named,
            Some(Box::new(move |t: Tracking| {
                let mut on = Tracking::on().keep(t.kept_for()).keep_count(t.kept_count());
                if let Some(keep) = keep {
                    on = on.keep(keep);
                }
                if let Some(count) = keep_count {
                    on = on.keep_count(count);
                }
                on
            })),
        ),
    };
    let service = service(admin, &named.name).await?;
    let mut tracking = service.tracking().await.map_err(failed)?;
    if let Some(change) = change {
        tracking = change(tracking);
        service.set_tracking(tracking).await.map_err(failed)?;
    }
    let shown = TrackingView {
        name: service.name(),
        on: tracking.is_on(),
        keep_ms: tracking.kept_for().as_millis() as u64,
        keep_count: tracking.kept_count(),
    };
    named.output.show(&shown, || {
        format!(
            "service {}: tracking {}; final records kept {} (at most {} per partition)\n",
            shown.name,
            if shown.on { "on" } else { "off" },
            humantime(tracking.kept_for()),
            shown.keep_count
        )
    })
}

/// How `tracking on|off` changes what is set.
type Change = Box<dyn FnOnce(Tracking) -> Tracking>;

/// Off, keeping the retention as set.
fn off(t: Tracking) -> Tracking {
    Tracking::off()
        .keep(t.kept_for())
        .keep_count(t.kept_count())
}

/// The service and the task `args` name.
async fn target(admin: &Admin, args: &TaskArgs) -> Result<(Service, TaskHandle), String> {
    let service = service(admin, &args.named.name).await?;
    let handle: TaskHandle = args.id.parse().map_err(failed)?;
    Ok((service, handle))
}

fn codec(service: &Service) -> &str {
    service.settings().codec.as_deref().unwrap_or("bincode")
}

fn unknown(service: &Service, handle: &TaskHandle) -> String {
    format!(
        "no task {handle} in service `{}` (untracked when enqueued and not started, never enqueued, or its record expired)",
        service.name()
    )
}

/// A task's record, one field per line, in the JSON's order.
fn shown(view: &TaskView) -> String {
    let opt = |v: Option<String>| v.unwrap_or_else(|| "-".to_owned());
    let num = |v: Option<u64>| opt(v.map(|v| v.to_string()));
    let json = |v: &Option<serde_json::Value>| opt(v.as_ref().map(|v| v.to_string()));
    let rows = [
        ("id", view.id.clone()),
        ("state", opt(view.state.map(str::to_owned))),
        ("attempt", num(view.attempt.map(u64::from))),
        ("partition", num(view.partition.map(u64::from))),
        ("instance", opt(view.instance.clone())),
        ("token", num(view.token)),
        ("progress", json(&view.progress)),
        ("result", json(&view.result)),
        ("error", opt(view.error.clone())),
        ("reason", opt(view.reason.clone())),
        ("dead_id", opt(view.dead_id.clone())),
        ("headers", headers(view.headers.as_ref())),
        ("cancel_requested_at", time(view.cancel_requested_at)),
        ("enqueued_at", time(view.enqueued_at)),
        ("due_at", time(view.due_at)),
        ("started_at", time(view.started_at)),
        ("finished_at", time(view.finished_at)),
    ];
    let mut out = String::new();
    for (k, v) in rows {
        let _ = writeln!(out, "{k:<20} {v}");
        if k == "headers" {
            // One line each, as `dead show` prints them.
            for (name, value) in view.headers.iter().flatten() {
                let _ = writeln!(out, "{:<20} {value}", format!("h:{name}"));
            }
        }
    }
    out
}

/// The `headers` line: how many, `none`, or `-` when its entry was not
/// read (a task that ended, a dead letter purged).
fn headers(headers: Option<&std::collections::BTreeMap<String, String>>) -> String {
    match headers.map(|h| h.len()) {
        None => "-".to_owned(),
        Some(0) => "none".to_owned(),
        Some(n) => n.to_string(),
    }
}

/// Unix milliseconds as an RFC 3339 UTC time.
fn time(ms: Option<u64>) -> String {
    ms.and_then(|ms| chrono::DateTime::from_timestamp_millis(ms as i64))
        .map(|t| t.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string())
        .unwrap_or_else(|| "-".to_owned())
}

/// A duration as the options take it: `1d`, `2h`, `5m`, `10s`, `500ms`.
fn humantime(d: std::time::Duration) -> String {
    let ms = d.as_millis();
    for (unit, size) in [
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1000),
    ] {
        if ms >= size && ms.is_multiple_of(size) {
            return format!("{}{unit}", ms / size);
        }
    }
    format!("{ms}ms")
}

/// `task cancel`'s answer. JSON: `id` (the handle), `outcome`
/// (`cancelled`, `requested`, `already_final`, `unknown`), `state` (the
/// final state it had, for `already_final`), `instance` (where it ran, for
/// `requested`).
#[derive(Serialize)]
struct Cancelled {
    id: String,
    outcome: &'static str,
    state: Option<&'static str>,
    instance: Option<String>,
}

impl Cancelled {
    fn of(handle: &TaskHandle, outcome: CancelOutcome) -> Cancelled {
        let (outcome, state, instance) = match outcome {
            CancelOutcome::Cancelled => ("cancelled", Some("cancelled"), None),
            CancelOutcome::Requested { instance } => ("requested", Some("running"), instance),
            CancelOutcome::AlreadyFinal(state) => ("already_final", Some(state.as_str()), None),
            _ => ("unknown", None, None),
        };
        Cancelled {
            id: handle.to_string(),
            outcome,
            state,
            instance,
        }
    }

    fn line(&self) -> String {
        match self.outcome {
            "cancelled" => format!("task {} cancelled: it never starts\n", self.id),
            "requested" => format!(
                "task {} is running on {}: cancel requested; it stops and ends cancelled\n",
                self.id,
                self.instance.as_deref().unwrap_or("an instance")
            ),
            _ => format!(
                "task {} was already final ({}): left as it is\n",
                self.id,
                self.state.unwrap_or("-")
            ),
        }
    }
}

/// `tracking`'s answer. JSON: `name`, `on`, `keep_ms`, `keep_count`.
#[derive(Serialize)]
struct TrackingView<'a> {
    name: &'a str,
    on: bool,
    keep_ms: u64,
    keep_count: u32,
}
