//! A service's dead letters: a paged list (oldest or newest first, of one
//! reason) or a search's matches ([`super::search`]), one letter's
//! details, and replay or purge of one letter.

use axum::Form;
use axum::extract::{Path, Query as UrlQuery, State};
use axum::response::Response;
use maud::{Markup, html};
use serde::Deserialize;

use super::layout::{Base, escape_segment, headers, page, tabs};
use super::periodic::at;
use super::search::{Filter, SEARCH_CALLS, back, search};
use super::{Failure, Shared};
use crate::dead_letters::{Cursor, DeadLetter, Query};
use crate::error::Error;

/// Letters per page.
const PAGE: usize = 50;

/// `GET /services/{name}/dead`.
pub(crate) async fn list(
    State(dash): State<Shared>,
    Path(name): Path<String>,
    UrlQuery(filter): UrlQuery<Filter>,
    base: Base,
) -> Result<Markup, Failure> {
    let service = dash.admin.service(&name).await?;
    let dead = service.dead_letters();
    let (letters, next, note) = if filter.q.is_empty() {
        let mut query = Query::new(PAGE).order(filter.order());
        if !filter.reason.is_empty() {
            query = query.reason(filter.reason.clone());
        }
        if let Some(after) = filter.after()? {
            query = query.after(after);
        }
        let page = dead.page(&query).await?;
        (page.letters, page.next, None)
    } else {
        let found = search(&dead, &filter, filter.after()?, PAGE, SEARCH_CALLS).await?;
        let note = format!(
            "Searched {} letters{}.",
            found.read,
            if found.next.is_some() {
                "; more remain"
            } else {
                ", to the last one"
            }
        );
        (found.letters, found.next, Some(note))
    };
    let frame = dash.frame(&base, &name);
    let here = base.service(&name, "dead");
    let reasons = [
        "",
        "failed",
        "permanent",
        "decode",
        "malformed",
        "too_large",
        "relay",
    ];
    Ok(page(
        &frame,
        html! {
            h1 { (name) }
            (tabs(&base, &name, "dead"))
            @if !filter.done.is_empty() { div.notice id="done" { (filter.done) } }
            form.filter method="get" action=(here) {
                input type="search" name="q" value=(filter.q) placeholder="task id, error or payload text";
                select name="reason" {
                    @for r in reasons {
                        option value=(r) selected[r == filter.reason] { @if r.is_empty() { "any reason" } @else { (r) } }
                    }
                }
                select name="order" {
                    option value="oldest" selected[filter.order != "newest"] { "oldest first" }
                    option value="newest" selected[filter.order == "newest"] { "newest first" }
                }
                button type="submit" id="search" { "Show" }
            }
            @if let Some(note) = &note { p.muted id="searched" { (note) } }
            @if !dash.read_only && !letters.is_empty() {
                form.filter method="post" action=(base.service(&name, "dead/matching"))
                    data-confirm="Act on every dead letter that matches this filter?" {
                    input type="hidden" name="csrf" value=(dash.csrf.token());
                    input type="hidden" name="reason" value=(filter.reason);
                    input type="hidden" name="q" value=(filter.q);
                    button type="submit" name="action" value="replay" { "Replay all matching" }
                    button.danger type="submit" name="action" value="purge" { "Purge all matching" }
                }
            }
            div.scroll {
                table id="letters" {
                    tr { th { "dead at" } th.num { "p" } th { "task id" } th { "reason" } th.num { "attempts" } th { "error" } th {} }
                    @for l in &letters {
                        tr {
                            td { (at(Some(millis(l.dead_at)))) }
                            td.num { (l.partition) }
                            td {
                                a href=(format!("{}/letter?at={}", here, escape_segment(&l.cursor().to_string()))) {
                                    @if let Some(id) = &l.task_id { (id.as_str()) } @else { "(no id)" }
                                }
                            }
                            td { (l.reason) }
                            td.num { (l.attempts) }
                            td.wrap { (l.error) }
                            td { (actions(&dash, &base, &name, l)) }
                        }
                    }
                }
            }
            @if letters.is_empty() { p.muted { "No dead letter matches." } }
            div.pager {
                @if let Some(next) = &next { a id="next" href=(format!("{here}{}", filter.link(next))) { "Next →" } }
            }
        },
    ))
}

/// Replay and purge buttons of one letter (none when read-only).
fn actions(dash: &super::Dash, base: &Base, name: &str, letter: &DeadLetter) -> Markup {
    if dash.read_only {
        return html! {};
    }
    let cursor = letter.cursor().to_string();
    html! {
        form.inline method="post" action=(base.service(name, "dead/replay")) {
            input type="hidden" name="csrf" value=(dash.csrf.token());
            input type="hidden" name="at" value=(cursor);
            button.replay type="submit" { "Replay" }
        }
        " "
        form.inline method="post" action=(base.service(name, "dead/purge")) {
            input type="hidden" name="csrf" value=(dash.csrf.token());
            input type="hidden" name="at" value=(cursor);
            button.danger type="submit" { "Purge" }
        }
    }
}

/// `?at=<partition>/<id>`.
#[derive(Debug, Deserialize)]
pub(crate) struct At {
    at: String,
}

/// `GET /services/{name}/dead/letter?at=…`: one letter.
pub(crate) async fn show(
    State(dash): State<Shared>,
    Path(name): Path<String>,
    UrlQuery(at_): UrlQuery<At>,
    base: Base,
) -> Result<Markup, Failure> {
    let dead = dash.admin.service(&name).await?.dead_letters();
    let cursor: Cursor = at_.at.parse()?;
    let letter = dead.get(&cursor).await?.ok_or_else(|| {
        Failure::NotFound(format!("no dead letter at {cursor} (replayed or purged?)"))
    })?;
    let frame = dash.frame(&base, &name);
    let payload = payload(&letter.codec, &letter.payload);
    Ok(page(
        &frame,
        html! {
            h1 { (name) }
            (tabs(&base, &name, "dead"))
            h2 { "Dead letter " (cursor.to_string()) }
            div.scroll {
                table id="letter" {
                    tr { th { "task id" } td { @if let Some(id) = &letter.task_id { (id.as_str()) } } }
                    tr { th { "reason" } td { (letter.reason) } }
                    tr { th { "error" } td.wrap { (letter.error) } }
                    tr { th { "attempts" } td { (letter.attempts) } }
                    tr { th { "failures" } td { (letter.failures) } }
                    tr { th { "partition" } td { (letter.partition) } }
                    tr { th { "key" } td { (letter.key.as_deref().unwrap_or("–")) } }
                    tr { th { "enqueued" } td { (at(Some(millis(letter.enqueued_at)))) } }
                    tr { th { "dead at" } td { (at(Some(millis(letter.dead_at)))) } }
                    tr { th { "codec" } td { (letter.codec) " (" (letter.payload.len()) " bytes)" } }
                }
            }
            (headers(&letter.headers))
            h2 { "Payload" }
            pre id="payload" { (payload) }
            (actions(&dash, &base, &name, &letter))
        },
    ))
}

/// The form of a one-letter action.
#[derive(Debug, Deserialize)]
pub(crate) struct OneLetter {
    #[serde(default)]
    csrf: String,
    at: String,
}

/// `POST /services/{name}/dead/replay`.
pub(crate) async fn replay(
    State(dash): State<Shared>,
    Path(name): Path<String>,
    base: Base,
    Form(form): Form<OneLetter>,
) -> Result<Response, Failure> {
    one(dash, name, base, form, true).await
}

/// `POST /services/{name}/dead/purge`.
pub(crate) async fn purge(
    State(dash): State<Shared>,
    Path(name): Path<String>,
    base: Base,
    Form(form): Form<OneLetter>,
) -> Result<Response, Failure> {
    one(dash, name, base, form, false).await
}

async fn one(
    dash: Shared,
    name: String,
    base: Base,
    form: OneLetter,
    replay: bool,
) -> Result<Response, Failure> {
    dash.allow(&form.csrf)?;
    let dead = dash.admin.service(&name).await?.dead_letters();
    let cursor: Cursor = form.at.parse()?;
    let done = match dead.get(&cursor).await? {
        // A unique key another task holds: said, not a failure of the page.
        Some(letter) if replay => match dead.replay(&letter).await {
            Ok(true) => format!("Replayed {cursor}."),
            Ok(false) => format!("{cursor} was gone already."),
            Err(Error::Duplicate(held)) => format!("Not replayed {cursor}: {held}."),
            Err(e) => return Err(e.into()),
        },
        Some(letter) if !replay && dead.purge(&letter).await? => format!("Purged {cursor}."),
        _ => format!("{cursor} was gone already."),
    };
    dash.forget(&name);
    Ok(back(&base, &name, &done))
}

fn millis(t: std::time::SystemTime) -> u64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis() as u64
}

/// A payload as the dashboard shows it (a dead letter's, a waiting
/// entry's): pretty JSON for the json codec, hex for any other (bincode
/// has no schema to read it by) or for JSON that does not parse.
pub(super) fn payload(codec: &str, bytes: &[u8]) -> String {
    match serde_json::from_slice::<serde_json::Value>(bytes) {
        Ok(json) if codec == "json" => serde_json::to_string_pretty(&json).unwrap_or_default(),
        _ => hex(bytes),
    }
}

/// Bytes as hex, 32 to a line.
fn hex(bytes: &[u8]) -> String {
    bytes
        .chunks(32)
        .map(|line| {
            line.iter()
                .map(|b| format!("{b:02x}"))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_print_as_hex_lines() {
        assert_eq!(hex(&[0, 15, 255]), "00 0f ff");
        assert_eq!(hex(&[1; 33]).lines().count(), 2);
    }
}
