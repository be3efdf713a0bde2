//! A service's page: its state in figures, the last hour's tasks per
//! minute, its members and singletons, and its partitions (a heatmap,
//! `super::partitions`), refreshed every few seconds without a reload; and
//! the pause and resume actions (and the layout with the reshard action,
//! `super::reshard`).

use axum::Form;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Redirect, Response};
use maud::{Markup, html};
use serde::Deserialize;

use super::chart::{Minute, backlog_chart, chart};
use super::layout::{Base, ago, page, tabs};
use super::{Dash, Failure, Shared};
use crate::admin::Status;

/// Above this many partitions the page refreshes every 10 s, not 3 s:
/// each refresh of 1,024 partitions carries some 300 KB of cells and rows.
const MANY_PARTITIONS: usize = 256;

/// `GET /services/{name}`.
pub(crate) async fn show(
    State(dash): State<Shared>,
    Path(name): Path<String>,
    base: Base,
) -> Result<Markup, Failure> {
    let status = dash.status(&name).await?;
    let minutes = dash.minutes(&name).await?;
    let frame = dash.frame(&base, &name);
    let every = if status.partitions.len() > MANY_PARTITIONS {
        10_000
    } else {
        3_000
    };
    Ok(page(
        &frame,
        html! {
            h1 { (name) }
            (tabs(&base, &name, ""))
            (pause_bar(&dash, &base, &status))
            (super::reshard::layout_bar(&dash, &base, &status))
            form.filter method="get" action=(base.service(&name, "task")) {
                input type="search" name="id" size="48" placeholder="task handle: <partition>/<task id>";
                button type="submit" id="find-task" { "Find task" }
            }
            div data-refresh=(base.service(&name, "live")) data-every=(every) {
                (live(&base, &status, &minutes))
            }
        },
    ))
}

/// `GET /services/{name}/live`: the parts of the page that refresh.
pub(crate) async fn live_fragment(
    State(dash): State<Shared>,
    Path(name): Path<String>,
    base: Base,
) -> Result<Markup, Failure> {
    // The status first: it finds no made-up service, whose minutes would
    // read as zeros and be kept.
    let status = dash.status(&name).await?;
    let minutes = dash.minutes(&name).await?;
    Ok(live(&base, &status, &minutes))
}

/// Whether the service is paused, and the action that changes it.
fn pause_bar(dash: &Dash, base: &Base, status: &Status) -> Markup {
    let name = &status.name;
    html! {
        @if let Some(pause) = &status.paused {
            div.banner id="paused" {
                "Paused by " (pause.by) ": no handler starts; entries wait in Redis. "
                @if !dash.read_only {
                    form.inline method="post" action=(base.service(name, "resume")) {
                        input type="hidden" name="csrf" value=(dash.csrf.token());
                        button.primary id="resume" type="submit" { "Resume" }
                    }
                }
            }
        } @else if !dash.read_only {
            p {
                form.inline method="post" action=(base.service(name, "pause")) {
                    input type="hidden" name="csrf" value=(dash.csrf.token());
                    button.danger id="pause" type="submit" { "Pause" }
                }
                span.muted { " Stops handlers on every instance; rounds, handovers and acks go on." }
            }
        }
    }
}

/// The figures, the last hour, the members and the partitions.
fn live(base: &Base, status: &Status, minutes: &[Minute]) -> Markup {
    let t = &status.totals;
    let r = &status.rates;
    let cards: [(&str, String); 7] = [
        ("instances", t.live_members.to_string()),
        ("backlog", t.backlog.to_string()),
        ("in flight", t.in_flight.to_string()),
        ("delayed", t.delayed.to_string()),
        ("dead letters", t.dead.to_string()),
        ("ok / s (5 min)", format!("{:.1}", r.ok_per_s)),
        ("failed / s (5 min)", format!("{:.1}", r.failed_per_s)),
    ];
    html! {
        div.cards {
            @for (label, value) in &cards {
                div.card { div.n { (value) } div.l { (label) } }
            }
        }
        h2 { "Last hour" }
        div id="last-hour" {
            (chart(&status.name, minutes))
            // The backlog as the instances read it each minute (each one
            // records its partitions' figure with its presence).
            (backlog_chart(&status.name, minutes))
            p.muted id="backlog-now" {
                "Backlog now: " (t.backlog) " (" (t.pending) " delivered and not yet acked)."
            }
        }
        p id="limits" {
            @if let Some(rate) = &status.limits.rate {
                "Rate limit: " (rate.count) " per " (rate.per_ms) " ms, service-wide; "
                (rate.waiting) " waiting to start. "
            }
            @if let Some(rate) = &status.limits.rate_per_key {
                "Rate limit per key: " (rate.count) " per " (rate.per_ms) " ms. "
            }
            @if let Some(n) = status.limits.concurrency_per_key {
                "At most " (n) " tasks of one key at once. "
            }
            @if status.limits.rate_per_key.is_some() || status.limits.concurrency_per_key.is_some() {
                (status.limits.waiting_per_key) " held aside for their key. "
            }
            @if status.limits.rate.is_none()
                && status.limits.rate_per_key.is_none()
                && status.limits.concurrency_per_key.is_none() {
                span.muted { "No limits." }
            } @else {
                span.muted { "Change them with " code { "peerq limit set|clear" } "." }
            }
        }
        h2 { "Members" }
        div.scroll {
            table id="members" {
                tr {
                    th { "instance" } th { "standing" } th.num { "index" } th.num { "epoch" }
                    th.num { "owned" } th.num { "in flight" } th.num { "handled" } th { "seen" }
                }
                @for m in &status.members {
                    tr {
                        td { (m.id) }
                        td class=(standing_class(&m.standing, m.live)) { (m.standing) @if !m.live { " (gone)" } }
                        td.num { @if let (Some(i), Some(n)) = (m.index, m.replicas) { (i) "/" (n) } @else { "–" } }
                        td.num { @if let Some(e) = m.epoch { (e) } @else { "–" } }
                        td.num { (m.owned) }
                        td.num { (m.in_flight) }
                        td.num { (m.handled) }
                        td { (ago(m.seen_ago_ms)) " ago" }
                    }
                }
            }
        }
        @if status.members.is_empty() {
            p.muted { "No instance is running." }
        }
        @if !status.singletons.is_empty() {
            h2 { "Singletons" }
            div.scroll {
                table id="singletons" {
                    tr { th { "singleton" } th { "holder" } th.num { "token" } th { "since" } }
                    @for s in &status.singletons {
                        @let live = status.members.iter().any(|m| m.live && m.id == s.instance);
                        tr data-singleton=(s.name) {
                            td { (s.name) }
                            td class=[(!live || s.released).then_some("muted")] {
                                @if s.released { "released by " }
                                (s.instance)
                                @if !live && !s.released { " (gone)" }
                            }
                            td.num { (s.token) }
                            td { @if let Some(at) = s.since_ms { (ago(status.at_ms.saturating_sub(at))) " ago" } @else { "–" } }
                        }
                    }
                }
            }
        }
        (super::partitions::section(base, status))
    }
}

fn standing_class(standing: &str, live: bool) -> &'static str {
    match (standing, live) {
        (_, false) => "muted",
        ("assigned", _) => "ok",
        ("fenced", _) => "bad",
        _ => "warn",
    }
}

/// The form of an action that only needs the token.
#[derive(Debug, Deserialize)]
pub(crate) struct Plain {
    #[serde(default)]
    csrf: String,
}

/// `POST /services/{name}/pause`.
pub(crate) async fn pause(
    State(dash): State<Shared>,
    Path(name): Path<String>,
    base: Base,
    Form(form): Form<Plain>,
) -> Result<Response, Failure> {
    set_paused(&dash, &name, &base, &form, true).await
}

/// `POST /services/{name}/resume`.
pub(crate) async fn resume(
    State(dash): State<Shared>,
    Path(name): Path<String>,
    base: Base,
    Form(form): Form<Plain>,
) -> Result<Response, Failure> {
    set_paused(&dash, &name, &base, &form, false).await
}

/// Pauses or resumes service `name`, then shows its page again.
async fn set_paused(
    dash: &Dash,
    name: &str,
    base: &Base,
    form: &Plain,
    paused: bool,
) -> Result<Response, Failure> {
    dash.allow(&form.csrf)?;
    let service = dash.admin.service(name).await?;
    if paused {
        service.pause("dashboard").await?;
    } else {
        service.resume().await?;
    }
    dash.forget(name);
    Ok(Redirect::to(&base.service(name, "")).into_response())
}
