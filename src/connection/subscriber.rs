//! Pub/sub connections (docs/design.md §14): what wakes a task's owner on
//! a user's cancel and a caller of `wait` when the task ends, so neither
//! polls. On one server, `SUBSCRIBE` on a RESP3 connection of its own; on
//! a Cluster, `SSUBSCRIBE` (a sharded channel lives in the slot of its
//! hash tag, so the scripts that publish in a partition's slot can), through
//! redis-rs's Cluster client, which follows the channel's slot and
//! subscribes again after a failover.
//!
//! This module makes such connections; `channels` shares one among many
//! listeners, and makes it again after a break (telling them
//! [`Event::Again`], as messages may have been lost meanwhile).

use deadpool_redis::redis::{
    AsyncConnectionConfig, Client, IntoConnectionInfo, ProtocolVersion, PushInfo,
};
use tokio::sync::mpsc;

use super::tls::Tls;
use super::{CONNECT_TIMEOUT, RESPONSE_TIMEOUT};
use crate::error::{Error, Result};

/// Where pub/sub connections go: the server's URL or the Cluster's seeds,
/// with their TLS settings.
#[derive(Clone, Debug)]
pub(crate) enum Source {
    Node(String, Option<Tls>),
    /// The master the sentinels name at each (re)connect.
    Sentinel(std::sync::Arc<super::sentinel::Sentinel>),
    Cluster(Vec<String>, Option<Tls>),
}

/// What a subscription hears.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Event {
    /// A message on the channel.
    Message(Vec<u8>),
    /// Subscribed again after a broken connection: messages may have been
    /// missed.
    Again,
}

/// The error for a Redis given as a pool: its URL is not known, so no
/// pub/sub connection can be made.
pub(crate) fn no_pubsub() -> Error {
    Error::invalid(
        "redis",
        "waiting for a task and cancelling a running one need pub/sub; give the Redis \
         by its URL or as a Cluster, not as a pool",
    )
}

/// A connection that holds subscriptions (dropping it unsubscribes).
pub(crate) enum Held {
    Node(deadpool_redis::redis::aio::MultiplexedConnection),
    Cluster(deadpool_redis::redis::cluster_async::ClusterConnection),
}

impl Held {
    /// Subscribes to one more channel (sharded on a Cluster).
    pub(crate) async fn subscribe(&mut self, channel: &str) -> Result<()> {
        match self {
            Held::Node(conn) => conn.subscribe(channel).await?,
            Held::Cluster(conn) => conn.ssubscribe(channel).await?,
        }
        Ok(())
    }
}

/// A connection subscribed to `channels` whose messages go to `pushes`.
pub(crate) async fn connect_many(
    source: &Source,
    channels: &[String],
    pushes: mpsc::UnboundedSender<PushInfo>,
) -> Result<Held> {
    let mut held = match source {
        Source::Node(url, tls) => {
            let client = node_client(url, tls.as_ref())?;
            let config = AsyncConnectionConfig::new()
                .set_push_sender(pushes)
                .set_connection_timeout(Some(CONNECT_TIMEOUT))
                .set_response_timeout(Some(RESPONSE_TIMEOUT));
            let conn = client
                .get_multiplexed_async_connection_with_config(&config)
                .await?;
            Held::Node(conn)
        }
        Source::Sentinel(sentinel) => {
            let config = AsyncConnectionConfig::new()
                .set_push_sender(pushes)
                .set_connection_timeout(Some(CONNECT_TIMEOUT))
                .set_response_timeout(Some(RESPONSE_TIMEOUT));
            Held::Node(sentinel.connect_resp3(&config).await?)
        }
        Source::Cluster(seeds, tls) => {
            let mut infos = Vec::with_capacity(seeds.len());
            for url in seeds {
                infos.push(
                    url.as_str()
                        .into_connection_info()
                        .map_err(|e| super::redact::not_a_url("redis_cluster", url, e))?,
                );
            }
            let builder = deadpool_redis::redis::cluster::ClusterClientBuilder::new(infos)
                .use_protocol(ProtocolVersion::RESP3)
                .push_sender(pushes)
                .connection_timeout(CONNECT_TIMEOUT);
            #[cfg(feature = "tls")]
            let builder = match tls {
                Some(tls) => builder.certs(tls.certificates()?),
                None => builder,
            };
            #[cfg(not(feature = "tls"))]
            if tls.is_some() {
                return Err(super::tls::unavailable());
            }
            let client = builder
                .build()
                .map_err(|e| Error::invalid("redis_cluster", e.to_string()))?;
            Held::Cluster(client.get_async_connection().await?)
        }
    };
    for channel in channels {
        held.subscribe(channel).await?;
    }
    Ok(held)
}

/// A client of the server at `url` that speaks RESP3 (pushes).
fn node_client(url: &str, tls: Option<&Tls>) -> Result<Client> {
    let info = url
        .into_connection_info()
        .map_err(|e| super::redact::not_a_url("redis", url, e))?;
    let settings = info
        .redis_settings()
        .clone()
        .set_protocol(ProtocolVersion::RESP3);
    let info = info.set_redis_settings(settings);
    match tls {
        #[cfg(feature = "tls")]
        Some(tls) => super::tls::client(info, tls),
        #[cfg(not(feature = "tls"))]
        Some(_) => Err(super::tls::unavailable()),
        None => Client::open(info).map_err(|e| super::redact::not_a_url("redis", url, e)),
    }
}
