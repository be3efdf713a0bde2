//! A trace through the queue (feature `otel`, docs/design.md §18): the
//! producer writes the current span's W3C trace context (`traceparent`,
//! `tracestate`) into the task's [`Headers`], and the consumer's `task`
//! span joins that trace, as a child of the producer's span or linked to
//! it ([`TraceJoin`]), through `tracing-opentelemetry`.
//!
//! Nothing here exports a span: the application installs its
//! `tracing-opentelemetry` layer and exporter as it would for any other
//! span. Without that layer (or outside any span) the current span has no
//! valid context, and nothing is written.

use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::TraceContextExt;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::headers::{Headers, MOST_HEADER_BYTES, MOST_HEADERS};

/// How a task's span joins the trace of the span that enqueued it.
///
/// ```no_run
/// # use peerq::{Consumer, Handler, HandlerError, TaskContext};
/// # struct Fanned;
/// # impl Handler for Fanned {
/// #     type Task = String;
/// #     async fn handle(&self, _: String, _: TaskContext) -> Result<(), HandlerError> { Ok(()) }
/// # }
/// # async fn demo() -> peerq::Result<()> {
/// use peerq::TraceJoin;
///
/// // One request enqueues thousands of tasks: each task its own trace,
/// // linked to the request's, rather than one trace of thousands of spans.
/// Consumer::builder()
///     .redis("redis://127.0.0.1/")
///     .name("thumbnails")
///     .trace_join(TraceJoin::Link)
///     .handler(Fanned)
///     .run()
///     .await
/// # }
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum TraceJoin {
    /// The task's span is a child of the producer's: one trace from the
    /// request to the handler (the default).
    #[default]
    Child,
    /// The task's span starts a trace of its own, with a link to the
    /// producer's span: for producers that fan out to many tasks.
    Link,
}

/// The trace context of the current span as headers, if it has one (an
/// OpenTelemetry layer is installed and the code runs in a span).
pub(crate) fn current() -> Option<Headers> {
    let cx = tracing::Span::current().context();
    if !cx.span().span_context().is_valid() {
        return None;
    }
    let mut headers = Headers::new();
    TraceContextPropagator::new().inject_context(&cx, &mut Carrier(&mut headers));
    Some(headers)
}

/// Adds `trace` (from [`current`]) to `headers`, unless they carry a trace
/// context of their own already (set by the user, or a task enqueued
/// again: its context is its first enqueue's).
pub(crate) fn add(headers: &mut Headers, trace: Option<&Headers>) {
    let Some(trace) = trace else {
        return;
    };
    // Kept within the bounds the enqueue checked: a trace that would not
    // fit beside the task's own headers is left out.
    let fits = headers.len() + trace.len() <= MOST_HEADERS
        && headers.bytes() + trace.bytes() <= MOST_HEADER_BYTES;
    if headers.get(TRACEPARENT).is_some() || !fits {
        return;
    }
    for (name, value) in trace {
        headers.insert(name, value);
    }
}

/// A task's `headers` (if it has options) with `trace` added: borrowed as
/// they are when there is no trace (the batch's fast path copies nothing).
pub(crate) fn with<'a>(
    headers: Option<&'a Headers>,
    trace: &Option<Headers>,
) -> Option<std::borrow::Cow<'a, Headers>> {
    match trace {
        None => headers.map(std::borrow::Cow::Borrowed),
        Some(_) => {
            let mut merged = headers.cloned().unwrap_or_default();
            add(&mut merged, trace.as_ref());
            Some(std::borrow::Cow::Owned(merged))
        }
    }
}

/// The name of the W3C header that carries the trace and parent span ids.
const TRACEPARENT: &str = "traceparent";

/// Joins `span` (a task's) to the trace in `headers`, as `how` says; a task
/// without a valid trace context is left as it is.
pub(crate) fn join(span: &tracing::Span, headers: &Headers, how: TraceJoin) {
    if headers.get(TRACEPARENT).is_none() {
        return;
    }
    let cx = TraceContextPropagator::new().extract(&Reader(headers));
    let parent = cx.span().span_context().clone();
    if !parent.is_valid() {
        return;
    }
    match how {
        TraceJoin::Child => {
            let _ = span.set_parent(cx);
        }
        TraceJoin::Link => span.add_link(parent),
    }
}

/// Headers as the propagator writes them.
struct Carrier<'a>(&'a mut Headers);

impl Injector for Carrier<'_> {
    fn set(&mut self, key: &str, value: String) {
        self.0.insert(key, value);
    }
}

/// Headers as the propagator reads them.
struct Reader<'a>(&'a Headers);

impl Extractor for Reader<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key)
    }

    fn keys(&self) -> Vec<&str> {
        self.0.iter().map(|(name, _)| name).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_task_with_its_own_trace_context_keeps_it() {
        let mut own = Headers::new();
        own.insert(TRACEPARENT, "00-aaaa-bbbb-01");
        let mut trace = Headers::new();
        trace.insert(TRACEPARENT, "00-cccc-dddd-01");
        trace.insert("tracestate", "x=1");
        add(&mut own, Some(&trace));
        assert_eq!(own.get(TRACEPARENT), Some("00-aaaa-bbbb-01"));
        assert_eq!(own.get("tracestate"), None);
        let mut none = Headers::new();
        add(&mut none, Some(&trace));
        assert_eq!(none, trace);
    }

    #[test]
    fn outside_any_span_there_is_no_trace_context() {
        assert!(current().is_none());
    }
}
