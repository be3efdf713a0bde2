//! The consumer's HTTP endpoint (cargo feature `http`, turned on by
//! `ConsumerBuilder::http`): `GET /metrics`, `GET /health/live` and
//! `GET /health/ready`.
//!
//! It owns the listener and its server (bound when `run` starts, stopped
//! when it returns), the process-wide Prometheus recorder (installed by the
//! first endpoint of the process and shared by every later one) with its
//! upkeep, and the rules that turn the instance's standing into liveness
//! and readiness. It records no metric and changes no standing: the runtime
//! publishes the standing after every round, and this module only reads it.
//!
//! - **Live** while the instance runs its loops: before the first round
//!   (starting, or waiting for Redis), after a graceful leave's last round
//!   (`Left`: the rounds stopped by design and `run` is returning), and
//!   otherwise while the last standing is at most three intervals old (at
//!   least 2 s). Rounds publish a standing every interval whatever happens
//!   to them — a round that fails is published as `Fenced` — so a standing
//!   that stops coming means the rounds or the runtime's loop are stuck.
//! - **Ready** while the last standing is an assignment whose lease holds
//!   (docs/design.md §4 rule 6: until `(E - 1) * I + 1.5 I + lease margin`
//!   by the instance's clock). That round reached Redis, so an instance cut
//!   from Redis turns unready at its next round, which is published as
//!   `Fenced` (round failed), or when its lease runs out, whichever is
//!   first. No extra `PING` is needed.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use metrics_exporter_prometheus::{BuildError, PrometheusBuilder, PrometheusHandle};
use serde_json::json;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::assignment::Assignment;
use crate::assignment::Standing;
use crate::clock::Clock;
use crate::error::{Error, Result};
use crate::timing::Timing;

/// How often the recorder's upkeep runs (it drains recorded histogram
/// samples, so memory stays bounded between scrapes).
const UPKEEP_EVERY: Duration = Duration::from_secs(5);
/// Live while the last standing is at most this many intervals old...
const LIVE_INTERVALS: u32 = 3;
/// ...and at least this old, so a short interval on a loaded machine does
/// not get a healthy instance restarted.
const LIVE_AT_LEAST: Duration = Duration::from_secs(2);
/// How long a stop waits for open connections before it drops them.
const STOP_WAIT: Duration = Duration::from_secs(1);
/// The histograms' bucket bounds, in seconds: Prometheus histograms (not
/// the exporter's default summaries), so the instances' buckets can be
/// summed into one service-wide quantile. From a millisecond (a handler
/// run) to five minutes (a wait behind a backlog).
const BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];
/// The content type of Prometheus's text format.
const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The recorder this process installed, shared by every endpoint in it.
/// A mutex rather than a `OnceLock`: two consumers starting at once must
/// not both try to install one, or the second would find "another
/// recorder" and refuse.
static RECORDER: Mutex<Option<PrometheusHandle>> = Mutex::new(None);

/// The process's Prometheus recorder: installed as the global `metrics`
/// recorder on first use (and peerq's metrics described to it), the same
/// one afterwards. Refused, naming the setting `http`, when the
/// application installed another recorder first: peerq's metrics go to that
/// one, which this endpoint cannot read.
fn recorder() -> Result<PrometheusHandle> {
    let mut installed = RECORDER.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(handle) = &*installed {
        return Ok(handle.clone());
    }
    let handle = PrometheusBuilder::new()
        .set_buckets(BUCKETS)
        .and_then(PrometheusBuilder::install_recorder)
        .map_err(|e| match e {
            BuildError::FailedToSetGlobalRecorder(_) => Error::invalid(
                "http",
                "another `metrics` recorder is installed in this process, so peerq's metrics \
                 go there and `/metrics` could not serve them; serve that recorder's metrics \
                 yourself (peerq records through the `metrics` facade) or leave out the \
                 other recorder",
            ),
            e => Error::invalid("http", format!("cannot build the Prometheus recorder: {e}")),
        })?;
    crate::metrics::describe();
    *installed = Some(handle.clone());
    Ok(handle)
}

/// The last standing the runtime published, and when it arrived.
#[derive(Debug, Clone)]
struct Seen {
    standing: Standing,
    at: Instant,
}

/// What the routes read.
#[derive(Debug)]
struct Served {
    /// `None` until the first round's standing.
    seen: Mutex<Option<Seen>>,
    clock: Arc<dyn Clock>,
    timing: Timing,
    metrics: PrometheusHandle,
}

impl Served {
    /// The last standing seen, locked.
    fn seen(&self) -> MutexGuard<'_, Option<Seen>> {
        self.seen.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records each standing the runtime publishes, until the run ends.
    async fn follow(&self, mut standing: watch::Receiver<Standing>) {
        while standing.changed().await.is_ok() {
            let now = standing.borrow_and_update().clone();
            *self.seen() = Some(Seen {
                standing: now,
                at: Instant::now(),
            });
        }
    }

    /// Runs the recorder's upkeep every [`UPKEEP_EVERY`], for as long as the
    /// endpoint serves. Each endpoint runs its own: the recorder outlives
    /// any one runtime (a test's, say), so no single task could own it.
    async fn upkeep(&self) {
        let mut tick = tokio::time::interval(UPKEEP_EVERY);
        loop {
            tick.tick().await;
            self.metrics.run_upkeep();
        }
    }
}

/// Liveness (see the module's doc): `Err` with the reason when not live.
fn liveness(seen: Option<&Seen>, interval: Duration, now: Instant) -> Result<(), String> {
    let Some(seen) = seen else {
        return Ok(()); // starting, or waiting for Redis
    };
    if matches!(seen.standing, Standing::Left { .. }) {
        return Ok(());
    }
    let limit = (interval * LIVE_INTERVALS).max(LIVE_AT_LEAST);
    let age = now.saturating_duration_since(seen.at);
    if age <= limit {
        Ok(())
    } else {
        Err(format!(
            "no round for {age:?}, more than the {limit:?} allowed"
        ))
    }
}

/// Readiness (see the module's doc): the assignment, or why there is none
/// in force. `now` is the instance's wall clock.
fn readiness(seen: Option<&Seen>, timing: &Timing, now: Duration) -> Result<Assignment, String> {
    // A later issue adds pausing: a paused instance keeps its assignment
    // and lease and only runs no tasks, so it will count as ready too.
    match seen.map(|s| &s.standing) {
        None => Err("starting".into()),
        Some(Standing::Joining) => Err("joining".into()),
        Some(Standing::Fenced { reason, .. }) => Err(format!("fenced: {reason}")),
        Some(Standing::Left { .. }) => Err("left".into()),
        Some(Standing::Assigned(a)) => match timing.lease_for(a.epoch, now) {
            Some(_) => Ok(a.clone()),
            None => Err("lease expired".into()),
        },
    }
}

/// The routes, on the shared state.
fn routes(served: Arc<Served>) -> Router {
    Router::new()
        .route("/metrics", get(scrape))
        .route("/health/live", get(live))
        .route("/health/ready", get(ready))
        .with_state(served)
}

/// `GET /metrics`: the recorder's Prometheus text.
async fn scrape(State(served): State<Arc<Served>>) -> Response {
    let text = served.metrics.render();
    ([(header::CONTENT_TYPE, PROMETHEUS_TEXT)], text).into_response()
}

/// `GET /health/live`: 200 `{"live":true}`, or 503 with the reason.
async fn live(State(served): State<Arc<Served>>) -> Response {
    let interval = served.timing.interval;
    match liveness(served.seen().as_ref(), interval, Instant::now()) {
        Ok(()) => reply(StatusCode::OK, json!({ "live": true })),
        Err(reason) => reply(
            StatusCode::SERVICE_UNAVAILABLE,
            json!({ "live": false, "reason": reason }),
        ),
    }
}

/// `GET /health/ready`: 200 with the assignment, or 503 with the reason.
async fn ready(State(served): State<Arc<Served>>) -> Response {
    let now = served.clock.now();
    match readiness(served.seen().as_ref(), &served.timing, now) {
        Ok(a) => reply(
            StatusCode::OK,
            json!({ "ready": true, "index": a.index, "replicas": a.replicas, "epoch": a.epoch }),
        ),
        Err(reason) => reply(
            StatusCode::SERVICE_UNAVAILABLE,
            json!({ "ready": false, "reason": reason }),
        ),
    }
}

/// A JSON reply.
fn reply(status: StatusCode, body: serde_json::Value) -> Response {
    let headers = [(header::CONTENT_TYPE, "application/json")];
    (status, headers, body.to_string()).into_response()
}

/// The endpoint of one run: it serves until [`stop`](Self::stop), or is
/// told to stop when dropped (the run's future dropped mid-way).
#[derive(Debug)]
pub(super) struct Endpoint {
    /// `None` when the consumer has no endpoint.
    running: Option<(CancellationToken, JoinHandle<()>)>,
}

impl Endpoint {
    /// Binds `addr` and serves there, reading the instance's standing from
    /// `standing`; without an address, an endpoint that does nothing.
    /// Fails with [`Error::InvalidSetting`] naming `http` when the address
    /// cannot be bound or another recorder is installed.
    pub(super) async fn start(
        addr: Option<SocketAddr>,
        standing: watch::Receiver<Standing>,
        clock: Arc<dyn Clock>,
        timing: Timing,
    ) -> Result<Endpoint> {
        let Some(addr) = addr else {
            return Ok(Endpoint { running: None });
        };
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| Error::invalid("http", format!("cannot listen on {addr}: {e}")))?;
        let served = Arc::new(Served {
            seen: Mutex::new(None),
            clock,
            timing,
            metrics: recorder()?,
        });
        let stop = CancellationToken::new();
        let serve = axum::serve(listener, routes(served.clone()))
            .with_graceful_shutdown(stop.clone().cancelled_owned());
        let task = tokio::spawn(async move {
            // `follow` ends with the run and `upkeep` never, so this ends
            // when the server does.
            let background = async { tokio::join!(served.follow(standing), served.upkeep()) };
            tokio::select! {
                _ = background => {}
                result = serve => {
                    if let Err(e) = result {
                        tracing::warn!(%addr, error = %e, "the http endpoint stopped");
                    }
                }
            }
        });
        Ok(Endpoint {
            running: Some((stop, task)),
        })
    }

    /// Stops serving: the listener closes, and open connections get up to
    /// a second to finish.
    pub(super) async fn stop(mut self) {
        if let Some((stop, task)) = &mut self.running {
            stop.cancel();
            if tokio::time::timeout(STOP_WAIT, &mut *task).await.is_err() {
                task.abort();
            }
        }
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        if let Some((stop, _)) = &self.running {
            stop.cancel();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::assignment::FenceReason;

    const MS: Duration = Duration::from_millis(1);

    fn seen(standing: Standing, at: Instant) -> Option<Seen> {
        Some(Seen { standing, at })
    }

    #[test]
    fn live_until_the_standing_is_three_intervals_old() {
        let now = Instant::now() + Duration::from_secs(60);
        let interval = 1000 * MS;
        let fenced = Standing::Fenced {
            epoch: 7,
            reason: FenceReason::NotCounted,
        };
        assert_eq!(liveness(None, interval, now), Ok(()), "starting");
        let fresh = seen(fenced.clone(), now - 3000 * MS);
        assert_eq!(liveness(fresh.as_ref(), interval, now), Ok(()));
        let stale = seen(fenced, now - 3001 * MS);
        assert!(liveness(stale.as_ref(), interval, now).is_err());
        let left = seen(Standing::Left { epoch: 7 }, now - 60_000 * MS);
        assert_eq!(liveness(left.as_ref(), interval, now), Ok(()), "leaving");
        // A short interval still allows 2 s.
        let short = seen(Standing::Joining, now - 1999 * MS);
        assert_eq!(liveness(short.as_ref(), 200 * MS, now), Ok(()));
    }

    /// The one test of this binary that touches the global recorder: it
    /// installs one of its own first, as an application might.
    #[test]
    fn another_recorder_is_refused_naming_http() {
        metrics::set_global_recorder(metrics::NoopRecorder).unwrap();
        match recorder() {
            Err(Error::InvalidSetting { setting, message }) => {
                assert_eq!(setting, "http");
                assert!(message.contains("another `metrics` recorder"), "{message}");
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn ready_while_assigned_and_the_lease_holds() {
        let timing = crate::timing::tests::timing();
        let start = crate::timing::tests::start;
        let at = Instant::now();
        let a = Assignment::modulo(100, 2, 3);
        let assigned = seen(Standing::Assigned(a.clone()), at);
        let lease_end = timing.lease_end(100);
        let ready = |s: &Option<Seen>, now| readiness(s.as_ref(), &timing, now);
        assert_eq!(ready(&assigned, start(100) + 100 * MS), Ok(a));
        assert_eq!(ready(&assigned, lease_end), Err("lease expired".to_owned()));
        assert_eq!(ready(&None, start(100)), Err("starting".to_owned()));
        let joining = seen(Standing::Joining, at);
        assert_eq!(ready(&joining, start(100)), Err("joining".to_owned()));
        let fenced = seen(
            Standing::Fenced {
                epoch: 100,
                reason: FenceReason::RoundFailed {
                    error: "connection refused".into(),
                },
            },
            at,
        );
        assert_eq!(
            ready(&fenced, start(100)),
            Err("fenced: round failed: connection refused".to_owned())
        );
        let left = seen(Standing::Left { epoch: 100 }, at);
        assert_eq!(ready(&left, start(100)), Err("left".to_owned()));
    }
}
