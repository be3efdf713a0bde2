//! A service's layout, and starting a reshard (docs/design.md §21): what
//! the admin API, the CLI and the dashboard call.

use std::sync::LazyLock;
use std::time::Duration;

use deadpool_redis::redis::{self, Script, Value};
use serde::Serialize;

use super::Service;
use crate::config::ServiceName;
use crate::connection::SharedConnection;
use crate::error::ReshardRefused;
use crate::error::{Error, Result};
use crate::keys;
use crate::presence::GONE_AFTER_INTERVALS;
use crate::reshard::{Layout, Phase};

static RESHARD: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/reshard.lua")));

/// A reshard that started: producers now write generation `generation`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Resharded {
    /// The generation written to from now on.
    pub generation: u32,
    /// Its partitions per level.
    pub partitions: u32,
    /// The partitions per level of the generation it replaces.
    pub from_partitions: u32,
}

/// A service's layout as `peerq status` shows it (docs/design.md §21).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ServiceLayout {
    /// The generation producers write to (0: never resharded).
    pub generation: u32,
    /// Its partitions per level.
    pub partitions: u32,
    /// `settled` (no reshard under way), `draining` (the previous
    /// generation drains) or `open` (the new one is live from
    /// `open_epoch`).
    pub state: String,
    /// The generation being replaced and its partitions per level, while
    /// a reshard is under way or just opened.
    pub from_generation: Option<u32>,
    /// See `from_generation`.
    pub from_partitions: Option<u32>,
    /// The epoch from which the new generation is live.
    pub open_epoch: Option<u64>,
    /// When the reshard started and opened (Unix ms, Redis's clock).
    pub started_ms: Option<u64>,
    /// See `started_ms`.
    pub opened_ms: Option<u64>,
    /// The replaced generation's partitions, every level's, and how many
    /// of them are sealed and retired so far (the reshard's progress).
    pub replaced: Option<u32>,
    /// See `replaced`.
    pub sealed: Option<u32>,
    /// See `replaced`.
    pub retired: Option<u32>,
}

impl ServiceLayout {
    fn of(layout: Option<&Layout>, first_partitions: u32) -> ServiceLayout {
        let Some(l) = layout else {
            return ServiceLayout {
                generation: 0,
                partitions: first_partitions,
                state: "settled".into(),
                from_generation: None,
                from_partitions: None,
                open_epoch: None,
                started_ms: None,
                opened_ms: None,
                replaced: None,
                sealed: None,
                retired: None,
            };
        };
        let (state, open_epoch) = match l.phase {
            Phase::Draining => ("draining", None),
            Phase::Open { open_epoch } => ("open", Some(open_epoch)),
        };
        ServiceLayout {
            generation: l.current.number,
            partitions: l.current.partitions,
            state: state.into(),
            from_generation: l.from.map(|g| g.number),
            from_partitions: l.from.map(|g| g.partitions),
            open_epoch,
            started_ms: l.started_ms,
            opened_ms: l.opened_ms,
            replaced: None,
            sealed: None,
            retired: None,
        }
    }
}

/// Reads service `name`'s layout (`first_partitions`: its `{N}:meta`
/// count, the layout of a service never resharded).
async fn read_layout(
    conn: &SharedConnection,
    name: &ServiceName,
    first_partitions: u32,
    levels: u32,
) -> Result<ServiceLayout> {
    let layout = crate::reshard::read_layout(conn, name).await?;
    let mut shown = ServiceLayout::of(layout.as_ref(), first_partitions);
    let Some(from) = layout.and_then(|l| l.from) else {
        return Ok(shown);
    };
    // The progress: which of the replaced partitions are sealed, retired.
    let units: Vec<u32> = from.units(levels).collect();
    let mut pipe = redis::pipe();
    for &u in &units {
        pipe.cmd("EXISTS").arg(keys::sealed(name, u));
        pipe.cmd("EXISTS").arg(keys::retired(name, u));
    }
    let found: Vec<u32> = conn.query_pipe(&pipe).await?;
    let count = |at: usize| found.iter().skip(at).step_by(2).sum::<u32>();
    shown.replaced = Some(units.len() as u32);
    shown.sealed = Some(count(0));
    shown.retired = Some(count(1));
    Ok(shown)
}

/// Starts a reshard of service `name` to `partitions` per level, or says
/// why not ([`ReshardRefused`]); `first_partitions` is its `{N}:meta`
/// count and `interval` its rounds'.
async fn start(
    conn: &SharedConnection,
    name: &ServiceName,
    first_partitions: u32,
    interval: Duration,
    partitions: u32,
) -> Result<Resharded> {
    if let Err(Error::InvalidSetting { message, .. }) =
        crate::config::validate_partitions(partitions)
    {
        return Err(Error::ReshardRefused(ReshardRefused::Partitions {
            partitions,
            message,
        }));
    }
    let mut script = RESHARD.key(keys::layout(name));
    script
        .key(keys::members(name))
        .arg(partitions)
        .arg(first_partitions)
        .arg(interval.as_millis() as u64)
        .arg((interval * GONE_AFTER_INTERVALS).as_millis() as u64);
    let reply: Vec<Value> = conn.invoke(&script).await?;
    let text = |i: usize| -> String {
        reply
            .get(i)
            .and_then(|v| redis::from_redis_value::<String>(v.clone()).ok())
            .unwrap_or_default()
    };
    let number = |i: usize| text(i).parse::<u32>().unwrap_or(0);
    match text(0).as_str() {
        "ok" => Ok(Resharded {
            generation: number(1),
            partitions,
            from_partitions: number(2),
        }),
        "running" => Err(Error::ReshardRefused(ReshardRefused::Running {
            generation: number(1),
            state: text(2),
        })),
        "partitions" => Err(Error::ReshardRefused(ReshardRefused::Partitions {
            partitions,
            message: format!("the service has {partitions} partitions already"),
        })),
        "member" => Err(Error::ReshardRefused(ReshardRefused::Member {
            instance: text(1),
            version: text(2),
        })),
        "idle" => Err(Error::ReshardRefused(ReshardRefused::Idle)),
        other => Err(Error::Redis(redis::RedisError::from((
            redis::ErrorKind::UnexpectedReturnType,
            "reshard.lua answered unexpectedly",
            other.to_owned(),
        )))),
    }
}

impl Service {
    /// The service's layout: its generation of partitions and, while a
    /// reshard is under way, the one it replaces.
    pub async fn layout(&self) -> Result<ServiceLayout> {
        let levels = self.settings.levels();
        read_layout(&self.admin.conn, &self.name, self.partitions(), levels).await
    }

    /// Starts a reshard to `partitions` partitions (per level): producers
    /// write the new generation from now on, the old one drains, and the
    /// new one is live once it has (docs/design.md §21). Refused with an
    /// [`Error::ReshardRefused`] naming why:
    /// `running` (another has not settled), `partitions` (out of range, or
    /// the count in use), `member` (a running instance takes no part in
    /// a reshard: a consumer of a previous version) or `idle` (no
    /// consumer runs to carry it out).
    pub async fn reshard(&self, partitions: u32) -> Result<Resharded> {
        start(
            &self.admin.conn,
            &self.name,
            self.partitions(),
            self.settings.interval(),
            partitions,
        )
        .await
    }
}
