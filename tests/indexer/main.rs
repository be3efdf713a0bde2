//! The peer indexer against real redis-servers: its rounds, the seed's
//! `Incr` indexing next to `Ranked`, and `MajorityIds` over three servers.

// The harness crate, named `support` in every module of this binary.
extern crate peerq_test_support as support;

mod incr;
mod indexer;
mod majority_ids;
