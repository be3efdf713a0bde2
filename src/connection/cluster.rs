//! What a Redis Cluster asks of the commands peerq sends (docs/design.md
//! §8): every key of one command, transaction or script in one slot (a
//! pipeline over several partitions: [`super::pipeline`]); a command with
//! no key (`TIME`, `INFO`, `CLIENT UNBLOCK`) goes to the node it is about;
//! and a blocking reader connects to the master of its slot.

use deadpool_redis::redis::cluster_async::ClusterConnection;
use deadpool_redis::redis::cluster_routing::{
    MultipleNodeRoutingInfo, Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr,
};
use deadpool_redis::redis::{self, Cmd, RedisResult, Value};

/// Slot ranges and the address of each one's master.
pub(super) type SlotMap = Vec<(std::ops::RangeInclusive<u16>, (String, u16))>;

/// The number of slots of a Redis Cluster.
const SLOTS: u16 = 16384;

/// The slot of `key`: CRC16 of its hash tag (the part between the first
/// `{` and the next `}`, when not empty), as Redis computes it.
pub(crate) fn slot(key: impl AsRef<[u8]>) -> u16 {
    let key = key.as_ref();
    let tagged = key.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        let close = rest.iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    crc16::State::<crc16::XMODEM>::calculate(tagged.unwrap_or(key)) % SLOTS
}

/// The slot a command goes to; `None` for one without a key. The key is
/// where the commands peerq sends have it: after `numkeys` for scripts,
/// after `STREAMS` for stream reads, after the subcommand for `XGROUP`
/// and `XINFO`, none for the server's own commands, else the first
/// argument.
pub(super) fn command_slot(cmd: &Cmd) -> Option<u16> {
    let mut args = cmd.args_iter().filter_map(|arg| match arg {
        redis::Arg::Simple(bytes) => Some(bytes),
        _ => None,
    });
    let name = args.next()?.to_ascii_uppercase();
    let key = match name.as_slice() {
        b"EVALSHA" | b"EVAL" | b"EVALSHA_RO" | b"EVAL_RO" | b"FCALL" => {
            let _script = args.next()?;
            let keys: usize = std::str::from_utf8(args.next()?).ok()?.parse().ok()?;
            if keys == 0 {
                return None;
            }
            args.next()?
        }
        b"XREAD" | b"XREADGROUP" => args
            .find(|arg| arg.eq_ignore_ascii_case(b"STREAMS"))
            .and_then(|_| args.next())?,
        // Commands with a subcommand before the key.
        b"XGROUP" | b"XINFO" | b"OBJECT" | b"MEMORY" => {
            let _subcommand = args.next()?;
            args.next()?
        }
        b"TIME" | b"INFO" | b"CLIENT" | b"PING" | b"SCRIPT" | b"CLUSTER" | b"SCAN" | b"CONFIG"
        | b"DBSIZE" | b"WAIT" | b"MULTI" | b"EXEC" => return None,
        _ => args.next()?,
    };
    Some(slot(key))
}

/// Runs `cmd`, which has no key, on the master of `key`'s slot: the node
/// whose clock or memory the caller asks about.
pub(crate) async fn query_at(conn: &ClusterConnection, cmd: &Cmd, key: &str) -> RedisResult<Value> {
    let route = Route::new(slot(key), SlotAddr::Master);
    let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route));
    conn.clone().route_command(cmd.clone(), routing).await
}

/// Runs `cmd` on the node at `host:port`.
pub(crate) async fn query_on(
    conn: &ClusterConnection,
    cmd: &Cmd,
    host: &str,
    port: u16,
) -> RedisResult<Value> {
    let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
        host: host.to_owned(),
        port,
    });
    conn.clone().route_command(cmd.clone(), routing).await
}

/// Runs `cmd` on every master; their replies, by node address.
pub(crate) async fn query_masters(
    conn: &ClusterConnection,
    cmd: &Cmd,
) -> RedisResult<Vec<(String, Value)>> {
    let routing = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
    let reply = conn.clone().route_command(cmd.clone(), routing).await?;
    match reply {
        Value::Map(pairs) => pairs
            .into_iter()
            .map(|(node, value)| Ok((redis::from_redis_value::<String>(node)?, value)))
            .collect(),
        other => Ok(vec![(String::new(), other)]),
    }
}

/// The address of the master serving `slot`, as the Cluster's slot map
/// says; `None` when no master serves it (the Cluster is down for it).
pub(crate) async fn master_of(
    conn: &ClusterConnection,
    slot: u16,
) -> RedisResult<Option<(String, u16)>> {
    Ok(slot_map(conn)
        .await?
        .into_iter()
        .find(|(slots, _)| slots.contains(&slot))
        .map(|(_, master)| master))
}

/// The addresses of the masters that serve slots, each once.
pub(crate) async fn masters(conn: &ClusterConnection) -> RedisResult<Vec<(String, u16)>> {
    let mut masters: Vec<(String, u16)> = slot_map(conn)
        .await?
        .into_iter()
        .map(|(_, master)| master)
        .collect();
    masters.sort();
    masters.dedup();
    Ok(masters)
}

/// The Cluster's slot ranges and the address of each one's master
/// (`CLUSTER SLOTS`, asked of any node).
pub(super) async fn slot_map(conn: &ClusterConnection) -> RedisResult<SlotMap> {
    let mut conn = conn.clone();
    let ranges: Vec<Value> = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query_async(&mut conn)
        .await?;
    let mut map = Vec::with_capacity(ranges.len());
    for range in ranges {
        let Value::Array(fields) = range else {
            continue;
        };
        let mut fields = fields.into_iter();
        let (Some(start), Some(end), Some(Value::Array(master))) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let mut master = master.into_iter();
        let (Some(host), Some(port)) = (master.next(), master.next()) else {
            continue;
        };
        let slots = redis::from_redis_value(start)?..=redis::from_redis_value(end)?;
        let address = (
            redis::from_redis_value(host)?,
            redis::from_redis_value(port)?,
        );
        map.push((slots, address));
    }
    Ok(map)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_follow_the_hash_tag() {
        // Values as `CLUSTER KEYSLOT` gives them.
        assert_eq!(slot("foo"), 12182);
        assert_eq!(slot("{foo}:bar"), 12182);
        assert_ne!(slot("{svc/0}:stream"), slot("{svc/1}:stream"));
        assert_eq!(slot("{svc/0}:stream"), slot("{svc/0}:owner"));
    }

    #[test]
    fn commands_have_the_slot_of_their_key() {
        let mut xack = redis::cmd("XACK");
        xack.arg("{svc/3}:stream").arg("g").arg("1-0");
        assert_eq!(command_slot(&xack), Some(slot("{svc/3}")));
        assert_eq!(command_slot(&redis::cmd("TIME")), None);
        let mut read = redis::cmd("XREADGROUP");
        read.arg("GROUP").arg("g").arg("c").arg("COUNT").arg(1);
        read.arg("STREAMS").arg("{svc/5}:stream").arg(">");
        assert_eq!(command_slot(&read), Some(slot("{svc/5}")));
        let mut script = redis::cmd("EVALSHA");
        script
            .arg("abc")
            .arg(2)
            .arg("{svc/7}:owner")
            .arg("{svc/7}:stream");
        assert_eq!(command_slot(&script), Some(slot("{svc/7}")));
        let mut create = redis::cmd("XGROUP");
        create.arg("CREATE").arg("{svc/9}:stream").arg("g").arg("$");
        assert_eq!(command_slot(&create), Some(slot("{svc/9}")));
        // An empty tag is no tag.
        assert_eq!(slot("{}foo"), slot("{}foo"));
        assert_ne!(slot("{}foo"), slot(""));
    }
}
