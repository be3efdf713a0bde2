//! A Sentinel set that requires everything at once: TLS only, client
//! certificates from the test CA required, on the sentinels and the data
//! servers and between them (replication, the sentinels' links); a
//! password on the sentinels, another on the data servers' default user
//! (what replicas and sentinels log in with), and peerq logging in to the
//! master as an ACL user of least privilege (the guide's rule). peerq
//! connects with `Redis::sentinel` over `rediss://` URLs
//! carrying the sentinels' password, `master_auth` and `tls`.

use peerq::{Producer, Redis, Tls};
use support::{SentinelOptions, ServerTls, TestPki};

use super::*;

const SENTINEL_PASSWORD: &str = "sentinel-pw-7f3a2c";
const DATA_PASSWORD: &str = "data-pw-91c2e8";
const APP_USER: &str = "peerq-app";
const APP_PASSWORD: &str = "app-pw-5d0e4b";

/// A set as described above; peerq's user made on every data server.
fn secure_set(name: &str) -> SentinelSet {
    let set = SentinelSet::start_with(SentinelOptions {
        tls: Some(ServerTls::new(true)),
        password: Some(DATA_PASSWORD),
        sentinel_password: Some(SENTINEL_PASSWORD),
        ..SentinelOptions::default()
    });
    // docs/guide/15-cluster-tls-acl.md's least-privilege rule, as it is:
    // the check that the server the sentinels name is the master asks
    // `ROLE`, and when that is refused `INFO replication`, which it grants.
    set.acl_setuser(&format!(
        "{APP_USER} on >{APP_PASSWORD} resetkeys ~{{{name}}}:* ~{{{name}/*}}:* \
         resetchannels &{{{name}}}:* &{{{name}/*}}:* -@all \
         +@stream +@hash +@sortedset +@list +get +set +incr +del +exists +expire +pexpire \
         +evalsha +script|load +ping +time +wait +info +client|id +client|unblock \
         +publish +subscribe +spublish +ssubscribe +hello +auth"
    ));
    set
}

/// The test CA to trust, the test client certificate to present.
fn trusted() -> Tls {
    let pki = TestPki::shared();
    Tls::new()
        .ca_file(&pki.ca_cert)
        .client_cert(&pki.client.cert, &pki.client.key)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_flow_through_a_failover_over_tls_with_passwords_and_an_acl_user() {
    let name = unique_name("sentinel-tls");
    let mut set = tokio::task::block_in_place(|| secure_set(&name));
    let urls = set.sentinel_urls();
    assert!(
        urls.iter()
            .all(|url| url.starts_with(&format!("rediss://:{SENTINEL_PASSWORD}@"))),
        "{urls:?}"
    );
    let connect = |set: &SentinelSet| {
        Redis::sentinel(MASTER_NAME, set.sentinel_urls())
            .master_auth(APP_USER, APP_PASSWORD)
            .tls(trusted())
            .wait_for_replicas(EVERY_REPLICA, 100 * MS)
    };
    let label = "sentinel-tls, wait_for_replicas Some(2)";
    let failover = |set: &mut SentinelSet| set.failover();
    let counted = flow_through(&mut set, &name, label, connect, failover).await;
    assert_eq!((counted.lost, counted.discarded), (0, 0), "{counted:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_connect_through_sentinel_never_shows_a_password() {
    let name = unique_name("sentinel-pw");
    let set = tokio::task::block_in_place(|| secure_set(&name));
    let urls = set.sentinel_urls();
    let with_password = |from: &str, to: &str| -> Vec<String> {
        urls.iter().map(|url| url.replace(from, to)).collect()
    };
    let wrong_sentinel_pw = "wrong-sentinel-pw-0b9d";
    let wrong_app_pw = "wrong-app-pw-3e71";
    let cases = [
        (
            "the master's password is wrong",
            Redis::sentinel(MASTER_NAME, urls.clone())
                .master_auth(APP_USER, wrong_app_pw)
                .tls(trusted()),
        ),
        (
            "the sentinels' password is wrong",
            Redis::sentinel(
                MASTER_NAME,
                with_password(SENTINEL_PASSWORD, wrong_sentinel_pw),
            )
            .master_auth(APP_USER, APP_PASSWORD)
            .tls(trusted()),
        ),
        (
            "the sentinels monitor no such master",
            Redis::sentinel("no-such-master", urls.clone())
                .master_auth(APP_USER, APP_PASSWORD)
                .tls(trusted()),
        ),
        (
            "the servers' CA is not trusted",
            Redis::sentinel(MASTER_NAME, urls.clone()).master_auth(APP_USER, APP_PASSWORD),
        ),
    ];
    let secrets = [
        SENTINEL_PASSWORD,
        DATA_PASSWORD,
        APP_PASSWORD,
        wrong_sentinel_pw,
        wrong_app_pw,
    ];
    for (case, redis) in cases {
        let err = match Producer::connect(redis, &name).await {
            Ok(_) => panic!("{case}: connected"),
            Err(err) => err,
        };
        let shown = format!("{err} / {err:?}");
        eprintln!("{case}: {err}");
        for secret in secrets {
            assert!(!shown.contains(secret), "{case}: `{secret}` in `{shown}`");
        }
    }
    // The right settings connect: the refusals above were theirs.
    let redis = Redis::sentinel(MASTER_NAME, urls)
        .master_auth(APP_USER, APP_PASSWORD)
        .tls(trusted());
    Producer::connect(redis, &name).await.unwrap();
}
