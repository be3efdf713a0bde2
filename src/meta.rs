//! Service-wide settings in `{N}:meta` (docs/design.md §3).
//!
//! Some settings only work when every instance (and producer) of a service
//! agrees on them: the interval, the skew, the partitions. The first process
//! to start records its values; every later one compares and is refused with
//! an error naming each difference. Each part records only its own fields,
//! so a producer does not need to know the indexer's interval.

use std::sync::LazyLock;

use deadpool_redis::redis::{Script, aio::ConnectionLike};

use crate::config::ServiceName;
use crate::error::{Error, Result, SettingDiff, SettingsMismatch};
use crate::keys;

static ENSURE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/meta_ensure.lua")));

/// Records `fields` for the service where absent, and fails if any is stored
/// with another value.
pub(crate) async fn ensure<C: ConnectionLike + Send>(
    conn: &mut C,
    name: &ServiceName,
    fields: &[(&'static str, String)],
) -> Result<()> {
    let key = keys::meta(name);
    let mut inv = ENSURE.key(&key);
    for (field, value) in fields {
        inv.arg(*field).arg(value);
    }
    let differ: Vec<String> = inv.invoke_async(conn).await?;
    if differ.is_empty() {
        return Ok(());
    }
    let settings = differ
        .chunks(2)
        .map(|pair| {
            let ours = fields
                .iter()
                .find(|(f, _)| *f == pair[0])
                .map(|(_, v)| v.clone())
                .unwrap_or_default();
            SettingDiff {
                setting: pair[0].clone(),
                ours,
                stored: pair[1].clone(),
            }
        })
        .collect();
    Err(Error::SettingsMismatch(SettingsMismatch { key, settings }))
}
