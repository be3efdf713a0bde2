//! `peerq ids status|repair|init`: a sequence of monotonic IDs over a
//! majority of Redis servers (`peerq::ids::MajorityIds`), for the operator
//! who restarted a server empty or starts a new sequence.

use peerq::ids::{MajorityIds, ServerState, ServerStatus};
use serde::Serialize;

use crate::args::{Ids, Sequence};
use crate::table::Table;

/// One server in `status`'s answer. JSON: `server` (its URL without the
/// password), `state` (`holds`, `needs_repair`, `unreachable`, `refused`),
/// `value` (with `holds`) and `detail` (why, with `unreachable` and
/// `refused`).
#[derive(Serialize)]
struct Server {
    server: String,
    state: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    value: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    detail: Option<String>,
}

impl From<ServerStatus> for Server {
    fn from(status: ServerStatus) -> Self {
        let (state, value, detail) = match status.state {
            ServerState::Holds(value) => ("holds", Some(value), None),
            ServerState::NeedsRepair => ("needs_repair", None, None),
            ServerState::Unreachable(why) => ("unreachable", None, Some(why)),
            ServerState::Refused(why) => ("refused", None, Some(why)),
            _ => ("unknown", None, None),
        };
        Server {
            server: status.server,
            state,
            value,
            detail,
        }
    }
}

/// `repair`'s answer. JSON: `value` (what the repaired servers were set
/// to) and `repaired` (their URLs; empty when none needed it).
#[derive(Serialize)]
struct Repaired {
    value: u64,
    repaired: Vec<String>,
}

/// `init`'s answer. JSON: `key` (the Redis key) and `first`.
#[derive(Serialize)]
struct Created<'a> {
    key: &'a str,
    first: u64,
}

/// Runs an `ids` command; its output, or the message of what went wrong
/// (URLs without their passwords).
pub(crate) async fn run(command: Ids, tls: Option<peerq::Tls>) -> Result<String, String> {
    match command {
        Ids::Status(sequence) => {
            let ids = connect(&sequence, tls).await?;
            let servers: Vec<Server> = ids.status().await.into_iter().map(Server::from).collect();
            sequence.output.show(&servers, || table(&servers))
        }
        Ids::Repair(sequence) => {
            let ids = connect(&sequence, tls).await?;
            let done = ids.repair().await.map_err(|e| e.to_string())?;
            let repaired = Repaired {
                value: done.value,
                repaired: done.servers,
            };
            sequence.output.show(&repaired, || {
                if repaired.repaired.is_empty() {
                    return format!("nothing to repair (value {})\n", repaired.value);
                }
                repaired
                    .repaired
                    .iter()
                    .map(|server| format!("repaired {server} at {}\n", repaired.value))
                    .collect()
            })
        }
        Ids::Init { sequence, first } => {
            let ids = connect(&sequence, tls).await?;
            ids.init(first).await.map_err(|e| e.to_string())?;
            let created = Created {
                key: ids.key(),
                first,
            };
            sequence.output.show(&created, || {
                format!("created {} (first ID {first})\n", created.key)
            })
        }
    }
}

async fn connect(sequence: &Sequence, tls: Option<peerq::Tls>) -> Result<MajorityIds, String> {
    let mut builder = MajorityIds::builder()
        .servers(sequence.servers.iter().map(|s| s.trim().to_owned()))
        .key(&sequence.key);
    if let Some(tls) = tls {
        builder = builder.tls(tls);
    }
    if sequence.allow_unsafe_durability {
        builder = builder.allow_unsafe_durability();
    }
    builder.build().await.map_err(|e| e.to_string())
}

/// `status` as a table: one line per server.
fn table(servers: &[Server]) -> String {
    let mut table = Table::new(&["SERVER", "STATE", "VALUE"]);
    for s in servers {
        let what = match (&s.value, &s.detail) {
            (Some(value), _) => value.to_string(),
            (None, Some(detail)) => detail.clone(),
            (None, None) => String::new(),
        };
        table.row(vec![s.server.clone(), s.state.replace('_', " "), what]);
    }
    table.render()
}
