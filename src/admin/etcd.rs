//! `peerq status` of a service whose membership is on etcd (docs/design.md
//! §2.2): the endpoints its instances use, the cluster's members and leader,
//! and the last closed round's instances.

use serde::Serialize;

use crate::config::ServiceName;
use crate::error::Result;
use crate::keys;

/// The etcd side of a service's status. Its JSON: `endpoints`, `members`
/// (each `name`, `client_urls`, `leader`), `round` (null, or `number` and
/// `instances`), `error` (null, or why the cluster could not be read).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct EtcdStatus {
    /// The client URLs the instances use, as the last one to start wrote
    /// them (`{N}:etcd`).
    pub endpoints: Vec<String>,
    /// The cluster's members, as its member list says.
    pub members: Vec<EtcdMember>,
    /// The newest closed round: the instances counted for the next epoch.
    pub round: Option<EtcdRound>,
    /// Why the cluster could not be read, if it could not (unreachable,
    /// no leader, a user needed, or peerq built without `etcd`).
    pub error: Option<String>,
}

/// One member of the etcd cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct EtcdMember {
    /// Its name (`--name`).
    pub name: String,
    /// Its client URLs.
    pub client_urls: Vec<String>,
    /// Whether it is the cluster's leader.
    pub leader: bool,
}

/// A closed etcd round of the service.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct EtcdRound {
    /// The round's number (its instances hold indices in the next epoch).
    pub number: u64,
    /// Its instances in index order, as `<id>@<weight>`.
    pub instances: Vec<String>,
}

/// How the admin reaches a cluster that asks for TLS or a user.
#[cfg(feature = "etcd")]
#[derive(Debug, Default)]
pub(super) struct Access {
    pub(super) tls: Option<crate::connection::Tls>,
    pub(super) auth: Option<crate::membership::EtcdAuth>,
}

/// The etcd status of service `name` whose rounds live under `prefix`.
pub(super) async fn read(
    admin: &super::Admin,
    name: &ServiceName,
    prefix: &str,
) -> Result<EtcdStatus> {
    let mut get = deadpool_redis::redis::cmd("GET");
    get.arg(keys::etcd(name));
    let stored: Option<String> = admin.conn.query(&get).await?;
    let endpoints: Vec<String> = stored
        .and_then(|s| serde_json::from_str(&s).ok())
        .unwrap_or_default();
    let mut status = EtcdStatus {
        endpoints,
        ..EtcdStatus::default()
    };
    if status.endpoints.is_empty() {
        status.error = Some(format!(
            "no instance recorded its etcd endpoints in `{}`",
            keys::etcd(name)
        ));
        return Ok(status);
    }
    // One endpoint after the other, until one answers: a node that is
    // down must not hide the others.
    #[cfg(feature = "etcd")]
    for endpoint in status.endpoints.clone() {
        match cluster(&mut status, &admin.etcd, &endpoint, name, prefix).await {
            Ok(()) => {
                status.error = None;
                break;
            }
            Err(e) => status.error = Some(format!("{endpoint}: {e}")),
        }
    }
    #[cfg(not(feature = "etcd"))]
    {
        let _ = prefix;
        status.error = Some("this peerq was built without its `etcd` feature".to_owned());
    }
    Ok(status)
}

/// Fills in the cluster's members and the newest closed round, as
/// `endpoint` answers.
#[cfg(feature = "etcd")]
async fn cluster(
    status: &mut EtcdStatus,
    access: &Access,
    endpoint: &str,
    name: &ServiceName,
    prefix: &str,
) -> std::result::Result<(), etcd_client::Error> {
    use etcd_client::{Client, ConnectOptions, GetOptions, SortOrder, SortTarget};
    use std::time::Duration;

    let mut options = ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(2))
        .with_timeout(Duration::from_secs(2));
    if let Some(auth) = &access.auth {
        options = options.with_user(&auth.user, &auth.password);
    }
    if let Some(tls) = &access.tls {
        let config =
            crate::membership::tls_options(tls).map_err(etcd_client::Error::InvalidArgs)?;
        options = options.with_tls(config);
    }
    let mut client = Client::connect([endpoint], Some(options)).await?;
    let leader = client.status().await?.leader();
    status.members = client
        .member_list()
        .await?
        .members()
        .iter()
        .map(|m| EtcdMember {
            name: m.name().to_owned(),
            client_urls: m.client_urls().to_vec(),
            leader: m.id() == leader,
        })
        .collect();
    // The newest close key: rounds' keys sort by creation, so the last
    // created `closed` under the service's prefix.
    let rounds = format!("{prefix}/{name}/rounds/");
    let newest = client
        .get(
            rounds.clone(),
            Some(
                GetOptions::new()
                    .with_prefix()
                    .with_sort(SortTarget::Create, SortOrder::Descend),
            ),
        )
        .await?;
    status.round = newest.kvs().iter().find_map(|kv| {
        let key = kv.key_str().ok()?.strip_prefix(&rounds)?;
        let number = key.strip_suffix("/closed")?.parse().ok()?;
        let instances = serde_json::from_slice(kv.value()).ok()?;
        Some(EtcdRound { number, instances })
    });
    Ok(())
}
