//! The cancels of tracked tasks heard on `{N}:cancels` (docs/design.md
//! §14): a pub/sub connection of its own while tracking is on, and, for
//! each message, the task it names, if it runs here ([`Running`]), whose
//! signals fire once its cancel request is read.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::broadcast;
use tokio::sync::broadcast::error::{RecvError, TryRecvError};
use tokio_util::task::AbortOnDropHandle;
use tracing::{Instrument, warn};

use super::running::{Running, RunningTask};
use crate::config::ServiceName;
use crate::connection::channels::Channels;
use crate::connection::subscriber::{Event, Source};
use crate::retry::Pauses;
use crate::tracking::watch::Watched;

/// Listens on service `name`'s `{N}:cancels` while tracking is on (a
/// pub/sub connection of its own then, `Channels`, which makes itself
/// again after a break; none while it is off), and fires the signals of
/// the cancelled tasks that run here.
pub(crate) fn listen(
    name: ServiceName,
    source: Option<Source>,
    mut tracking: Watched,
    running: Arc<Running>,
) -> AbortOnDropHandle<()> {
    let task = async move {
        let channel = crate::keys::cancels(&name);
        // The connection, and what it hears of the channel.
        let mut heard: Option<(Channels, broadcast::Receiver<Event>)> = None;
        let mut pauses = Pauses::new(Duration::from_millis(100), Duration::from_secs(5));
        loop {
            let on = tracking.on().is_some();
            if on && heard.is_none() {
                let channels = Channels::new(source.clone());
                let listened = tokio::select! {
                    listened = channels.listen(&channel) => listened,
                    _ = tracking.changed() => continue,
                };
                match listened {
                    Ok(receiver) => {
                        heard = Some((channels, receiver));
                        pauses.reset();
                    }
                    Err(e) => {
                        warn!(service = %name, cause = %e, "cannot listen for cancels; running tasks hear of a cancel only as they end");
                        tokio::select! {
                            _ = tokio::time::sleep(pauses.take()) => {}
                            _ = tracking.changed() => {}
                        }
                        continue;
                    }
                }
            } else if !on {
                heard = None;
            }
            tokio::select! {
                event = async { heard.as_mut().expect("checked").1.recv().await }, if heard.is_some() => {
                    match event {
                        Ok(Event::Message(handle)) => {
                            let mut found = Vec::new();
                            find(&running, &handle, &mut found);
                            // The messages already here with it (a batch's
                            // cancel publishes its tasks' at once): checked
                            // together and fired together, so that a task
                            // stopped first frees no permit for one whose
                            // cancel is still being read.
                            let receiver = &mut heard.as_mut().expect("checked").1;
                            loop {
                                match receiver.try_recv() {
                                    Ok(Event::Message(handle)) => find(&running, &handle, &mut found),
                                    Ok(Event::Again) | Err(TryRecvError::Lagged(_)) => {}
                                    Err(_) => break,
                                }
                            }
                            if !found.is_empty() {
                                // Checked apart, so that the next message
                                // is not held back by this one's read.
                                tokio::spawn(
                                    RunningTask::fire_all_if_requested(found).in_current_span(),
                                );
                            }
                        }
                        // Messages may have been missed: such a task ends
                        // `cancelled` all the same, as its end reads the
                        // request.
                        Ok(Event::Again) | Err(RecvError::Lagged(_)) => {}
                        Err(RecvError::Closed) => heard = None,
                    }
                }
                _ = tracking.changed() => {}
            }
        }
    };
    AbortOnDropHandle::new(tokio::spawn(task.in_current_span()))
}

/// Adds the task message `handle` (`<partition>/<task id>`) names to
/// `found`, if it runs here.
fn find(running: &Running, handle: &[u8], found: &mut Vec<RunningTask>) {
    let handle = String::from_utf8_lossy(handle);
    let id = handle.split_once('/').map_or(&*handle, |(_, id)| id);
    if let Some(task) = running.find(id) {
        found.push(task);
    }
}
