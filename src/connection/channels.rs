//! One pub/sub connection shared by every `wait` of an [`Admin`]
//! (docs/design.md §14): a channel is subscribed when a wait first needs
//! it and stays subscribed (a service has at most one per partition), so a
//! caller waiting on a thousand tasks holds one connection, not a thousand.
//! Each message goes to the waits of its channel; after a broken
//! connection (made again with backoff, every channel subscribed again) or
//! a wait that fell behind, a wait is told [`Event::Again`] and reads its
//! task once more.
//!
//! [`Admin`]: crate::admin::Admin

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use deadpool_redis::redis::{PushInfo, PushKind, Value};
use tokio::sync::{broadcast, mpsc};
use tokio_util::task::AbortOnDropHandle;
use tracing::{Instrument, warn};

use super::subscriber::{Event, Held, Source, connect_many};
use crate::error::{Error, Result};
use crate::retry::Pauses;

/// Messages kept per channel for a wait that has not read them yet.
const BACKLOG: usize = 1024;

/// The shared connection, made on first use.
#[derive(Default)]
pub(crate) struct Channels {
    source: Option<Source>,
    live: tokio::sync::Mutex<Option<Live>>,
}

impl std::fmt::Debug for Channels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Channels").finish_non_exhaustive()
    }
}

/// The connection and what reads its messages.
struct Live {
    /// Every subscribed channel's listeners.
    listeners: Arc<Mutex<HashMap<String, broadcast::Sender<Event>>>>,
    /// Channels to subscribe on the connection, with who waits for it.
    subscribe: mpsc::UnboundedSender<(String, tokio::sync::oneshot::Sender<Result<()>>)>,
    _task: AbortOnDropHandle<()>,
}

impl Channels {
    /// For the Redis at `source` (`None`: a pool given by the caller,
    /// which cannot subscribe).
    pub(crate) fn new(source: Option<Source>) -> Self {
        Channels {
            source,
            live: tokio::sync::Mutex::default(),
        }
    }

    /// Listens on `channel`; returns once Redis confirmed the subscription
    /// (at once if it is subscribed already), so a read made after this
    /// cannot miss a message published after it.
    pub(crate) async fn listen(&self, channel: &str) -> Result<broadcast::Receiver<Event>> {
        let mut live = self.live.lock().await;
        if live.is_none() {
            *live = Some(self.start()?);
        }
        let live = live.as_ref().expect("started");
        // Listening before the subscription is confirmed, so that the
        // first message after it is not missed.
        let receiver = {
            let mut listeners = live.listeners.lock().expect("not poisoned");
            if let Some(sender) = listeners.get(channel) {
                return Ok(sender.subscribe());
            }
            let (sender, receiver) = broadcast::channel(BACKLOG);
            listeners.insert(channel.to_owned(), sender);
            receiver
        };
        let (done, confirmed) = tokio::sync::oneshot::channel();
        let gone = || Error::Runtime("the pub/sub connection's task ended".into());
        let subscribed = match live.subscribe.send((channel.to_owned(), done)) {
            Ok(()) => confirmed.await.unwrap_or_else(|_| Err(gone())),
            Err(_) => Err(gone()),
        };
        if let Err(e) = subscribed {
            // Not subscribed: the next wait on it tries again.
            live.listeners.lock().expect("not poisoned").remove(channel);
            return Err(e);
        }
        Ok(receiver)
    }

    /// Starts the task that holds the connection: it subscribes what
    /// `listen` asks, hands each message to its channel's listeners, and
    /// connects and subscribes again after a broken connection.
    fn start(&self) -> Result<Live> {
        let Some(source) = self.source.clone() else {
            return Err(super::subscriber::no_pubsub());
        };
        let listeners: Arc<Mutex<HashMap<String, broadcast::Sender<Event>>>> = Arc::default();
        let (subscribe, mut asked) =
            mpsc::unbounded_channel::<(String, tokio::sync::oneshot::Sender<Result<()>>)>();
        let heard = listeners.clone();
        let task = async move {
            let (pushes, mut incoming) = mpsc::unbounded_channel::<PushInfo>();
            let mut held: Option<Held> = None;
            let mut pauses = Pauses::new(Duration::from_millis(100), Duration::from_secs(5));
            loop {
                if held.is_none() {
                    let channels: Vec<String> = heard
                        .lock()
                        .expect("not poisoned")
                        .keys()
                        .cloned()
                        .collect();
                    match connect_many(&source, &channels, pushes.clone()).await {
                        Ok(conn) => {
                            held = Some(conn);
                            pauses.reset();
                            tell_all(&heard, Event::Again);
                        }
                        Err(e) => {
                            warn!(cause = %e, "cannot subscribe to the tasks' channels; retrying");
                            tokio::time::sleep(pauses.take()).await;
                            continue;
                        }
                    }
                }
                tokio::select! {
                    asked = asked.recv() => {
                        let Some((channel, done)) = asked else { return };
                        let conn = held.as_mut().expect("connected");
                        let _ = done.send(conn.subscribe(&channel).await);
                    }
                    push = incoming.recv() => {
                        let Some(push) = push else { return };
                        match push.kind {
                            PushKind::Message | PushKind::SMessage => {
                                let mut data = push.data.into_iter();
                                if let (Some(Value::BulkString(channel)), Some(Value::BulkString(payload))) =
                                    (data.next(), data.next())
                                {
                                    let channel = String::from_utf8_lossy(&channel).into_owned();
                                    if let Some(sender) = heard.lock().expect("not poisoned").get(&channel) {
                                        let _ = sender.send(Event::Message(payload));
                                    }
                                }
                            }
                            // A Cluster's client subscribes again by itself.
                            PushKind::SSubscribe if matches!(source, Source::Cluster(..)) => {
                                tell_all(&heard, Event::Again);
                            }
                            PushKind::Disconnection if matches!(source, Source::Node(..)) => {
                                held = None;
                            }
                            _ => {}
                        }
                    }
                }
            }
        };
        Ok(Live {
            listeners,
            subscribe,
            _task: AbortOnDropHandle::new(tokio::spawn(task.in_current_span())),
        })
    }
}

/// Tells every listener `event`.
fn tell_all(listeners: &Mutex<HashMap<String, broadcast::Sender<Event>>>, event: Event) {
    for sender in listeners.lock().expect("not poisoned").values() {
        let _ = sender.send(event.clone());
    }
}
