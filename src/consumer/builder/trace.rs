//! The builder's setting of trace context (feature `otel`, docs/design.md
//! §18).

use super::ConsumerBuilder;
use crate::codec::Codec;
use crate::trace_context::TraceJoin;

impl<T, S, C: Codec> ConsumerBuilder<T, S, C> {
    /// How a task's `task` span joins the trace its producer's span was in
    /// (default [`TraceJoin::Child`]): through the task's `traceparent`
    /// header, written by a producer built with the `otel` feature (or by
    /// any W3C trace context producer). It takes effect where a
    /// `tracing-opentelemetry` layer is installed.
    pub fn trace_join(mut self, how: TraceJoin) -> Self {
        self.settings.trace_join = how;
        self
    }
}
