//! Whether anyone sees peerq's logs.
//!
//! peerq logs through `tracing`, which drops every event while no
//! subscriber is installed: a consumer would then fail tasks, dead-letter
//! them and lose Redis without a word. So a consumer that starts with no
//! subscriber says so, once per process, on stderr. It does not install
//! one: which subscriber, format and filter is the application's choice.

use std::sync::Once;

/// What the hint says.
pub(crate) const HINT: &str = "peerq: no tracing subscriber is installed, so this consumer's \
    logs (failed tasks, dead letters, handovers, Redis errors) go nowhere; install one before \
    running it, e.g. `tracing_subscriber::fmt().init()` with the `tracing-subscriber` crate";

/// Prints [`HINT`] to stderr, once per process, if no tracing subscriber
/// is installed, neither globally nor for this thread.
pub(crate) fn hint_if_unseen() {
    static HINTED: Once = Once::new();
    if tracing::dispatcher::has_been_set() {
        return;
    }
    // A scoped subscriber (`tracing::subscriber::set_default`) counts too;
    // with none, the current dispatcher is the no-op one.
    let unseen = tracing::dispatcher::get_default(|d| d.is::<tracing::subscriber::NoSubscriber>());
    if unseen {
        HINTED.call_once(|| eprintln!("{HINT}"));
    }
}
