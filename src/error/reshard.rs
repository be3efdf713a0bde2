//! Why a reshard was refused (docs/design.md §21), by name.

use std::fmt;

/// A reshard that did not start, and why: each variant is a refusal the
/// design names (`running`, `partitions`, `member`, `idle`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReshardRefused {
    /// `running`: the reshard to `generation` has not settled (it drains,
    /// or its cut-over is under two rounds old).
    Running {
        /// The generation being moved to.
        generation: u32,
        /// `draining` or `opening`.
        state: String,
    },
    /// `partitions`: the count is out of range, or the one in use.
    Partitions {
        /// The count asked for.
        partitions: u32,
        /// What is wrong and what would work.
        message: String,
    },
    /// `member`: a running instance takes no part in a reshard (a consumer
    /// of a previous version); it would go on with the old partitions.
    Member {
        /// Its instance id.
        instance: String,
        /// The peerq version its record gives.
        version: String,
    },
    /// `idle`: no consumer of the service runs; the old partitions are
    /// sealed and drained by their owners, so a reshard needs them.
    Idle,
}

impl ReshardRefused {
    /// The refusal's name: `running`, `partitions`, `member` or `idle`.
    pub fn reason(&self) -> &'static str {
        match self {
            ReshardRefused::Running { .. } => "running",
            ReshardRefused::Partitions { .. } => "partitions",
            ReshardRefused::Member { .. } => "member",
            ReshardRefused::Idle => "idle",
        }
    }
}

impl fmt::Display for ReshardRefused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "reshard refused (`{}`): ", self.reason())?;
        match self {
            ReshardRefused::Running { generation, state } => write!(
                f,
                "the reshard to generation {generation} is still {state}; start another once \
                 `peerq status` shows it settled"
            ),
            ReshardRefused::Partitions { message, .. } => f.write_str(message),
            ReshardRefused::Member { instance, version } => write!(
                f,
                "instance {instance} (peerq {version}) takes no part in a reshard; upgrade or \
                 stop it first"
            ),
            ReshardRefused::Idle => f.write_str(
                "no consumer of the service runs; start its consumers first, which carry a \
                 reshard out",
            ),
        }
    }
}

impl std::error::Error for ReshardRefused {}
