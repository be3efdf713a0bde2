//! Rendezvous: the member list of the last round this instance read, kept
//! so that an unchanged list is neither sent by Redis nor parsed again, and
//! the owners it decides are computed once per membership change.
//!
//! A round asks for the previous round's list saying whether it holds the
//! list of the round before that; Redis compares the two lists once per
//! round (the first reader does, the others read its verdict) and sends the
//! list only if it changed. At 1,000 instances, sending every list to
//! every instance in every round made rounds miss their timeout.

use std::sync::Arc;

use crate::assignment::Members;

/// What a round read of the previous round's members.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Read {
    /// The names, in rank order (empty when not asked).
    Names(Vec<String>),
    /// The same list as the round before, which this instance holds.
    Unchanged,
}

/// The member list this instance holds, and whose round it is.
#[derive(Debug, Default)]
pub(super) struct Listed {
    held: Option<(u64, Arc<Members>)>,
}

impl Listed {
    /// Whether round `number`'s read may answer [`Read::Unchanged`]: this
    /// instance holds the list of round `number - 2`.
    pub(super) fn holds_before(&self, number: u64) -> bool {
        matches!(&self.held, Some((round, _)) if round + 2 == number)
    }

    /// The members of round `number - 1`, from what round `number` read;
    /// `None` for an unchanged list this instance does not hold (never
    /// asked for, so something outside the protocol answered).
    pub(super) fn members(&mut self, number: u64, read: Read) -> Option<Arc<Members>> {
        let members = match read {
            Read::Unchanged if self.holds_before(number) => self.held.as_ref()?.1.clone(),
            Read::Unchanged => return None,
            Read::Names(names) => {
                let members = Members::from_names(&names);
                match &self.held {
                    // The same list from an older round: its owners are
                    // computed already.
                    Some((_, last)) if **last == members => last.clone(),
                    _ => Arc::new(members),
                }
            }
        };
        self.held = Some((number - 1, members.clone()));
        Some(members)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Read {
        Read::Names(list.iter().map(|n| n.to_string()).collect())
    }

    #[test]
    fn an_unchanged_list_is_the_one_held_and_only_if_it_is_the_round_before() {
        let mut listed = Listed::default();
        assert!(!listed.holds_before(10));
        assert_eq!(listed.members(10, Read::Unchanged), None);
        let first = listed.members(10, names(&["a@1", "b@1"])).unwrap();
        assert!(listed.holds_before(11));
        let kept = listed.members(11, Read::Unchanged).unwrap();
        assert!(Arc::ptr_eq(&first, &kept));
        // A round missed: the list held is too old to be "unchanged".
        assert!(!listed.holds_before(13));
        assert_eq!(listed.members(13, Read::Unchanged), None);
        // The same names again keep the computed owners.
        let again = listed.members(13, names(&["a@1", "b@1"])).unwrap();
        assert!(Arc::ptr_eq(&first, &again));
        let changed = listed.members(14, names(&["a@1", "c@1"])).unwrap();
        assert!(!Arc::ptr_eq(&first, &changed));
        assert_eq!(changed.list().len(), 2);
    }
}
