//! The web dashboard (feature `dashboard`): every service on a Redis, a
//! service's members, its last hour and its partitions (a heatmap at any
//! count, and a partition's waiting entries), its dead letters (search,
//! replay, purge), delayed tasks, periodic jobs, a tracked task (and its
//! cancel), a batch (its members by state, a chain's step, its callback),
//! and pause and resume.
//!
//! Server-rendered HTML (maud) on axum, with one stylesheet and one small
//! script of its own, served by the dashboard itself: nothing is loaded
//! from another site. Two ways to run it: mount [`router`] in your own
//! axum app under any path, or run `peerq dashboard --redis URL`.
//!
//! ```no_run
//! # async fn demo() -> peerq::Result<()> {
//! use peerq::admin::Admin;
//! use peerq::dashboard::{self, Access, Settings};
//!
//! let admin = Admin::connect("redis://127.0.0.1/").await?;
//! let settings = Settings::new().access(Access::from_env()?);
//! let app = axum::Router::new().nest("/admin/queues", dashboard::router(admin, settings));
//! # let _ = app;
//! # Ok(()) }
//! ```
//!
//! What it reads is what the CLI reads ([`crate::admin`]): summaries per
//! partition, never `KEYS`, never the contents of a stream but a page of
//! dead letters, delayed tasks or a partition's waiting entries. A
//! service's state and its last hour are read at most every 2 s however
//! many browsers watch it. Every action is a `POST` carrying the
//! dashboard's CSRF token; a read-only dashboard shows no action and
//! refuses them all.

mod batch;
mod cache;
mod chart;
mod dead;
mod delayed;
mod guard;
mod layout;
mod overview;
mod partitions;
mod periodic;
mod reshard;
mod search;
mod service;
mod task;
mod waiting;

use std::sync::Arc;

use axum::Router;
use axum::http::{StatusCode, header};
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use maud::html;

pub use guard::{Access, BASIC_AUTH_ENV, TOKEN_ENV};

use self::cache::{Cache, FRESH};
use self::chart::Minute;
use self::guard::{Csrf, Refusal};
use crate::admin::{Admin, Status};
use crate::config::ServiceName;
use crate::error::Error;

/// How the dashboard runs.
#[derive(Debug, Clone, Default)]
#[must_use]
pub struct Settings {
    read_only: bool,
    access: Access,
    hosts: Vec<String>,
}

impl Settings {
    /// Actions on, open to whoever reaches it.
    pub fn new() -> Self {
        Settings::default()
    }

    /// Read-only: no action is shown, and every action is refused (403).
    pub fn read_only(mut self, read_only: bool) -> Self {
        self.read_only = read_only;
        self
    }

    /// Who may see it (default [`Access::Open`]; see
    /// [`Access::from_env`]).
    pub fn access(mut self, access: Access) -> Self {
        self.access = access;
        self
    }

    /// Answer only requests whose `Host` is one of `hosts` (such as
    /// `127.0.0.1:8080`, `localhost:8080`); others get 421. Set it when the
    /// dashboard listens on loopback without credentials: a page of another
    /// site that points its own name at 127.0.0.1 (DNS rebinding) could
    /// otherwise read the dashboard. Default: any host.
    pub fn hosts<I: IntoIterator<Item = S>, S: Into<String>>(mut self, hosts: I) -> Self {
        self.hosts = hosts.into_iter().map(Into::into).collect();
        self
    }
}

/// The dashboard of the services on `admin`'s Redis, to serve alone or to
/// nest under a path of your app (its links follow the path it is nested
/// under).
pub fn router(admin: Admin, settings: Settings) -> Router {
    let dash = Arc::new(Dash {
        admin,
        read_only: settings.read_only,
        csrf: Csrf::new(),
        overview: Cache::new(FRESH),
        statuses: Cache::new(FRESH),
        minutes: Cache::new(FRESH),
    });
    Router::new()
        .route("/", get(overview::show))
        .route("/services/{name}", get(service::show))
        .route("/services/{name}/live", get(service::live_fragment))
        .route(
            "/services/{name}/partitions/{partition}/waiting",
            get(waiting::list),
        )
        .route("/services/{name}/pause", post(service::pause))
        .route("/services/{name}/reshard", post(reshard::reshard))
        .route("/services/{name}/resume", post(service::resume))
        .route("/services/{name}/dead", get(dead::list))
        .route("/services/{name}/dead/letter", get(dead::show))
        .route("/services/{name}/dead/replay", post(dead::replay))
        .route("/services/{name}/dead/purge", post(dead::purge))
        .route("/services/{name}/dead/matching", post(search::matching))
        .route("/services/{name}/delayed", get(delayed::list))
        .route("/services/{name}/delayed/act", post(delayed::act))
        .route("/services/{name}/periodic", get(periodic::list))
        .route("/services/{name}/task", get(task::show))
        .route("/services/{name}/batch", get(batch::show))
        .route("/services/{name}/task/cancel", post(task::cancel))
        .route("/assets/style.css", get(style))
        .route("/assets/dashboard.js", get(script))
        .layer(middleware::from_fn_with_state(
            guard::Door {
                access: settings.access,
                hosts: settings.hosts,
            },
            guard::require,
        ))
        .with_state(dash)
}

/// What every handler shares.
pub(crate) struct Dash {
    pub(crate) admin: Admin,
    pub(crate) read_only: bool,
    pub(crate) csrf: Csrf,
    overview: Cache<overview::Overview>,
    statuses: Cache<Status>,
    minutes: Cache<Vec<Minute>>,
}

pub(crate) type Shared = Arc<Dash>;

impl Dash {
    /// Service `name`'s state, read at most every 2 s.
    pub(crate) async fn status(&self, name: &str) -> Result<Arc<Status>, Failure> {
        let read = || async { self.admin.service(name).await?.status().await };
        Ok(self.statuses.get(name, read).await?)
    }

    /// Service `name`'s tasks ok and failed in each minute of the last
    /// hour (the current minute last), read at most every 2 s.
    pub(crate) async fn minutes(&self, name: &str) -> Result<Arc<Vec<Minute>>, Failure> {
        let read = || async {
            let name = ServiceName::new(name)?;
            let mut each = self.admin.minutes(&[&name], overview::MINUTES).await?;
            let minutes = each.pop().unwrap_or_default();
            Ok::<_, Error>(minutes.iter().map(Minute::of).collect())
        };
        Ok(self.minutes.get(name, read).await?)
    }

    /// The frame of a page titled `title` at `base`.
    pub(crate) fn frame<'a>(&'a self, base: &'a layout::Base, title: &'a str) -> layout::Frame<'a> {
        layout::Frame {
            base,
            redis: self.admin.redis(),
            read_only: self.read_only,
            title,
        }
    }

    /// Whether an action with form token `csrf` may run.
    pub(crate) fn allow(&self, csrf: &str) -> Result<(), Failure> {
        guard::allow(self.read_only, &self.csrf, csrf).map_err(Failure::Refused)
    }

    /// After an action on service `name`: its next page shows the effect.
    pub(crate) fn forget(&self, name: &str) {
        self.statuses.forget(name);
        self.overview.forget("");
    }
}

/// Why a page or an action did not work, as a small page saying so. The
/// crate's errors never contain a password.
#[derive(Debug)]
pub(crate) enum Failure {
    Refused(Refusal),
    Error(Error),
    NotFound(String),
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        Failure::Error(e)
    }
}

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        let (status, message) = match self {
            Failure::Refused(refusal) => return refusal.into_response(),
            Failure::NotFound(what) => (StatusCode::NOT_FOUND, what),
            Failure::Error(e @ Error::UnknownService { .. }) => {
                (StatusCode::NOT_FOUND, e.to_string())
            }
            Failure::Error(e @ Error::InvalidSetting { .. }) => {
                (StatusCode::BAD_REQUEST, e.to_string())
            }
            Failure::Error(e @ Error::ReshardRefused(_)) => (StatusCode::CONFLICT, e.to_string()),
            Failure::Error(e) => (StatusCode::BAD_GATEWAY, e.to_string()),
        };
        let body = html! {
            (maud::DOCTYPE)
            html lang="en" {
                head { meta charset="utf-8"; title { "peerq: " (status.as_u16()) } }
                body { h1 { (status.as_u16()) } p id="failure" { (message) } }
            }
        };
        (status, body).into_response()
    }
}

async fn style() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/css; charset=utf-8"),
            (header::CACHE_CONTROL, "max-age=300"),
        ],
        include_str!("assets/style.css"),
    )
}

async fn script() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/javascript; charset=utf-8"),
            (header::CACHE_CONTROL, "max-age=300"),
        ],
        include_str!("assets/dashboard.js"),
    )
}
