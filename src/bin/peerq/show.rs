//! The tables: how each answer reads for a person (`--json` prints the
//! answer's JSON instead).

use std::fmt::Write as _;

use peerq::admin::{Delayed, PeriodicJob, ServiceSummary, Status};
use peerq::dead_letters::{DeadLetter, Page};

use crate::table::Table;
use crate::{Acted, Paused, Resumed};

/// Longest text shown in a table cell (errors, payloads).
const CELL: usize = 60;

/// `peerq services`.
pub(crate) fn services(services: &[ServiceSummary], redis: &str) -> String {
    if services.is_empty() {
        return format!("no peerq services at {redis}\n");
    }
    let mut table = Table::new(&[
        "NAME",
        "INSTANCES>",
        "PARTITIONS>",
        "CODEC",
        "BACKLOG>",
        "DELAYED>",
        "DEAD>",
        "PAUSED",
    ]);
    for s in services {
        table.row(vec![
            s.name.clone(),
            s.instances.to_string(),
            opt(s.partitions),
            s.codec.clone().unwrap_or_else(|| "-".into()),
            s.backlog.to_string(),
            s.delayed.to_string(),
            s.dead.to_string(),
            yes_no(s.paused).into(),
        ]);
    }
    table.render()
}

/// `peerq status`'s lines on the etcd cluster of the rounds.
fn etcd_status(etcd: &peerq::admin::EtcdStatus, prefix: &str) -> String {
    let mut out = format!("etcd: {} (prefix {prefix})\n", etcd.endpoints.join(","));
    for m in &etcd.members {
        let leader = if m.leader { " leader" } else { "" };
        let _ = writeln!(
            out,
            "  etcd member {} {}{leader}",
            m.name,
            m.client_urls.join(",")
        );
    }
    if let Some(round) = &etcd.round {
        let _ = writeln!(
            out,
            "  etcd round {}: {} instances: {}",
            round.number,
            round.instances.len(),
            round.instances.join(" ")
        );
    }
    if let Some(error) = &etcd.error {
        let _ = writeln!(out, "  etcd not read: {error}");
    }
    out
}

/// `peerq status`.
pub(crate) fn status(status: &Status) -> String {
    let mut out = String::new();
    let s = &status.settings;
    let _ = writeln!(
        out,
        "{} at {}, {}",
        status.name,
        status.redis,
        when(status.at_ms)
    );
    let mut settings = vec![
        format!("kind {}", s.kind.as_deref().unwrap_or("-")),
        format!("partitions {}", opt(s.partitions)),
        format!("codec {}", s.codec.as_deref().unwrap_or("-")),
    ];
    for (name, value) in [
        ("interval", &s.interval),
        ("skew", &s.skew),
        ("lease_margin", &s.lease_margin),
        ("indexing", &s.indexing),
        ("assignor", &s.assignor),
        ("drain_timeout", &s.drain_timeout),
        ("priorities", &s.priorities),
        ("limit_key", &s.limit_key),
    ] {
        settings.push(format!("{name} {}", value.as_deref().unwrap_or("-")));
    }
    settings.push(format!("ordered {}", opt(s.ordered)));
    settings.push(format!(
        "membership {}",
        s.membership.as_deref().unwrap_or("redis")
    ));
    let _ = writeln!(out, "settings: {}", settings.join(", "));
    if let Some(etcd) = &status.etcd {
        out.push_str(&etcd_status(etcd, s.etcd_prefix.as_deref().unwrap_or("-")));
    }
    let l = &status.layout;
    if l.state != "settled" || l.generation > 0 {
        let from = match (l.from_generation, l.from_partitions) {
            (Some(g), Some(p)) => format!(" from generation {g} ({p} partitions)"),
            _ => String::new(),
        };
        let progress = match (l.replaced, l.sealed, l.retired) {
            (Some(of), Some(sealed), Some(retired)) => {
                format!(": {sealed} sealed, {retired} retired of {of}")
            }
            _ => String::new(),
        };
        let _ = writeln!(
            out,
            "layout: generation {} ({} partitions), {}{from}{progress}",
            l.generation, l.partitions, l.state
        );
    }
    match &status.paused {
        Some(p) => {
            let _ = writeln!(
                out,
                "PAUSED by {} since {} ({} ago): no handler starts until `peerq resume --name {}`",
                p.by,
                when(p.at_ms),
                age(status.at_ms.saturating_sub(p.at_ms)),
                status.name
            );
        }
        None => out.push_str("paused: no\n"),
    }
    let mut limits = Vec::new();
    if let Some(r) = &status.limits.rate {
        limits.push(format!(
            "rate {}/{}ms service-wide ({} waiting to start)",
            r.count, r.per_ms, r.waiting
        ));
    }
    if let Some(r) = &status.limits.rate_per_key {
        limits.push(format!("rate {}/{}ms per key", r.count, r.per_ms));
    }
    if let Some(n) = status.limits.concurrency_per_key {
        limits.push(format!("at most {n} tasks of one key at once"));
    }
    if status.limits.rate_per_key.is_some() || status.limits.concurrency_per_key.is_some() {
        limits.push(format!(
            "{} held aside for their key",
            status.limits.waiting_per_key
        ));
    }
    match limits.is_empty() {
        true => out.push_str("limits: none\n"),
        false => {
            let _ = writeln!(out, "limits: {}", limits.join("; "));
        }
    }

    let t = &status.totals;
    let _ = writeln!(
        out,
        "\nmembers: {} live of {}",
        t.live_members,
        status.members.len()
    );
    if !status.members.is_empty() {
        let mut table = Table::new(&[
            "ID",
            "STANDING",
            "INDEX>",
            "EPOCH>",
            "OWNED>",
            "IN FLIGHT>",
            "HANDLED>",
            "LAST SEEN",
        ]);
        for m in &status.members {
            let index = match (m.index, m.replicas) {
                (Some(i), Some(r)) => format!("{i}/{r}"),
                _ => "-".into(),
            };
            let seen = format!(
                "{} ago{}",
                age(m.seen_ago_ms),
                if m.live { "" } else { " (gone)" }
            );
            table.row(vec![
                m.id.clone(),
                m.standing.clone(),
                index,
                opt(m.epoch),
                m.owned.to_string(),
                m.in_flight.to_string(),
                m.handled.to_string(),
                seen,
            ]);
        }
        out.push_str(&table.render());
    }

    singletons(&mut out, status);

    let _ = writeln!(
        out,
        "\npartitions: {} of {} owned by a live member",
        t.owned_partitions,
        status.partitions.len()
    );
    let mut table = Table::new(&[
        "P>",
        "OWNER",
        "TOKEN>",
        "LENGTH>",
        "PENDING>",
        "BACKLOG>",
        "OLDEST PENDING>",
        "DELAYED>",
        "DEAD>",
    ]);
    for p in &status.partitions {
        let live = |id: &String| status.members.iter().any(|m| m.live && m.id == *id);
        let owner = match &p.owner {
            Some(id) if live(id) => id.clone(),
            Some(id) => format!("{id} (gone)"),
            None => "-".into(),
        };
        table.row(vec![
            p.partition.to_string(),
            owner,
            opt(p.token),
            p.length.to_string(),
            p.pending.to_string(),
            p.backlog.to_string(),
            p.oldest_pending_age_ms.map_or_else(|| "-".into(), age),
            p.delayed.to_string(),
            p.dead.to_string(),
        ]);
    }
    table.row(vec![
        String::new(),
        "total".into(),
        String::new(),
        t.length.to_string(),
        t.pending.to_string(),
        t.backlog.to_string(),
        String::new(),
        t.delayed.to_string(),
        t.dead.to_string(),
    ]);
    out.push_str(&table.render());

    let r = &status.rates;
    let _ = writeln!(
        out,
        "\nlast 5 minutes ({}): ok {} ({:.1}/s), failed {} ({:.1}/s), dead {}, retried {}; \
         in flight {}, handled {} since the members started",
        age((r.window_s * 1000.0) as u64),
        r.ok,
        r.ok_per_s,
        r.failed,
        r.failed_per_s,
        r.dead,
        r.retried,
        t.in_flight,
        t.handled
    );
    out
}

/// `peerq dead list`.
pub(crate) fn dead_page(page: &Page) -> String {
    if page.letters.is_empty() {
        return "no dead letters\n".into();
    }
    let mut table = Table::new(&["REF", "REASON", "ATTEMPTS>", "DEAD AT", "TASK", "ERROR"]);
    for l in &page.letters {
        table.row(vec![
            l.cursor().to_string(),
            l.reason.clone(),
            l.attempts.to_string(),
            when(millis(l.dead_at)),
            l.task_id
                .as_ref()
                .map_or_else(|| "-".into(), |t| t.to_string()),
            clip(&l.error),
        ]);
    }
    let mut out = table.render();
    if let Some(next) = &page.next {
        let _ = writeln!(out, "more: --after {next}");
    }
    out
}

/// `peerq dead show`.
pub(crate) fn dead_letter(l: &DeadLetter) -> String {
    let mut out = String::new();
    let task = l
        .task_id
        .as_ref()
        .map_or_else(|| "-".into(), |t| t.to_string());
    let fields = [
        ("ref", l.cursor().to_string()),
        ("task", task),
        ("reason", l.reason.clone()),
        ("error", l.error.clone()),
        ("attempts", l.attempts.to_string()),
        ("failures", l.failures.to_string()),
        ("dead at", when(millis(l.dead_at))),
        ("enqueued at", when(millis(l.enqueued_at))),
        ("key", l.key.clone().unwrap_or_else(|| "-".into())),
        ("codec", l.codec.clone()),
        ("payload", format!("{} bytes", l.payload.len())),
    ];
    for (name, value) in fields {
        let _ = writeln!(out, "{name:<12} {value}");
    }
    for (name, value) in &l.headers {
        let _ = writeln!(out, "{:<12} {value}", format!("h:{name}"));
    }
    let json = (l.codec == "json")
        .then(|| serde_json::from_slice::<serde_json::Value>(&l.payload).ok())
        .flatten();
    match json.and_then(|v| serde_json::to_string_pretty(&v).ok()) {
        Some(pretty) => out.push_str(&pretty),
        None => {
            for b in &l.payload {
                let _ = write!(out, "{b:02x}");
            }
        }
    }
    out.push('\n');
    out
}

/// `peerq delayed list`.
pub(crate) fn delayed(delayed: &Delayed) -> String {
    let mut out = format!("{} delayed tasks\n", delayed.total);
    if delayed.tasks.is_empty() {
        return out;
    }
    let mut table = Table::new(&["DUE IN>", "DUE AT", "P>", "TASK", "ATTEMPT>", "PAYLOAD"]);
    for t in &delayed.tasks {
        let payload = match (&t.payload, &t.payload_hex) {
            (Some(json), _) => json.to_string(),
            (None, Some(hex)) => hex.clone(),
            (None, None) => String::new(),
        };
        table.row(vec![
            age(t.due_in_ms),
            when(t.due_at_ms),
            t.partition.to_string(),
            t.task_id.clone().unwrap_or_else(|| "-".into()),
            opt(t.attempt),
            clip(&payload),
        ]);
    }
    out.push_str(&table.render());
    out
}

/// `peerq periodic list`.
pub(crate) fn periodic(jobs: &[PeriodicJob]) -> String {
    if jobs.is_empty() {
        return "no periodic jobs\n".into();
    }
    let mut table = Table::new(&["JOB", "SCHEDULE", "MISSED", "P>", "LAST DUE", "NEXT DUE"]);
    for j in jobs {
        let schedule = match (j.every_ms, &j.cron) {
            (Some(ms), _) => format!("every {}", age(ms)),
            (None, Some(cron)) => format!("cron {cron}"),
            (None, None) => "-".into(),
        };
        table.row(vec![
            j.name.clone(),
            schedule,
            j.missed.clone(),
            j.partition.to_string(),
            j.last_due_ms.map_or_else(|| "never".into(), when),
            j.next_due_ms.map_or_else(|| "-".into(), when),
        ]);
    }
    table.render()
}

/// `peerq pause`.
pub(crate) fn paused(p: &Paused<'_>) -> String {
    format!(
        "{} paused by {} since {}: no handler starts until `peerq resume --name {}`; \
         tasks wait in Redis\n",
        p.name,
        p.paused.by,
        when(p.paused.at_ms),
        p.name
    )
}

/// `peerq resume`.
pub(crate) fn resumed(r: &Resumed<'_>) -> String {
    match r.resumed {
        true => format!("{} resumed\n", r.name),
        false => format!("{} was not paused\n", r.name),
    }
}

/// `peerq dead replay` / `purge`.
pub(crate) fn acted(a: &Acted<'_>) -> String {
    match (a.replayed, a.purged) {
        (Some(n), _) => format!("{}: replayed {n} dead letters\n", a.name),
        (_, Some(n)) => format!("{}: purged {n} dead letters\n", a.name),
        _ => String::new(),
    }
}

fn opt<T: ToString>(value: Option<T>) -> String {
    value.map_or_else(|| "-".into(), |v| v.to_string())
}

fn yes_no(yes: bool) -> &'static str {
    if yes { "yes" } else { "no" }
}

/// Unix ms as a UTC time.
fn when(ms: u64) -> String {
    chrono::DateTime::from_timestamp_millis(ms as i64).map_or_else(
        || format!("{ms} ms"),
        |t| t.format("%Y-%m-%d %H:%M:%S UTC").to_string(),
    )
}

fn millis(t: std::time::SystemTime) -> u64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis() as u64
}

/// A span of ms, short: `850ms`, `12s`, `3m05s`, `2h10m`, `3d4h`.
fn age(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        _ if ms < 1000 => format!("{ms}ms"),
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        3600..86_400 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{}h", s / 86_400, s % 86_400 / 3600),
    }
}

/// `text` on one line, cut to [`CELL`] characters.
fn clip(text: &str) -> String {
    let line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    match line.char_indices().nth(CELL) {
        Some((cut, _)) => format!("{}…", &line[..cut]),
        None => line,
    }
}

/// The singletons' holders (docs/design.md §20), when the service has any.
fn singletons(out: &mut String, status: &Status) {
    if status.singletons.is_empty() {
        return;
    }
    let _ = writeln!(out, "\nsingletons: {}", status.singletons.len());
    let mut table = Table::new(&["NAME", "HOLDER", "TOKEN>", "SINCE"]);
    for s in &status.singletons {
        let live = status.members.iter().any(|m| m.live && m.id == s.instance);
        let holder = match (s.released, live) {
            (true, _) => format!("- (released by {})", s.instance),
            (false, true) => s.instance.clone(),
            (false, false) => format!("{} (gone)", s.instance),
        };
        let since = s.since_ms.map_or_else(
            || "-".into(),
            |at| {
                format!(
                    "{} ({} ago)",
                    when(at),
                    age(status.at_ms.saturating_sub(at))
                )
            },
        );
        table.row(vec![s.name.clone(), holder, s.token.to_string(), since]);
    }
    out.push_str(&table.render());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_read_short() {
        assert_eq!(age(850), "850ms");
        assert_eq!(age(12_400), "12s");
        assert_eq!(age(185_000), "3m05s");
        assert_eq!(age(7_800_000), "2h10m");
        assert_eq!(age(3 * 86_400_000 + 4 * 3_600_000), "3d4h");
    }

    #[test]
    fn long_cells_are_cut_to_one_line() {
        assert_eq!(clip("a\nb"), "a b");
        let long = "x".repeat(100);
        assert_eq!(clip(&long).chars().count(), CELL + 1);
    }
}
