//! A service's layout (docs/design.md §21): which generation of partitions
//! is current, the one it replaces while a reshard runs, and from which
//! epoch the new one is live. Free of I/O: parsed from `{N}:layout`'s
//! fields as the round scripts return them, and asked which units an
//! epoch's assignment may own.

use std::collections::HashMap;
use std::sync::Arc;

use crate::partition::{index_of, partition_of, unit};

/// Where a reshard stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Phase {
    /// The previous generation's units are live and drain; producers
    /// already write the new one's.
    Draining,
    /// Every unit of the previous generation retired: the new generation
    /// is live from epoch `open_epoch` on (the old one before it).
    Open { open_epoch: u64 },
}

/// One generation: its number and its partition count per level.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Generation {
    pub(crate) number: u32,
    pub(crate) partitions: u32,
}

impl Generation {
    /// The unit a task of partition key `key` at level `rank` goes to
    /// (docs/design.md §17: `rank * P + fnv1a64(key) % P`).
    pub(crate) fn route(self, key: &[u8], rank: u32) -> u32 {
        unit(
            self.number,
            rank * self.partitions + partition_of(key, self.partitions),
        )
    }

    /// The level of unit `u` of this generation.
    pub(crate) fn rank_of(self, u: u32) -> u32 {
        index_of(u) / self.partitions
    }

    /// Its units, with `levels` priority levels (docs/design.md §17):
    /// level `r`'s partition `i` is unit `r * partitions + i`.
    pub(crate) fn units(self, levels: u32) -> impl Iterator<Item = u32> {
        (0..self.partitions * levels).map(move |i| unit(self.number, i))
    }
}

/// `{N}:layout` as one instance read it; a service without the key is
/// generation 0 with `{N}:meta`'s partitions, settled (no layout).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Layout {
    /// The generation producers write to.
    pub(crate) current: Generation,
    /// The generation being replaced, while it matters.
    pub(crate) from: Option<Generation>,
    pub(crate) phase: Phase,
    /// When the reshard started and opened (Redis time, ms).
    pub(crate) started_ms: Option<u64>,
    pub(crate) opened_ms: Option<u64>,
    /// Every generation before the current one, oldest first (`history`:
    /// `0:16,1:64`; a layout written before it was kept: `from` alone).
    /// Their partitions may still hold batch callbacks parked by a sealed
    /// home (docs/design.md §21).
    pub(crate) past: Vec<Generation>,
}

impl Layout {
    /// The layout `{N}:layout`'s fields describe; `Ok(None)` for no
    /// fields (the key is absent); an error names a field that does not
    /// read, or a layout that cannot be (a draining one with nothing to
    /// drain).
    pub(crate) fn from_fields(fields: &HashMap<String, String>) -> Result<Option<Layout>, String> {
        if fields.is_empty() {
            return Ok(None);
        }
        let number = |name: &str| -> Result<Option<u64>, String> {
            fields
                .get(name)
                .map(|v| {
                    v.parse::<u64>()
                        .map_err(|_| format!("`{name}` = {v:?} is not a number"))
                })
                .transpose()
        };
        let required = |name: &str| number(name)?.ok_or_else(|| format!("`{name}` is missing"));
        let generation = |n: u64, p: u64| -> Result<Generation, String> {
            Ok(Generation {
                number: u32::try_from(n)
                    .ok()
                    .filter(|&n| n < 1 << 16)
                    .ok_or_else(|| format!("generation {n} is out of range"))?,
                partitions: u32::try_from(p)
                    .ok()
                    .filter(|p| (1..=crate::partition::MAX_PARTITIONS).contains(p))
                    .ok_or_else(|| format!("{p} partitions is out of range"))?,
            })
        };
        let current = generation(required("generation")?, required("partitions")?)?;
        let from = match (number("from_generation")?, number("from_partitions")?) {
            (Some(g), Some(p)) => Some(generation(g, p)?),
            (None, None) => None,
            _ => return Err("`from_generation` and `from_partitions` come together".into()),
        };
        let phase = match fields.get("state").map(String::as_str) {
            Some("draining") => Phase::Draining,
            Some("open") => Phase::Open {
                open_epoch: required("open_epoch")?,
            },
            other => return Err(format!("`state` = {other:?} is neither draining nor open")),
        };
        if phase == Phase::Draining && from.is_none() {
            return Err("a draining layout names no generation it drains".into());
        }
        let past = match fields.get("history").filter(|h| !h.is_empty()) {
            Some(history) => history
                .split(',')
                .map(|one| {
                    let bad = || format!("`history` item {one:?} is not <generation>:<partitions>");
                    let (g, p) = one.split_once(':').ok_or_else(bad)?;
                    let (g, p) = (g.parse().map_err(|_| bad())?, p.parse().map_err(|_| bad())?);
                    generation(g, p)
                })
                .collect::<Result<Vec<_>, String>>()?,
            None => from.into_iter().collect(),
        };
        Ok(Some(Layout {
            current,
            from,
            phase,
            started_ms: number("started_ms")?,
            opened_ms: number("opened_ms")?,
            past,
        }))
    }

    /// The generation whose units are live in epoch `epoch`: the previous
    /// one while draining and before the open epoch, the current one from
    /// then on. Every instance assigned in `epoch` computes the same: the
    /// open epoch is written two rounds ahead (docs/design.md §21).
    pub(crate) fn live(&self, epoch: u64) -> Generation {
        match (self.phase, self.from) {
            (Phase::Draining, Some(from)) => from,
            (Phase::Open { open_epoch }, Some(from)) if epoch < open_epoch => from,
            _ => self.current,
        }
    }

    /// The first epoch in which generation `number` is live, when it
    /// followed another: no instance owned its units before, so they are
    /// acquired at once, without a mark or a deadline.
    pub(crate) fn first_epoch(&self, number: u32) -> Option<u64> {
        match self.phase {
            Phase::Open { open_epoch } if self.from.is_some() && number == self.current.number => {
                Some(open_epoch)
            }
            _ => None,
        }
    }
}

/// The units of `layout` (none: generation 0 of `first` partitions) to
/// look at: the previous generation's while it matters, then the current
/// one's, every level's, ascending.
pub(crate) fn units_of(layout: Option<&Layout>, first: u32, levels: u32) -> Arc<[u32]> {
    let Some(layout) = layout else {
        return Generation {
            number: 0,
            partitions: first,
        }
        .units(levels)
        .collect();
    };
    let mut units: Vec<u32> = layout.from.iter().flat_map(|g| g.units(levels)).collect();
    units.extend(layout.current.units(levels));
    units.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn draining() -> Layout {
        Layout::from_fields(&fields(&[
            ("generation", "1"),
            ("partitions", "64"),
            ("from_generation", "0"),
            ("from_partitions", "16"),
            ("state", "draining"),
            ("started_ms", "5"),
        ]))
        .unwrap()
        .unwrap()
    }

    #[test]
    fn the_history_lists_every_generation_before() {
        assert_eq!(
            draining().past,
            vec![Generation {
                number: 0,
                partitions: 16
            }]
        );
        let mut f = fields(&[
            ("generation", "2"),
            ("partitions", "8"),
            ("from_generation", "1"),
            ("from_partitions", "64"),
            ("state", "draining"),
            ("history", "0:16,1:64"),
        ]);
        let l = Layout::from_fields(&f).unwrap().unwrap();
        assert_eq!(
            l.past.iter().map(|g| g.partitions).collect::<Vec<_>>(),
            [16, 64]
        );
        f.insert("history".into(), "0:16,1".into());
        assert!(Layout::from_fields(&f).unwrap_err().contains("history"));
    }

    #[test]
    fn no_key_is_no_layout() {
        assert_eq!(Layout::from_fields(&HashMap::new()), Ok(None));
    }

    #[test]
    fn while_draining_the_old_generation_is_live() {
        let l = draining();
        assert_eq!(l.live(1).partitions, 16);
        assert_eq!(l.live(u64::MAX).number, 0);
        assert_eq!(l.first_epoch(1), None);
    }

    #[test]
    fn once_open_the_new_generation_is_live_from_its_epoch() {
        let mut l = draining();
        l.phase = Phase::Open { open_epoch: 40 };
        assert_eq!(l.live(39).number, 0);
        assert_eq!(l.live(40).number, 1);
        assert_eq!(l.live(41).partitions, 64);
        assert_eq!(l.first_epoch(1), Some(40));
        assert_eq!(l.first_epoch(0), None);
    }

    #[test]
    fn units_carry_their_generation_and_levels() {
        let g = Generation {
            number: 2,
            partitions: 3,
        };
        let shown: Vec<String> = g
            .units(2)
            .map(|u| crate::partition::Shown(u).to_string())
            .collect();
        assert_eq!(shown, ["2.0", "2.1", "2.2", "2.3", "2.4", "2.5"]);
    }

    #[test]
    fn a_layout_that_does_not_read_is_refused_by_field() {
        let bad = [
            (vec![("partitions", "4"), ("state", "open")], "`generation`"),
            (
                vec![
                    ("generation", "1"),
                    ("partitions", "0"),
                    ("state", "draining"),
                ],
                "0 partitions",
            ),
            (
                vec![
                    ("generation", "1"),
                    ("partitions", "4"),
                    ("state", "draining"),
                ],
                "no generation it drains",
            ),
            (
                vec![("generation", "1"), ("partitions", "4"), ("state", "open")],
                "`open_epoch`",
            ),
            (
                vec![("generation", "x"), ("partitions", "4"), ("state", "open")],
                "not a number",
            ),
            (
                vec![
                    ("generation", "1"),
                    ("partitions", "4"),
                    ("state", "sealed"),
                ],
                "`state`",
            ),
        ];
        for (pairs, says) in bad {
            let err = Layout::from_fields(&fields(&pairs)).unwrap_err();
            assert!(err.contains(says), "{err} should say {says}");
        }
    }
}
