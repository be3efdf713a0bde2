//! A property test of the etcd round's close (docs/design.md §2.2), on a
//! model of etcd: a linearizable store with revisions, leases whose expiry
//! deletes their keys, and transactions that compare then act atomically.
//! Registrants, closers and expiries take their steps in every order
//! proptest draws; the closers run the steps of [`super::closed::close`].
//!
//! What it checks is what the rounds rely on: every reader of a round gets
//! one list; a registration that succeeded is in it unless its lease ended
//! before the close; one that came after the close was refused; and the
//! list holds no one who did not register. A lease that ends between a
//! closer's read and its close leaves its instance listed: counted and
//! gone, like an instance that crashes right after its round.

use std::collections::BTreeMap;

use proptest::prelude::*;

/// The model of etcd: key → (value, create revision, lease).
#[derive(Debug, Default)]
struct Store {
    revision: i64,
    keys: BTreeMap<String, (Vec<String>, i64, Option<usize>)>,
}

const CLOSED: &str = "closed";

impl Store {
    fn put(&mut self, key: &str, value: Vec<String>, lease: Option<usize>) {
        self.revision += 1;
        let created = self.keys.get(key).map_or(self.revision, |k| k.1);
        self.keys.insert(key.to_owned(), (value, created, lease));
    }

    /// The registrations, as `(name, create revision)`.
    fn members(&self) -> Vec<(String, i64)> {
        self.keys
            .iter()
            .filter_map(|(k, v)| Some((k.strip_prefix("m/")?.to_owned(), v.1)))
            .collect()
    }

    fn expire(&mut self, lease: usize) {
        let before = self.keys.len();
        self.keys.retain(|_, v| v.2 != Some(lease));
        if self.keys.len() != before {
            self.revision += 1;
        }
    }
}

/// A closer's progress through [`super::closed::close`].
#[derive(Debug, Clone)]
enum Closer {
    /// About to read the registrations (try `n`).
    Read(u32),
    /// Read them at `revision`: about to send the closing transaction.
    Close(u32, i64, Vec<String>),
    Done(Vec<String>),
    GaveUp,
}

/// One step: registrant `i` sends its transaction, closer `i` takes its
/// next step, or registrant `i`'s lease expires.
#[derive(Debug, Clone, Copy)]
enum Step {
    Register(usize),
    Closer(usize),
    Expire(usize),
}

fn steps(registrants: usize, closers: usize) -> impl Strategy<Value = Vec<Step>> {
    let step = prop_oneof![
        4 => (0..registrants).prop_map(Step::Register),
        4 => (0..closers).prop_map(Step::Closer),
        1 => (0..registrants).prop_map(Step::Expire),
    ];
    prop::collection::vec(step, 0..60)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn every_reader_of_a_round_reads_one_list_with_every_live_registration(
        steps in steps(5, 3)
    ) {
        let mut store = Store::default();
        // Registrant i: None = not yet sent; Some(ok) = its answer.
        let mut registered: Vec<Option<bool>> = vec![None; 5];
        let mut expired_at: Vec<Option<i64>> = vec![None; 5];
        let mut closers = vec![Closer::Read(0); 3];
        let mut closed_at: Option<i64> = None;
        let all = steps.iter().copied().chain((0..3).flat_map(|c| [Step::Closer(c); 8]));
        for step in all {
            match step {
                Step::Register(i) if registered[i].is_none() && expired_at[i].is_none() => {
                    // The registration's transaction: only while not closed.
                    let ok = !store.keys.contains_key(CLOSED);
                    if ok {
                        store.put(&format!("m/r{i}"), Vec::new(), Some(i));
                    }
                    registered[i] = Some(ok);
                }
                Step::Expire(i) if expired_at[i].is_none() => {
                    store.expire(i);
                    expired_at[i] = Some(store.revision);
                }
                Step::Closer(c) => {
                    closers[c] = match closers[c].clone() {
                        Closer::Read(n) if n >= 3 => Closer::GaveUp,
                        Closer::Read(n) => match store.keys.get(CLOSED) {
                            Some((list, ..)) => Closer::Done(list.clone()),
                            None => {
                                let mut members = store.members();
                                members.sort();
                                let names = members.into_iter().map(|m| m.0).collect();
                                Closer::Close(n, store.revision, names)
                            }
                        },
                        Closer::Close(n, revision, list) => {
                            let absent = !store.keys.contains_key(CLOSED);
                            let none_since = store.members().iter().all(|m| m.1 < revision + 1);
                            if absent && none_since {
                                store.put(CLOSED, list.clone(), None);
                                closed_at = Some(store.revision);
                                Closer::Done(list)
                            } else if let Some((stored, ..)) = store.keys.get(CLOSED) {
                                Closer::Done(stored.clone())
                            } else {
                                Closer::Read(n + 1)
                            }
                        }
                        done => done,
                    };
                }
                _ => {}
            }
        }
        let lists: Vec<&Vec<String>> = closers
            .iter()
            .filter_map(|c| match c { Closer::Done(l) => Some(l), _ => None })
            .collect();
        // Closers that gave up are fenced for the round; the others agree.
        prop_assert!(lists.windows(2).all(|w| w[0] == w[1]), "{lists:?}");
        let Some(list) = lists.first() else { return Ok(()); };
        let closed_at = closed_at.expect("a list was read, so the round was closed");
        for i in 0..5 {
            let name = format!("r{i}");
            let listed = list.contains(&name);
            match registered[i] {
                Some(true) => {
                    // One whose lease ended between the closer's read and
                    // its close may be listed too: counted, and gone, as
                    // an instance that crashes after its round.
                    let lived = expired_at[i].is_none_or(|at| at > closed_at);
                    prop_assert!(listed || !lived, "registrant {} (expired at {:?}, closed at {})", i, expired_at[i], closed_at);
                }
                _ => prop_assert!(!listed, "registrant {} listed without a registration", i),
            }
        }
    }
}
