//! One tracked task of a service ([`crate::tracking`]): found by its
//! handle, its state, progress, times, and result or error, a link to its
//! dead letter; and a user's cancel. It shows what `peerq task show`
//! shows; the records themselves are the tracking module's.

use axum::Form;
use axum::extract::{Path, Query as UrlQuery, State};
use axum::response::{IntoResponse, Redirect, Response};
use maud::{Markup, html};
use serde::Deserialize;

use super::layout::{Base, Lookup, headers, page, tabs, url_query};
use super::periodic::at;
use super::{Dash, Failure, Shared};
use crate::admin::Service;
use crate::tracking::{CancelOutcome, TaskHandle, TaskRecord, TaskState};

/// `?id=<handle>&done=…`.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct Find {
    /// The handle searched for (`<partition>/<task id>` or a bare id);
    /// empty: the search form alone.
    #[serde(default)]
    id: String,
    /// What the last action did, to say so.
    #[serde(default)]
    done: String,
}

/// `GET /services/{name}/task?id=…`.
///
/// An unknown task or a mistyped handle answers 404 or 400 with the whole
/// page, search form included, not the bare failure page: the operator
/// most likely mistyped, and fixes it right there.
pub(crate) async fn show(
    State(dash): State<Shared>,
    Path(name): Path<String>,
    UrlQuery(find): UrlQuery<Find>,
    base: Base,
) -> Result<Response, Failure> {
    let service = dash.admin.service(&name).await?;
    let found = match Lookup::asked(&find.id, |id| id.parse::<TaskHandle>()) {
        Ok(Some(handle)) => {
            let record = service.task(&handle).await?;
            Lookup::of(handle, record.map(Box::new))
        }
        Ok(None) => Lookup::Nothing,
        Err(lookup) => lookup,
    };
    // Off, a search finds only tasks enqueued while it was on: say so
    // before the operator wonders why nothing is found.
    let tracked = service.tracking().await?.is_on();
    let status = found.status();
    let frame = dash.frame(&base, &name);
    let body = page(
        &frame,
        html! {
            h1 { (name) }
            (tabs(&base, &name, "task"))
            @if !find.done.is_empty() { div.notice id="done" { (find.done) } }
            form.filter method="get" action=(base.service(&name, "task")) {
                input type="search" name="id" value=(find.id) size="48"
                    placeholder="task handle: <partition>/<task id>, or the bare id";
                button type="submit" id="find" { "Find task" }
            }
            @if !tracked {
                p.muted id="untracked" {
                    "Tracking is off for this service: tasks enqueued now get no record "
                    "(switch it on with " code { "peerq tracking on" } ")."
                }
            }
            @match &found {
                Lookup::Nothing => {}
                Lookup::Invalid(why) => p.bad id="failure" { (why) }
                Lookup::Unknown(handle) => p.bad id="failure" {
                    "No such task: " (handle.to_string()) " (untracked when enqueued and not \
                     started, never enqueued, or its record expired)."
                }
                Lookup::Found(task) => (record(&dash, &base, &name, task, codec(&service)))
            }
        },
    );
    Ok((status, body).into_response())
}

/// A task's record, and its cancel while it is not final.
fn record(dash: &Dash, base: &Base, name: &str, task: &TaskRecord, codec: &str) -> Markup {
    let view = task.view(codec);
    // A record without a state holds only a cancel request (a task enqueued
    // untracked, not started): cancelling again is harmless, so the button
    // stays.
    let state = view.state.unwrap_or("cancel requested");
    let dead_letter = match (view.partition, &view.dead_id) {
        (Some(p), Some(id)) => Some(format!(
            "{}{}",
            base.service(name, "dead/letter"),
            url_query(&[("at", &format!("{p}/{id}"))])
        )),
        _ => None,
    };
    html! {
        h2 { "Task " (view.id) }
        div.scroll {
            table id="task" {
                tr { th { "state" } td id="state" class=[state_class(task.state)] { (state) } }
                tr { th { "attempt" } td { (or_dash(view.attempt)) } }
                tr { th { "partition" } td { (or_dash(view.partition)) } }
                tr { th { "instance" } td { (view.instance.as_deref().unwrap_or("–")) } }
                tr { th { "token" } td { (or_dash(view.token)) } }
                tr { th { "progress" } td id="progress" { (progress(view.progress.as_ref())) } }
                tr { th { "enqueued" } td { (at(view.enqueued_at)) } }
                @if view.due_at.is_some() { tr { th { "due" } td { (at(view.due_at)) } } }
                tr { th { "started" } td { (at(view.started_at)) } }
                tr { th { "finished" } td { (at(view.finished_at)) } }
                @if view.cancel_requested_at.is_some() {
                    tr { th { "cancel requested" } td { (at(view.cancel_requested_at)) } }
                }
                @if let Some(reason) = &view.reason { tr { th { "reason" } td { (reason) } } }
                @if let Some(error) = &view.error { tr { th { "error" } td.wrap id="error" { (error) } } }
                tr {
                    th { "headers" }
                    td id="header-count" {
                        // Read from its entry, which is gone once it ended.
                        @match &view.headers {
                            None => "–",
                            Some(h) if h.is_empty() => "none",
                            Some(h) => (h.len()),
                        }
                    }
                }
                @if let Some(id) = &view.dead_id {
                    tr {
                        th { "dead letter" }
                        td {
                            @if let Some(link) = &dead_letter { a id="dead-letter" href=(link) { (id) } }
                            @else { (id) }
                        }
                    }
                }
            }
        }
        (headers(view.headers.iter().flatten().map(|(n, v)| (n.as_str(), v.as_str()))))
        @if let Some(result) = &view.result {
            h2 { "Result" }
            pre id="result" { (serde_json::to_string_pretty(result).unwrap_or_default()) }
        }
        @if !task.is_final() && !dash.read_only {
            form.inline method="post" action=(base.service(name, "task/cancel"))
                data-confirm="Cancel this task?" {
                input type="hidden" name="csrf" value=(dash.csrf.token());
                input type="hidden" name="id" value=(view.id);
                button.danger id="cancel" type="submit" { "Cancel task" }
            }
        }
    }
}

/// Progress of 0 to 100 (a percentage, as most handlers report it) as a
/// bar; any other value as its JSON text. Only the JSON codec's progress
/// decodes to a number: another codec's shows as `{"base64": …}`.
fn progress(value: Option<&serde_json::Value>) -> Markup {
    let Some(value) = value else {
        return html! { "–" };
    };
    match value.as_f64().filter(|p| (0.0..=100.0).contains(p)) {
        Some(percent) => html! {
            progress.bar max="100" value=(percent) {}
            " " (value) " %"
        },
        None => html! { code { (value) } },
    }
}

fn state_class(state: Option<TaskState>) -> Option<&'static str> {
    match state {
        Some(TaskState::Succeeded) => Some("ok"),
        Some(TaskState::Dead) => Some("bad"),
        Some(TaskState::Retrying | TaskState::Cancelled) | None => Some("warn"),
        Some(_) => None,
    }
}

fn or_dash<T: ToString>(value: Option<T>) -> String {
    value.map_or_else(|| "–".to_owned(), |v| v.to_string())
}

/// The service's codec, as the CLI reads it: a service that recorded none
/// had no producer or consumer that says, and bincode is the default.
fn codec(service: &Service) -> &str {
    service.settings().codec.as_deref().unwrap_or("bincode")
}

/// The form of a cancel.
#[derive(Debug, Deserialize)]
pub(crate) struct CancelForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    id: String,
}

/// `POST /services/{name}/task/cancel`: cancels the task, then shows its
/// page again saying what the cancel did.
pub(crate) async fn cancel(
    State(dash): State<Shared>,
    Path(name): Path<String>,
    base: Base,
    Form(form): Form<CancelForm>,
) -> Result<Response, Failure> {
    dash.allow(&form.csrf)?;
    let service = dash.admin.service(&name).await?;
    let handle: TaskHandle = form.id.parse()?;
    let done = said(&handle, &service.cancel(&handle).await?);
    dash.forget(&name);
    let url = format!(
        "{}{}",
        base.service(&name, "task"),
        url_query(&[("id", &handle.to_string()), ("done", &done)])
    );
    Ok(Redirect::to(&url).into_response())
}

/// What a cancel of `handle` did, as the page's notice says it.
fn said(handle: &TaskHandle, outcome: &CancelOutcome) -> String {
    match outcome {
        CancelOutcome::Cancelled => format!("Cancelled {handle}: it never starts."),
        CancelOutcome::Requested { instance } => format!(
            "Cancel requested for {handle} (running on {}): it stops when its handler sees it.",
            instance.as_deref().unwrap_or("an instance")
        ),
        CancelOutcome::AlreadyFinal(state) => {
            format!("{handle} is already final ({state}); nothing changed.")
        }
        CancelOutcome::Unknown => format!(
            "No task {handle}; the cancel request is kept for a week, so it never starts if it exists."
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_percentage_is_a_bar_and_anything_else_its_json() {
        let bar = progress(Some(&serde_json::json!(42))).into_string();
        assert!(
            bar.contains(r#"<progress class="bar" max="100" value="42"></progress> 42 %"#),
            "{bar}"
        );
        let over = progress(Some(&serde_json::json!(250))).into_string();
        assert!(
            !over.contains("<progress") && over.contains("250"),
            "{over}"
        );
        let text = progress(Some(&serde_json::json!({"step": 2}))).into_string();
        assert!(text.contains("<code>{&quot;step&quot;:2}</code>"), "{text}");
        assert_eq!(progress(None).into_string(), "–");
    }

    #[test]
    fn each_outcome_says_what_happened() {
        let handle: TaskHandle = "3/t-1".parse().unwrap();
        assert!(said(&handle, &CancelOutcome::Cancelled).starts_with("Cancelled 3/t-1"));
        let running = CancelOutcome::Requested {
            instance: Some("web-1".into()),
        };
        assert!(said(&handle, &running).contains("(running on web-1)"));
        let done = CancelOutcome::AlreadyFinal(TaskState::Succeeded);
        assert!(said(&handle, &done).contains("already final (succeeded)"));
        assert!(said(&handle, &CancelOutcome::Unknown).starts_with("No task 3/t-1"));
    }
}
