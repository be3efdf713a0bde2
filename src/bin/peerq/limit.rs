//! `peerq limit show|set|clear`: a service's flow limits on a running
//! service (every instance follows within a second).

use peerq::admin::Admin;
use peerq::limits::{Limits, RateLimit};
use serde::Serialize;

use crate::args::LimitCommand;
use crate::{failed, service};

/// `--rate`: `N/PERIOD` (`300/1s`, `5/250ms`, `1000/1m`), or `N` for a
/// second.
pub(crate) fn rate(text: &str) -> Result<RateLimit, String> {
    let (count, per) = text.split_once('/').unwrap_or((text, "1s"));
    let count: u32 = count
        .trim()
        .parse()
        .map_err(|_| format!("`{text}` is not a rate; use N/PERIOD, as 300/1s or 5/250ms"))?;
    let per = peerq::parse_duration(per.trim())
        .ok_or_else(|| format!("`{per}` is not a period; use 250ms, 1s, 1m or 1h"))?;
    Ok(RateLimit::new(count, per))
}

/// The limits as `show` prints them with `--json`.
#[derive(Serialize)]
struct LimitsView<'a> {
    name: &'a str,
    rate: Option<RateView>,
    rate_per_key: Option<RateView>,
    concurrency_per_key: Option<u32>,
}

#[derive(Serialize)]
struct RateView {
    count: u32,
    per_ms: u64,
    per_second: f64,
}

impl RateView {
    fn of(rate: RateLimit) -> Self {
        RateView {
            count: rate.count(),
            per_ms: rate.per().as_millis() as u64,
            per_second: rate.per_second(),
        }
    }
}

/// How `set` or `clear` changes the limits in force.
type Change = Box<dyn FnOnce(Limits) -> Limits>;

/// `peerq limit …`.
pub(crate) async fn limit(admin: &Admin, command: LimitCommand) -> Result<String, String> {
    let (named, change): (_, Option<Change>) = match command {
        LimitCommand::Show(named) => (named, None),
        LimitCommand::Set {
            named,
            rate,
            rate_per_key,
            concurrency_per_key,
        } => {
            let set = move |mut l: Limits| {
                if let Some(rate) = rate {
                    l = l.rate(rate);
                }
                if let Some(rate) = rate_per_key {
                    l = l.rate_per_key(rate);
                }
                if let Some(n) = concurrency_per_key {
                    l = l.concurrency_per_key(n);
                }
                l
            };
            (named, Some(Box::new(set)))
        }
        LimitCommand::Clear {
            named,
            rate,
            rate_per_key,
            concurrency_per_key,
        } => {
            // Nothing named clears them all.
            let all = !rate && !rate_per_key && !concurrency_per_key;
            let cleared = move |mut l: Limits| {
                if rate || all {
                    l = l.without_rate();
                }
                if rate_per_key || all {
                    l = l.without_rate_per_key();
                }
                if concurrency_per_key || all {
                    l = l.without_concurrency_per_key();
                }
                l
            };
            (named, Some(Box::new(cleared)))
        }
    };
    let service = service(admin, &named.name).await?;
    let mut limits = service.limits().await.map_err(failed)?;
    if let Some(change) = change {
        limits = change(limits);
        service.set_limits(limits).await.map_err(failed)?;
    }
    let shown = LimitsView {
        name: service.name(),
        rate: limits.rate_limit().map(RateView::of),
        rate_per_key: limits.rate_limit_per_key().map(RateView::of),
        concurrency_per_key: limits.per_key(),
    };
    named.output.show(&shown, || {
        let mut said = Vec::new();
        if let Some(rate) = limits.rate_limit() {
            said.push(format!(
                "rate limit {rate} ({} starts a second, service-wide)",
                per_second(rate)
            ));
        }
        if let Some(rate) = limits.rate_limit_per_key() {
            said.push(format!("rate limit {rate} per key"));
        }
        if let Some(n) = limits.per_key() {
            said.push(format!("at most {n} tasks of one key at once"));
        }
        match said.is_empty() {
            true => format!("service {}: no limits\n", shown.name),
            false => format!("service {}: {}\n", shown.name, said.join("; ")),
        }
    })
}

/// Starts a second, without a tail of zeros.
fn per_second(rate: RateLimit) -> String {
    let per = rate.per_second();
    if per.fract() == 0.0 {
        format!("{per:.0}")
    } else {
        format!("{per:.3}")
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_rate_reads_as_count_per_period_and_a_bare_count_is_per_second() {
        let s = Duration::from_secs;
        assert_eq!(rate("300/1s"), Ok(RateLimit::new(300, s(1))));
        assert_eq!(rate("300"), Ok(RateLimit::new(300, s(1))));
        assert_eq!(
            rate("5/250ms"),
            Ok(RateLimit::new(5, Duration::from_millis(250)))
        );
        assert_eq!(rate("1000 / 1m"), Ok(RateLimit::new(1000, s(60))));
        assert!(rate("fast").is_err());
        assert!(rate("300/soon").is_err());
    }
}
