//! The Prometheus text format (version 0.0.4) of the exporter's six
//! gauges. The metric names are a contract: dashboards, alert rules and
//! autoscalers query them.
//!
//! Written by hand: six gauges need no client library, and
//! `metrics-exporter-prometheus` (the instances' exporter, which records
//! through the `metrics` facade) keeps every series it was ever given, so
//! a service removed from Redis would go on being reported with its last
//! figures; here a scrape shows what Redis holds now and nothing else.

use std::fmt::Write as _;

use super::ServiceGauges;

/// A gauge: its name, its help, and its figure of one service.
type Gauge = (&'static str, &'static str, fn(&ServiceGauges) -> f64);

/// The gauges, in the order they are written.
const GAUGES: [Gauge; 6] = [
    (
        "peerq_service_backlog_entries",
        "Tasks waiting to start: stream entries not yet delivered plus due delayed tasks and retries.",
        |g| g.backlog as f64,
    ),
    (
        "peerq_service_oldest_waiting_seconds",
        "Age of the oldest stream entry not yet delivered, by its id's time; 0 when none.",
        |g| g.oldest_waiting_ms as f64 / 1000.0,
    ),
    (
        "peerq_service_delayed_tasks",
        "Delayed tasks and retries waiting, due or not.",
        |g| g.delayed as f64,
    ),
    ("peerq_service_dead_letters", "Dead letters.", |g| {
        g.dead as f64
    }),
    (
        "peerq_service_instances",
        "Live instances (seen within three round intervals).",
        |g| g.instances as f64,
    ),
    (
        "peerq_service_paused",
        "1 while the service is paused.",
        |g| f64::from(u8::from(g.paused)),
    ),
];

/// `gauges` in the text format: each gauge's `HELP` and `TYPE`, then one
/// sample per service, labelled `service`.
pub(super) fn exposition(gauges: &[ServiceGauges]) -> String {
    let mut text = String::new();
    for (metric, help, figure) in GAUGES {
        // Writing to a String cannot fail.
        let _ = writeln!(text, "# HELP {metric} {help}");
        let _ = writeln!(text, "# TYPE {metric} gauge");
        for service in gauges {
            let name = label(&service.name);
            let _ = writeln!(text, "{metric}{{service=\"{name}\"}} {}", figure(service));
        }
    }
    text
}

/// `value` as a label value: `\`, `"` and line feeds escaped (a service
/// name may hold the first two).
fn label(value: &str) -> String {
    value
        .replace('\\', r"\\")
        .replace('"', "\\\"")
        .replace('\n', r"\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exposition_has_six_gauges_with_escaped_labels() {
        let gauges = [ServiceGauges {
            name: r#"a"b\c"#.to_owned(),
            backlog: 55,
            oldest_waiting_ms: 1_250,
            paused: true,
            ..ServiceGauges::default()
        }];
        let text = exposition(&gauges);
        assert!(text.contains("# TYPE peerq_service_backlog_entries gauge\n"));
        assert!(text.contains(r#"peerq_service_backlog_entries{service="a\"b\\c"} 55"#));
        assert!(text.contains(r#"peerq_service_oldest_waiting_seconds{service="a\"b\\c"} 1.25"#));
        assert!(text.contains(r#"peerq_service_paused{service="a\"b\\c"} 1"#));
        assert!(text.contains(r#"peerq_service_instances{service="a\"b\\c"} 0"#));
        assert_eq!(text.lines().filter(|l| l.starts_with("# TYPE")).count(), 6);
        assert_eq!(text.lines().filter(|l| !l.starts_with('#')).count(), 6);
    }
}
