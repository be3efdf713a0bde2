//! What operators use, against a real Redis: metrics, the HTTP endpoint,
//! the CLI, the dashboard (in Chromium), presence, TLS and a
//! least-privilege ACL user (features `cli` and `http`).

// The harness crate, named `support` in every module of this binary.
extern crate peerq_test_support as support;

mod acl;
mod cli;
mod dashboard;
mod http;
mod metrics;
mod presence;
mod tls;
