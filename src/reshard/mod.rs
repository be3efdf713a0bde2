//! Resharding a running service (docs/design.md §21): generations of
//! partitions, and the layout that says which is live (free of I/O; the
//! start of a reshard is the admin API's, `src/admin/reshard.rs`).

mod layout;

pub(crate) use layout::{Generation, Layout, Phase};
