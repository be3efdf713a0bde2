//! A metrics recorder for tests and benchmarks that keeps every value
//! (metrics-util's atomic registry) and is read without resetting it, so
//! tests running side by side in one process each read their own series
//! by its labels.

use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};

use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};
use metrics_util::registry::{AtomicStorage, Registry};

/// The values recorded in this process.
pub struct Readings(Arc<Registry<Key, AtomicStorage>>);

impl std::fmt::Debug for Readings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Readings")
    }
}

struct Keeper(Arc<Registry<Key, AtomicStorage>>);

impl Recorder for Keeper {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        self.0
            .get_or_create_counter(key, |c| Counter::from_arc(c.clone()))
    }

    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        self.0
            .get_or_create_gauge(key, |g| Gauge::from_arc(g.clone()))
    }

    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        self.0
            .get_or_create_histogram(key, |h| Histogram::from_arc(h.clone()))
    }
}

/// Installs the recorder as the process's, once; its readings.
pub fn install() -> &'static Readings {
    static READINGS: OnceLock<Readings> = OnceLock::new();
    READINGS.get_or_init(|| {
        let registry = Arc::new(Registry::atomic());
        metrics::set_global_recorder(Keeper(registry.clone()))
            .expect("no other recorder in this process");
        Readings(registry)
    })
}

/// Whether `key` is `name` with every label of `labels`.
fn matches(key: &Key, name: &str, labels: &[(&str, &str)]) -> bool {
    key.name() == name
        && labels
            .iter()
            .all(|(k, v)| key.labels().any(|l| l.key() == *k && l.value() == *v))
}

impl Readings {
    /// The sum of the counters `name` with `labels`.
    pub fn counter(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        self.0
            .get_counter_handles()
            .into_iter()
            .filter(|(key, _)| matches(key, name, labels))
            .map(|(_, c)| c.load(Ordering::SeqCst))
            .sum()
    }

    /// The sum of the gauges `name` with `labels`.
    pub fn gauge(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.0
            .get_gauge_handles()
            .into_iter()
            .filter(|(key, _)| matches(key, name, labels))
            .map(|(_, g)| f64::from_bits(g.load(Ordering::SeqCst)))
            .sum()
    }

    /// How many gauges `name` with `labels` were registered (set at least
    /// once, to any value).
    pub fn gauges(&self, name: &str, labels: &[(&str, &str)]) -> usize {
        self.0
            .get_gauge_handles()
            .into_iter()
            .filter(|(key, _)| matches(key, name, labels))
            .count()
    }

    /// The values the histograms `name` with `labels` hold.
    pub fn values(&self, name: &str, labels: &[(&str, &str)]) -> Vec<f64> {
        self.0
            .get_histogram_handles()
            .into_iter()
            .filter(|(key, _)| matches(key, name, labels))
            .flat_map(|(_, h)| h.data())
            .collect()
    }

    /// How many values the histograms `name` with `labels` hold.
    pub fn samples(&self, name: &str, labels: &[(&str, &str)]) -> usize {
        self.0
            .get_histogram_handles()
            .into_iter()
            .filter(|(key, _)| matches(key, name, labels))
            .map(|(_, h)| h.data().len())
            .sum()
    }
}
