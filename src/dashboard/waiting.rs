//! A partition's waiting entries: the tasks no instance was given yet,
//! oldest first, 50 to a page, each with its stream id, task id, how long
//! it waited, attempt, key, headers and payload (shown as a dead letter's
//! is). Read-only: what an operator looks at to see what a backlog holds;
//! the entries themselves are `crate::admin`'s to read.

use axum::extract::{Path, Query as UrlQuery, State};
use maud::{Markup, html};
use serde::Deserialize;

use super::dead::payload;
use super::layout::{Base, ago, page, tabs, url_query};
use super::{Failure, Shared};
use crate::admin::waiting::WaitingEntry;
use crate::partition::{Shown, parse_unit};

/// Entries per page.
const PAGE: usize = 50;

/// The most characters of a payload shown: 50 entries of a 1 MB payload
/// would make a page no browser wants.
const PAYLOAD_CHARS: usize = 4_096;

/// `?after=<stream id>`: the page after that entry.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct After {
    #[serde(default)]
    after: String,
}

/// `GET /services/{name}/partitions/{partition}/waiting?after=…`; 404 for
/// a partition the service does not have.
pub(crate) async fn list(
    State(dash): State<Shared>,
    Path((name, partition)): Path<(String, String)>,
    UrlQuery(after): UrlQuery<After>,
    base: Base,
) -> Result<Markup, Failure> {
    let unit = parse_unit(&partition).ok_or_else(|| {
        Failure::NotFound(format!(
            "no partition `{partition}`: a partition is written `i`, or `g.i` after a reshard"
        ))
    })?;
    let service = dash.admin.service(&name).await?;
    let after = Some(after.after.trim()).filter(|a| !a.is_empty());
    let waiting = service.waiting(unit, after, PAGE).await?.ok_or_else(|| {
        Failure::NotFound(format!(
            "service `{name}` has no partition {} (in the generation in use, or one a reshard \
             replaces)",
            Shown(unit)
        ))
    })?;
    // Its owner and figures, as the service's page shows them (read at
    // most every 2 s): what the entries below wait behind.
    let status = dash.status(&name).await?;
    let state = status.partitions.iter().find(|p| p.partition == unit);
    let here = base.service(&name, &format!("partitions/{}/waiting", Shown(unit)));
    let frame = dash.frame(&base, &name);
    Ok(page(
        &frame,
        html! {
            h1 { (name) }
            (tabs(&base, &name, ""))
            h2 { "Partition " (Shown(unit)) ": waiting entries" }
            @if let Some(p) = state {
                p id="partition-state" {
                    @match &p.owner {
                        Some(owner) => { "Owner " (owner) }
                        None => { "No owner yet" }
                    }
                    @if let Some(token) = p.token { " (token " (token) ")" }
                    ". Backlog " (p.backlog) ", of which " (p.pending)
                    " delivered and not yet acked (not listed); " (p.delayed) " delayed, "
                    (p.dead) " dead."
                }
            }
            p.muted {
                "Entries no instance was given yet, oldest first, " (PAGE) " to a page"
                @if let Some(id) = &waiting.delivered_to { " (instances were given those up to " code { (id) } ")" }
                "."
                @if let Some(after) = after {
                    " After entry " code { (after) } ": " a id="first" href=(here) { "from the oldest" } "."
                }
            }
            @if waiting.entries.is_empty() {
                p.muted id="none" { "Nothing waits in this partition" @if after.is_some() { " past that entry" } "." }
            } @else {
                div.scroll {
                    table id="waiting" {
                        tr {
                            th { "stream id" } th { "task id" } th { "waiting" } th.num { "attempt" }
                            th { "key" } th { "headers" } th { "payload" }
                        }
                        @for entry in &waiting.entries {
                            (row(&base, &name, unit, entry))
                        }
                    }
                }
            }
            div.pager {
                @if let Some(next) = &waiting.next {
                    a id="next" href=(format!("{here}{}", url_query(&[("after", next)]))) { "Next " (PAGE) " →" }
                }
            }
        },
    ))
}

/// One entry's row.
fn row(base: &Base, name: &str, unit: u32, entry: &WaitingEntry) -> Markup {
    let mut shown = payload(&entry.codec, &entry.payload);
    if let Some((cut, _)) = shown.char_indices().nth(PAYLOAD_CHARS) {
        shown.truncate(cut);
        shown.push_str(&format!("\n… ({} bytes in all)", entry.payload.len()));
    }
    html! {
        tr data-id=(entry.id) {
            td { code { (entry.id) } }
            td {
                @if let Some(id) = &entry.task_id {
                    @let handle = format!("{}/{}", Shown(unit), id.as_str());
                    a href=(format!("{}{}", base.service(name, "task"), url_query(&[("id", &handle)]))) { (id.as_str()) }
                } @else { "(no id)" }
            }
            td { (ago(entry.waited_ms)) }
            td.num { (entry.attempt) }
            td { (entry.key.as_deref().unwrap_or("–")) }
            td.wrap {
                @for (header, value) in &entry.headers { (header) ": " (value) br; }
            }
            td { pre.payload { (shown) } }
        }
    }
}
