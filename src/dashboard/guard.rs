//! Who may use the dashboard, and what they may do: an optional basic-auth
//! login or bearer token (from the environment, never from a page or a
//! log), a CSRF token on every action, and a read-only mode in which no
//! action is shown or accepted.

use std::fmt;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::Engine;

use crate::error::{Error, Result};

/// The environment variable with a bearer token the dashboard requires.
pub const TOKEN_ENV: &str = "PEERQ_DASHBOARD_TOKEN";
/// The environment variable with `user:password` for basic auth.
pub const BASIC_AUTH_ENV: &str = "PEERQ_DASHBOARD_BASIC_AUTH";

/// Who may see the dashboard. Its `Debug` shows the kind, never the secret.
#[derive(Clone, Default, PartialEq, Eq)]
pub enum Access {
    /// Anyone who reaches it (behind your own proxy or on localhost).
    #[default]
    Open,
    /// A browser login: HTTP basic auth with this user and password.
    Basic {
        /// The user name.
        user: String,
        /// The password.
        password: String,
    },
    /// `Authorization: Bearer <token>` on every request (for a proxy or a
    /// script in front of it).
    Bearer(String),
}

impl fmt::Debug for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Access::Open => f.write_str("Open"),
            Access::Basic { user, .. } => {
                write!(f, "Basic {{ user: {user:?}, password: <hidden> }}")
            }
            Access::Bearer(_) => f.write_str("Bearer(<hidden>)"),
        }
    }
}

impl Access {
    /// From the environment: a bearer token in `PEERQ_DASHBOARD_TOKEN`, or
    /// `user:password` in `PEERQ_DASHBOARD_BASIC_AUTH`; open when neither
    /// is set. Both set, an empty one or basic auth without a `:` is
    /// refused, naming the variable.
    pub fn from_env() -> Result<Access> {
        let read = |name: &str| std::env::var(name).ok();
        Access::from_values(read(TOKEN_ENV), read(BASIC_AUTH_ENV))
    }

    fn from_values(token: Option<String>, basic: Option<String>) -> Result<Access> {
        match (token, basic) {
            (Some(_), Some(_)) => Err(Error::invalid(
                TOKEN_ENV,
                format!("is set together with {BASIC_AUTH_ENV}; set one of them"),
            )),
            (Some(token), None) if token.is_empty() => Err(Error::invalid(
                TOKEN_ENV,
                "is empty; unset it or give a token",
            )),
            (Some(token), None) => Ok(Access::Bearer(token)),
            (None, Some(basic)) => match basic.split_once(':') {
                Some((user, password)) if !user.is_empty() && !password.is_empty() => {
                    Ok(Access::Basic {
                        user: user.to_owned(),
                        password: password.to_owned(),
                    })
                }
                _ => Err(Error::invalid(
                    BASIC_AUTH_ENV,
                    "must be `user:password`, both non-empty",
                )),
            },
            (None, None) => Ok(Access::Open),
        }
    }

    /// Whether `headers` carry this access's credentials.
    fn admits(&self, headers: &HeaderMap) -> bool {
        let given = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        match self {
            Access::Open => true,
            Access::Bearer(token) => given
                .and_then(|v| v.strip_prefix("Bearer "))
                .is_some_and(|t| same(t.as_bytes(), token.as_bytes())),
            Access::Basic { user, password } => given
                .and_then(|v| v.strip_prefix("Basic "))
                .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
                .is_some_and(|pair| same(&pair, format!("{user}:{password}").as_bytes())),
        }
    }

    /// What a refused request is asked for.
    fn challenge(&self) -> HeaderValue {
        match self {
            Access::Bearer(_) => HeaderValue::from_static("Bearer realm=\"peerq\""),
            _ => HeaderValue::from_static("Basic realm=\"peerq\", charset=\"UTF-8\""),
        }
    }
}

/// What the middleware in front of every page checks.
#[derive(Debug, Clone)]
pub(crate) struct Door {
    pub(crate) access: Access,
    /// The `Host` values accepted; any when empty.
    pub(crate) hosts: Vec<String>,
}

/// The middleware in front of every page: 421 for a `Host` the dashboard
/// does not answer for (a DNS-rebinding page could otherwise read it,
/// tokens and all), 401 without the credentials; and on every answer,
/// headers that keep other sites from framing or sniffing it.
pub(crate) async fn require(State(door): State<Door>, request: Request, next: Next) -> Response {
    let host = request
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or_default();
    let mut response = if !door.hosts.is_empty() && !door.hosts.iter().any(|h| h == host) {
        let why = format!(
            "this dashboard answers for {} only\n",
            door.hosts.join(", ")
        );
        (StatusCode::MISDIRECTED_REQUEST, why).into_response()
    } else if door.access.admits(request.headers()) {
        next.run(request).await
    } else {
        let mut refused = (StatusCode::UNAUTHORIZED, "credentials required\n").into_response();
        refused
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, door.access.challenge());
        refused
    };
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
        ),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    response
}

/// The token every action's form carries: random per dashboard, so a page
/// of another site cannot know it (it cannot read the dashboard's pages).
#[derive(Clone)]
pub(crate) struct Csrf(String);

impl fmt::Debug for Csrf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Csrf(<hidden>)")
    }
}

impl Csrf {
    /// A new random token.
    pub(crate) fn new() -> Self {
        let bytes: [u8; 32] = rand::random();
        Csrf(bytes.iter().map(|b| format!("{b:02x}")).collect())
    }

    /// The token, for the forms.
    pub(crate) fn token(&self) -> &str {
        &self.0
    }
}

/// Why an action was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    ReadOnly,
    Csrf,
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let why = match self {
            Refusal::ReadOnly => "this dashboard is read-only: actions are turned off\n",
            Refusal::Csrf => {
                "the form's CSRF token is missing or wrong: reload the page and try again\n"
            }
        };
        (StatusCode::FORBIDDEN, why).into_response()
    }
}

/// Whether an action with form token `given` may run.
pub(crate) fn allow(read_only: bool, csrf: &Csrf, given: &str) -> std::result::Result<(), Refusal> {
    if read_only {
        return Err(Refusal::ReadOnly);
    }
    if !same(given.as_bytes(), csrf.0.as_bytes()) {
        return Err(Refusal::Csrf);
    }
    Ok(())
}

/// Compares in time that does not depend on where the inputs differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn auth(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(header::AUTHORIZATION, HeaderValue::from_str(value).unwrap());
        headers
    }

    #[test]
    fn the_environment_gives_one_kind_of_access() {
        let s = |v: &str| Some(v.to_owned());
        assert_eq!(Access::from_values(None, None).unwrap(), Access::Open);
        assert_eq!(
            Access::from_values(s("t0k"), None).unwrap(),
            Access::Bearer("t0k".into())
        );
        let basic = Access::from_values(None, s("ops:s3cret")).unwrap();
        assert_eq!(
            format!("{basic:?}"),
            "Basic { user: \"ops\", password: <hidden> }"
        );
        let both = Access::from_values(s("a"), s("b:c"))
            .unwrap_err()
            .to_string();
        assert!(
            both.contains(TOKEN_ENV) && both.contains(BASIC_AUTH_ENV),
            "{both}"
        );
        let bad = Access::from_values(None, s("nopassword"))
            .unwrap_err()
            .to_string();
        assert!(
            bad.contains(BASIC_AUTH_ENV) && !bad.contains("nopassword"),
            "{bad}"
        );
    }

    #[test]
    fn credentials_are_checked() {
        let basic = Access::Basic {
            user: "ops".into(),
            password: "s3cret".into(),
        };
        // base64("ops:s3cret")
        assert!(basic.admits(&auth("Basic b3BzOnMzY3JldA==")));
        assert!(!basic.admits(&auth("Basic b3BzOndyb25n")));
        assert!(!basic.admits(&HeaderMap::new()));
        let bearer = Access::Bearer("t0k".into());
        assert!(bearer.admits(&auth("Bearer t0k")));
        assert!(!bearer.admits(&auth("Bearer t0")));
        assert!(Access::Open.admits(&HeaderMap::new()));
    }

    #[test]
    fn actions_need_the_token_and_a_writable_dashboard() {
        let csrf = Csrf::new();
        assert_eq!(csrf.token().len(), 64);
        assert_eq!(allow(false, &csrf, csrf.token()), Ok(()));
        assert_eq!(allow(false, &csrf, "forged"), Err(Refusal::Csrf));
        assert_eq!(allow(true, &csrf, csrf.token()), Err(Refusal::ReadOnly));
        assert_ne!(Csrf::new().token(), csrf.token());
    }
}
