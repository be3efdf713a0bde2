//! The Postgres outbox, the inbox and the `ledger` example against a real
//! PostgreSQL and Redis (feature `postgres`).

// The harness crate, named `support` in every module of this binary.
extern crate peerq_test_support as support;

mod inbox;
mod ledger;
mod outbox;
