//! The delivery guarantees with consumers as separate processes, killed,
//! frozen and restarted for real, and the `mail_sender` example run as a
//! person would.

// The harness crate, named `support` in every module of this binary.
extern crate peerq_test_support as support;

mod batches;
mod delivery;
mod example;
mod examples_run;
mod singleton;
mod unique;
