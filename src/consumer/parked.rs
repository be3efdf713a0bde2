//! Batch callbacks parked by a sealed home partition (docs/design.md §19,
//! §21). A batch's record lives in its home partition's slot, and the
//! script that finds the batch complete adds its callback (or a chain's
//! next step) to that partition's stream in the same step. Once a reshard
//! sealed the home, the stream takes no entry and, after the open, no one
//! owns the partition: the script parks the entry in `{N/h}:parked`
//! instead, and the instance with index 1 sends what is parked in every
//! partition of the generations before the current one to the layout in
//! use, once per assignment (`unpark.lua`, deduplicated per task), then
//! removes it.

use std::sync::LazyLock;

use deadpool_redis::redis::{self, Script};
use tracing::info;

use super::shared::Shared;
use crate::entry::{field, route_key, unpack_strings, value_of};
use crate::error::Result;
use crate::keys;
use crate::reshard::Layout;

static UNPARK: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/unpark.lua")));

/// Sends every entry parked in a past generation's partitions of
/// `layout` to the current generation; returns how many it sent. One
/// `HGETALL` per past partition (pipelined), and per parked entry one
/// script and one `HDEL`.
pub(super) async fn send_parked(shared: &Shared, layout: &Layout) -> Result<usize> {
    let levels = shared.settings.levels().count();
    let units: Vec<u32> = layout.past.iter().flat_map(|g| g.units(levels)).collect();
    if units.is_empty() {
        return Ok(0);
    }
    let mut pipe = redis::pipe();
    for &u in &units {
        pipe.cmd("HGETALL").arg(keys::parked(&shared.name, u));
    }
    let parked: Vec<Vec<(String, Vec<u8>)>> = shared.conn.query_pipe(&pipe).await?;
    let mut sent = 0;
    for (&u, entries) in units.iter().zip(&parked) {
        for (name, packed) in entries {
            let Some(fields) = unpack_strings(packed) else {
                continue;
            };
            let id = value_of(&fields, field::ID).unwrap_or_default();
            let dest = layout.current.route(route_key(&fields), 0);
            let task = String::from_utf8_lossy(id);
            let mut script = UNPARK.key(keys::stream(&shared.name, dest));
            script
                .key(keys::dedup(&shared.name, dest, &format!("parked:{task}")))
                .key(keys::sealed(&shared.name, dest));
            for f in &fields {
                script.arg(f.as_slice());
            }
            let added: i64 = shared.conn.invoke(&script).await?;
            if added != 1 {
                continue;
            }
            let mut del = redis::cmd("HDEL");
            del.arg(keys::parked(&shared.name, u)).arg(name);
            let _: i64 = shared.conn.query(&del).await?;
            info!(service = %shared.name, task = %task, partition = %crate::partition::Shown(dest),
                  "sent a batch's entry its sealed home partition parked");
            sent += 1;
        }
    }
    Ok(sent)
}
