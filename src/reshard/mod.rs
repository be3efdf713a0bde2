//! Resharding a running service (docs/design.md §21): generations of
//! partitions, the layout that says which is live (free of I/O), and
//! which partitions the admin tools look at. The start of a reshard is the
//! admin API's (`src/admin/reshard.rs`).

mod layout;
mod read;

pub(crate) use layout::{Generation, Layout, Phase, units_of};
pub(crate) use read::{read_layout, read_units};
