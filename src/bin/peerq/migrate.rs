//! `peerq migrate --postgres URL`: applies peerq's PostgreSQL migrations
//! (`migrations/`, embedded in peerq) that the database lacks.

use serde::Serialize;

use crate::args::Migrate;

/// `migrate`'s answer. JSON: `applied` (each `version` and `name`, in
/// order; empty when the database was up to date) and `latest` (the newest
/// version this peerq has).
#[derive(Serialize)]
struct Migrated {
    applied: Vec<Applied>,
    latest: i32,
}

#[derive(Serialize)]
struct Applied {
    version: i32,
    name: &'static str,
}

/// Runs `migrate`; its output, or the message of what went wrong (the URL
/// without its password).
pub(crate) async fn run(args: &Migrate) -> Result<String, String> {
    let applied = peerq::postgres::migrate_url(&args.postgres)
        .await
        .map_err(|e| e.to_string())?;
    let latest = peerq::postgres::MIGRATIONS.last().map_or(0, |m| m.version);
    let migrated = Migrated {
        applied: applied
            .iter()
            .map(|m| Applied {
                version: m.version,
                name: m.name,
            })
            .collect(),
        latest,
    };
    args.output.show(&migrated, || {
        if migrated.applied.is_empty() {
            return format!("up to date (version {latest})\n");
        }
        migrated
            .applied
            .iter()
            .map(|m| format!("applied {:04}_{}\n", m.version, m.name))
            .collect()
    })
}
