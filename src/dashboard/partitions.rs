//! A service's partitions at a glance: a heatmap of one small cell per
//! partition, coloured by its backlog, hatched when no live instance owns
//! it, its figures on hover (and as a screen reader's name of the link),
//! a click or a tab and Enter away from its waiting entries
//! (`super::waiting`); the largest backlogs named; and every partition's
//! figures as a table, collapsed. A card per partition, as before,
//! repeated its owner and token into a wall at P = 1,024; these cells fit
//! one screen there, and the whole page is some 310 KB (measured with
//! three instances, `tests/operating/dashboard/scale.rs`).

use maud::{Markup, html};

use super::layout::{Base, ago};
use crate::admin::{PartitionState, Status};
use crate::partition::{Shown, generation_of, index_of};
use crate::priority::Levels;

/// The backlog buckets' lower bounds, and their legend; a partition's
/// bucket is the last whose bound its backlog reaches. Powers of ten: a
/// backlog spans orders of magnitude, and an operator asks which order.
const BUCKETS: [(u64, &str); 6] = [
    (0, "empty"),
    (1, "1–9"),
    (10, "10–99"),
    (100, "100–999"),
    (1_000, "1,000–9,999"),
    (10_000, "10,000 and more"),
];

/// Up to this many partitions get large cells; more get small ones, so
/// that 1,024 fit a laptop's screen (77 to a row at 1,280 px).
const LARGE_UP_TO: usize = 128;

/// How many of the largest backlogs are named above the heatmap.
const LARGEST: usize = 5;

/// The bucket (an index into [`BUCKETS`]) of `backlog`.
fn bucket(backlog: u64) -> usize {
    BUCKETS
        .iter()
        .rposition(|(from, _)| backlog >= *from)
        .unwrap_or(0)
}

/// The "Partitions" section of `status`'s page: the legend, the largest
/// backlogs, a heatmap per generation shown (the one in use first, then
/// the one a reshard drains) and the table of them all.
pub(super) fn section(base: &Base, status: &Status) -> Markup {
    let view = View::of(status);
    let mut counts = [0usize; BUCKETS.len()];
    for p in &status.partitions {
        counts[bucket(p.backlog)] += 1;
    }
    let mut largest: Vec<&PartitionState> =
        status.partitions.iter().filter(|p| p.backlog > 0).collect();
    largest.sort_by_key(|p| std::cmp::Reverse(p.backlog));
    largest.truncate(LARGEST);
    let unowned = status.partitions.iter().filter(|p| !view.owned(p)).count();
    let size = if status.partitions.len() <= LARGE_UP_TO {
        "heat large"
    } else {
        "heat"
    };
    html! {
        h2 { "Partitions" }
        // Swatches and counts: how the backlog spreads, before any hover.
        div.legend id="heat-legend" {
            @for (i, (_, label)) in BUCKETS.iter().enumerate() {
                span.key { i class=(format!("b{i}")) {} (label) " (" (counts[i]) ")" }
            }
            span.key { i class="b0 u" {} "no live owner (" (unowned) ")" }
        }
        @if !largest.is_empty() {
            p id="largest" {
                "Largest backlogs: "
                @for (n, p) in largest.iter().enumerate() {
                    @if n > 0 { ", " }
                    a href=(view.waiting(base, p.partition)) { "partition " (Shown(p.partition)) }
                    " (" (p.backlog) ")"
                }
            }
        }
        @for (generation, caption) in view.groups() {
            @if view.generations.len() > 1 { h3 { (caption) } }
            div class=(size) id=[(generation == view.current).then_some("partitions")]
                data-generation=(generation) {
                @for p in status.partitions.iter().filter(|p| generation_of(p.partition) == generation) {
                    (view.cell(base, p))
                }
            }
        }
        details id="partition-table" {
            // No link per row: the cells are the links, in the same order,
            // and 1,024 more would cost 60 KB a refresh.
            summary { "Every partition as a table" }
            div.scroll {
                table.figures {
                    tr {
                        th { "partition" } th { "owner" } th { "token" } th { "backlog" }
                        th { "pending" } th { "oldest pending" } th { "delayed" } th { "dead" }
                    }
                    @for p in &status.partitions {
                        tr {
                            td { (Shown(p.partition)) }
                            td class=[(!view.owned(p)).then_some("bad")] { (p.owner.as_deref().unwrap_or("none")) }
                            td { (number(p.token)) }
                            td { (p.backlog) }
                            td { (p.pending) }
                            td { @if let Some(age) = p.oldest_pending_age_ms { (ago(age)) } @else { "–" } }
                            td { (p.delayed) }
                            td { (p.dead) }
                        }
                    }
                }
            }
        }
    }
}

/// What the cells of one page share.
struct View<'a> {
    status: &'a Status,
    /// The live instances' ids: a partition whose owner is not one of
    /// them is fetched by no one until its next owner acquires it.
    live: Vec<&'a str>,
    levels: Levels,
    /// The generation in use, and every generation shown, in use first.
    current: u32,
    generations: Vec<u32>,
}

impl<'a> View<'a> {
    fn of(status: &'a Status) -> View<'a> {
        let live = status
            .members
            .iter()
            .filter(|m| m.live)
            .map(|m| m.id.as_str())
            .collect();
        let current = status.layout.generation;
        let mut generations = vec![current];
        for p in &status.partitions {
            let g = generation_of(p.partition);
            if !generations.contains(&g) {
                generations.push(g);
            }
        }
        View {
            status,
            live,
            // A level list that does not read shows no level, not an error.
            levels: Levels::parse(status.settings.priorities.as_deref()).unwrap_or_default(),
            current,
            generations,
        }
    }

    /// The generations shown with their captions, the one in use first.
    fn groups(&self) -> Vec<(u32, String)> {
        self.generations
            .iter()
            .map(|&g| {
                let caption = if g == self.current {
                    format!("Generation {g}, in use")
                } else {
                    format!("Generation {g}, being replaced")
                };
                (g, caption)
            })
            .collect()
    }

    fn owned(&self, p: &PartitionState) -> bool {
        p.owner
            .as_deref()
            .is_some_and(|owner| self.live.contains(&owner))
    }

    /// The link to partition `unit`'s waiting entries.
    fn waiting(&self, base: &Base, unit: u32) -> String {
        base.service(
            &self.status.name,
            &format!("partitions/{}/waiting", Shown(unit)),
        )
    }

    /// The partitions per level of `unit`'s generation.
    fn per_level(&self, unit: u32) -> u32 {
        let layout = &self.status.layout;
        match layout.from_partitions {
            Some(from) if generation_of(unit) != layout.generation => from,
            _ => layout.partitions,
        }
    }

    /// One partition's cell: its colour, and its figures as the hover text
    /// (one per line: a tooltip shows line breaks). Every byte counts
    /// 1,024 times here: no attribute but these three.
    fn cell(&self, base: &Base, p: &PartitionState) -> Markup {
        let mut class = format!("b{}", bucket(p.backlog));
        if !self.owned(p) {
            class.push_str(" u");
        }
        let mut title = format!("partition {}", Shown(p.partition));
        if self.levels.any() {
            let level = self
                .levels
                .level_of(index_of(p.partition), self.per_level(p.partition));
            title.push_str(&format!(" ({level})"));
        }
        let owner = match &p.owner {
            Some(owner) if self.owned(p) => owner.clone(),
            Some(owner) => format!("{owner} (gone)"),
            None => "none".to_owned(),
        };
        title.push_str(&format!(
            "\nowner {owner}\ntoken {}\nbacklog {}\npending {}",
            number(p.token),
            p.backlog,
            p.pending
        ));
        if let Some(age) = p.oldest_pending_age_ms {
            title.push_str(&format!(" (oldest {})", ago(age)));
        }
        title.push_str(&format!("\ndelayed {}\ndead {}", p.delayed, p.dead));
        html! {
            a class=(class) href=(self.waiting(base, p.partition)) title=(title) {}
        }
    }
}

fn number(n: Option<u64>) -> String {
    n.map_or("–".to_owned(), |n| n.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admin::{Member, ServiceLayout};
    use crate::partition::unit;

    fn partition(unit: u32, owner: &str, backlog: u64) -> PartitionState {
        PartitionState {
            partition: unit,
            owner: Some(owner.to_owned()),
            token: Some(7),
            backlog,
            ..PartitionState::default()
        }
    }

    /// Service `svc` with `partitions`, and instance `web-1` alive.
    fn status(partitions: Vec<PartitionState>, layout: ServiceLayout) -> Status {
        Status {
            name: "svc".into(),
            redis: "redis://127.0.0.1/".into(),
            at_ms: 0,
            settings: Default::default(),
            paused: None,
            limits: Default::default(),
            layout,
            members: vec![Member {
                id: "web-1".into(),
                live: true,
                ..Member::default()
            }],
            partitions,
            singletons: Vec::new(),
            totals: Default::default(),
            rates: Default::default(),
            etcd: None,
        }
    }

    fn layout(generation: u32, partitions: u32, from: Option<u32>) -> ServiceLayout {
        ServiceLayout {
            generation,
            partitions,
            state: if from.is_some() {
                "draining"
            } else {
                "settled"
            }
            .into(),
            from_generation: from.map(|_| generation - 1),
            from_partitions: from,
            open_epoch: None,
            started_ms: None,
            opened_ms: None,
            replaced: None,
            sealed: None,
            retired: None,
        }
    }

    #[test]
    fn a_draining_reshard_shows_the_generation_in_use_first() {
        // 2 -> 4: the replaced units 0 and 1 come first in the status.
        let mut partitions = vec![partition(0, "web-1", 0), partition(1, "web-1", 12)];
        partitions.extend((0..4).map(|i| partition(unit(1, i), "web-1", 0)));
        let page = section(
            &Base(String::new()),
            &status(partitions, layout(1, 4, Some(2))),
        )
        .into_string();
        let in_use = page.find("Generation 1, in use").expect("its caption");
        let replaced = page
            .find("Generation 0, being replaced")
            .expect("its caption");
        assert!(in_use < replaced, "{page}");
        assert_eq!(page.matches(r#"id="partitions""#).count(), 1);
        assert!(
            page.contains(r#"id="partitions" data-generation="1""#),
            "{page}"
        );
        assert!(page.contains(r#"href="/services/svc/partitions/1.3/waiting""#));
        assert!(page.contains(r#"<a class="b2" href="/services/svc/partitions/1/waiting""#));
        assert!(page.contains("partition 1</a> (12)"), "the largest backlog");
    }

    #[test]
    fn a_cell_whose_owner_left_is_hatched_and_says_so() {
        let mut settled = status(
            vec![partition(0, "web-1", 0), partition(1, "web-2", 3)],
            layout(0, 2, None),
        );
        let page = section(&Base(String::new()), &settled).into_string();
        assert!(page.contains(r#"<a class="b1 u" "#), "{page}");
        assert!(
            page.contains("owner web-2 (gone)\ntoken 7\nbacklog 3\n"),
            "{page}"
        );
        assert!(page.contains("no live owner (1)"), "{page}");
        // With priority levels, a cell names its level (normal's
        // partitions come first).
        settled.settings.priorities = Some("high,normal".into());
        settled.partitions.push(partition(2, "web-1", 0));
        let page = section(&Base(String::new()), &settled).into_string();
        assert!(page.contains(r#"title="partition 0 (normal)"#), "{page}");
        assert!(page.contains(r#"title="partition 2 (high)"#), "{page}");
    }

    #[test]
    fn backlogs_fall_into_buckets_by_their_order_of_magnitude() {
        let buckets: Vec<usize> = [0, 1, 9, 10, 99, 100, 999, 1_000, 9_999, 10_000, u64::MAX]
            .into_iter()
            .map(bucket)
            .collect();
        assert_eq!(buckets, [0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5]);
    }
}
