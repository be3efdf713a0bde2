//! Service-wide settings in `{N}:meta` (docs/design.md §3).
//!
//! Some settings only work when every instance (and producer) of a service
//! agrees on them: the interval, the skew, the partitions. The first process
//! to start records its values; every later one compares and is refused with
//! an error naming each difference. Each part records only its own fields,
//! so a producer does not need to know the indexer's interval.
//!
//! The `kind` field says what runs under the name, so that a standalone
//! peer indexer cannot silently join a consumer service's membership.

use std::sync::LazyLock;

use deadpool_redis::redis::{self, Script, aio::ConnectionLike};

use crate::config::ServiceName;
use crate::connection::SharedConnection;
use crate::error::{Error, Result, SettingDiff, SettingsMismatch};
use crate::keys;

static ENSURE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/meta_ensure.lua")));

/// The `{N}:meta` field that records what runs under a service's name.
pub(crate) const KIND: &str = "kind";

/// What runs under a service's name, recorded in `{N}:meta` as `kind`.
///
/// A standalone [`Indexer`](crate::indexer::Indexer) counts as an instance
/// of whatever service it names: beside consumers it would raise their
/// replica count and take a share of the partitions that no one then
/// processes. Recording the kind lets each refuse the other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Consumers (each with its own peer indexer).
    Consumer,
    /// Standalone peer indexers.
    Indexer,
    /// Standalone singletons ([`crate::singleton::Singleton`]).
    Singleton,
}

impl Kind {
    /// The kind's `{N}:meta` field.
    pub(crate) fn field(self) -> (&'static str, String) {
        let kind = match self {
            Kind::Consumer => "consumer",
            Kind::Indexer => "indexer",
            Kind::Singleton => "singleton",
        };
        (KIND, kind.to_owned())
    }
}

/// The partitions `{N}:meta` records for service `name` as `stored`: an
/// error naming the setting when it is not 1 to 4096 (written by hand).
/// What a producer or a consumer given none takes.
pub(crate) fn recorded_partitions(name: &ServiceName, stored: &str) -> Result<u32> {
    stored
        .parse()
        .ok()
        .filter(|p| crate::config::validate_partitions(*p).is_ok())
        .ok_or_else(|| {
            Error::invalid(
                "partitions",
                format!(
                    "`{}` records partitions = {stored:?}, which is not 1 to 4096",
                    keys::meta(name)
                ),
            )
        })
}

/// The partitions of service `name`'s first generation, as `{N}:meta`
/// records them (docs/design.md §21: a reshard leaves them as they were).
pub(crate) async fn first_partitions(conn: &SharedConnection, name: &ServiceName) -> Result<u32> {
    let mut get = redis::cmd("HGET");
    get.arg(keys::meta(name)).arg("partitions");
    let stored: Option<String> = conn.query(&get).await?;
    recorded_partitions(name, stored.as_deref().unwrap_or_default())
}

/// Records `fields` for the service where absent, and fails if any is stored
/// with another value.
pub(crate) async fn ensure<C: ConnectionLike + Send>(
    conn: &mut C,
    name: &ServiceName,
    fields: &[(&'static str, String)],
) -> Result<()> {
    let differ = differences(conn, name, fields).await?;
    if differ.is_empty() {
        return Ok(());
    }
    let key = keys::meta(name);
    let advice = if differ.iter().any(|d| d.setting == KIND) {
        "A standalone Indexer or Singleton and a consumer service cannot share a name, nor can \
         an Indexer and a Singleton: each counts as one of the others' instances and takes a \
         share of their partitions or singletons that no one then runs. Give it a name of its \
         own (a consumer's standing is in `ConsumerBuilder::standing()`, and a consumer runs \
         singletons with `ConsumerBuilder::singleton`)"
            .to_owned()
    } else {
        format!(
            "Every instance of a service must use the same values; to change them, stop all \
             instances and delete `{key}`"
        )
    };
    Err(mismatch(name, differ, advice))
}

/// Records `fields` for the service where absent, and returns those stored
/// with another value. One script, so two processes starting at once cannot
/// both record their own values.
pub(crate) async fn differences<C: ConnectionLike + Send>(
    conn: &mut C,
    name: &ServiceName,
    fields: &[(&'static str, String)],
) -> Result<Vec<SettingDiff>> {
    let mut inv = ENSURE.key(keys::meta(name));
    for (field, value) in fields {
        inv.arg(*field).arg(value);
    }
    let differ: Vec<String> = inv.invoke_async(conn).await?;
    let settings = differ
        .chunks(2)
        .map(|pair| {
            let ours = fields
                .iter()
                .find(|(f, _)| *f == pair[0])
                .map(|(_, v)| v.clone())
                .unwrap_or_default();
            SettingDiff {
                setting: pair[0].clone(),
                ours,
                stored: pair[1].clone(),
            }
        })
        .collect();
    Ok(settings)
}

/// The error for `settings` that differ from service `name`'s, with what to
/// do about them.
pub(crate) fn mismatch(name: &ServiceName, settings: Vec<SettingDiff>, advice: String) -> Error {
    Error::SettingsMismatch(SettingsMismatch {
        key: keys::meta(name),
        settings,
        advice,
    })
}
