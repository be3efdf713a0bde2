//! The peer indexer against real redis-servers: its rounds, the seed's
//! `Incr` indexing next to `Ranked`, the rounds on etcd, and `MajorityIds`
//! over three servers.

// The harness crate, named `support` in every module of this binary.
extern crate peerq_test_support as support;

#[cfg(feature = "etcd")]
mod etcd;
mod incr;
mod indexer;
mod majority_ids;
