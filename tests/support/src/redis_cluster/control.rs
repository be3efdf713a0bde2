//! The harness's own connections to one node of a [`RedisCluster`]: plain
//! or TLS as the node serves, each fresh and bounded by
//! [`CONTROL_TIMEOUT`], for the checks and operations that must reach a
//! node directly rather than follow redirects.

use deadpool_redis::redis;

use super::topology::{NodeLine, parse_nodes};
use super::{CONTROL_TIMEOUT, RedisCluster};

/// `redis://127.0.0.1:<port>/`: a node the harness did not start (none
/// should be) is taken to speak plain TCP.
pub(super) fn plain_url(port: u16) -> String {
    format!("redis://127.0.0.1:{port}/")
}

impl RedisCluster {
    /// The port of the master that holds `key` now (see
    /// [`holders`](Self::holders)).
    pub fn holder(&self, key: &str) -> Option<u16> {
        self.holders(&[key.to_owned()]).remove(0)
    }

    /// For each key, the port of the master that holds it now, asked of
    /// every master directly over one connection each (a master without
    /// it answers 0, or `MOVED`); `None` when none does.
    pub fn holders(&self, keys: &[String]) -> Vec<Option<u16>> {
        let mut holders = vec![None; keys.len()];
        for master in self.masters() {
            let mut con = self.node_connection(master.port).unwrap_or_else(|err| {
                self.fail(&format!("connect to node {}: {err}", master.port))
            });
            for (key, holder) in keys.iter().zip(&mut holders) {
                let exists: bool = super::super::retry_interrupted(|| {
                    redis::cmd("EXISTS").arg(key).query(&mut con)
                })
                .unwrap_or(false);
                if exists {
                    *holder = Some(master.port);
                }
            }
        }
        holders
    }

    /// A fresh control connection to the node on `port`, over TLS on a TLS
    /// cluster (trusting the test CA, presenting the test client
    /// certificate).
    pub(super) fn node_connection(&self, port: u16) -> redis::RedisResult<redis::Connection> {
        let client = match self.nodes.iter().find(|node| node.port() == port) {
            Some(node) => node.client(),
            None => redis::Client::open(plain_url(port))?,
        };
        super::super::connect_client(&client, CONTROL_TIMEOUT)
    }

    /// `CLUSTER NODES` of the node on `port`, parsed.
    pub(super) fn node_lines(&self, port: u16) -> Result<Vec<NodeLine>, String> {
        let text: String = self.node_query(port, redis::cmd("CLUSTER").arg("NODES"))?;
        parse_nodes(&text).map_err(|err| format!("node {port}: {err}"))
    }

    /// Runs `cmd` on the node on `port` over a fresh control connection.
    pub(super) fn node_query<T: redis::FromRedisValue>(
        &self,
        port: u16,
        cmd: &redis::Cmd,
    ) -> Result<T, String> {
        let describe = || {
            let args: Vec<String> = cmd
                .args_iter()
                .take(3)
                .map(|arg| match arg {
                    redis::Arg::Simple(bytes) => String::from_utf8_lossy(bytes).into_owned(),
                    _ => "?".to_owned(),
                })
                .collect();
            args.join(" ")
        };
        let mut con = self
            .node_connection(port)
            .map_err(|err| format!("connect to node {port}: {err}"))?;
        super::super::retry_interrupted(|| cmd.query(&mut con))
            .map_err(|err| format!("{} on node {port}: {err}", describe()))
    }
}
