//! What the servers said, and what it adds up to: the votes of one read or
//! one write of [`MajorityIds`](super::MajorityIds), counted as replies
//! come in, free of I/O.
//!
//! A decision is taken as soon as the replies so far settle it, so a
//! server that is slow or frozen never delays an ID the others can give.

use std::fmt;

/// One server as a read, a write or [`status`](super::MajorityIds::status)
/// found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerStatus {
    /// The server's URL, without its password.
    pub server: String,
    /// What it said.
    pub state: ServerState,
}

/// What one server said about a sequence.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ServerState {
    /// It holds the sequence, at this value (the highest ID it took).
    Holds(u64),
    /// Its key is missing while the sequence exists: it lost it (restarted
    /// empty, flushed). It does not vote until
    /// [`repair`](super::MajorityIds::repair) sets it.
    NeedsRepair,
    /// It could not be reached, or did not answer in time.
    Unreachable(String),
    /// It answered but cannot vote: it may lose what it acknowledges
    /// (AOF off, not `appendfsync always`), or its key holds something
    /// that is not an ID.
    Refused(String),
}

impl fmt::Display for ServerStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let server = &self.server;
        match &self.state {
            ServerState::Holds(value) => write!(f, "{server} holds {value}"),
            ServerState::NeedsRepair => write!(
                f,
                "{server} needs repair (its key is missing: it lost its data)"
            ),
            ServerState::Unreachable(why) => write!(f, "{server} unreachable ({why})"),
            ServerState::Refused(why) => write!(f, "{server} refused ({why})"),
        }
    }
}

/// `servers` as one line for an error message.
pub(super) fn list(servers: &[ServerStatus]) -> String {
    servers
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// The votes needed out of `n` servers: a majority, so that any two
/// majorities share a server.
pub(super) fn majority(n: usize) -> usize {
    n / 2 + 1
}

/// What a read of the current value from the servers settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ReadDecision {
    /// A majority holds the sequence; the highest value they hold.
    Majority(u64),
    /// Every server answered and none holds it: it was never created (or
    /// every server lost it, which no one can tell apart).
    NotCreated,
    /// Too few hold it, but enough are unreachable that it may work once
    /// they are back: worth another attempt.
    Unavailable,
    /// Too few hold it even if every unreachable server came back: a
    /// repair (or a refused server fixed) must come first.
    NeedsRepair,
}

/// The replies of one read or one write, by server index, as they come.
#[derive(Debug)]
pub(super) struct Tally<T> {
    replies: Vec<Option<T>>,
}

/// The replies of one read.
pub(super) type ReadTally = Tally<ServerState>;
/// The replies of one write.
pub(super) type WriteTally = Tally<Write>;

impl<T: Clone> Tally<T> {
    pub(super) fn new(n: usize) -> Self {
        Tally {
            replies: vec![None; n],
        }
    }
}

impl<T> Tally<T> {
    pub(super) fn add(&mut self, server: usize, reply: T) {
        self.replies[server] = Some(reply);
    }

    /// Servers yet to answer.
    fn pending(&self) -> usize {
        self.replies.iter().filter(|r| r.is_none()).count()
    }

    /// Fills in the servers yet to answer with `silent`: the deadline
    /// passed.
    fn close_with(&mut self, silent: impl Fn() -> T) {
        for reply in self.replies.iter_mut().filter(|r| r.is_none()) {
            *reply = Some(silent());
        }
    }
}

impl ReadTally {
    /// The decision once the replies so far settle it; `None` while the
    /// servers yet to answer could still change it.
    pub(super) fn decision(&self) -> Option<ReadDecision> {
        let needed = majority(self.replies.len());
        let pending = self.pending();
        let mut holders = 0;
        let mut highest = 0;
        let mut unreachable = 0;
        for state in self.replies.iter().flatten() {
            match state {
                ServerState::Holds(value) => {
                    holders += 1;
                    highest = highest.max(*value);
                }
                ServerState::Unreachable(_) => unreachable += 1,
                ServerState::NeedsRepair | ServerState::Refused(_) => {}
            }
        }
        if holders >= needed {
            return Some(ReadDecision::Majority(highest));
        }
        if holders + pending >= needed {
            return None;
        }
        let all_missing = self
            .replies
            .iter()
            .all(|state| matches!(state, Some(ServerState::NeedsRepair)));
        Some(if all_missing {
            ReadDecision::NotCreated
        } else if holders + unreachable + pending >= needed {
            ReadDecision::Unavailable
        } else {
            ReadDecision::NeedsRepair
        })
    }

    /// Counts the servers yet to answer as unreachable: the deadline
    /// passed. A closed tally always decides.
    pub(super) fn close(&mut self) {
        self.close_with(no_reply);
    }

    /// Every server's state, those not waited for as such.
    pub(super) fn finish(self, servers: &[String]) -> Vec<ServerStatus> {
        finish(self.replies, servers)
    }
}

/// A server the deadline passed for.
fn no_reply() -> ServerState {
    ServerState::Unreachable("no reply in time".to_owned())
}

fn finish(states: Vec<Option<ServerState>>, servers: &[String]) -> Vec<ServerStatus> {
    states
        .into_iter()
        .zip(servers)
        .map(|(state, server)| ServerStatus {
            server: server.clone(),
            state: state.unwrap_or_else(|| ServerState::Unreachable("not waited for".to_owned())),
        })
        .collect()
}

/// What one server did with a proposed ID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Write {
    /// It took it: its value was lower and is now the ID.
    Set,
    /// It holds this value already, at least the ID: another caller's.
    Higher(u64),
    /// It cannot vote (missing key, unreachable, refused).
    NoVote(ServerState),
}

/// What a write of a proposed ID settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum WriteDecision {
    /// A majority took it: the ID is the caller's.
    Issued,
    /// It can no longer reach a majority: the ID is another caller's, or
    /// nobody's (a gap).
    Lost,
}

impl WriteTally {
    /// The decision once the replies so far settle it.
    pub(super) fn decision(&self) -> Option<WriteDecision> {
        let needed = majority(self.replies.len());
        let set = self
            .replies
            .iter()
            .filter(|w| matches!(w, Some(Write::Set)))
            .count();
        if set >= needed {
            Some(WriteDecision::Issued)
        } else if set + self.pending() >= needed {
            None
        } else {
            Some(WriteDecision::Lost)
        }
    }

    /// Counts the servers yet to answer as unreachable: the deadline
    /// passed. A closed tally always decides.
    pub(super) fn close(&mut self) {
        self.close_with(|| Write::NoVote(no_reply()));
    }

    /// Every server's state as the write left it.
    pub(super) fn finish(self, servers: &[String], id: u64) -> Vec<ServerStatus> {
        let states = self
            .replies
            .into_iter()
            .map(|write| {
                write.map(|write| match write {
                    Write::Set => ServerState::Holds(id),
                    Write::Higher(value) => ServerState::Holds(value),
                    Write::NoVote(state) => state,
                })
            })
            .collect();
        finish(states, servers)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn down() -> ServerState {
        ServerState::Unreachable("connection refused".to_owned())
    }

    #[test]
    fn a_majority_is_more_than_half() {
        assert_eq!(
            [1, 2, 3, 4, 5, 7].map(majority),
            [1, 2, 2, 3, 3, 4],
            "any two majorities of n share a server"
        );
    }

    #[test]
    fn a_read_decides_at_a_majority_of_holders_with_their_highest_value() {
        let mut tally = ReadTally::new(3);
        tally.add(2, ServerState::Holds(7));
        assert_eq!(tally.decision(), None);
        tally.add(0, ServerState::Holds(9));
        assert_eq!(tally.decision(), Some(ReadDecision::Majority(9)));
    }

    #[test]
    fn a_server_that_lost_its_key_is_no_read_vote() {
        // Counted as 0 (or as anything), it would make a majority with
        // the holder here and let an ID through that a server which is
        // down may have taken already.
        let mut tally = ReadTally::new(3);
        tally.add(0, ServerState::NeedsRepair);
        tally.add(1, ServerState::Holds(5));
        assert_eq!(tally.decision(), None, "the third may still hold it");
        tally.add(2, down());
        assert_eq!(tally.decision(), Some(ReadDecision::Unavailable));
    }

    #[test]
    fn a_majority_that_lost_its_key_needs_repair_not_a_new_start() {
        let mut tally = ReadTally::new(3);
        tally.add(0, ServerState::NeedsRepair);
        tally.add(1, ServerState::NeedsRepair);
        assert_eq!(tally.decision(), Some(ReadDecision::NeedsRepair));
        let mut tally = ReadTally::new(3);
        tally.add(0, ServerState::NeedsRepair);
        tally.add(1, ServerState::Refused("appendonly no".to_owned()));
        assert_eq!(tally.decision(), Some(ReadDecision::NeedsRepair));
    }

    #[test]
    fn only_every_server_without_the_key_is_a_sequence_never_created() {
        let mut tally = ReadTally::new(3);
        tally.add(0, ServerState::NeedsRepair);
        tally.add(1, ServerState::NeedsRepair);
        tally.add(2, down());
        assert_eq!(tally.decision(), Some(ReadDecision::NeedsRepair));
        let mut tally = ReadTally::new(3);
        for server in 0..3 {
            tally.add(server, ServerState::NeedsRepair);
        }
        assert_eq!(tally.decision(), Some(ReadDecision::NotCreated));
    }

    #[test]
    fn a_closed_read_decides_with_the_silent_servers_unreachable() {
        let mut tally = ReadTally::new(3);
        tally.add(0, ServerState::Holds(1));
        assert_eq!(tally.decision(), None);
        tally.close();
        assert_eq!(tally.decision(), Some(ReadDecision::Unavailable));
    }

    #[test]
    fn servers_not_waited_for_are_listed_as_such() {
        let mut tally = ReadTally::new(2);
        tally.add(0, ServerState::Holds(1));
        let servers = ["a".to_owned(), "b".to_owned()];
        let listed = list(&tally.finish(&servers));
        assert_eq!(listed, "a holds 1; b unreachable (not waited for)");
    }

    #[test]
    fn a_write_issues_at_a_majority_of_sets_only() {
        let mut tally = WriteTally::new(3);
        tally.add(0, Write::Set);
        assert_eq!(tally.decision(), None);
        // A server that holds the ID already took it for another caller:
        // it is no vote for this one, or two callers could share an ID.
        tally.add(1, Write::Higher(4));
        assert_eq!(tally.decision(), None);
        tally.add(2, Write::Set);
        assert_eq!(tally.decision(), Some(WriteDecision::Issued));
    }

    #[test]
    fn a_write_is_lost_once_a_majority_is_out_of_reach() {
        let mut tally = WriteTally::new(3);
        tally.add(0, Write::Higher(4));
        assert_eq!(tally.decision(), None);
        tally.add(1, Write::NoVote(ServerState::NeedsRepair));
        assert_eq!(tally.decision(), Some(WriteDecision::Lost));
        tally.close();
        let servers = ["a".to_owned(), "b".to_owned(), "c".to_owned()];
        assert_eq!(
            list(&tally.finish(&servers, 4)),
            "a holds 4; b needs repair (its key is missing: it lost its data); \
             c unreachable (no reply in time)"
        );
    }
}
