//! The per-minute charts of a service, drawn on the server as SVG: tasks
//! ok and failed in each minute of the last hour, and the backlog the
//! instances read in each minute, from `{N}:stats:<minute>` (docs/design.md
//! §7). No script, no library: polylines in a fixed view box that scales
//! with the page.

use std::fmt::Write;

use maud::{Markup, html};

/// The view box's size; the SVG scales to its container's width.
const WIDTH: f64 = 600.0;
const HEIGHT: f64 = 120.0;
/// Room above the peak, so its line is not cut.
const TOP: f64 = 4.0;

/// One minute's counts, oldest first in a series.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Minute {
    pub(crate) ok: u64,
    pub(crate) failed: u64,
    /// The backlog the instances recorded in that minute (`None`: none).
    pub(crate) backlog: Option<u64>,
}

impl Minute {
    /// The chart's part of a minute's counts.
    pub(crate) fn of(counts: &crate::admin::MinuteCounts) -> Minute {
        Minute {
            ok: counts.ok,
            failed: counts.failed,
            backlog: counts.backlog,
        }
    }
}

/// The chart of `minutes` (oldest first, one per minute, the last one the
/// current minute). `label` names it for screen readers.
pub(crate) fn chart(label: &str, minutes: &[Minute]) -> Markup {
    let peak = minutes
        .iter()
        .map(|m| m.ok.max(m.failed))
        .max()
        .unwrap_or(0)
        .max(1);
    let ok = polyline(minutes, peak, |m| m.ok);
    let failed = polyline(minutes, peak, |m| m.failed);
    let total_ok: u64 = minutes.iter().map(|m| m.ok).sum();
    let total_failed: u64 = minutes.iter().map(|m| m.failed).sum();
    let summary = format!(
        "{label}: {total_ok} ok and {total_failed} failed in the last {} minutes",
        minutes.len()
    );
    html! {
        svg.chart viewBox=(format!("0 0 {WIDTH} {HEIGHT}")) preserveAspectRatio="none"
            role="img" aria-label=(summary) {
            title { (summary) }
            line.axis x1="0" y1=(HEIGHT - 0.5) x2=(WIDTH) y2=(HEIGHT - 0.5) {}
            polyline.ok points=(ok) {}
            polyline.failed points=(failed) {}
        }
        // Below the chart, not in it: the view box stretches its text.
        div.legend {
            span.ok { (total_ok) " ok" } ", " span.bad { (total_failed) " failed" }
            " in the last " (minutes.len()) " minutes; the top line is " (peak) " per minute"
        }
    }
}

/// The chart of the backlog over `minutes`, on a scale of its own (tasks
/// waiting, not tasks a minute): a line through the minutes in which an
/// instance recorded it, none where none did (no instance ran).
pub(crate) fn backlog_chart(label: &str, minutes: &[Minute]) -> Markup {
    let recorded: Vec<u64> = minutes.iter().filter_map(|m| m.backlog).collect();
    let peak = recorded.iter().copied().max().unwrap_or(0).max(1);
    let line = polyline(minutes, peak, |m| m.backlog.unwrap_or(0));
    // Only the recorded minutes' points: a minute without a figure is
    // left out rather than drawn as an empty queue.
    let points: Vec<&str> = line
        .split(' ')
        .zip(minutes)
        .filter(|(_, m)| m.backlog.is_some())
        .map(|(p, _)| p)
        .collect();
    let now = minutes.iter().rev().find_map(|m| m.backlog);
    let summary = match now {
        Some(now) => format!(
            "{label}: backlog {now} now, at most {} in the last {} minutes",
            recorded.iter().max().unwrap_or(&0),
            minutes.len()
        ),
        None => format!(
            "{label}: no backlog recorded in the last {} minutes",
            minutes.len()
        ),
    };
    html! {
        svg.chart.backlog viewBox=(format!("0 0 {WIDTH} {HEIGHT}")) preserveAspectRatio="none"
            role="img" aria-label=(summary) {
            title { (summary) }
            line.axis x1="0" y1=(HEIGHT - 0.5) x2=(WIDTH) y2=(HEIGHT - 0.5) {}
            polyline.backlog points=(points.join(" ")) {}
        }
        div.legend { (summary) "; the top line is " (peak) " tasks" }
    }
}

/// The points of one series: x spread evenly, y scaled to `peak`.
fn polyline(minutes: &[Minute], peak: u64, value: fn(&Minute) -> u64) -> String {
    let step = if minutes.len() > 1 {
        WIDTH / (minutes.len() - 1) as f64
    } else {
        0.0
    };
    let mut points = String::new();
    for (i, m) in minutes.iter().enumerate() {
        let x = i as f64 * step;
        let y = HEIGHT - 1.0 - (value(m) as f64 / peak as f64) * (HEIGHT - 1.0 - TOP);
        let _ = write!(points, "{x:.1},{y:.1} ");
    }
    points.trim_end().to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Three minutes: none, then 10 ok and 5 failed with 40 waiting, then
    /// 5 ok with 20 waiting (the first minute recorded no backlog).
    fn three_minutes() -> [Minute; 3] {
        [
            Minute {
                ok: 0,
                failed: 0,
                backlog: None,
            },
            Minute {
                ok: 10,
                failed: 5,
                backlog: Some(40),
            },
            Minute {
                ok: 5,
                failed: 0,
                backlog: Some(20),
            },
        ]
    }

    #[test]
    fn the_peak_reaches_the_top_and_zero_the_axis() {
        let minutes = three_minutes();
        let ok = polyline(&minutes, 10, |m| m.ok);
        assert_eq!(ok, "0.0,119.0 300.0,4.0 600.0,61.5");
        let svg = chart("mail-sender", &minutes).into_string();
        assert!(
            svg.contains("15 ok and 5 failed in the last 3 minutes"),
            "{svg}"
        );
        assert!(svg.contains("the top line is 10 per minute"), "{svg}");
    }

    #[test]
    fn the_backlog_is_drawn_where_recorded_on_its_own_scale() {
        let minutes = three_minutes();
        let svg = backlog_chart("mail-sender", &minutes).into_string();
        assert!(svg.contains(r#"points="300.0,4.0 600.0,61.5""#), "{svg}");
        assert!(
            svg.contains("backlog 20 now, at most 40 in the last 3 minutes"),
            "{svg}"
        );
        let none = backlog_chart("idle", &[Minute::default(); 60]).into_string();
        assert!(
            none.contains("no backlog recorded in the last 60 minutes"),
            "{none}"
        );
    }

    #[test]
    fn an_idle_hour_draws_flat_lines() {
        let svg = chart("idle", &[Minute::default(); 60]).into_string();
        assert!(svg.contains("0 ok and 0 failed in the last 60 minutes"));
        assert!(svg.contains("the top line is 1 per minute"));
    }
}
