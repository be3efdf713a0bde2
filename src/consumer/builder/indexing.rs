//! The settings the instances of a service share with their peer indexer:
//! the rounds' timing, the indexing, and who owns which partition.

use super::ConsumerBuilder;
use crate::codec::Codec;
use crate::indexer::indexer_setters;

impl<T, S, C: Codec> ConsumerBuilder<T, S, C> {
    indexer_setters!();
}
