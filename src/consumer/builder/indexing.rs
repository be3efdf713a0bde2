//! The settings the instances of a service share with their peer indexer:
//! the rounds' timing, the indexing, and who owns which partition.

use std::time::Duration;

use super::ConsumerBuilder;
use crate::assignment::Assignor;
use crate::codec::Codec;
use crate::indexer::Indexing;

impl<T, S, C: Codec> ConsumerBuilder<T, S, C> {
    /// The indexer's round interval `I` (default 1 s). Service-wide.
    pub fn interval(mut self, interval: Duration) -> Self {
        self.indexer.interval = interval;
        self
    }

    /// The tolerated clock skew `S` (default 50 ms). Service-wide.
    pub fn skew(mut self, skew: Duration) -> Self {
        self.indexer.skew = skew;
        self
    }

    /// The lease margin (default 20 ms). Service-wide.
    pub fn lease_margin(mut self, margin: Duration) -> Self {
        self.indexer.lease_margin = margin;
        self
    }

    /// The indexing mode (default [`Indexing::Ranked`]). Service-wide.
    pub fn indexing(mut self, indexing: Indexing) -> Self {
        self.indexer.indexing = indexing;
        self
    }

    /// Who owns which partition (default [`Assignor::Modulo`]). Service-wide:
    /// [`Assignor::Rendezvous`] moves about `P / N` partitions per join or
    /// leave instead of most of them, and needs [`Indexing::Ranked`].
    pub fn assignor(mut self, assignor: Assignor) -> Self {
        self.indexer.assignor = assignor;
        self
    }

    /// This instance's weight, 1 to 1000 (default 1): under
    /// [`Assignor::Rendezvous`] instances own partitions in proportion to
    /// their weights (give a machine with twice the cores weight 2). Each
    /// instance's own; the others read it from the round's member list.
    pub fn weight(mut self, weight: u32) -> Self {
        self.indexer.weight = weight;
        self
    }
}
