//! `peerq reshard`: a running service's new partition count
//! (docs/design.md §21).

use peerq::admin::Admin;
use serde::Serialize;

use crate::args::Named;
use crate::{failed, service};

/// `reshard`'s answer. JSON: `name`, `generation`, `partitions`,
/// `from_partitions`.
#[derive(Serialize)]
struct Started<'a> {
    name: &'a str,
    #[serde(flatten)]
    resharded: peerq::admin::Resharded,
}

/// `peerq reshard --name N --partitions P`.
pub(crate) async fn reshard(
    admin: &Admin,
    named: Named,
    partitions: u32,
) -> Result<String, String> {
    let service = service(admin, &named.name).await?;
    let resharded = service.reshard(partitions).await.map_err(failed)?;
    let started = Started {
        name: service.name(),
        resharded,
    };
    named.output.show(&started, || {
        format!(
            "{}: resharding from {} to {} partitions (generation {}); `peerq status` shows its \
             progress\n",
            started.name,
            started.resharded.from_partitions,
            started.resharded.partitions,
            started.resharded.generation
        )
    })
}
