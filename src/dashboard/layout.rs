//! The frame of every page: the head (the dashboard's own stylesheet and
//! script, nothing from another site), the top bar and a service's tabs;
//! and the path prefix the dashboard is mounted under, so its links work
//! wherever the user's app nests it.

use axum::extract::{FromRequestParts, OriginalUri};
use axum::http::request::Parts;
use maud::{DOCTYPE, Markup, html};

/// The path the dashboard is mounted under (`""` when it is the whole
/// site), from the request's original and nested paths.
#[derive(Debug, Clone)]
pub(crate) struct Base(pub(crate) String);

impl<S: Send + Sync> FromRequestParts<S> for Base {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        let nested = parts.uri.path();
        let original = parts
            .extensions
            .get::<OriginalUri>()
            .map(|o| o.0.path().to_owned())
            .unwrap_or_else(|| nested.to_owned());
        // A nested router sees its own root as `/` whether or not the
        // original path ended in one.
        let base = original
            .trim_end_matches('/')
            .strip_suffix(nested.trim_end_matches('/'))
            .unwrap_or_default();
        Ok(Base(base.to_owned()))
    }
}

impl Base {
    /// The absolute path of `path` (which starts with `/`) under the base.
    /// The overview (`/`) of a nested dashboard is the base itself: a
    /// router nested at `/admin/queues` serves `/admin/queues`, not
    /// `/admin/queues/`.
    pub(crate) fn at(&self, path: &str) -> String {
        if path == "/" && !self.0.is_empty() {
            return self.0.clone();
        }
        format!("{}{path}", self.0)
    }

    /// The path of service `name`'s page `page` (`""` for its overview).
    pub(crate) fn service(&self, name: &str, page: &str) -> String {
        let name = escape_segment(name);
        if page.is_empty() {
            self.at(&format!("/services/{name}"))
        } else {
            self.at(&format!("/services/{name}/{page}"))
        }
    }
}

/// A path segment with the characters a service name may hold but a URL
/// path may not percent-encoded.
pub(crate) fn escape_segment(segment: &str) -> String {
    let mut out = String::with_capacity(segment.len());
    for b in segment.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// `?k=v&…`, each value percent-encoded.
pub(crate) fn url_query(pairs: &[(&str, &str)]) -> String {
    let parts: Vec<String> = pairs
        .iter()
        .map(|(k, v)| format!("{k}={}", escape_segment(v)))
        .collect();
    format!("?{}", parts.join("&"))
}

/// What the frame needs to know besides the page's content.
pub(crate) struct Frame<'a> {
    pub(crate) base: &'a Base,
    /// The Redis shown in the top bar (without its password).
    pub(crate) redis: &'a str,
    pub(crate) read_only: bool,
    pub(crate) title: &'a str,
}

/// A whole page around `content`.
pub(crate) fn page(frame: &Frame<'_>, content: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                meta name="color-scheme" content="light dark";
                title { (frame.title) " · peerq" }
                link rel="stylesheet" href=(frame.base.at("/assets/style.css"));
                script defer src=(frame.base.at("/assets/dashboard.js")) {}
            }
            body {
                header.top {
                    a.brand href=(frame.base.at("/")) { "peerq" }
                    span.redis { (frame.redis) }
                    @if frame.read_only { span.mode { "read-only" } }
                }
                main { (content) }
            }
        }
    }
}

/// The tabs of service `name`, with `here` marked.
pub(crate) fn tabs(base: &Base, name: &str, here: &str) -> Markup {
    let tabs = [
        ("", "Overview"),
        ("dead", "Dead letters"),
        ("delayed", "Delayed"),
        ("periodic", "Periodic"),
    ];
    html! {
        nav.tabs {
            @for (page, label) in tabs {
                a href=(base.service(name, page)) class=[(page == here).then_some("here")] { (label) }
            }
        }
    }
}

/// A duration in milliseconds as people read it: `850 ms`, `12 s`,
/// `4 min`, `3 h`, `2 d`.
pub(crate) fn ago(ms: u64) -> String {
    match ms {
        0..1_000 => format!("{ms} ms"),
        1_000..120_000 => format!("{} s", ms / 1_000),
        120_000..7_200_000 => format!("{} min", ms / 60_000),
        7_200_000..172_800_000 => format!("{} h", ms / 3_600_000),
        _ => format!("{} d", ms / 86_400_000),
    }
}

/// A task's headers under their heading (the dead letter's and the task's
/// pages); nothing when it has none.
pub(crate) fn headers<'a>(headers: impl IntoIterator<Item = (&'a str, &'a str)>) -> Markup {
    let headers: Vec<_> = headers.into_iter().collect();
    html! {
        @if !headers.is_empty() {
            h2 { "Headers" }
            div.scroll {
                table id="headers" {
                    @for (header, value) in headers {
                        tr { th { (header) } td.wrap { (value) } }
                    }
                }
            }
        }
    }
}

/// What a page that finds one thing by its id found (the task page, the
/// batch page): no id asked for yet, an id that does not parse (400, and
/// why), no such thing (404), or it.
pub(crate) enum Lookup<I, T> {
    Nothing,
    Invalid(String),
    Unknown(I),
    Found(T),
}

impl<I, T> Lookup<I, T> {
    /// What was asked for (trimmed; empty: nothing asked), parsed with
    /// `parse`: `Ok(None)` for nothing, `Err` for an id that does not
    /// parse (the page's answer, with why).
    pub(crate) fn asked<E: std::fmt::Display>(
        asked: &str,
        parse: impl FnOnce(&str) -> Result<I, E>,
    ) -> Result<Option<I>, Lookup<I, T>> {
        match asked.trim() {
            "" => Ok(None),
            id => parse(id)
                .map(Some)
                .map_err(|e| Lookup::Invalid(e.to_string())),
        }
    }

    /// `found` for `id`: it, or `Unknown`.
    pub(crate) fn of(id: I, found: Option<T>) -> Lookup<I, T> {
        match found {
            Some(found) => Lookup::Found(found),
            None => Lookup::Unknown(id),
        }
    }

    /// The page's status: a mistyped or unknown id answers 400 or 404 with
    /// the whole page, its search form included (the operator most likely
    /// mistyped, and fixes it right there).
    pub(crate) fn status(&self) -> axum::http::StatusCode {
        use axum::http::StatusCode;
        match self {
            Lookup::Invalid(_) => StatusCode::BAD_REQUEST,
            Lookup::Unknown(_) => StatusCode::NOT_FOUND,
            Lookup::Nothing | Lookup::Found(_) => StatusCode::OK,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_become_safe_path_segments() {
        assert_eq!(escape_segment("mail-sender"), "mail-sender");
        assert_eq!(escape_segment("a b#c?d"), "a%20b%23c%3Fd");
        let base = Base("/admin/queues".into());
        assert_eq!(
            base.service("mail", "dead"),
            "/admin/queues/services/mail/dead"
        );
        assert_eq!(base.service("mail", ""), "/admin/queues/services/mail");
        assert_eq!(base.at("/"), "/admin/queues");
        assert_eq!(Base(String::new()).at("/"), "/");
    }

    #[test]
    fn queries_are_encoded() {
        assert_eq!(
            url_query(&[("q", "a b&c"), ("reason", "")]),
            "?q=a%20b%26c&reason="
        );
    }

    #[test]
    fn durations_read_as_people_say_them() {
        assert_eq!(ago(850), "850 ms");
        assert_eq!(ago(12_000), "12 s");
        assert_eq!(ago(240_000), "4 min");
        assert_eq!(ago(3 * 3_600_000 + 5), "3 h");
        assert_eq!(ago(3 * 86_400_000), "3 d");
    }
}
