//! # peerq
//!
//! A queue-consumer framework on Redis. A service such as `mail-sender` runs
//! as any number of identical instances; with no static configuration and no
//! central coordinator they find out how many of them there are and which one
//! each is, and split the service's partition streams between them by modulo.
//!
//! What is here so far:
//!
//! - the **peer indexer** ([`indexer`]): each instance learns its
//!   [`Assignment`] `(index, replicas)` once per interval from an atomic
//!   write to a per-interval Redis key, in the seed's `INCR` mode or the
//!   jitter-proof `Ranked` mode;
//! - the modulo filter ([`Assignment::owns`]): under `(index, replicas)` an
//!   instance owns the partitions `p` with `p % replicas == index - 1`.
//!
//! The design, its guarantees and its key layout are in the project's
//! `DESIGN.md`.
//!
//! ## Quick start: the peer indexer alone
//!
//! ```no_run
//! use std::time::Duration;
//! use peerq::indexer::{Indexer, Standing};
//!
//! # async fn demo() -> peerq::Result<()> {
//! let indexer = Indexer::builder()
//!     .name("mail-sender")
//!     .redis("redis://127.0.0.1/")
//!     .interval(Duration::from_secs(1))
//!     .build()?        // validates the settings
//!     .start()         // checks them against the service's, starts the rounds
//!     .await?;
//! let mut standing = indexer.standing();
//! while standing.changed().await.is_ok() {
//!     if let Standing::Assigned(a) = &*standing.borrow() {
//!         println!("instance {} of {} in epoch {}", a.index, a.replicas, a.epoch);
//!     }
//! }
//! # Ok(()) }
//! ```
//!
//! ## Layout
//!
//! | module | owns |
//! |---|---|
//! | [`config`] | validated settings: service name, interval, skew, lease margin, indexing mode |
//! | [`error`] | the crate's [`Error`] and [`Result`] |
//! | `keys` | every Redis key name (`{N}:<round>`, `{N}:meta`, …), in one place |
//! | `meta` | service-wide settings recorded in `{N}:meta`, checked at start |
//! | [`clock`] | the wall clock behind a trait, so tests can skew it |
//! | [`instance`] | the unique id of a running instance |
//! | [`indexer`] | the peer indexer: round schedule, rounds, the instance's standing |
//! | [`assignment`] | `(index, replicas)` and the partitions it owns |
//! | [`metrics`] | metric names and descriptions |
//! | `scripts/` | Lua scripts, one per atomic step |

pub mod assignment;
pub mod clock;
pub mod codec;
pub mod config;
mod connection;
pub mod consumer;
pub mod error;
pub mod handler;
pub mod indexer;
pub mod instance;
mod keys;
mod meta;
pub mod metrics;
pub mod partition;
pub mod producer;
pub mod task;

pub use assignment::Assignment;
pub use config::Indexing;
pub use consumer::Consumer;
pub use error::{Error, Result};
pub use handler::{Handler, HandlerError, TaskContext};
