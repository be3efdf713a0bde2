//! A closed round on etcd (docs/design.md §2.2): its keys, the member list
//! its closer stores, and the closing itself.
//!
//! A round's registrations are keys `{prefix}/{N}/rounds/<m>/members/<member>`
//! (value: the instance's offset in µs), each under its instance's lease.
//! The first reader of round `m` closes it: it reads the registrations, then
//! writes `{prefix}/{N}/rounds/<m>/closed` holding their names in index
//! order, in a transaction that finds the close key absent and no
//! registration created after its read. A registration is a transaction that
//! finds the close key absent. So a registration that succeeded is in the
//! closed list unless its lease expired first, one that comes after the
//! close is refused, and every reader reads the one list the close key
//! holds: what etcd cannot refuse by the clock, the close refuses by order.

use etcd_client::{
    Compare, CompareOp, DeleteOptions, GetOptions, KeyValue, Txn, TxnOp, TxnOpResponse,
};

use super::endpoints::Endpoints;

use crate::error::Result;
use crate::indexer::Indexing;

/// How many times a closer reads again when registrations landed between
/// its read and its close. Registrations stop well before the first reader
/// comes (their window ends in the round's own interval), so a second try
/// is already rare.
const CLOSE_TRIES: u32 = 3;

/// How many rounds of keys are kept: a close of round `m` deletes the keys
/// of round `m - KEPT` and every older one, which no round reads any more
/// (a round reads the one before it, within one interval). Every older
/// one: rounds that were never closed (no instance read them, the service
/// stopped, or every read failed) are deleted with the next close.
const KEPT: u64 = 3;

/// The etcd keys of one service's rounds.
#[derive(Debug, Clone)]
pub(super) struct RoundKeys {
    /// `{prefix}/{N}/rounds/`.
    base: String,
}

impl RoundKeys {
    /// The keys of service `name`'s rounds under `prefix`.
    pub(super) fn new(prefix: &str, name: &str) -> Self {
        RoundKeys {
            base: format!("{prefix}/{name}/rounds/"),
        }
    }

    /// Every round's keys: `.../rounds/`.
    pub(super) fn base(&self) -> &str {
        &self.base
    }

    /// Every key of round `m`: `.../rounds/<m>/`, the number zero-padded
    /// to 20 digits so that the keys of older rounds sort before it.
    fn round(&self, m: u64) -> String {
        format!("{}{m:020}/", self.base)
    }

    /// Round `m`'s registrations: `.../rounds/<m>/members/`.
    pub(super) fn members(&self, m: u64) -> String {
        format!("{}members/", self.round(m))
    }

    /// `member`'s registration in round `m`.
    pub(super) fn member(&self, m: u64, member: &str) -> String {
        format!("{}{member}", self.members(m))
    }

    /// Round `m`'s close key.
    pub(super) fn closed(&self, m: u64) -> String {
        format!("{}closed", self.round(m))
    }
}

/// The member names of round `m`'s registrations, in index order: by
/// offset then name under [`Indexing::Ranked`] (as `ZRANK` orders the
/// Redis rounds), by arrival (the key's create revision) under
/// [`Indexing::Incr`].
pub(super) fn ordered(
    keys: &RoundKeys,
    m: u64,
    kvs: &[KeyValue],
    indexing: Indexing,
) -> Vec<String> {
    let prefix = keys.members(m);
    let mut members: Vec<(u64, i64, String)> = kvs
        .iter()
        .filter_map(|kv| {
            let name = kv.key_str().ok()?.strip_prefix(&prefix)?.to_owned();
            let offset = kv.value_str().ok()?.parse().unwrap_or(u64::MAX);
            Some((offset, kv.create_revision(), name))
        })
        .collect();
    match indexing {
        Indexing::Ranked => members.sort_by(|a, b| (a.0, &a.2).cmp(&(b.0, &b.2))),
        Indexing::Incr => members.sort_by_key(|m| m.1),
    }
    members.into_iter().map(|(_, _, name)| name).collect()
}

/// The list a close key holds.
pub(super) fn decode(value: &[u8]) -> Result<Vec<String>> {
    serde_json::from_slice(value).map_err(|e| {
        crate::error::Error::Runtime(format!("an etcd round's close key does not read: {e}"))
    })
}

/// The close key's value in a transaction's answer to a get of it, if it
/// exists.
pub(super) fn closed_in(responses: &[TxnOpResponse]) -> Option<&[u8]> {
    responses.iter().find_map(|r| match r {
        TxnOpResponse::Get(get) => get.kvs().first().map(|kv| kv.value()),
        _ => None,
    })
}

/// Round `m`'s closed list: the one stored, or this instance closes the
/// round (and deletes the keys of round `m - KEPT` and older). `at` says
/// where an etcd
/// error came from.
pub(super) async fn close(
    endpoints: &mut Endpoints,
    keys: &RoundKeys,
    m: u64,
    indexing: Indexing,
    at: impl Fn(etcd_client::Error) -> crate::error::Error,
) -> Result<Vec<String>> {
    for _ in 0..CLOSE_TRIES {
        let members = keys.members(m);
        let read = endpoints
            .run(|mut client| {
                let members = members.clone();
                async move {
                    let options = GetOptions::new().with_prefix();
                    client.get(members, Some(options)).await
                }
            })
            .await
            .map_err(&at)?;
        let revision = read.header().map_or(0, |h| h.revision());
        let list = ordered(keys, m, read.kvs(), indexing);
        let value = serde_json::to_vec(&list).expect("a list of strings encodes");
        let close = Txn::new()
            .when([
                Compare::create_revision(keys.closed(m), CompareOp::Equal, 0),
                // No registration since the read: none is left out of the list.
                Compare::create_revision(keys.members(m), CompareOp::Less, revision + 1)
                    .with_prefix(),
            ])
            .and_then([
                TxnOp::put(keys.closed(m), value, None),
                TxnOp::delete(
                    keys.base.clone(),
                    Some(DeleteOptions::new().with_range(keys.round(m.saturating_sub(KEPT - 1)))),
                ),
            ])
            .or_else([TxnOp::get(keys.closed(m), None)]);
        let closed = endpoints
            .run(|mut client| {
                let close = close.clone();
                async move { client.txn(close).await }
            })
            .await
            .map_err(&at)?;
        if closed.succeeded() {
            return Ok(list);
        }
        if let Some(stored) = closed_in(&closed.op_responses()) {
            return decode(stored);
        }
    }
    Err(crate::error::Error::Runtime(format!(
        "etcd round {m} kept gaining registrations while it was being closed"
    )))
}
