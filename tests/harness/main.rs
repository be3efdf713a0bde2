//! Self-tests of the test harness (`tests/support`): the Redis servers,
//! restarts, pauses and the proxy, TLS and ACL, Redis Cluster,
//! PostgreSQL and etcd behave as the other tests assume.

// The harness crate, named `support` in every module of this binary.
extern crate peerq_test_support as support;

mod cluster;
mod etcd;
mod postgres;
mod servers;
mod tls;
