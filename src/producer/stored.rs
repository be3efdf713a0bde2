//! What the outbox relay sends through the producer (docs/design.md §10): a
//! task written to `peerq_outbox`, already encoded, under the id the outbox
//! gave it and at most once per its dedup record `outbox:<task id>`; and
//! the dead letter of a row that cannot be enqueued, at most once by the
//! same record.

use std::sync::LazyLock;
use std::time::Duration;

use deadpool_redis::redis;

use super::{Options, Producer};
use crate::codec::Codec;
use crate::error::Result;
use crate::task::{Entry, TaskId};
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

impl Stored {
    /// Its dedup record's name under `{N/p}:dedup:`.
    fn record(&self) -> String {
        format!("outbox:{}", self.id)
    }

    /// Its first attempt's entry.
    fn entry(&self) -> Entry {
        Entry {
            id: self.id.clone(),
            key: self.options.partition_key().map(str::to_owned),
            attempt: 1,
            enqueued_at: Duration::from_millis(self.written_ms),
            codec: self.codec.clone(),
            payload: self.payload.clone(),
        }
    }
}

impl<C: Codec> Producer<C> {
    /// Enqueues `stored` under its own id, at most once per its dedup
    /// record (kept for `ttl`) and its idempotency key; whether it is new.
    pub(crate) async fn send_stored(&self, stored: &Stored, ttl: Duration) -> Result<bool> {
        let record = stored.record();
        let sent = self
            .send_entry(stored.entry(), &stored.options, Some((&record, ttl)))
            .await;
        match &sent {
            Ok((_, true)) => self.enqueued.increment(1),
            Ok(_) => {}
            Err(_) => self.errors.increment(1),
        }
        Ok(sent?.1)
    }

    /// Writes the dead letter of `stored` to its partition's dead letters,
    /// with reason `relay` and `error`, at most once per its dedup record
    /// (kept for `ttl`); whether it was written now.
    pub(crate) async fn dead_letter_stored(
        &self,
        stored: &Stored,
        error: &str,
        ttl: Duration,
    ) -> Result<bool> {
        let entry = stored.entry();
        let p = self.partition_of(&entry);
        let fields = entry
            .fields()
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect();
        let letter = dead_letters::letter(fields, "relay", error, None);
        let mut script = RELAY_DEAD.key(keys::dead(&self.name, p));
        script
            .key(keys::dedup(&self.name, p, &stored.record()))
            .arg(ttl.as_millis() as u64)
            .arg(stored.id.as_str());
        for (k, v) in &letter {
            script.arg(k).arg(v);
        }
        let written: i64 = self.conn.invoke(&script).await?;
        Ok(written == 1)
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
