//! What the outbox relay sends through the producer (docs/design.md §10): a
//! task written to `peerq_outbox`, already encoded, under the id the outbox
//! gave it and at most once per its dedup record `outbox:<task id>`; the
//! dead letter of a row that cannot be enqueued, at most once by the same
//! record; both only until the relay's claim's deadline by Redis's clock;
//! and, once the rows' delete has committed, the records' expiry.

use std::sync::LazyLock;
use std::time::Duration;

use deadpool_redis::redis;

use super::send::Enqueued;
use super::{Options, Producer};
use crate::codec::Codec;
use crate::entry::{Entry, TaskId};
use crate::error::Result;
use crate::{dead_letters, keys};

static RELAY_DEAD: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("../scripts/relay_dead.lua")));

/// A task as the outbox stored it.
#[derive(Debug, Clone)]
pub(crate) struct Stored {
    pub(crate) id: TaskId,
    /// The codec the payload was encoded with.
    pub(crate) codec: String,
    pub(crate) payload: Vec<u8>,
    /// When it was written, in Unix milliseconds: its `enqueued_at`, so
    /// the queue's lag counts the time it waited in the outbox.
    pub(crate) written_ms: u64,
    /// Its partition key, idempotency key and due time.
    pub(crate) options: Options,
}

/// What became of a stored task's send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sent {
    /// Enqueued (or dead-lettered) now.
    Now,
    /// Its dedup record was there: an earlier send did it.
    Before,
    /// The claim's deadline had passed by Redis's clock: nothing written.
    Late,
}

/// A stored task's dedup record's name under `{N/p}:dedup:`.
fn record(id: &TaskId) -> String {
    format!("outbox:{id}")
}

impl Stored {
    /// Its first attempt's entry.
    fn entry(&self) -> Entry {
        Entry {
            id: self.id.clone(),
            key: self.options.partition_key().map(str::to_owned),
            attempt: 1,
            failures: 0,
            enqueued_at: Duration::from_millis(self.written_ms),
            codec: self.codec.clone(),
            payload: self.payload.clone(),
            unique: None,
            headers: self.options.headers.clone(),
            extra: Vec::new(),
        }
    }
}

impl<C: Codec> Producer<C> {
    /// Enqueues `stored` under its own id, at most once per its dedup
    /// record (written without an expiry) and its idempotency key, unless
    /// Redis's clock is past `until_ms` (Unix ms).
    pub(crate) async fn send_stored(&self, stored: &Stored, until_ms: u64) -> Result<Sent> {
        let record = record(&stored.id);
        let sent = self
            .send_entry(stored.entry(), &stored.options, Some((&record, until_ms)))
            .await;
        match &sent {
            Ok(Some(Enqueued::New(_))) => self.enqueued.increment(1),
            Ok(_) => {}
            Err(_) => self.errors.increment(1),
        }
        Ok(match sent? {
            Some(Enqueued::New(_)) => Sent::Now,
            // (The outbox refuses unique keys when a row is written.)
            Some(Enqueued::Earlier(_) | Enqueued::Refused(_)) => Sent::Before,
            None => Sent::Late,
        })
    }

    /// Writes the dead letter of `stored` to its partition's dead letters,
    /// with reason `relay` and `error`, at most once per its dedup record
    /// (written without an expiry), unless Redis's clock is past
    /// `until_ms` (Unix ms).
    pub(crate) async fn dead_letter_stored(
        &self,
        stored: &Stored,
        error: &str,
        until_ms: u64,
    ) -> Result<Sent> {
        let entry = stored.entry();
        let p = self.partition_of(&entry);
        let fields = entry
            .fields()
            .into_iter()
            .map(|(k, v)| (k.into_owned(), v))
            .collect();
        let letter = dead_letters::letter(fields, "relay", error, None);
        let mut script = RELAY_DEAD.key(keys::dead(&self.name, p));
        script
            .key(keys::dedup(&self.name, p, &record(&stored.id)))
            .arg(until_ms)
            .arg(stored.id.as_str());
        for (k, v) in &letter {
            script.arg(k).arg(v);
        }
        // With `wait_for_replicas`, confirmed before the relay deletes the
        // row: the letter is then the task's only copy (docs/design.md §8).
        let written: i64 = self.conn.write_script(&script).await?;
        Ok(match written {
            1 => Sent::Now,
            0 => Sent::Before,
            _ => Sent::Late,
        })
    }

    /// The partition `stored` goes to.
    pub(crate) fn partition_of_stored(&self, stored: &Stored) -> u32 {
        let key = stored.options.partition_key().unwrap_or(stored.id.as_str());
        self.route().current.route(key.as_bytes(), 0)
    }

    /// Gives the dedup records of `sent` (each a task id and its
    /// partition) an expiry of `grace`, in one round trip per node; with
    /// `wait_for_replicas`, returns once the replicas have it. Safe to
    /// repeat (it only restarts the grace).
    pub(crate) async fn forget_stored(
        &self,
        sent: &[(TaskId, u32)],
        grace: Duration,
    ) -> Result<()> {
        if sent.is_empty() {
            return Ok(());
        }
        let keys: Vec<String> = sent
            .iter()
            .map(|(id, p)| keys::dedup(&self.name, *p, &record(id)))
            .collect();
        let mut pipe = redis::pipe();
        for key in &keys {
            pipe.cmd("PEXPIRE").arg(key).arg(grace.as_millis() as u64);
        }
        // With `wait_for_replicas`, the WAIT goes on the connections that
        // carried the PEXPIREs (docs/design.md §8).
        let waited = self.conn.write_pipe(&mut pipe).await?;
        for (i, reply) in waited.replies().iter().enumerate() {
            reply
                .clone()
                .extract_error()
                .map_err(crate::error::Error::from)?;
            waited.confirmed(i)?;
        }
        Ok(())
    }

    /// Redis's clock, in Unix milliseconds.
    pub(crate) async fn redis_now_ms(&self) -> Result<u64> {
        let (secs, micros): (u64, u64) = self.conn.query(&redis::cmd("TIME")).await?;
        Ok(secs * 1000 + micros / 1000)
    }

    /// The service's codec, as rows name it.
    pub(crate) fn codec_name(&self) -> &'static str {
        C::NAME
    }

    /// The largest payload it enqueues.
    pub(crate) fn max_payload(&self) -> usize {
        self.max_payload
    }
}
