//! One batch of a service ([`crate::workflow`]): found by its id, its
//! members by state as a bar, whether it is sealed, expired or done, a
//! chain's step, and its callback. It shows what `peerq batch show` shows.

use axum::extract::{Path, Query as UrlQuery, State};
use axum::response::{IntoResponse, Response};
use maud::{Markup, html};
use serde::Deserialize;

use super::layout::{Base, Lookup, page, tabs};
use super::periodic::at;
use super::{Failure, Shared};
use crate::workflow::{BatchId, BatchView, CallbackState};

/// `?id=<batch id>`.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct Find {
    /// The batch searched for; empty: the search form alone.
    #[serde(default)]
    id: String,
}

/// `GET /services/{name}/batch?id=…`: a mistyped or unknown id answers 400
/// or 404 with the whole page, search form included.
pub(crate) async fn show(
    State(dash): State<Shared>,
    Path(name): Path<String>,
    UrlQuery(find): UrlQuery<Find>,
    base: Base,
) -> Result<Response, Failure> {
    let service = dash.admin.service(&name).await?;
    let found = match Lookup::asked(&find.id, |id| id.parse::<BatchId>()) {
        Ok(Some(id)) => {
            let view = service.batch(&id).await?;
            Lookup::of(id, view.map(Box::new))
        }
        Ok(None) => Lookup::Nothing,
        Err(lookup) => lookup,
    };
    let status = found.status();
    let frame = dash.frame(&base, &name);
    let body = page(
        &frame,
        html! {
            h1 { (name) }
            (tabs(&base, &name, "batch"))
            form.filter method="get" action=(base.service(&name, "batch")) {
                input type="search" name="id" value=(find.id) size="48"
                    placeholder="batch id: <partition>/<uuid>";
                button type="submit" id="find" { "Find batch" }
            }
            @match &found {
                Lookup::Nothing => {}
                Lookup::Invalid(why) => p.bad id="failure" { (why) }
                Lookup::Unknown(id) => p.bad id="failure" {
                    "No such batch: " (id.as_str()) " (never opened, or gone after its retention)."
                }
                Lookup::Found(view) => (batch(view))
            }
        },
    );
    Ok((status, body).into_response())
}

/// The batch's state as a word, as `peerq batch show` says it, and its
/// class.
fn state(view: &BatchView) -> (&'static str, Option<&'static str>) {
    let state = view.state();
    let class = match state {
        "expired" | "stopped" | "cancelled" | "cancelling" => Some("bad"),
        "done" => Some("ok"),
        _ => None,
    };
    (state, class)
}

fn batch(view: &BatchView) -> Markup {
    let (state, class) = state(view);
    let ended = view.succeeded + view.dead + view.cancelled;
    let callback = match view.callback {
        CallbackState::Enqueued => view.callback_kind.as_deref().unwrap_or("enqueued"),
        _ => "none",
    };
    html! {
        h2 { "Batch " (view.id.as_str()) }
        p {
            progress.bar id="ended" max=(view.total.max(1)) value=(ended) {}
            " " (ended) " of " (view.total) " members final"
        }
        div.scroll {
            table id="batch" {
                tr { th { "state" } td id="state" class=[class] { (state) } }
                tr { th { "total" } td id="total" { (view.total) } }
                tr { th { "pending" } td id="pending" { (view.pending) } }
                tr { th { "succeeded" } td id="succeeded" class="ok" { (view.succeeded) } }
                tr { th { "dead" } td id="dead" class=[(view.dead > 0).then_some("bad")] { (view.dead) } }
                tr { th { "cancelled" } td id="cancelled" { (view.cancelled) } }
                @if let (Some(steps), Some(step)) = (view.steps, view.step) {
                    tr { th { "step" } td id="step" { (step) " of " (steps) } }
                }
                tr { th { "callback" } td id="callback" { (callback) } }
                @if let Some(id) = &view.callback_id {
                    tr { th { "callback task" } td id="callback-id" { (id) } }
                }
                tr { th { "opened" } td { (at(Some(view.created_at))) } }
                @if !view.sealed { tr { th { "expires" } td { (at(Some(view.expires_at))) } } }
                tr { th { "done" } td { (at(view.done_at)) } }
            }
        }
    }
}
