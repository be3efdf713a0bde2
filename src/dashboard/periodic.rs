//! A service's periodic jobs: schedule, last triggered and next due, from
//! `{N}:periodic` and each job's `{N/p}:cron:<job>` mark.

use axum::extract::{Path, State};
use maud::{Markup, html};

use super::layout::{Base, page, tabs};
use super::{Failure, Shared};

/// `GET /services/{name}/periodic`.
pub(crate) async fn list(
    State(dash): State<Shared>,
    Path(name): Path<String>,
    base: Base,
) -> Result<Markup, Failure> {
    let jobs = dash.admin.service(&name).await?.periodic().await?;
    let frame = dash.frame(&base, &name);
    Ok(page(
        &frame,
        html! {
            h1 { (name) }
            (tabs(&base, &name, "periodic"))
            @if jobs.is_empty() {
                p.muted { "No periodic job registered." }
            } @else {
                div.scroll {
                    table id="periodic" {
                        tr { th { "job" } th { "schedule" } th { "missed" } th.num { "partition" } th { "last triggered" } th { "next due" } }
                        @for job in &jobs {
                            tr {
                                td { (job.name) }
                                td {
                                    @if let Some(cron) = &job.cron { code { (cron) } " (UTC)" }
                                    @else if let Some(every) = job.every_ms { "every " (humantime(every)) }
                                }
                                td { (job.missed) }
                                td.num { (job.partition) }
                                td { (at(job.last_due_ms)) }
                                td { (at(job.next_due_ms)) }
                            }
                        }
                    }
                }
            }
        },
    ))
}

/// Unix milliseconds as a UTC time, `–` for none.
pub(crate) fn at(ms: Option<u64>) -> String {
    match ms {
        // Out of chrono's range (a malformed letter's time): shown as is.
        Some(ms) => match i64::try_from(ms)
            .ok()
            .and_then(chrono::DateTime::from_timestamp_millis)
        {
            Some(time) => time.format("%Y-%m-%d %H:%M:%S UTC").to_string(),
            None => format!("{ms} ms after 1970"),
        },
        None => "–".to_owned(),
    }
}

/// An interval in milliseconds as it was probably written: `30s`, `5m`.
fn humantime(ms: u64) -> String {
    match ms {
        ms if ms % 3_600_000 == 0 => format!("{}h", ms / 3_600_000),
        ms if ms % 60_000 == 0 => format!("{}m", ms / 60_000),
        ms if ms % 1_000 == 0 => format!("{}s", ms / 1_000),
        ms => format!("{ms}ms"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_and_intervals_read_well() {
        assert_eq!(at(Some(0)), "1970-01-01 00:00:00 UTC");
        assert_eq!(at(None), "–");
        assert_eq!(at(Some(u64::MAX)), "18446744073709551615 ms after 1970");
        assert_eq!(humantime(7_200_000), "2h");
        assert_eq!(humantime(300_000), "5m");
        assert_eq!(humantime(30_000), "30s");
        assert_eq!(humantime(1_500), "1500ms");
    }
}
