//! A service's singletons in Redis (docs/design.md §20): the holders'
//! records in `{N}:singletons`, written by `acquire.lua` (the partitions'
//! owner records' script, on a hash field), and
//! the release marks, fields of `{N}:transition` beside the partitions'.

use std::collections::BTreeMap;
use std::sync::LazyLock;

use deadpool_redis::redis::{self, Script};
use serde::Serialize;

use crate::config::ServiceName;
use crate::connection::SharedConnection;
use crate::error::{Error, Result};
use crate::keys;
use crate::marks;

static ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/acquire.lua")));

/// The longest singleton name.
pub(crate) const MAX_NAME: usize = 64;

/// Checks a singleton's name: 1 to 64 of `A-Z a-z 0-9 _ . -`, so that it
/// is a field of its own in `{N}:singletons` (no `:`) and a metric label
/// as it is.
pub(crate) fn check_name(name: &str) -> Result<()> {
    let fine = !name.is_empty()
        && name.len() <= MAX_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
    if fine {
        Ok(())
    } else {
        Err(Error::invalid(
            "singleton",
            format!("name {name:?}: 1 to {MAX_NAME} letters, digits, `_`, `.` or `-`"),
        ))
    }
}

/// Records this instance (`id`) as the holder of singleton `singleton`
/// with `token`; `Err(recorded)` when a token at or above it is recorded
/// (another instance acquired it in a later epoch).
pub(crate) async fn acquire(
    conn: &SharedConnection,
    service: &ServiceName,
    singleton: &str,
    token: u64,
    id: &str,
) -> Result<std::result::Result<(), u64>> {
    let key = keys::singletons(service);
    let mut script = ACQUIRE.key(&key);
    script.arg(token).arg(id).arg(singleton);
    let reply: i64 = conn.write_script(&script).await?;
    Ok(if reply == 1 {
        Ok(())
    } else {
        Err(reply.unsigned_abs())
    })
}

/// Who holds a singleton, as `peerq status` and the dashboard show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SingletonHolder {
    /// The singleton's name.
    pub name: String,
    /// The instance that acquired it last.
    pub instance: String,
    /// Its fencing token: the epoch it acquired in.
    pub token: u64,
    /// When it acquired it, Unix milliseconds (Redis's clock).
    pub since_ms: Option<u64>,
    /// Whether that instance has released it since (its release mark is
    /// past the token): nobody holds it until the next holder acquires.
    pub released: bool,
}

/// The holders of service `service`'s singletons, by name: every singleton
/// ever held, with its release mark read in the same round trip.
pub(crate) async fn holders(
    conn: &SharedConnection,
    service: &ServiceName,
) -> Result<Vec<SingletonHolder>> {
    let mut all = redis::cmd("HGETALL");
    all.arg(keys::singletons(service));
    let fields: BTreeMap<String, String> = conn.query(&all).await?;
    let mut held: Vec<SingletonHolder> = fields
        .iter()
        .filter(|(field, _)| !field.contains(':'))
        .filter_map(|(name, record)| {
            let (token, instance) = record.split_once(':')?;
            Some(SingletonHolder {
                name: name.clone(),
                instance: instance.to_owned(),
                token: token.parse().ok()?,
                since_ms: fields
                    .get(&format!("{name}:since"))
                    .and_then(|s| s.parse().ok()),
                released: false,
            })
        })
        .collect();
    if held.is_empty() {
        return Ok(held);
    }
    let fields: Vec<String> = held.iter().map(|h| keys::singleton_mark(&h.name)).collect();
    let read = marks::marks_of(conn, service, &fields).await?;
    for (holder, mark) in held.iter_mut().zip(read) {
        holder.released = mark.is_some_and(|m| m.epoch > holder.token);
    }
    Ok(held)
}
