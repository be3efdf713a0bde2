//! What [`MajorityIds`](super::MajorityIds) could not do, with the servers
//! that made it so and what to do about it.

use std::sync::Arc;
use std::time::Duration;

use super::votes::{ServerStatus, list};
use crate::error::{Error, Transient};

impl From<Error> for IdsError {
    fn from(e: Error) -> Self {
        IdsError::Setup(Arc::new(e))
    }
}

/// Why [`MajorityIds`](super::MajorityIds) gave no ID, refused to start, or
/// refused a repair. Every message names the servers involved (without
/// their passwords). `MajorityIds`'s methods return it rather than the
/// crate's `Error`: every way they fail is one of these.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum IdsError {
    /// [`build`](super::MajorityIdsBuilder::build) was given an invalid
    /// setting (named in the error), or a server refused this client (a
    /// wrong password, an ACL).
    #[error(transparent)]
    Setup(Arc<Error>),

    /// A server may lose writes it acknowledged, or its settings could not
    /// be read: its votes could not be trusted after a crash.
    #[error(
        "redis at {server} cannot be trusted to keep the IDs it acknowledges: {reason}; \
         MajorityIds needs `appendonly yes` and `appendfsync always` on every server \
         (or `allow_unsafe_durability()`, which gives up the guarantee across crashes)"
    )]
    Unsafe {
        /// The server's URL, without its password.
        server: String,
        /// What was found, or why it could not be checked.
        reason: String,
    },

    /// Every server answered and none holds the sequence.
    #[error(
        "sequence `{key}` does not exist on any of the {servers} servers: create it once \
         with `MajorityIds::init` (if it did exist, every server lost its data, and only \
         an init above the highest ID issued can start it again safely)"
    )]
    NotCreated {
        /// The Redis key of the sequence.
        key: String,
        /// How many servers answered.
        servers: usize,
    },

    /// [`init`](super::MajorityIds::init) found the sequence on a server
    /// already, or could not reach every server to make sure it is new.
    #[error(
        "cannot create sequence `{key}`: init needs every server reachable and none \
         holding it; {}", list(.servers)
    )]
    NotNew {
        /// The Redis key of the sequence.
        key: String,
        /// Every server's state.
        servers: Vec<ServerStatus>,
    },

    /// Fewer than a majority of the servers hold the sequence and could be
    /// reached, until the deadline.
    #[error(
        "no ID from `{key}` after {attempts} attempts in {elapsed:?}: {needed} of the \
         servers must hold it and answer; {}", list(.servers)
    )]
    NoMajority {
        /// The Redis key of the sequence.
        key: String,
        /// Votes needed: a majority of the servers.
        needed: usize,
        /// Every server's state at the last attempt.
        servers: Vec<ServerStatus>,
        /// Attempts made.
        attempts: u32,
        /// Time spent.
        elapsed: Duration,
    },

    /// Fewer than a majority hold the sequence even counting those that
    /// cannot be reached: a server that lost its data must be repaired
    /// first (or a refused one fixed). No ID is given meanwhile, never one
    /// from a sequence started again.
    #[error(
        "no ID from `{key}`: fewer than {needed} servers hold it even if every \
         unreachable one came back; repair the servers that lost it \
         (`MajorityIds::repair`) once a majority of holders is reachable; {}",
        list(.servers)
    )]
    NeedsRepair {
        /// The Redis key of the sequence.
        key: String,
        /// Votes needed: a majority of the servers.
        needed: usize,
        /// Every server's state.
        servers: Vec<ServerStatus>,
    },

    /// Every attempt reached a majority, but other callers' IDs won until
    /// the deadline.
    #[error(
        "no ID from `{key}` after {attempts} attempts in {elapsed:?}: other callers' IDs \
         won every attempt (too many concurrent callers for the timeout)"
    )]
    Contended {
        /// The Redis key of the sequence.
        key: String,
        /// Attempts made.
        attempts: u32,
        /// Time spent.
        elapsed: Duration,
    },

    /// [`repair`](super::MajorityIds::repair) cannot learn the sequence's
    /// value: fewer than a majority of the servers hold it and answer.
    #[error(
        "cannot repair `{key}`: {needed} servers that kept it must answer to learn its \
         value, and no server was changed. Bring back the servers that hold it; if a \
         majority lost its data for good, delete the key everywhere and `init` it above \
         the highest ID ever issued; {}", list(.servers)
    )]
    CannotRepair {
        /// The Redis key of the sequence.
        key: String,
        /// Holders needed: a majority of the servers.
        needed: usize,
        /// Every server's state.
        servers: Vec<ServerStatus>,
    },

    /// [`init`](super::MajorityIds::init) was asked to start at 0: IDs
    /// start at 1.
    #[error("invalid setting `init`: the first ID must be at least 1")]
    FirstIsZero,

    /// The sequence reached `u64::MAX`.
    #[error("sequence `{key}` has issued its last ID (u64::MAX)")]
    Exhausted {
        /// The Redis key of the sequence.
        key: String,
    },
}

impl Transient for IdsError {
    /// Whether another attempt may succeed: servers may come back, other
    /// callers may stop winning.
    fn is_transient(&self) -> bool {
        matches!(
            self,
            IdsError::NoMajority { .. } | IdsError::Contended { .. }
        )
    }
}

impl IdsError {
    /// The error with the attempts made so far, for the last one's error.
    pub(super) fn after(self, made: u32, spent: Duration) -> Self {
        match self {
            IdsError::NoMajority {
                key,
                needed,
                servers,
                ..
            } => IdsError::NoMajority {
                key,
                needed,
                servers,
                attempts: made,
                elapsed: spent,
            },
            IdsError::Contended { key, .. } => IdsError::Contended {
                key,
                attempts: made,
                elapsed: spent,
            },
            other => other,
        }
    }
}
