//! `peerq migrate --postgres URL` against a PostgreSQL the harness starts:
//! it applies peerq's migrations once and says which, needs no Redis, and a
//! database it cannot reach is one line that names the URL without its
//! password.

use std::process::Command;

use serde_json::json;

use super::{BIN, run};
use support::PostgresServer;

/// `peerq migrate --postgres url args…`, with no Redis anywhere.
fn migrate(url: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.env_remove("PEERQ_REDIS_URL")
        .env_remove("PEERQ_POSTGRES_URL")
        .args(["migrate", "--postgres", url])
        .args(args);
    cmd
}

#[tokio::test]
async fn migrate_applies_each_migration_once_without_a_redis() {
    let db = tokio::task::spawn_blocking(|| PostgresServer::shared().database())
        .await
        .unwrap();
    // Every migration the crate carries, in order, each once.
    let all = peerq::postgres::MIGRATIONS;
    let applied: String = all
        .iter()
        .map(|m| format!("applied {:04}_{}\n", m.version, m.name))
        .collect();
    assert!(applied.starts_with("applied 0001_outbox\napplied 0002_inbox\n"));
    let latest = all.last().unwrap().version;
    let first = run(migrate(&db.url, &[])).await;
    assert_eq!(first.ok(), applied);
    let again = run(migrate(&db.url, &["--json"])).await;
    assert_eq!(again.json(), json!({ "applied": [], "latest": latest }));
    let text = run(migrate(&db.url, &[])).await;
    assert_eq!(text.ok(), format!("up to date (version {latest})\n"));
}

#[tokio::test]
async fn an_unreachable_database_is_one_line_without_the_password() {
    // Nothing listens on port 1.
    let url = "postgres://app:s3cret@127.0.0.1:1/app";
    let failed = run(migrate(url, &[])).await;
    let line = failed.failure();
    assert!(
        line.starts_with("peerq: cannot use postgres at postgres://app:***@127.0.0.1:1/app: "),
        "{line}"
    );
    assert!(!line.contains("s3cret"), "{line}");
}
