//! A batch as its record says now (`peerq batch show`, the dashboard's
//! batch page, `Service::batch`).

use std::collections::HashMap;

use deadpool_redis::redis;
use serde::Serialize;

use super::{BatchId, BatchKeys, as_str};
use crate::config::ServiceName;
use crate::connection::SharedConnection;
use crate::error::Result;

/// Whether a batch's callback went out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum CallbackState {
    /// None went: the batch is not done yet, or it is done with nothing to
    /// send (an on-failure callback alone, and every member succeeded).
    None,
    /// Enqueued: the callback (or the on-failure callback) is a task.
    Enqueued,
}

/// A batch as its record says now (`peerq batch show`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct BatchView {
    /// The batch.
    #[serde(serialize_with = "as_str")]
    pub id: BatchId,
    /// Members added.
    pub total: u64,
    /// Members not final yet.
    pub pending: u64,
    /// Members that succeeded.
    pub succeeded: u64,
    /// Members that went to the dead letters.
    pub dead: u64,
    /// Members a user cancelled.
    pub cancelled: u64,
    /// Whether members may still be added.
    pub sealed: bool,
    /// Not sealed before its time ran out: no callback will come.
    pub expired: bool,
    /// Done: sealed and every member final (its callback, if any, went).
    pub done: bool,
    /// Whether its callback went out.
    pub callback: CallbackState,
    /// The callback's task id, once enqueued.
    pub callback_id: Option<String>,
    /// Which callback went: `callback` or `on_failure`.
    pub callback_kind: Option<String>,
    /// A chain: its steps.
    pub steps: Option<u64>,
    /// A chain's step running (or the last that ran), from 1.
    pub step: Option<u64>,
    /// A chain a dead (or cancelled) step stopped.
    pub stopped: bool,
    /// When a user cancelled it ([`Service::cancel_batch`]), Unix ms: it
    /// takes no member and sends no callback.
    ///
    /// [`Service::cancel_batch`]: crate::admin::Service::cancel_batch
    pub cancelled_at: Option<u64>,
    /// When it was opened, Unix ms (Redis's clock).
    pub created_at: u64,
    /// When an unsealed batch expires, Unix ms.
    pub expires_at: u64,
    /// When it was done (callback enqueued or not needed), Unix ms.
    pub done_at: Option<u64>,
}

impl BatchView {
    /// Its state as a word (`peerq batch show`, the dashboard): `cancelled`
    /// (a user's cancel, and every member final), `cancelling`, `expired`,
    /// `stopped` (a chain a step's failure stopped), `done`, `sealed` or
    /// `open`.
    pub fn state(&self) -> &'static str {
        match () {
            _ if self.cancelled_at.is_some() && self.done => "cancelled",
            _ if self.cancelled_at.is_some() => "cancelling",
            _ if self.expired => "expired",
            _ if self.stopped => "stopped",
            _ if self.done => "done",
            _ if self.sealed => "sealed",
            _ => "open",
        }
    }

    /// The view of record `fields` (HGETALL) of batch `id`, read at
    /// `now_ms`; `None` for no record.
    fn read(id: &BatchId, fields: HashMap<String, String>, now_ms: u64) -> Option<BatchView> {
        if fields.is_empty() {
            return None;
        }
        let n = |name: &str| fields.get(name).and_then(|v| v.parse::<u64>().ok());
        let (total, succeeded) = (n("total")?, n("ok").unwrap_or(0));
        let (dead, cancelled) = (n("dead").unwrap_or(0), n("cancelled").unwrap_or(0));
        let sealed = n("sealed") == Some(1);
        let expires_at = n("expires_at").unwrap_or(0);
        let done_at = n("done_at");
        let sent = fields.get("sent").map(String::as_str);
        let callback = match sent {
            Some("callback" | "on_failure") => CallbackState::Enqueued,
            _ => CallbackState::None,
        };
        let sent_id = fields.get("sent_id").filter(|id| !id.is_empty());
        Some(BatchView {
            id: id.clone(),
            total,
            pending: total.saturating_sub(succeeded + dead + cancelled),
            succeeded,
            dead,
            cancelled,
            sealed,
            expired: !sealed && now_ms > expires_at,
            done: done_at.is_some(),
            callback,
            callback_id: sent_id.cloned(),
            callback_kind: sent
                .filter(|s| matches!(*s, "callback" | "on_failure"))
                .map(str::to_owned),
            steps: n("steps"),
            step: n("step"),
            stopped: n("steps").is_some() && done_at.is_some() && dead + cancelled > 0,
            cancelled_at: n("cancelled_at"),
            created_at: n("created_at").unwrap_or(0),
            expires_at,
            done_at,
        })
    }
}

/// Batch `id` of service `name` as its record says now; `None` when it
/// does not exist (never, or expired and gone).
pub(crate) async fn view(
    conn: &SharedConnection,
    name: &ServiceName,
    id: &BatchId,
) -> Result<Option<BatchView>> {
    let keys = BatchKeys::of(name, id);
    let mut hgetall = redis::cmd("HGETALL");
    hgetall.arg(&keys.record);
    let fields: HashMap<String, String> = conn.query(&hgetall).await?;
    // Whether an open batch expired, by this clock: the record's times
    // are Redis's, a skew of the clock moves the answer by as much.
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    let now_ms = now.unwrap_or_default().as_millis() as u64;
    Ok(BatchView::read(id, fields, now_ms))
}
