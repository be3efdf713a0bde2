//! The process's stop signal, SIGTERM or ctrl-c: what `run()` of the
//! consumer and of the outbox relay wait for before a graceful stop.

use std::future::Future;
use std::pin::Pin;

/// Resolves on SIGTERM or ctrl-c. The handlers are installed when this is
/// called, not when the future is first polled: a consumer polls it only
/// between its start's attempts and once started, and a SIGTERM that came
/// during its first attempt (connecting, recording its settings, creating
/// its groups) took the default action and killed the process instead of
/// stopping it. Called within a Tokio runtime.
pub(crate) fn signal() -> Pin<Box<dyn Future<Output = ()> + Send>> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) {
            (Ok(mut term), Ok(mut interrupt)) => Box::pin(async move {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = interrupt.recv() => {}
                }
            }),
            _ => Box::pin(async {
                let _ = tokio::signal::ctrl_c().await;
            }),
        }
    }
    #[cfg(not(unix))]
    {
        Box::pin(async {
            let _ = tokio::signal::ctrl_c().await;
        })
    }
}
