//! Pausing a service (docs/design.md §7): while `{N}:paused` exists no
//! handler starts on any instance. Everything else goes on: rounds,
//! ownership, handovers, acks of running tasks, promotion of retries and
//! periodic triggers. The key is written by operators (the `peerq` CLI, the
//! dashboard, [`crate::admin::Service::pause`]) and only read by the
//! consumers.

use std::time::{SystemTime, UNIX_EPOCH};

use deadpool_redis::redis;
use serde::{Deserialize, Serialize};

use crate::config::ServiceName;
use crate::connection::SharedConnection;
use crate::error::Result;
use crate::keys;

/// Who paused a service, and when.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pause {
    /// When it was paused, Unix milliseconds (the pausing machine's clock).
    pub at_ms: u64,
    /// Who paused it: free text, such as `alice@laptop` or `deploy-42`.
    pub by: String,
}

/// Pauses service `name`: no handler starts until [`resume`]. Pausing a
/// paused service keeps the first pause's record.
pub(crate) async fn pause(conn: &SharedConnection, name: &ServiceName, by: &str) -> Result<()> {
    let at_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis() as u64;
    let record = serde_json::to_string(&Pause {
        at_ms,
        by: by.to_owned(),
    })
    .expect("a pause record serializes");
    let mut set = redis::cmd("SET");
    set.arg(keys::paused(name)).arg(record).arg("NX");
    let _: Option<String> = conn.query(&set).await?;
    Ok(())
}

/// Resumes service `name`; true if it was paused.
pub(crate) async fn resume(conn: &SharedConnection, name: &ServiceName) -> Result<bool> {
    let mut del = redis::cmd("DEL");
    del.arg(keys::paused(name));
    let removed: u64 = conn.query(&del).await?;
    Ok(removed == 1)
}

/// Whether service `name` is paused, and by whom. A record that does not
/// parse (written by hand) still pauses: the key's presence is what counts.
pub(crate) async fn read(conn: &SharedConnection, name: &ServiceName) -> Result<Option<Pause>> {
    let mut get = redis::cmd("GET");
    get.arg(keys::paused(name));
    // Bytes, not text: a value that is not UTF-8 still pauses.
    let value: Option<Vec<u8>> = conn.query(&get).await?;
    Ok(value.map(|v| {
        serde_json::from_slice(&v).unwrap_or_else(|_| Pause {
            at_ms: 0,
            by: String::from_utf8_lossy(&v).into_owned(),
        })
    }))
}
