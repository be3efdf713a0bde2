//! The overview: every service on the Redis, with its instances, backlog,
//! dead letters and whether it is paused, and its tasks ok and failed per
//! minute over the last hour.

use axum::extract::State;
use maud::{Markup, html};

use super::chart::{Minute, chart};
use super::layout::{Base, page};
use super::{Failure, Shared};
use crate::admin::{Admin, ServiceSummary};
use crate::config::ServiceName;
use crate::error::Result;

/// The minutes the charts cover.
pub(crate) const MINUTES: u32 = 60;

/// What the overview shows, read at most every 2 s.
pub(crate) struct Overview {
    services: Vec<(ServiceSummary, Vec<Minute>)>,
}

impl Overview {
    /// The services and their charts: a scan, two pipelines, and `TIME`
    /// with one pipeline for every chart.
    async fn read(admin: &Admin) -> Result<Overview> {
        let summaries = admin.services().await?;
        let names = summaries
            .iter()
            .map(|s| ServiceName::new(&s.name))
            .collect::<Result<Vec<_>>>()?;
        let names: Vec<&ServiceName> = names.iter().collect();
        let charts = admin.minutes(&names, MINUTES).await?;
        let services = summaries
            .into_iter()
            .zip(charts)
            .map(|(summary, minutes)| (summary, minutes.iter().map(Minute::of).collect()))
            .collect();
        Ok(Overview { services })
    }
}

/// `GET /`.
pub(crate) async fn show(State(dash): State<Shared>, base: Base) -> Result<Markup, Failure> {
    let overview = dash
        .overview
        .get("", || Overview::read(&dash.admin))
        .await?;
    let frame = dash.frame(&base, "Services");
    Ok(page(
        &frame,
        html! {
            h1 { "Services" }
            @if overview.services.is_empty() {
                p.muted { "No service on this Redis yet: a service appears once a producer or consumer of it ran." }
            }
            @for (s, minutes) in &overview.services {
                section.service data-service=(s.name) {
                    h2 {
                        a href=(base.service(&s.name, "")) { (s.name) }
                        @if s.paused { " " span.badge.warn { "paused" } }
                    }
                    div.cards {
                        div.card { div.n { (s.instances) } div.l { "instances" } }
                        div.card { div.n { (s.backlog) } div.l { "backlog" } }
                        div.card { div.n { (s.delayed) } div.l { "delayed" } }
                        div.card {
                            div class=(if s.dead > 0 { "n bad" } else { "n" }) {
                                a href=(base.service(&s.name, "dead")) { (s.dead) }
                            }
                            div.l { "dead letters" }
                        }
                    }
                    (chart(&s.name, minutes))
                }
            }
        },
    ))
}
