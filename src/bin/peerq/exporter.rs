//! `peerq exporter`: the services' queue figures as Prometheus gauges at
//! `GET /metrics`, read from Redis at each scrape by the library's
//! [`Exporter`] (which says what a scrape costs Redis). It runs apart from
//! the instances, so a service scaled to zero is still reported.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use peerq::admin::{Admin, Exporter};

/// The content type of the Prometheus text format.
const TEXT_FORMAT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// How long a scrape may wait for Redis: below Prometheus's default scrape
/// timeout (10 s), so a stuck Redis answers a failed scrape rather than
/// piling up requests.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(8);

/// Serves the gauges of `services` (every service when empty), scanning
/// for services every `rescan`, at `listen` until ctrl-c or SIGTERM.
pub(crate) async fn serve(
    admin: Admin,
    listen: SocketAddr,
    services: &[String],
    rescan: Duration,
) -> Result<String, String> {
    let mut exporter = Exporter::new(admin).rescan(rescan);
    if !services.is_empty() {
        exporter = exporter.only(services).map_err(crate::failed)?;
    }
    let app = Router::new()
        .route("/metrics", get(metrics))
        .with_state(Arc::new(exporter));
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| format!("cannot listen on {listen} (--listen): {e}"))?;
    eprintln!("peerq: the exporter is at http://{listen}/metrics; ctrl-c to stop");
    axum::serve(listener, app)
        .with_graceful_shutdown(crate::stopped())
        .await
        .map_err(|e| format!("the exporter stopped: {e}"))?;
    Ok(String::new())
}

/// `GET /metrics`: the gauges read now, or 503 when Redis could not be
/// read (Prometheus then records the scrape as failed, `up` 0, rather than
/// figures that are not there).
async fn metrics(State(exporter): State<Arc<Exporter>>) -> Response {
    let failed = match tokio::time::timeout(SCRAPE_TIMEOUT, exporter.scrape()).await {
        Ok(Ok(text)) => return ([(CONTENT_TYPE, TEXT_FORMAT)], text).into_response(),
        Ok(Err(e)) => crate::failed(e),
        Err(_) => format!("no answer from Redis within {SCRAPE_TIMEOUT:?}"),
    };
    eprintln!("peerq: a scrape failed: {failed}");
    (StatusCode::SERVICE_UNAVAILABLE, failed + "\n").into_response()
}
