//! # peerq
//!
//! A queue-consumer framework on Redis. A service such as `mail-sender` runs
//! as any number of identical instances; with no static configuration and no
//! central coordinator they find out how many of them there are and which one
//! each is, and split the service's partition streams between them by modulo.
//!
//! Users implement one trait, [`Handler`], run a [`Consumer`], and enqueue
//! with the bundled [`Producer`]. peerq logs through `tracing`: install a
//! subscriber (such as `tracing_subscriber::fmt().init()`) to see failed
//! tasks, handovers and Redis errors.
//!
//! ```no_run
//! use std::time::Duration;
//! use peerq::{Consumer, Handler, HandlerError, Options, Producer, TaskContext};
//! use serde::{Deserialize, Serialize};
//! use tower::timeout::TimeoutLayer;
//!
//! #[derive(Serialize, Deserialize)]
//! struct Mail { to: String, body: String }
//!
//! struct SendMail;
//! impl Handler for SendMail {
//!     type Task = Mail;
//!     async fn handle(&self, mail: Mail, cx: TaskContext) -> Result<(), HandlerError> {
//!         println!("{} (attempt {}) to {}", cx.task_id(), cx.attempt(), mail.to);
//!         Ok(())
//!     }
//! }
//!
//! # async fn demo(mails: Vec<Mail>) -> peerq::Result<()> {
//! // consumer side
//! Consumer::builder()
//!     .name("mail-sender")
//!     .redis("redis://127.0.0.1/")
//!     .handler(SendMail)                                 // or .service(any tower Service)
//!     .layer(TimeoutLayer::new(Duration::from_secs(10))) // any tower layer
//!     .run()                                             // until SIGTERM / ctrl-c
//!     .await?;
//!
//! // producer side
//! let producer = Producer::connect("redis://127.0.0.1/", "mail-sender").await?;
//! producer.enqueue(&Mail { to: "a@example.com".into(), body: "hi".into() }).await?;
//! producer.enqueue_batch(&mails).await?;                 // pipelined, in parts
//! let mail = Mail { to: "b@example.com".into(), body: "hi".into() };
//! producer.enqueue_with(mail, Options::new().key("user-42")).await?;
//! # Ok(()) }
//! ```
//!
//! How it works:
//!
//! - the **peer indexer** ([`indexer`]): each instance learns its
//!   [`Assignment`] `(index, replicas)` once per interval from an atomic
//!   write to a per-interval Redis key, in the seed's `INCR` mode or the
//!   jitter-proof `Ranked` mode;
//! - the **modulo filter** ([`Assignment::owns`]): the queue is `P` partition
//!   streams, and an instance reads only the partitions `p` with
//!   `p % replicas == index - 1`;
//! - the **consumer** ([`consumer`]): a worker per owned partition reads with
//!   `XREADGROUP`, runs the handler as a `tower::Service`, acks in batches,
//!   retries failures and moves what cannot run to the dead letters.
//!
//! The design, its guarantees and its key layout are in the repository's
//! `docs/design.md`.
//!
//! ## Layout
//!
//! | module | owns |
//! |---|---|
//! | [`config`] | validated settings of the service and its indexer: name, interval, skew, lease margin, indexing mode (the consumer's own: `consumer`'s `settings`) |
//! | [`error`] | the crate's [`Error`] and [`Result`] |
//! | `keys` | every Redis key name (`{N}:<round>`, `{N}:meta`, …), in one place |
//! | `meta` | service-wide settings recorded in `{N}:meta`, checked at start, and the `kind` of process a name belongs to |
//! | `logs` | the one stderr line of a consumer started without a tracing subscriber |
//! | [`clock`] | the wall clock behind a trait, so tests can skew it |
//! | [`instance`] | the unique id of a running instance |
//! | [`ids`] | `MajorityIds`: unique, increasing IDs over a majority of independent Redis servers (invoice numbers), apart from the queues |
//! | [`indexer`] | the peer indexer: round schedule, rounds, the instance's standing |
//! | [`assignment`] | `(index, replicas)`, the assignors (modulo, rendezvous) and the partitions an assignment owns |
//! | [`partition`] | which partition a key goes to (FNV-1a 64 modulo `P`) |
//! | [`task`] | task ids and the stream entry format |
//! | [`codec`] | payload encodings: bincode (default) and JSON |
//! | [`producer`] | enqueues typed tasks: one, a batch, with a key or an idempotency key |
//! | [`dead_letters`] | lists (a page at a time, oldest or newest first, by reason), finds, replays and purges the dead letters across partitions |
//! | [`admin`] | what the `peerq` CLI and the dashboard read and do: the services on a Redis, a service's status (members, partitions, rates), its delayed tasks and periodic jobs, JSON enqueues, pause and resume; summaries only, never a scan of the streams |
//! | `due` | the due index `{N}:due`: notices that a partition's delayed set got a task from someone other than its owner |
//! | [`pause`] | pausing a service: the `{N}:paused` key the consumers' gate reads |
//! | [`periodic`] | periodic jobs (interval or cron), triggered once per due time by a claim; their schedules in `{N}:periodic` |
//! | `postgres` | feature `postgres`: peerq's tables (`migrations/`, `migrate`), the transactional `Outbox` and its `Relay` (its own Layout table) |
//! | `presence` | what an instance tells operators each round: its `{N}:members` record and per-minute counts |
//! | [`retry`] | the backoff between a failed task's attempts, and the pauses of the internal retry loops |
//! | `shutdown` | the process's stop signal (SIGTERM, ctrl-c) that `run()` waits for |
//! | [`handler`] | the `Handler` trait, `TaskContext`, the tower adapter |
//! | [`consumer`] | the builder (which erases the handler's types) and the runtime: the handover driver, leases, and per partition fetch → run → settle with fenced writes through one partition store (its own Layout table) |
//! | `connection` | one multiplexed connection per part, kept out of the pool |
//! | `timing` | epoch arithmetic: where an epoch begins, and the handover rules' deadlines, drain ends and leases |
//! | `transition` | drain-then-switch: the per-partition state machine of docs/design.md §4, free of I/O |
//! | [`metrics`] | metric names and descriptions |
//! | `scripts/` | Lua scripts, one per atomic step |

pub mod admin;
pub mod assignment;
pub mod clock;
pub mod codec;
pub mod config;
mod connection;
pub mod consumer;
#[cfg(feature = "dashboard")]
pub mod dashboard;
pub mod dead_letters;
mod due;
pub mod error;
pub mod handler;
pub mod ids;
pub mod indexer;
pub mod instance;
mod keys;
mod logs;
mod meta;
pub mod metrics;
pub mod partition;
pub mod pause;
pub mod periodic;
#[cfg(feature = "postgres")]
pub mod postgres;
mod presence;
pub mod producer;
pub mod retry;
mod shutdown;
pub mod task;
mod timing;
mod transition;

/// The integration tests' harness (real redis-server processes), for unit
/// tests of the scripts.
#[cfg(test)]
#[path = "../tests/support/mod.rs"]
mod test_support;

pub use assignment::{Assignment, Assignor};
pub use config::Indexing;
pub use connection::Tls;
pub use consumer::Consumer;
pub use dead_letters::DeadLetters;
pub use error::{Error, Result};
pub use handler::{Handler, HandlerError, TaskContext};
pub use periodic::{Missed, Periodic};
pub use producer::{Options, Producer};
pub use retry::Backoff;

/// The README's Rust snippets, compiled as doc tests (those that need a
/// Redis are `no_run`). Only with the `http`, `dashboard` and `postgres`
/// features, which three of them use: `scripts/test` (and CI) runs
/// `cargo test --all-features`.
#[cfg(all(doctest, feature = "http", feature = "dashboard", feature = "postgres"))]
#[doc = include_str!("../README.md")]
mod readme {}
