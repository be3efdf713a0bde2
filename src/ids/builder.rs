//! The builder of [`MajorityIds`]: the servers, the sequence, the
//! deadline of a call, and the two opt-outs; everything is validated in
//! [`build`](MajorityIdsBuilder::build), before a server is asked anything.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;

use super::server::{Failure, Server};
use super::{IdsError, Inner, MajorityIds};
use crate::connection::{self, Tls, redact};
use crate::error::{Error, Result};
use crate::keys;
use crate::retry::Backoff;

/// How long a call may keep trying, by default.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
/// The pauses between attempts, by default: short, since a lost attempt
/// costs a few round trips, and random, so that callers that collided do
/// not collide again.
const DEFAULT_BACKOFF: Backoff =
    Backoff::exponential(Duration::from_millis(1), Duration::from_millis(100));
/// The fewest servers that survive the loss of one.
const MIN_SERVERS: usize = 3;
/// The longest sequence name.
const MAX_KEY_LEN: usize = 128;

/// Builds a [`MajorityIds`]; see there for an example.
#[must_use]
#[derive(Clone, Default)]
pub struct MajorityIdsBuilder {
    servers: Vec<String>,
    key: Option<String>,
    tls: Option<Tls>,
    timeout: Option<Duration>,
    backoff: Option<Backoff>,
    unsafe_durability: bool,
    fewer_servers: bool,
}

impl fmt::Debug for MajorityIdsBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let servers: Vec<String> = self.servers.iter().map(|s| redact(s)).collect();
        f.debug_struct("MajorityIdsBuilder")
            .field("servers", &servers)
            .field("key", &self.key)
            .field("tls", &self.tls)
            .field("timeout", &self.timeout)
            .field("backoff", &self.backoff)
            .field("unsafe_durability", &self.unsafe_durability)
            .field("fewer_servers", &self.fewer_servers)
            .finish()
    }
}

impl MajorityIdsBuilder {
    /// The URLs of the independent Redis servers (not replicas of one
    /// another, not nodes of one Cluster): at least 3. `redis://` or
    /// `rediss://`, with a user and password if they need one.
    pub fn servers<I, S>(mut self, urls: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.servers = urls.into_iter().map(Into::into).collect();
        self
    }

    /// The sequence's name, such as `invoices`: letters, digits, `_`, `-`,
    /// `.` and `:`. Its key on each server is `peerq:ids:<key>`.
    pub fn key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// TLS settings for `rediss://` servers (a CA, a client certificate),
    /// the same for every server.
    pub fn tls(mut self, tls: Tls) -> Self {
        self.tls = Some(tls);
        self
    }

    /// How long [`next`](MajorityIds::next) keeps trying before it fails
    /// (default 5 s), and how long the other calls wait for replies.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// The random pauses between attempts (default 1 ms doubling up to
    /// 100 ms, each drawn in the upper half of its range).
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = Some(backoff);
        self
    }

    /// Uses servers without `appendonly yes` and `appendfsync always`, or
    /// whose settings the client may not read (CONFIG denied by an ACL),
    /// without checking. A server that crashes may then forget IDs it
    /// acknowledged, and an ID may be issued twice: for tests, or for a
    /// persistence checked some other way.
    pub fn allow_unsafe_durability(mut self) -> Self {
        self.unsafe_durability = true;
        self
    }

    /// Accepts 1 or 2 servers: a majority of 2 is both, so losing either
    /// stops the IDs, and 1 survives no loss at all. For development.
    pub fn allow_fewer_servers(mut self) -> Self {
        self.fewer_servers = true;
        self
    }

    /// Validates the settings and connects to every server it can reach,
    /// checking each one's persistence. A server that is down is checked
    /// when it comes back, before its first vote.
    ///
    /// Errors: an invalid setting, naming it; a server that may lose
    /// acknowledged writes ([`IdsError::Unsafe`], naming it); a server
    /// that refused this client (a wrong password, an ACL).
    pub async fn build(self) -> Result<MajorityIds, IdsError> {
        let key = validate_key(self.key.as_deref())?;
        let n = self.servers.len();
        if n == 0 {
            return Err(IdsError::from(Error::invalid(
                "servers",
                "no servers given; pass the URLs of 3 or more independent Redis servers",
            )));
        }
        if n < MIN_SERVERS && !self.fewer_servers {
            return Err(IdsError::from(Error::invalid(
                "servers",
                format!(
                    "{n} servers cannot lose one and still make a majority; give at least \
                     {MIN_SERVERS} (an odd number: 3 or 5), or `allow_fewer_servers()` for \
                     development"
                ),
            )));
        }
        let timeout = self.timeout.unwrap_or(DEFAULT_TIMEOUT);
        if timeout.is_zero() {
            return Err(IdsError::from(Error::invalid(
                "timeout",
                "0 leaves no time for an attempt; use at least a few milliseconds",
            )));
        }
        let backoff = self.backoff.unwrap_or(DEFAULT_BACKOFF);
        backoff.validate()?;
        let check = !self.unsafe_durability;
        let servers = self
            .servers
            .iter()
            .map(|url| Server::new(url, self.tls.as_ref(), check))
            .collect::<Result<Vec<_>>>()?;
        refuse_duplicates(&servers)?;
        for (server, reached) in servers
            .iter()
            .zip(join_all(servers.iter().map(Server::connection)).await)
        {
            match reached {
                Ok(_) => {}
                Err(Failure::Unsafe(reason)) => {
                    return Err(IdsError::Unsafe {
                        server: server.name().to_owned(),
                        reason,
                    });
                }
                Err(Failure::Down(e)) if e.is_transient() => {
                    tracing::warn!(server = server.name(), cause = %e,
                        "ids server unreachable; it is checked when it is back");
                }
                Err(Failure::Down(e)) => return Err(connection::at(server.name(), e).into()),
            }
        }
        Ok(MajorityIds {
            inner: Arc::new(Inner {
                name: key.clone(),
                key: keys::ids(&key),
                servers,
                timeout,
                backoff,
            }),
        })
    }
}

/// The sequence's name, if it is one.
fn validate_key(key: Option<&str>) -> Result<String> {
    let Some(key) = key else {
        return Err(Error::invalid(
            "key",
            "no key given; name the sequence, such as .key(\"invoices\")",
        ));
    };
    let allowed = |c: char| c.is_ascii_alphanumeric() || "_-.:".contains(c);
    if key.is_empty() || key.len() > MAX_KEY_LEN || !key.chars().all(allowed) {
        return Err(Error::invalid(
            "key",
            format!("`{key}`: use 1 to {MAX_KEY_LEN} letters, digits, `_`, `-`, `.` or `:`"),
        ));
    }
    Ok(key.to_owned())
}

/// Refuses a server given twice: it would count as two votes, and a
/// majority of it and one other would not be a majority of servers.
fn refuse_duplicates(servers: &[Server]) -> Result<()> {
    let mut seen: HashMap<String, &Server> = HashMap::new();
    for server in servers {
        if let Some(first) = seen.insert(server.address(), server) {
            return Err(Error::invalid(
                "servers",
                format!(
                    "`{}` and `{}` are the same server; each must be a separate Redis",
                    first.name(),
                    server.name()
                ),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_a_plain_name() {
        assert_eq!(
            validate_key(Some("invoices:2026")).unwrap(),
            "invoices:2026"
        );
        for bad in ["", "in voices", "{x}", "a/b", &"k".repeat(MAX_KEY_LEN + 1)] {
            let msg = validate_key(Some(bad)).unwrap_err().to_string();
            assert!(msg.starts_with("invalid setting `key`"), "{msg}");
        }
        let msg = validate_key(None).unwrap_err().to_string();
        assert!(msg.contains("no key given"), "{msg}");
    }
}
