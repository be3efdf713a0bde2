//! `peerq ids status|repair|init` against three private redis-servers with
//! AOF (`appendfsync always`): a new sequence, a server restarted empty
//! shown as needing repair and repaired, a repair refused with one line
//! that never holds the password; no Redis of `--redis` needed.

use std::process::Command;

use peerq::ids::MajorityIds;
use serde_json::json;

use super::{BIN, run};
use support::{RedisServer, ServerOptions, unique_name};

const PASSWORD: &str = "s3cret-ids";

/// `peerq ids <args…> --servers <urls> --key <key>`, with no Redis of its own.
fn ids(servers: &[RedisServer], key: &str, args: &[&str]) -> Command {
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    let mut cmd = Command::new(BIN);
    cmd.env_remove("PEERQ_REDIS_URL")
        .env_remove("PEERQ_IDS_SERVERS")
        .arg("ids")
        .args(args)
        .args(["--servers", &urls.join(","), "--key", key]);
    cmd
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_init_status_and_repair_of_a_server_restarted_empty() {
    let mut servers: Vec<RedisServer> = (0..3)
        .map(|_| {
            RedisServer::start_with(ServerOptions {
                aof: true,
                requirepass: Some(PASSWORD),
                ..ServerOptions::default()
            })
        })
        .collect();
    let key = unique_name("cli-ids");
    let created = run(ids(&servers, &key, &["init", "--first", "100", "--json"])).await;
    assert_eq!(
        created.json(),
        json!({ "key": format!("peerq:ids:{key}"), "first": 100 })
    );
    let sequence = MajorityIds::builder()
        .servers(servers.iter().map(RedisServer::url))
        .key(&key)
        .build()
        .await
        .unwrap();
    assert_eq!(sequence.next().await.unwrap(), 100);
    let masked = |server: &RedisServer| format!("redis://:***@127.0.0.1:{}/", server.port());
    // A majority took 100; the third copy may still hold 99 (the write
    // to it is dropped once a majority has decided).
    let before = run(ids(&servers, &key, &["status", "--json"])).await.json();
    let holding = |value: u64| {
        (0..3)
            .filter(|&i| {
                before[i]
                    == json!({ "server": masked(&servers[i]), "state": "holds", "value": value })
            })
            .count()
    };
    assert!(
        holding(100) >= 2 && holding(100) + holding(99) == 3,
        "{before}"
    );

    servers[0].kill_and_restart_empty();
    let status = run(ids(&servers, &key, &["status", "--json"])).await;
    let mut expected = before.clone();
    expected[0] = json!({ "server": masked(&servers[0]), "state": "needs_repair" });
    assert_eq!(status.json(), expected);
    let table = run(ids(&servers, &key, &["status"])).await;
    assert!(table.ok().contains("needs repair"), "{table:?}");

    // Two servers down: one holder cannot say what the sequence is at.
    servers[1].stop();
    servers[2].stop();
    let refused = run(ids(&servers, &key, &["repair"])).await;
    let line = refused.failure();
    assert!(line.starts_with("peerq: cannot repair"), "{line}");
    assert!(!line.contains(PASSWORD), "{line}");
    servers[1].start_again();
    servers[2].start_again();

    let repaired = run(ids(&servers, &key, &["repair"])).await;
    assert_eq!(
        repaired.ok(),
        format!("repaired {} at 100\n", masked(&servers[0]))
    );
    let again = run(ids(&servers, &key, &["repair", "--json"])).await;
    assert_eq!(again.json(), json!({ "value": 100, "repaired": [] }));
    // Repaired, it votes: with another server down, it makes the majority.
    servers[1].stop();
    assert_eq!(sequence.next().await.unwrap(), 101);
}
