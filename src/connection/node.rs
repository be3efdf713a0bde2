//! How peerq's own connections reach one node of a Redis Cluster (its
//! pipelines, its idle reads): with the first seed node's user, password
//! and TLS settings, at the address the slot map gives.

use std::time::Duration;

use deadpool_redis::redis::aio::MultiplexedConnection;
use deadpool_redis::redis::{self, AsyncConnectionConfig, ConnectionAddr, ConnectionInfo};

use super::CONNECT_TIMEOUT;
#[cfg(feature = "tls")]
use super::tls;
use super::tls::Tls;
use crate::error::Result;

/// What a connection to one node is made with.
#[derive(Clone)]
pub(crate) struct NodeSettings {
    /// The first seed node's settings: user, password, TLS parameters.
    pub(crate) seed: ConnectionInfo,
    /// What connections to one node trust and present.
    pub(crate) tls: Option<Tls>,
}

impl NodeSettings {
    /// A connection of its own to the node at `host:port`, with the seed
    /// node's user, password and TLS settings, whose replies may take up to
    /// `timeout`.
    pub(crate) async fn connect(
        &self,
        host: &str,
        port: u16,
        timeout: Duration,
    ) -> Result<MultiplexedConnection> {
        let addr = match self.seed.addr() {
            ConnectionAddr::TcpTls {
                insecure,
                tls_params,
                ..
            } => ConnectionAddr::TcpTls {
                host: host.to_owned(),
                port,
                insecure: *insecure,
                tls_params: tls_params.clone(),
            },
            _ => ConnectionAddr::Tcp(host.to_owned(), port),
        };
        let info = self.seed.clone().set_addr(addr);
        let client = match &self.tls {
            #[cfg(feature = "tls")]
            Some(tls) => tls::client(info, tls)?,
            _ => redis::Client::open(info)?,
        };
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(CONNECT_TIMEOUT))
            .set_response_timeout(Some(timeout));
        Ok(client
            .get_multiplexed_async_connection_with_config(&config)
            .await?)
    }
}
