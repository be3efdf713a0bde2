//! A service's delayed tasks (delayed enqueues and retries waiting for
//! their backoff), soonest due first, with "run now" (due at once: the
//! partition's owner moves it into the stream within a second) and delete.

use axum::Form;
use axum::extract::{Path, Query as UrlQuery, State};
use axum::response::{IntoResponse, Redirect, Response};
use maud::{Markup, html};
use serde::Deserialize;

use super::layout::{Base, ago, escape_segment, page, tabs};
use super::periodic::at;
use super::{Failure, Shared};
use crate::admin::DelayedAction;

/// Tasks shown, the soonest due.
const SHOWN: usize = 100;

/// What the last action did, to say so.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct Done {
    #[serde(default)]
    done: String,
}

/// `GET /services/{name}/delayed`.
pub(crate) async fn list(
    State(dash): State<Shared>,
    Path(name): Path<String>,
    UrlQuery(done): UrlQuery<Done>,
    base: Base,
) -> Result<Markup, Failure> {
    let delayed = dash.admin.service(&name).await?.delayed(SHOWN).await?;
    let frame = dash.frame(&base, &name);
    let act = base.service(&name, "delayed/act");
    Ok(page(
        &frame,
        html! {
            h1 { (name) }
            (tabs(&base, &name, "delayed"))
            @if !done.done.is_empty() { div.notice id="done" { (done.done) } }
            p.muted { (delayed.total) " delayed tasks" @if delayed.total > SHOWN as u64 { "; the " (SHOWN) " due soonest:" } }
            div.scroll {
                table id="delayed" {
                    tr { th { "due" } th { "in" } th.num { "p" } th { "task id" } th.num { "attempt" } th { "key" } th {} }
                    @for t in &delayed.tasks {
                        tr {
                            td { (at(Some(t.due_at_ms))) }
                            td { (ago(t.due_in_ms)) }
                            td.num { (t.partition) }
                            td { (t.task_id.as_deref().unwrap_or("–")) }
                            td.num { @if let Some(a) = t.attempt { (a) } }
                            td { (t.key.as_deref().unwrap_or("–")) }
                            td {
                                @if !dash.read_only {
                                    @if let Some(id) = &t.task_id {
                                        @for (action, label, class) in [("run", "Run now", "primary"), ("delete", "Delete", "danger")] {
                                            form.inline method="post" action=(act) {
                                                input type="hidden" name="csrf" value=(dash.csrf.token());
                                                input type="hidden" name="partition" value=(t.partition);
                                                input type="hidden" name="due_at_ms" value=(t.due_at_ms);
                                                input type="hidden" name="task_id" value=(id);
                                                button class=(class) type="submit" name="action" value=(action) { (label) }
                                            }
                                            " "
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        },
    ))
}

/// The form of an action on one delayed task.
#[derive(Debug, Deserialize)]
pub(crate) struct Act {
    #[serde(default)]
    csrf: String,
    action: String,
    partition: u32,
    due_at_ms: u64,
    task_id: String,
}

/// `POST /services/{name}/delayed/act`.
pub(crate) async fn act(
    State(dash): State<Shared>,
    Path(name): Path<String>,
    base: Base,
    Form(form): Form<Act>,
) -> Result<Response, Failure> {
    dash.allow(&form.csrf)?;
    let action = match form.action.as_str() {
        "run" => DelayedAction::RunNow,
        "delete" => DelayedAction::Delete,
        other => {
            return Err(Failure::NotFound(format!(
                "no action `{other}`: run or delete"
            )));
        }
    };
    let service = dash.admin.service(&name).await?;
    let found = service
        .delayed_act(form.partition, form.due_at_ms, &form.task_id, action)
        .await?;
    let done = match (found, action) {
        (false, _) => format!("Task {} is no longer delayed.", form.task_id),
        (true, DelayedAction::RunNow) => format!("Task {} is due now.", form.task_id),
        (true, DelayedAction::Delete) => format!("Deleted task {}.", form.task_id),
    };
    dash.forget(&name);
    let url = format!(
        "{}?done={}",
        base.service(&name, "delayed"),
        escape_segment(&done)
    );
    Ok(Redirect::to(&url).into_response())
}
