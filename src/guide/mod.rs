//! The guide: peerq from a first consumer to production, in chapters to
//! read in order.

// Each chapter is a markdown file in `docs/guide/`, included as the
// documentation of a module with no items, as clap's `_tutorial` is
// written, so every Rust snippet in it is a doc test of this crate.
//
// Links between chapters are reference links whose definitions each file
// carries for GitHub (`[13-guarantees.md]: 13-guarantees.md`). `links.md`
// defines the same labels as the chapter modules; it comes first in each
// module's documentation, and the first definition of a label wins, so
// rustdoc links the modules while GitHub links the files.
#![doc = ""]
#![doc = include_str!("links.md")]
#![doc = include_str!("../../docs/guide/README.md")]

pub mod ch01_getting_started {
    #![doc = include_str!("links.md")]
    #![doc = include_str!("../../docs/guide/01-getting-started.md")]
}

pub mod ch02_handlers_and_layers {
    #![doc = include_str!("links.md")]
    #![doc = include_str!("../../docs/guide/02-handlers-and-layers.md")]
}

pub mod ch03_producing {
    #![doc = include_str!("links.md")]
    #![doc = include_str!("../../docs/guide/03-producing.md")]
}

pub mod ch04_retries_and_dead_letters {
    #![doc = include_str!("links.md")]
    #![doc = include_str!("../../docs/guide/04-retries-and-dead-letters.md")]
}

pub mod ch05_scheduling {
    #![doc = include_str!("links.md")]
    #![doc = include_str!("../../docs/guide/05-scheduling.md")]
}

pub mod ch06_ordering_and_priorities {
    #![doc = include_str!("links.md")]
    #![doc = include_str!("../../docs/guide/06-ordering-and-priorities.md")]
}

pub mod ch07_task_handles {
    #![doc = include_str!("links.md")]
    #![doc = include_str!("../../docs/guide/07-task-handles.md")]
}

pub mod ch08_flow_control {
    #![doc = include_str!("links.md")]
    #![doc = include_str!("../../docs/guide/08-flow-control.md")]
}

pub mod ch09_workflows {
    #![doc = include_str!("links.md")]
    #![doc = include_str!("../../docs/guide/09-workflows.md")]
}

pub mod ch10_singletons {
    #![doc = include_str!("links.md")]
    #![doc = include_str!("../../docs/guide/10-singletons.md")]
}

// Its snippets need `etcd`: doc-tested only with it.
#[cfg(any(not(doctest), feature = "etcd"))]
pub mod ch11_indexer_and_assignors {
    #![doc = include_str!("links.md")]
    #![doc = include_str!("../../docs/guide/11-indexer-and-assignors.md")]
}

pub mod ch12_resharding {
    #![doc = include_str!("links.md")]
    #![doc = include_str!("../../docs/guide/12-resharding.md")]
}

pub mod ch13_guarantees {
    #![doc = include_str!("links.md")]
    #![doc = include_str!("../../docs/guide/13-guarantees.md")]
}

// Its snippets need `http`, `dashboard`, `otel`: doc-tested only with them.
#[cfg(any(
    not(doctest),
    all(feature = "http", feature = "dashboard", feature = "otel")
))]
pub mod ch14_operating {
    #![doc = include_str!("links.md")]
    #![doc = include_str!("../../docs/guide/14-operating.md")]
}

pub mod ch15_cluster_tls_acl {
    #![doc = include_str!("links.md")]
    #![doc = include_str!("../../docs/guide/15-cluster-tls-acl.md")]
}

// Its snippets need `postgres`: doc-tested only with it.
#[cfg(any(not(doctest), feature = "postgres"))]
pub mod ch16_postgres {
    #![doc = include_str!("links.md")]
    #![doc = include_str!("../../docs/guide/16-postgres.md")]
}

pub mod ch17_monotonic_ids {
    #![doc = include_str!("links.md")]
    #![doc = include_str!("../../docs/guide/17-monotonic-ids.md")]
}

pub mod ch18_deploying_and_scaling {
    #![doc = include_str!("links.md")]
    #![doc = include_str!("../../docs/guide/18-deploying-and-scaling.md")]
}

pub mod ch19_design {
    #![doc = include_str!("links.md")]
    #![doc = include_str!("../../docs/guide/19-design.md")]
}

pub mod ch20_development {
    #![doc = include_str!("links.md")]
    #![doc = include_str!("../../docs/guide/20-development.md")]
}
