//! What the dashboard read from Redis, kept for 2 s: however many browsers
//! watch a service (each page refreshes every few seconds), its state is
//! gathered at most once per 2 s. Concurrent requests for one key wait
//! for one read instead of each sending their own.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

/// How long a read stays fresh.
pub(crate) const FRESH: Duration = Duration::from_secs(2);

type Slot<V> = Arc<tokio::sync::Mutex<Option<(Instant, Arc<V>)>>>;

/// Values of one kind by key (a service's name, say).
pub(crate) struct Cache<V> {
    slots: Mutex<HashMap<String, Slot<V>>>,
    fresh: Duration,
}

impl<V> Cache<V> {
    /// An empty cache whose values stay fresh for `fresh`.
    pub(crate) fn new(fresh: Duration) -> Self {
        Cache {
            slots: Mutex::new(HashMap::new()),
            fresh,
        }
    }

    fn slot(&self, key: &str) -> Slot<V> {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        slots.entry(key.to_owned()).or_default().clone()
    }

    /// The value of `key`: the one read less than `fresh` ago, or a new one
    /// from `read`. A failed read is not kept: the next request tries again.
    pub(crate) async fn get<E, F, Fut>(&self, key: &str, read: F) -> Result<Arc<V>, E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<V, E>>,
    {
        let slot = self.slot(key);
        // Held across the read: whoever comes meanwhile waits for it.
        let mut kept = slot.lock().await;
        if let Some((at, value)) = &*kept
            && at.elapsed() < self.fresh
        {
            return Ok(value.clone());
        }
        let value = match read().await {
            Ok(value) => Arc::new(value),
            Err(e) => {
                // A key that never read well (a service that does not
                // exist, say) leaves nothing behind: requests for made-up
                // names must not grow the map.
                if kept.is_none() {
                    drop(kept);
                    self.forget(key);
                }
                return Err(e);
            }
        };
        *kept = Some((Instant::now(), value.clone()));
        Ok(value)
    }

    /// Forgets `key`'s value: after an action, the next page shows its
    /// effect.
    pub(crate) fn forget(&self, key: &str) {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        slots.remove(key);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn many_readers_at_once_cause_one_read_per_two_seconds() {
        let cache = Arc::new(Cache::<u32>::new(FRESH));
        let reads = Arc::new(AtomicU32::new(0));
        let read = |cache: Arc<Cache<u32>>, reads: Arc<AtomicU32>| async move {
            cache
                .get("svc", || async {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    Ok::<_, ()>(reads.fetch_add(1, Ordering::SeqCst) + 1)
                })
                .await
                .unwrap()
        };
        let browsers: Vec<_> = (0..20)
            .map(|_| tokio::spawn(read(cache.clone(), reads.clone())))
            .collect();
        for browser in browsers {
            assert_eq!(*browser.await.unwrap(), 1);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(*read(cache.clone(), reads.clone()).await, 1, "still fresh");
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(*read(cache.clone(), reads.clone()).await, 2, "read again");
        cache.forget("svc");
        assert_eq!(*read(cache.clone(), reads.clone()).await, 3, "forgotten");
        assert_eq!(reads.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn a_failed_read_is_not_kept() {
        let cache = Cache::<u32>::new(FRESH);
        let failed: Result<_, &str> = cache.get("svc", || async { Err("down") }).await;
        assert!(failed.is_err());
        assert!(
            cache.slots.lock().unwrap().is_empty(),
            "a failed read keeps no slot"
        );
        let value = cache.get("svc", || async { Ok::<_, &str>(7) }).await;
        assert_eq!(*value.unwrap(), 7);
    }
}
