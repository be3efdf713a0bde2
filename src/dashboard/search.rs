//! Searching a service's dead letters, and acting on every match.
//!
//! A search reads the letters a partition at a time, in calls of at most
//! [`SEARCH_BATCH`] letters (`DeadLetters::scan`: one round trip each), and
//! at most [`SEARCH_CALLS`] calls per request: 10,000 letters. When it
//! stops early the page says how far it got and links on from there. Its
//! matches come in partition order. A bulk action on a search's matches
//! reads at most [`BULK_CALLS`] calls (100,000 letters) per request and
//! says when more may match, and only on the letters dead when it began
//! (by their place in each partition's dead letters, not by any clock).

use axum::Form;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Redirect, Response};
use serde::Deserialize;

use super::layout::{Base, escape_segment, url_query};
use super::{Failure, Shared};
use crate::dead_letters::{Act, Cursor, DeadLetter, DeadLetters, Order};

/// Letters a search reads per call.
pub(crate) const SEARCH_BATCH: usize = 500;
/// Calls a search makes per request, at most.
pub(crate) const SEARCH_CALLS: usize = 20;
/// Calls a bulk action on a search's matches makes per request, at most
/// (of `BULK_BATCH` letters: 100,000); it says when more remain.
const BULK_CALLS: usize = 200;

/// The list's filter, from the URL.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct Filter {
    #[serde(default)]
    pub(crate) reason: String,
    #[serde(default)]
    pub(crate) q: String,
    #[serde(default)]
    pub(crate) order: String,
    #[serde(default)]
    pub(crate) after: String,
    /// What the last action did, to say so.
    #[serde(default)]
    pub(crate) done: String,
}

impl Filter {
    pub(crate) fn order(&self) -> Order {
        if self.order == "newest" {
            Order::NewestFirst
        } else {
            Order::OldestFirst
        }
    }

    pub(crate) fn after(&self) -> Result<Option<Cursor>, Failure> {
        if self.after.is_empty() {
            return Ok(None);
        }
        Ok(Some(self.after.parse::<Cursor>()?))
    }

    /// The query string of this filter from `after`.
    pub(crate) fn link(&self, after: &Cursor) -> String {
        let mut url = url_query(&[
            ("reason", &self.reason),
            ("q", &self.q),
            ("order", &self.order),
        ]);
        url.push_str(&format!("&after={}", escape_segment(&after.to_string())));
        url
    }
}

/// Whether `letter` matches search text `q` (lowercase): in its task id,
/// its error or, for a JSON payload, the payload's text.
fn matches(letter: &DeadLetter, q: &str) -> bool {
    let has = |text: &str| text.to_lowercase().contains(q);
    letter.task_id.as_ref().is_some_and(|id| has(id.as_str()))
        || has(&letter.error)
        || (letter.codec == "json" && has(&String::from_utf8_lossy(&letter.payload)))
}

/// What a search found.
pub(crate) struct Found {
    pub(crate) letters: Vec<DeadLetter>,
    /// Where to go on, when it stopped before the last letter.
    pub(crate) next: Option<Cursor>,
    pub(crate) read: usize,
}

/// Searches from `from` for up to `want` matches, in at most `calls`
/// calls of [`SEARCH_BATCH`] letters.
pub(crate) async fn search(
    dead: &DeadLetters,
    filter: &Filter,
    from: Option<Cursor>,
    want: usize,
    calls: usize,
) -> Result<Found, Failure> {
    let q = filter.q.to_lowercase();
    let mut found = Found {
        letters: Vec::new(),
        next: from,
        read: 0,
    };
    for _ in 0..calls {
        let scan = dead.scan(found.next.as_ref(), SEARCH_BATCH).await?;
        found.read += scan.letters.len();
        for letter in scan.letters {
            let reason_ok = filter.reason.is_empty() || letter.reason == filter.reason;
            if reason_ok && matches(&letter, &q) {
                found.letters.push(letter);
            }
        }
        found.next = scan.next;
        if found.next.is_none() || found.letters.len() >= want {
            break;
        }
    }
    Ok(found)
}

/// The form of an action on every match of a filter.
#[derive(Debug, Deserialize)]
pub(crate) struct Matching {
    #[serde(default)]
    csrf: String,
    action: String,
    #[serde(default)]
    reason: String,
    #[serde(default)]
    q: String,
}

/// `POST /services/{name}/dead/matching`: replay or purge every letter the
/// filter matches.
pub(crate) async fn matching(
    State(dash): State<Shared>,
    Path(name): Path<String>,
    base: Base,
    Form(form): Form<Matching>,
) -> Result<Response, Failure> {
    dash.allow(&form.csrf)?;
    let replay = match form.action.as_str() {
        "replay" => true,
        "purge" => false,
        other => {
            return Err(Failure::NotFound(format!(
                "no action `{other}`: replay or purge"
            )));
        }
    };
    let dead = dash.admin.service(&name).await?.dead_letters();
    let reason = (!form.reason.is_empty()).then_some(form.reason.as_str());
    let (count, more) = if form.q.is_empty() {
        let count = match (replay, reason) {
            (true, reason) => dead.replay_all(reason).await?,
            (false, Some(reason)) => dead.purge_reason(reason).await?,
            (false, None) => dead.purge_all().await?,
        };
        (count, false)
    } else {
        let filter = Filter {
            reason: form.reason.clone(),
            q: form.q.clone(),
            ..Filter::default()
        };
        act_on_matches(&dead, &filter, replay).await?
    };
    let verb = if replay { "Replayed" } else { "Purged" };
    let more = if more {
        "; more may match: run it again"
    } else {
        ""
    };
    dash.forget(&name);
    Ok(back(
        &base,
        &name,
        &format!("{verb} {count} dead letters{more}."),
    ))
}

/// Replays or purges every letter `filter` matches, in at most
/// [`BULK_CALLS`] calls; how many, and whether more may match. Only the
/// letters dead when the action began are acted on, by their position in
/// each partition's dead letters as it began (`DeadLetters::act_on`), so
/// a replayed task that fails again at once is not replayed over and over,
/// whatever the consumers' and the dashboard's clocks say.
async fn act_on_matches(
    dead: &DeadLetters,
    filter: &Filter,
    replay: bool,
) -> Result<(u64, bool), Failure> {
    let q = filter.q.to_lowercase();
    let wanted = |letter: &DeadLetter| {
        (filter.reason.is_empty() || letter.reason == filter.reason) && matches(letter, &q)
    };
    let act = if replay { Act::Replay } else { Act::Purge };
    Ok(dead.act_on(wanted, act, BULK_CALLS).await?)
}

/// Back to the list, saying what was done.
pub(crate) fn back(base: &Base, name: &str, done: &str) -> Response {
    let url = format!(
        "{}{}",
        base.service(name, "dead"),
        url_query(&[("done", done)])
    );
    Redirect::to(&url).into_response()
}
