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
//! What a user navigates (public modules; the items most programs need are
//! also at the crate root: [`Consumer`], [`Producer`], [`Handler`],
//! [`TaskContext`], [`Options`], [`Error`], [`Backoff`], [`Periodic`],
//! [`Json`], [`Redis`], [`Tls`]):
//!
//! | module | owns |
//! |---|---|
//! | [`consumer`] | the builder (which erases the handler's types) and the running instance: the handover driver, leases, and per partition fetch → run → settle with fenced writes through one partition store (its own Layout table) |
//! | [`producer`] | enqueues typed tasks: one, a batch, with a key, a delay or an idempotency key |
//! | [`handler`] | the `Handler` trait, `TaskContext`, `HandlerError`, the tower adapter |
//! | [`dead_letters`] | lists (a page at a time, oldest or newest first, by reason), finds, replays and purges the dead letters across partitions |
//! | [`workflow`] | batches: member tasks and a callback enqueued once every member is final, counted through the fenced scripts that end them |
//! | [`admin`] | what the `peerq` CLI and the dashboard read and do: the services on a Redis, a service's status, its delayed tasks and periodic jobs, JSON enqueues, pause and resume; summaries only, never a scan of the streams |
//! | `dashboard` | feature `dashboard`: the web dashboard, to mount in an axum app or run with `peerq dashboard` |
//! | `postgres` | feature `postgres`: peerq's tables (`migrations/`), the transactional `Outbox` and its `Relay`, the `Inbox` (its own Layout table) |
//! | [`indexer`] | the peer indexer, also standalone: round schedule, rounds, its settings ([`Indexing`]) |
//! | [`assignment`] | `(index, replicas)`, the instance's [`assignment::Standing`], the assignors (modulo, rendezvous) and the partitions an assignment owns |
//! | [`ids`] | `MajorityIds`: unique, increasing IDs over a majority of independent Redis servers (invoice numbers), apart from the queues |
//! | [`metrics`] | metric names and descriptions |
//! | [`error`] | the crate's [`Error`] and [`Result`], at the bottom: it imports nothing of the crate |
//!
//! Inside (private; what they define that users need is re-exported at the
//! root):
//!
//! | module | owns |
//! |---|---|
//! | `config` | settings every part shares: the service name, the partition count, durations as operators write them ([`parse_duration`]) |
//! | `keys` | every Redis key name (`{N}:<round>`, `{N}:meta`, …), in one place |
//! | `meta` | service-wide settings recorded in `{N}:meta`, checked at start, and the `kind` of process a name belongs to |
//! | `task_id` | task ids ([`TaskId`]) |
//! | `entry` | the stream entry format and what makes an entry unrunnable |
//! | `headers` | a task's [`Headers`], and their fields in the entry (`h:<name>`) |
//! | `trace_context` | feature `otel`: the current span's W3C trace context into a task's headers, and a task's span joined to it (`TraceJoin`) |
//! | `codec` | payload encodings: [`Bincode`] (default) and [`Json`] |
//! | `partition` | which partition a key goes to ([`partition_of`]: FNV-1a 64 modulo `P`) |
//! | `clock` | the wall clock behind a trait ([`Clock`]), so tests can skew it |
//! | `instance` | the unique id of a running instance ([`InstanceId`]) |
//! | `retry` | the backoff between a failed task's attempts ([`Backoff`]), and the pauses of the internal retry loops |
//! | `periodic` | periodic jobs ([`Periodic`], interval or cron), triggered once per due time by a claim; their schedules in `{N}:periodic` |
//! | `priority` | priority levels ([`Priority`]): a service's partitions once per level, and which partition a task of a level goes to |
//! | `pause` | pausing a service: the `{N}:paused` key the consumers' gate reads ([`Pause`]) |
//! | `due` | the due index `{N}:due`: notices that a partition's delayed set got a task from someone other than its owner |
//! | `presence` | what an instance tells operators each round: its `{N}:members` record and per-minute counts |
//! | `connection` | where Redis is ([`Redis`], the one value every builder and entry point takes: a URL, a Cluster, a pool, TLS, replica waiting) and the connections each part keeps, out of the pool |
//! | `timing` | epoch arithmetic: where an epoch begins, and the handover rules' deadlines, drain ends and leases |
//! | `transition` | drain-then-switch: the per-partition state machine of docs/design.md §4, free of I/O |
//! | `shutdown` | the process's stop signal (SIGTERM, ctrl-c) that `run()` waits for |
//! | `logs` | the one stderr line of a consumer started without a tracing subscriber |
//! | `scripts/` | Lua scripts, one per atomic step |
//!
//! No two modules import each other, directly or through a loop, and none
//! imports through these re-exports: `scripts/import-cycles` checks both
//! in CI.
//!
//! The integration tests are one binary per area, `tests/<area>/main.rs`
//! (consumer, indexer, scenarios, operating, cluster, postgres, harness;
//! `tests/tracing.rs` alone, as it installs a global subscriber). Their
//! harness, and that of the unit tests of the scripts, is the unpublished
//! crate `peerq-test-support` in `tests/support`: private servers and ways
//! to break them, no peerq type.

// On docs.rs (`--cfg docsrs`, Cargo.toml's `package.metadata.docs.rs`),
// every item gated on a feature says which one it needs.
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod admin;
pub mod assignment;
mod backlog;
mod clock;
mod codec;
mod config;
mod connection;
pub mod consumer;
#[cfg(feature = "dashboard")]
pub mod dashboard;
pub mod dead_letters;
mod due;
mod entry;
pub mod error;
mod gate;
pub mod guide;
pub mod handler;
mod headers;
pub mod ids;
pub mod indexer;
mod instance;
mod keys;
mod lease;
pub mod limits;
mod logs;
mod marks;
mod membership;
mod meta;
pub mod metrics;
mod partition;
mod pause;
mod periodic;
#[cfg(feature = "postgres")]
pub mod postgres;
mod presence;
mod priority;
pub mod producer;
mod reshard;
mod retry;
mod shutdown;
pub mod singleton;
mod task_id;
mod timing;
#[cfg(feature = "otel")]
mod trace_context;
pub mod tracking;
mod transition;
pub mod workflow;

pub use assignment::{Assignment, Assignor};
pub use clock::{Clock, OffsetClock, SystemClock};
pub use codec::{Bincode, Codec, Json};
pub use config::parse_duration;
pub use connection::{Redis, Tls};
pub use consumer::Consumer;
pub use dead_letters::DeadLetters;
pub use error::{Error, Result};
pub use handler::{Handler, HandlerError, TaskContext};
pub use headers::Headers;
pub use indexer::Indexing;
pub use instance::InstanceId;
pub use membership::Membership;
#[cfg(feature = "etcd")]
pub use membership::{DEFAULT_ETCD_PREFIX, EtcdAuth};
pub use partition::{DEFAULT_PARTITIONS, MAX_PARTITIONS, partition_of};
pub use pause::Pause;
pub use periodic::{Missed, Periodic};
pub use priority::Priority;
pub use producer::{Options, Producer};
pub use retry::Backoff;
pub use task_id::TaskId;
#[cfg(feature = "otel")]
pub use trace_context::TraceJoin;

/// The README's Rust snippets, compiled as doc tests (those that need a
/// Redis are `no_run`). Only with the `http`, `dashboard`, `postgres` and
/// `otel` features, which some of them use: `scripts/test` (and CI) runs
/// `cargo test --all-features`.
#[cfg(all(
    doctest,
    feature = "http",
    feature = "dashboard",
    feature = "postgres",
    feature = "otel"
))]
#[doc = include_str!("../README.md")]
mod readme {}
