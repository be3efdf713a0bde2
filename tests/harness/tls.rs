//! Self-tests of the harness's TLS and ACL support (`support::ServerTls`,
//! `RedisServer::acl_setuser`): a TLS-only server takes clients that trust
//! the test CA and refuses the others, client certificates are enforced when
//! asked for, and the harness's own PING, SHUTDOWN and ACL work over TLS.
//!
//! Each refusal prints the error text a user would see (run with
//! `--nocapture` to read them); the assertions check only the stable part.

use std::time::Duration;

use deadpool_redis::redis;
use support::{CertFiles, RedisServer, ServerOptions, ServerTls, TestPki, connect};

/// Bound of every connect-and-PING: a refusal must come as an error, never
/// as a hang.
const ATTEMPT: Duration = Duration::from_secs(5);

fn tls_server(require_client_cert: bool) -> RedisServer {
    RedisServer::start_with(ServerOptions {
        tls: Some(ServerTls::new(require_client_cert)),
        ..ServerOptions::default()
    })
}

/// Connects with `client` and sends PING, as one step: with TLS 1.3 a server
/// that rejects the client's certificate says so only after the client has
/// finished its side of the handshake, so the refusal may surface at the
/// first command rather than at connect.
async fn connect_and_ping(client: &redis::Client) -> redis::RedisResult<String> {
    let attempt = async {
        let mut con = client.get_multiplexed_async_connection().await?;
        redis::cmd("PING").query_async::<String>(&mut con).await
    };
    tokio::time::timeout(ATTEMPT, attempt)
        .await
        .expect("a TLS connect-and-PING ends within its bound")
}

/// A client of `server` that trusts `ca_cert` and presents `client_cert`.
fn client_trusting(
    server: &RedisServer,
    ca_cert: &std::path::Path,
    client_cert: Option<&CertFiles>,
) -> redis::Client {
    let certs = TestPki::certificates(ca_cert, client_cert);
    redis::Client::build_with_tls(server.url(), certs).expect("TLS client config is valid")
}

/// Asserts that `result` is a refusal whose text holds `expected`, prints
/// it and returns it.
fn assert_refused<T: std::fmt::Debug>(
    what: &str,
    result: redis::RedisResult<T>,
    expected: &str,
) -> redis::RedisError {
    let err = result.expect_err(what);
    println!(
        "{what}:\n  display: {err}\n  code:    {:?}\n  kind:    {:?}",
        err.code(),
        err.kind()
    );
    assert!(
        err.to_string().contains(expected),
        "{what}: expected {expected:?} in the error, got: {err}"
    );
    err
}

#[tokio::test]
async fn a_client_that_trusts_the_test_ca_connects_and_pings_over_tls_only() {
    let server = tls_server(false);
    let url = server.url();
    assert_eq!(url, format!("rediss://127.0.0.1:{}/", server.port()));
    let pki = TestPki::shared();

    let no_client_cert = client_trusting(&server, &pki.ca_cert, None);
    assert_eq!(
        connect_and_ping(&no_client_cert).await.expect("PING"),
        "PONG"
    );

    // The harness's own client and pool go over TLS as well.
    assert_eq!(
        connect_and_ping(&server.client()).await.expect("PING"),
        "PONG"
    );
    let mut pooled = server.pool().get().await.expect("pooled TLS connection");
    let pong: String = redis::cmd("PING")
        .query_async(&mut pooled)
        .await
        .expect("PING");
    assert_eq!(pong, "PONG");

    // No plain-text port: the same port does not speak RESP in the clear.
    let plain = format!("redis://127.0.0.1:{}/", server.port());
    let plain_ping = match connect(&plain, Duration::from_secs(1)) {
        Ok(mut con) => redis::cmd("PING").query::<String>(&mut con),
        Err(err) => Err(err),
    };
    assert!(
        plain_ping.is_err(),
        "plain PING to a TLS port: {plain_ping:?}"
    );
}

#[tokio::test]
async fn a_client_that_trusts_another_ca_is_refused() {
    let server = tls_server(false);
    let client = client_trusting(&server, &TestPki::shared().other_ca_cert, None);
    assert_refused(
        "client trusting an unrelated CA",
        connect_and_ping(&client).await,
        "UnknownIssuer",
    );
}

#[tokio::test]
async fn a_server_certificate_for_another_host_name_is_refused() {
    let server = RedisServer::start_with(ServerOptions {
        tls: Some(ServerTls {
            wrong_host: true,
            ..ServerTls::new(false)
        }),
        ..ServerOptions::default()
    });
    let ca_cert = &TestPki::shared().ca_cert;
    let client = client_trusting(&server, ca_cert, None);
    assert_refused(
        "server certificate for localhost only, client of 127.0.0.1",
        connect_and_ping(&client).await,
        "certificate not valid for name \"127.0.0.1\"",
    );
    // The same certificate is fine for the name it was made for, so the
    // refusal above is the hostname check and nothing else.
    let by_name = format!("rediss://localhost:{}/", server.port());
    let by_name = redis::Client::build_with_tls(by_name, TestPki::certificates(ca_cert, None))
        .expect("TLS client config is valid");
    assert_eq!(connect_and_ping(&by_name).await.expect("PING"), "PONG");
}

#[tokio::test]
async fn with_client_certificates_required_only_a_client_with_one_from_the_ca_gets_in() {
    let server = tls_server(true);
    let pki = TestPki::shared();

    let without = client_trusting(&server, &pki.ca_cert, None);
    // rustls reports the server's alert; which one depends on the TLS
    // version (TLS 1.3 here: `CertificateRequired`, `UnknownCA`), so only
    // the common part is asserted.
    assert_refused(
        "client without a certificate",
        connect_and_ping(&without).await,
        "received fatal alert",
    );

    let foreign = client_trusting(&server, &pki.ca_cert, Some(&pki.other_client));
    assert_refused(
        "client certificate from an unrelated CA",
        connect_and_ping(&foreign).await,
        "received fatal alert",
    );

    let with = client_trusting(&server, &pki.ca_cert, Some(&pki.client));
    assert_eq!(connect_and_ping(&with).await.expect("PING"), "PONG");
}

#[tokio::test]
async fn restart_and_acl_users_work_over_tls() {
    let mut server = tls_server(true);
    let mut con = async_con(&server.client()).await.expect("connect over TLS");
    let () = redis::cmd("SET")
        .arg("kept")
        .arg("1")
        .query_async(&mut con)
        .await
        .expect("SET");
    let pid = server.pid();
    // SHUTDOWN SAVE and the PING that waits for the new process go over TLS.
    server.restart();
    assert_ne!(server.pid(), pid);
    let mut con = async_con(&server.client())
        .await
        .expect("connect after restart");
    let kept: Option<String> = redis::cmd("GET")
        .arg("kept")
        .query_async(&mut con)
        .await
        .expect("GET");
    assert_eq!(kept.as_deref(), Some("1"));

    server.acl_setuser("reader on >reader-pw ~allowed:* +get +ping");
    let url = server.url_as("reader", "pw");
    assert!(url.starts_with("rediss://reader:pw@127.0.0.1:"), "{url}");
    let mut reader = async_con(&server.client_as("reader", "reader-pw"))
        .await
        .expect("connect as reader");
    let value: Option<String> = redis::cmd("GET")
        .arg("allowed:x")
        .query_async(&mut reader)
        .await
        .expect("GET on an allowed key");
    assert_eq!(value, None);
    let set: redis::RedisResult<()> = redis::cmd("SET")
        .arg("allowed:x")
        .arg("1")
        .query_async(&mut reader)
        .await;
    let err = assert_refused(
        "command outside the user's rule",
        set,
        "no permissions to run the 'set' command",
    );
    assert_eq!(err.code(), Some("NOPERM"));
    let get: redis::RedisResult<Option<String>> =
        redis::cmd("GET").arg("kept").query_async(&mut reader).await;
    let err = assert_refused(
        "key outside the user's rule",
        get,
        "no permissions to access one of the keys",
    );
    assert_eq!(err.code(), Some("NOPERM"));
    let err = assert_refused(
        "wrong password",
        connect_and_ping(&server.client_as("reader", "not-the-password")).await,
        "Password authentication failed",
    );
    // redis-rs turns the server's WRONGPASS into an error of its own, with
    // no server code left.
    assert_eq!(err.kind(), redis::ErrorKind::AuthenticationFailed);
}

async fn async_con(
    client: &redis::Client,
) -> redis::RedisResult<redis::aio::MultiplexedConnection> {
    tokio::time::timeout(ATTEMPT, client.get_multiplexed_async_connection())
        .await
        .expect("a TLS connect ends within its bound")
}
