//! A minimal cluster client for the tests' own checks: one command, sent
//! where a client without a slot map would send it, following the
//! redirects a real cluster client must follow.

use deadpool_redis::redis;

use super::super::retry_interrupted;
use super::RedisCluster;

/// Redirects followed before giving up: a settled cluster needs one
/// (`MOVED`), a slot in migration two (`ASK`, then the answer).
const MAX_REDIRECTS: usize = 5;

impl RedisCluster {
    /// Runs `cmd` as a cluster client would: sends it to the first live
    /// node in start order, follows `MOVED` to the node it names, and on
    /// `ASK` sends `ASKING` then `cmd` to the importing node.
    ///
    /// Any other error, and a redirect chain longer than 5, is returned.
    /// Starting at a fixed node rather than the key's master is what makes
    /// the redirects happen, so a test can check them.
    pub fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> redis::RedisResult<T> {
        let mut port = self
            .live()
            .next()
            .map(|node| node.port())
            .expect("a node of the cluster is running");
        let mut asking = false;
        for _ in 0..MAX_REDIRECTS {
            let mut con = self.node_connection(port)?;
            if asking {
                let () = retry_interrupted(|| redis::cmd("ASKING").query(&mut con))?;
            }
            let err = match retry_interrupted(|| cmd.query::<T>(&mut con)) {
                Ok(value) => return Ok(value),
                Err(err) => err,
            };
            let Some((addr, _slot)) = err.redirect_node() else {
                return Err(err);
            };
            asking = err.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::Ask);
            port = addr
                .rsplit_once(':')
                .and_then(|(_, port)| port.parse().ok())
                .ok_or_else(|| err.clone())?;
        }
        Err(redis::RedisError::from((
            redis::ErrorKind::Client,
            "too many cluster redirects",
        )))
    }
}
