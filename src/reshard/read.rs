//! Reading a service's layout (docs/design.md §21), for the parts that
//! are not told it by a round: producers at connect and after a refusal,
//! consumers at start, and the admin tools, which look at the partitions
//! of the generation in use and of the one a reshard replaces.

use std::collections::HashMap;
use std::sync::Arc;

use deadpool_redis::redis;

use super::{Layout, units_of};
use crate::config::ServiceName;
use crate::connection::SharedConnection;
use crate::error::{Error, Result};
use crate::keys;

/// Service `name`'s layout; `None`: it was never resharded.
pub(crate) async fn read_layout(
    conn: &SharedConnection,
    name: &ServiceName,
) -> Result<Option<Layout>> {
    let mut get = redis::cmd("HGETALL");
    get.arg(keys::layout(name));
    let fields: HashMap<String, String> = conn.query(&get).await?;
    Layout::from_fields(&fields).map_err(|e| {
        Error::Redis(redis::RedisError::from((
            redis::ErrorKind::UnexpectedReturnType,
            "the service's layout does not read",
            e,
        )))
    })
}

/// The units of service `name` to look at, ascending (`first`: its
/// `{N}:meta` partitions per level; `levels`: its priority levels).
pub(crate) async fn read_units(
    conn: &SharedConnection,
    name: &ServiceName,
    first: u32,
    levels: u32,
) -> Result<Arc<[u32]>> {
    let layout = read_layout(conn, name).await?;
    Ok(units_of(layout.as_ref(), first, levels))
}
