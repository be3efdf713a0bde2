//! A service's layout on its page, and the reshard action (docs/design.md
//! §21): a POST with the CSRF token, refused by name as the CLI's is.

use axum::Form;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Redirect, Response};
use maud::{Markup, html};
use serde::Deserialize;

use super::layout::Base;
use super::{Dash, Failure, Shared};
use crate::admin::Status;

/// The layout in use, a reshard's progress, and the form that starts one.
pub(super) fn layout_bar(dash: &Dash, base: &Base, status: &Status) -> Markup {
    let l = &status.layout;
    html! {
        p id="layout" {
            "Partitions: " (l.partitions) " (generation " (l.generation) ")"
            @if let (Some(from), Some(of), Some(sealed), Some(retired)) = (l.from_partitions, l.replaced, l.sealed, l.retired) {
                @if l.state == "draining" {
                    "; resharding from " (from) ": " (sealed) " sealed, " (retired) " retired of " (of) "."
                } @else {
                    "; resharded from " (from) "."
                }
            }
            @if !dash.read_only {
                " "
                form.inline method="post" action=(base.service(&status.name, "reshard")) {
                    input type="hidden" name="csrf" value=(dash.csrf.token());
                    input type="number" name="partitions" min="1" max="4096" required size="5" aria-label="partitions";
                    button id="reshard" type="submit" { "Reshard" }
                }
            }
        }
    }
}

/// The reshard form.
#[derive(Deserialize)]
pub(crate) struct ReshardForm {
    #[serde(default)]
    csrf: String,
    partitions: u32,
}

/// `POST /services/{name}/reshard`: starts a reshard, then shows the
/// service's page again; a refusal is a 409 naming why.
pub(crate) async fn reshard(
    State(dash): State<Shared>,
    Path(name): Path<String>,
    base: Base,
    Form(form): Form<ReshardForm>,
) -> Result<Response, Failure> {
    dash.allow(&form.csrf)?;
    let service = dash.admin.service(&name).await?;
    service.reshard(form.partitions).await?;
    dash.forget(&name);
    Ok(Redirect::to(&base.service(&name, "")).into_response())
}
