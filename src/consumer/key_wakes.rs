//! Which batches hold entries aside for which key (docs/design.md §15,
//! limits per key): a key given a slot or tokens back wakes only the
//! batches that hold entries of it.
//!
//! Why not one channel every batch hears: with a thousand keys and every
//! partition's batches holding entries aside, each key told reached every
//! batch, which looked it up and mostly let it go; a leaser's reply for a
//! thousand keys woke sixty-four batches a thousand times each, and that
//! work (on the threads that also read the replies) is what let a rate per
//! key from the task fall behind its own tokens' validity in `cargo bench
//! --bench limits`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

/// One batch's keys told since it last looked.
#[derive(Default)]
pub(crate) struct Wake {
    told: Mutex<Vec<Arc<str>>>,
    notify: Notify,
}

impl Wake {
    /// Tells this batch about `key`.
    fn tell(&self, key: &Arc<str>) {
        self.told.lock().expect("not poisoned").push(key.clone());
        self.notify.notify_one();
    }

    /// Waits until a key is told, and takes every key told so far.
    pub(crate) async fn told(&self, into: &mut Vec<Arc<str>>) {
        loop {
            {
                let mut told = self.told.lock().expect("not poisoned");
                if !told.is_empty() {
                    into.append(&mut told);
                    return;
                }
            }
            self.notify.notified().await;
        }
    }

    /// Tells this batch about `key` itself (it may have room already).
    pub(crate) fn tell_self(&self, key: &str) {
        self.tell(&Arc::from(key));
    }
}

/// The batches waiting on each key, on one instance.
#[derive(Default)]
pub(crate) struct KeyWakes {
    waiting: Mutex<HashMap<Arc<str>, Vec<Arc<Wake>>>>,
}

impl KeyWakes {
    /// `wake` hears `key` from now on, until [`unwatch`](Self::unwatch).
    pub(crate) fn watch(&self, key: &str, wake: &Arc<Wake>) {
        let mut waiting = self.waiting.lock().expect("not poisoned");
        match waiting.get_mut(key) {
            Some(wakes) => wakes.push(wake.clone()),
            None => {
                waiting.insert(Arc::from(key), vec![wake.clone()]);
            }
        }
    }

    /// `wake` hears `key` no more.
    pub(crate) fn unwatch(&self, key: &str, wake: &Arc<Wake>) {
        let mut waiting = self.waiting.lock().expect("not poisoned");
        if let Some(wakes) = waiting.get_mut(key) {
            wakes.retain(|w| !Arc::ptr_eq(w, wake));
            if wakes.is_empty() {
                waiting.remove(key);
            }
        }
    }

    /// Tells `key` to the batches that wait on it (none is no error).
    pub(crate) fn tell(&self, key: &str) {
        let waiting = self.waiting.lock().expect("not poisoned");
        if let Some((key, wakes)) = waiting.get_key_value(key) {
            for wake in wakes {
                wake.tell(key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_key_wakes_only_the_batches_that_wait_on_it() {
        let wakes = KeyWakes::default();
        let (a, b) = (Arc::new(Wake::default()), Arc::new(Wake::default()));
        wakes.watch("k1", &a);
        wakes.watch("k2", &b);
        wakes.tell("k1");
        wakes.tell("k3");
        let mut told = Vec::new();
        a.told(&mut told).await;
        assert_eq!(told, vec![Arc::<str>::from("k1")]);
        assert!(b.told.lock().unwrap().is_empty(), "b waits on k2 only");
        wakes.unwatch("k2", &b);
        wakes.tell("k2");
        assert!(b.told.lock().unwrap().is_empty(), "unwatched");
        assert!(wakes.waiting.lock().unwrap().get("k2").is_none());
    }
}
