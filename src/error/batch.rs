//! What a batch (docs/design.md §19) refuses: a call on a batch that does
//! not exist, is sealed, expired before it was sealed, or was cancelled;
//! the crate's
//! `Error` carries it.

/// Why a batch refused an add or a seal.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BatchRefused {
    /// No such batch: never opened, or done (or expired) and gone after
    /// its retention.
    #[error("batch {0} does not exist (never opened, or gone after its retention)")]
    Gone(String),
    /// The batch is sealed: its members are fixed.
    #[error("batch {0} is sealed: no member can be added")]
    Sealed(String),
    /// The batch was not sealed before its time (`expire_after`) ran out:
    /// it takes no member, and no callback comes.
    #[error("batch {0} expired before it was sealed: no member can be added, no callback comes")]
    Expired(String),
    /// A user cancelled the batch: it takes no member, and no callback
    /// comes.
    #[error("batch {0} was cancelled: no member can be added, no callback comes")]
    Cancelled(String),
}
