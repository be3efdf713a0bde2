//! The PostgreSQL harness itself (`tests/support/src/postgres/mod.rs`): its own
//! server starts as an unprivileged user on a free loopback port and
//! answers; each test gets a database of its own; a server is gone with its
//! handle, and the shared one with a test process that was killed; another
//! server's URL (`PEERQ_TEST_POSTGRES_URL`) is used as given.

use std::thread;
use std::time::{Duration, Instant};

use sqlx::{Connection, PgConnection, Row};
use support::{PostgresServer, process_exists};

async fn connect(url: &str) -> PgConnection {
    PgConnection::connect(url).await.unwrap()
}

#[tokio::test]
async fn the_shared_server_answers_and_each_test_gets_its_own_database() {
    let server = PostgresServer::shared();
    let one = server.database();
    let two = server.database();
    assert_ne!(one.name, two.name);
    let mut a = connect(&one.url).await;
    let mut b = connect(&two.url).await;
    sqlx::raw_sql("CREATE TABLE t (x int); INSERT INTO t VALUES (1)")
        .execute(&mut a)
        .await
        .unwrap();
    let seen: i64 = sqlx::query_scalar("SELECT count(*) FROM t")
        .fetch_one(&mut a)
        .await
        .unwrap();
    assert_eq!(seen, 1);
    let missing = sqlx::query("SELECT * FROM t").fetch_all(&mut b).await;
    assert!(missing.is_err(), "the other database has no table t");
    let current: String = sqlx::query_scalar("SELECT current_database()")
        .fetch_one(&mut b)
        .await
        .unwrap();
    assert_eq!(current, two.name);
}

#[tokio::test]
async fn our_own_server_runs_unprivileged_on_a_loopback_port_that_is_not_5432() {
    if std::env::var_os(support::POSTGRES_URL_ENV).is_some() {
        // The given server is not ours to inspect; the other tests use it.
        return;
    }
    let server = PostgresServer::shared();
    let port = server.port().expect("our own server");
    assert_ne!(port, 5432);
    let db = server.database();
    assert!(
        db.url.contains(&format!("@127.0.0.1:{port}/")),
        "{}",
        db.url
    );
    let mut conn = connect(&db.url).await;
    let row = sqlx::query("SELECT current_setting('listen_addresses'), current_setting('fsync')")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(row.get::<String, _>(0), "127.0.0.1");
    assert_eq!(row.get::<String, _>(1), "off");
    // initdb and postgres refuse root: the data belongs to someone else
    // when the tests run as root.
    use std::os::unix::fs::MetadataExt;
    let data = std::fs::metadata(server.dir().unwrap().join("data")).unwrap();
    let me = std::fs::metadata("/proc/self").unwrap().uid();
    if me == 0 {
        assert_ne!(data.uid(), 0, "the data directory is not root's");
    } else {
        assert_eq!(data.uid(), me);
    }
}

#[tokio::test]
async fn a_server_and_its_dir_are_gone_with_its_handle() {
    if std::env::var_os(support::POSTGRES_URL_ENV).is_some() {
        return;
    }
    let server = tokio::task::spawn_blocking(PostgresServer::start)
        .await
        .unwrap();
    let pid = server.pid().unwrap();
    let dir = server.dir().unwrap().to_owned();
    let db = server.database();
    let mut conn = connect(&db.url).await;
    let one: i32 = sqlx::query_scalar("SELECT 1")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(one, 1);
    tokio::task::spawn_blocking(move || drop(server))
        .await
        .unwrap();
    assert!(!process_exists(pid), "postgres {pid} is gone");
    assert!(!dir.exists(), "{} is removed", dir.display());
    let after = sqlx::query("SELECT 1").fetch_one(&mut conn).await;
    assert!(after.is_err(), "the server no longer answers");
}

#[tokio::test]
async fn a_given_url_is_used_with_a_database_per_test() {
    // Any server will do as "the given one": the shared one's URL.
    let shared = PostgresServer::shared();
    let given = PostgresServer::external(&(shared.url_of("postgres") + "?application_name=given"));
    assert_eq!(given.pid(), None, "nothing started");
    let db = given.database();
    assert!(
        db.url
            .ends_with(&format!("/{}?application_name=given", db.name)),
        "{}",
        db.url
    );
    let mut conn = connect(&db.url).await;
    let row = sqlx::query("SELECT current_database(), current_setting('application_name')")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(row.get::<String, _>(0), db.name);
    assert_eq!(row.get::<String, _>(1), "given");
}

/// Turns [`child_holding_the_shared_server`] into the child process of
/// [`the_shared_server_dies_with_a_killed_test_process`].
const CHILD_ENV: &str = "PEERQ_POSTGRES_HARNESS_CHILD";

#[test]
fn the_shared_server_dies_with_a_killed_test_process() {
    if std::env::var_os(support::POSTGRES_URL_ENV).is_some() {
        return;
    }
    let (mut child, line) = support::child_test(
        "postgres::child_holding_the_shared_server",
        (CHILD_ENV, "1"),
        "postgres ",
    );
    let mut words = line.split(' ');
    let pid: u32 = words.next().unwrap().parse().unwrap();
    let dir = std::path::PathBuf::from(words.next().unwrap());
    assert!(process_exists(pid));

    // Nothing in the child runs after SIGKILL: only the reaper can clean up.
    child.0.kill().unwrap();
    child.0.wait().unwrap();

    let deadline = Instant::now() + Duration::from_secs(15);
    while process_exists(pid) || dir.exists() {
        assert!(
            Instant::now() < deadline,
            "postgres {pid} or {} outlived its test process",
            dir.display()
        );
        thread::sleep(Duration::from_millis(50));
    }
}

/// Not a test of its own: the child process of
/// [`the_shared_server_dies_with_a_killed_test_process`], which holds the
/// shared server until it is killed. Without [`CHILD_ENV`] it returns at
/// once.
#[test]
fn child_holding_the_shared_server() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    let server = PostgresServer::shared();
    println!(
        "postgres {} {}",
        server.pid().unwrap(),
        server.dir().unwrap().display()
    );
    thread::sleep(Duration::from_secs(600));
}
