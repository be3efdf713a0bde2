//! A private PostgreSQL server per [`PostgresServer`]: `initdb` into its
//! own temp dir, `postgres` as a child process on a free loopback port
//! (its socket in that dir too), run as an unprivileged user when the
//! tests run as root (`initdb` and `postgres` refuse root), and a fresh
//! database per test ([`PostgresServer::database`]), so the tests of one
//! binary share one server ([`PostgresServer::shared`]). A server of a
//! test's own can be taken away and brought back
//! ([`PostgresServer::restart_after`], or [`PostgresServer::shut_down`]
//! and [`PostgresServer::start_again`] at moments of the test's choosing).
//!
//! With `PEERQ_TEST_POSTGRES_URL` set (a URL of a server where that user
//! may `CREATE DATABASE`), [`shared`](PostgresServer::shared) uses that
//! server instead of starting one; each test still gets a fresh database.
//! A server on the machine's own port 5432 is never used otherwise.
//!
//! The process is killed on drop (SIGQUIT, Postgres's immediate shutdown,
//! then SIGKILL), also when the test panics; one never dropped (the shared
//! one) or outliving a test process that was SIGKILLed is shut down by the
//! [`reaper`](super::reaper) when the test process exits.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions, Connection, Executor};

use super::reaper;
use super::redis_server::{fresh_dir, signal};
use binaries::{Runner, bin_dir};

mod binaries;

/// The environment variable naming a server to use instead of one of our own.
pub const URL_ENV: &str = "PEERQ_TEST_POSTGRES_URL";
/// How long a server may take to accept connections, and to exit.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
const POLL_INTERVAL: Duration = Duration::from_millis(50);
/// Fresh ports to try when another process takes ours first.
const PORT_ATTEMPTS: usize = 5;
/// Tries to bind the same port again on restart, in case the kernel is slow
/// to release it.
const SAME_PORT_ATTEMPTS: usize = 20;
/// The user an own server's clients connect as (trust authentication).
const SUPERUSER: &str = "postgres";

/// A PostgreSQL server the tests use: one of our own, or the one
/// `PEERQ_TEST_POSTGRES_URL` names.
#[derive(Debug)]
pub struct PostgresServer {
    /// `postgres://user@host:port` (and the password, if any): the server,
    /// without a database.
    base: String,
    /// After the database in a URL (`?sslmode=…`), kept as given.
    query: String,
    /// Our own server's process and dir; `None` for an external one.
    own: Option<Own>,
}

#[derive(Debug)]
struct Own {
    dir: PathBuf,
    port: u16,
    child: Child,
    /// Who runs it.
    user: Runner,
}

/// A database of its own for one test, on a [`PostgresServer`].
#[derive(Debug, Clone)]
pub struct TestDatabase {
    /// Its name, `t_<pid>_<n>_<random>`.
    pub name: String,
    /// `postgres://…/<name>`.
    pub url: String,
}

impl TestDatabase {
    /// Connection options for it, for `PgPool::connect_with`.
    pub fn options(&self) -> PgConnectOptions {
        self.url.parse().expect("the harness makes valid URLs")
    }
}

impl PostgresServer {
    /// The test binary's server: `PEERQ_TEST_POSTGRES_URL`'s, or one of
    /// our own started on first use. Rust never drops a `static`, so ours
    /// outlives the last test; the reaper shuts it down at exit.
    pub fn shared() -> &'static PostgresServer {
        static SHARED: OnceLock<PostgresServer> = OnceLock::new();
        SHARED.get_or_init(|| match std::env::var(URL_ENV) {
            Ok(url) if !url.is_empty() => PostgresServer::external(&url),
            _ => PostgresServer::start(),
        })
    }

    /// The server at `url` (its database part is ignored): each
    /// [`database`](Self::database) is created there.
    pub fn external(url: &str) -> PostgresServer {
        let (url, query) = url.split_once('?').unwrap_or((url, ""));
        let scheme_end = url.find("://").map_or(0, |i| i + 3);
        let base = match url[scheme_end..].find('/') {
            Some(slash) => &url[..scheme_end + slash],
            None => url,
        };
        PostgresServer {
            base: base.to_owned(),
            query: if query.is_empty() {
                String::new()
            } else {
                format!("?{query}")
            },
            own: None,
        }
    }

    /// Starts a server of our own and waits until it accepts connections.
    pub fn start() -> PostgresServer {
        let bin = bin_dir();
        let dir = fresh_dir("postgres");
        let user = Runner::for_this_process();
        user.own(&dir);
        let data = dir.join("data");
        let initdb = user
            .command(bin.join("initdb"))
            .arg("-D")
            .arg(&data)
            .args([
                "-U",
                SUPERUSER,
                "--auth=trust",
                "--no-sync",
                "--no-instructions",
            ])
            .args(["--encoding=UTF8", "--locale=C"])
            .stdin(Stdio::null())
            .stdout(log(&dir, "initdb.log"))
            .stderr(log(&dir, "initdb.log"))
            .status()
            .unwrap_or_else(|e| panic!("run initdb: {e}"));
        assert!(
            initdb.success(),
            "initdb failed ({initdb}):\n{}",
            tail(&dir.join("initdb.log"))
        );
        for _ in 0..PORT_ATTEMPTS {
            let port = free_port();
            let mut server = PostgresServer {
                base: format!("postgres://{SUPERUSER}@127.0.0.1:{port}"),
                query: String::new(),
                own: Some(Own {
                    child: spawn(user, &dir, port),
                    dir: dir.clone(),
                    port,
                    user,
                }),
            };
            match server.wait_ready() {
                Ok(()) => return server,
                Err(Exited::AddrInUse) => {
                    server.stop();
                    // Without its process, `Drop` leaves the dir to the next try.
                    server.own = None;
                }
                Err(Exited::Failed(log)) => panic!("postgres exited at start; log:\n{log}"),
            }
        }
        panic!("postgres found no free port in {PORT_ATTEMPTS} attempts");
    }

    /// Shuts our own server down at once (as [`Drop`] does), stays down
    /// for `down` (clients are refused), and starts it again on the same
    /// port and data: what was committed is there again (Postgres recovers
    /// it from its WAL).
    pub fn restart_after(&mut self, down: Duration) {
        self.stop();
        thread::sleep(down);
        self.start_again();
    }

    /// Shuts our own server down at once (as [`Drop`] does) and leaves it
    /// down, keeping its data and port: clients are refused until
    /// [`start_again`](Self::start_again). For a test that takes Postgres
    /// away at a moment of its choosing (from a hook, say) for longer than
    /// some window.
    pub fn shut_down(&mut self) {
        self.stop();
    }

    /// Starts our own server again after [`shut_down`](Self::shut_down),
    /// on the same port and data: what was committed is there again
    /// (Postgres recovers it from its WAL).
    pub fn start_again(&mut self) {
        for _ in 0..SAME_PORT_ATTEMPTS {
            let own = self.own.as_mut().expect("our own server");
            own.child = spawn(own.user, &own.dir, own.port);
            match self.wait_ready() {
                Ok(()) => return,
                Err(Exited::AddrInUse) => thread::sleep(Duration::from_millis(100)),
                Err(Exited::Failed(log)) => panic!("postgres exited at restart; log:\n{log}"),
            }
        }
        panic!("postgres could not bind its port again");
    }

    /// Waits until the server answers as ours (its data directory), or
    /// its process exited.
    fn wait_ready(&mut self) -> Result<(), Exited> {
        let deadline = Instant::now() + READY_TIMEOUT;
        let own = self.own.as_mut().expect("our own server");
        let want = own.dir.join("data").to_string_lossy().into_owned();
        let log = own.dir.join("postgres.log");
        // What this process adds to the log comes after this.
        let from = fs::metadata(&log).map_or(0, |m| m.len() as usize);
        loop {
            let own = self.own.as_mut().expect("our own server");
            if let Ok(Some(_)) = own.child.try_wait() {
                let text = fs::read(&log).unwrap_or_default();
                let said = String::from_utf8_lossy(&text[from.min(text.len())..]).into_owned();
                reaper::release_pid(own.child.id());
                if said.contains("Address already in use") {
                    return Err(Exited::AddrInUse);
                }
                return Err(Exited::Failed(said));
            }
            let url = self.url_of("postgres");
            if let Ok(answered) =
                block_on(async move { query_text(&url, "SHOW data_directory").await })
            {
                // Another server that won the port race would answer too.
                assert_eq!(answered, want, "another postgres answers on our port");
                return Ok(());
            }
            if Instant::now() >= deadline {
                let log = tail(&self.own.as_ref().expect("ours").dir.join("postgres.log"));
                self.stop();
                panic!("postgres did not accept connections within {READY_TIMEOUT:?}; log:\n{log}");
            }
            thread::sleep(POLL_INTERVAL);
        }
    }

    /// A new, empty database for one test.
    pub fn database(&self) -> TestDatabase {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "t_{}_{}_{:08x}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed),
            rand::random::<u32>()
        );
        let admin = self.url_of("postgres");
        let create = format!("CREATE DATABASE {name}");
        block_on(async move { execute(&admin, &create).await })
            .unwrap_or_else(|e| panic!("create test database {name}: {e}"));
        TestDatabase {
            url: self.url_of(&name),
            name,
        }
    }

    /// The URL of database `db` on this server.
    pub fn url_of(&self, db: &str) -> String {
        format!("{}/{db}{}", self.base, self.query)
    }

    /// Our own server's port (`None` for an external one).
    pub fn port(&self) -> Option<u16> {
        self.own.as_ref().map(|own| own.port)
    }

    /// Our own server's postmaster pid (`None` for an external one).
    pub fn pid(&self) -> Option<u32> {
        self.own.as_ref().map(|own| own.child.id())
    }

    /// Our own server's dir (data, socket, logs).
    pub fn dir(&self) -> Option<&Path> {
        self.own.as_ref().map(|own| own.dir.as_path())
    }

    /// Shuts our own server down at once (SIGQUIT: Postgres's immediate
    /// shutdown, which ends its backends and frees its shared memory),
    /// SIGKILL after a bound, and reaps it. Never panics: it runs in
    /// `Drop`.
    fn stop(&mut self) {
        let Some(own) = self.own.as_mut() else {
            return;
        };
        let pid = own.child.id();
        // A process already reaped is not signalled: its pid may be
        // another's by now.
        if matches!(own.child.try_wait(), Ok(None)) {
            signal(pid, "QUIT");
        }
        let deadline = Instant::now() + READY_TIMEOUT;
        while !matches!(own.child.try_wait(), Ok(Some(_)) | Err(_)) {
            if Instant::now() >= deadline {
                let _ = own.child.kill();
                let _ = own.child.wait();
                break;
            }
            thread::sleep(Duration::from_millis(10));
        }
        reaper::release_pid(pid);
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        self.stop();
        if let Some(own) = &self.own {
            let _ = fs::remove_dir_all(&own.dir);
            reaper::release_dir(&own.dir);
        }
    }
}

/// How a server process exited while we waited for it.
enum Exited {
    /// Another process holds the port.
    AddrInUse,
    /// Anything else, with what it logged.
    Failed(String),
}

/// Starts `postgres` as `user` on `dir`'s data at `port`, its socket in
/// `dir`, its log appended to `dir/postgres.log`.
fn spawn(user: Runner, dir: &Path, port: u16) -> Child {
    let child = user
        .command(bin_dir().join("postgres"))
        .arg("-D")
        .arg(dir.join("data"))
        .arg("-k")
        .arg(dir)
        .args(["-p", &port.to_string(), "-c", "listen_addresses=127.0.0.1"])
        // Durability is not what these servers are for.
        .args(["-c", "fsync=off", "-c", "synchronous_commit=off"])
        .args(["-c", "full_page_writes=off", "-c", "max_connections=300"])
        // Its dynamic shared memory in its dir, removed with it.
        .args(["-c", "dynamic_shared_memory_type=mmap"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log(dir, "postgres.log"))
        .spawn()
        .unwrap_or_else(|e| panic!("spawn postgres: {e}"));
    reaper::adopt_quit_pid(child.id());
    child
}

/// A file in `dir` for a process's output (appended to).
fn log(dir: &Path, name: &str) -> File {
    File::options()
        .create(true)
        .append(true)
        .open(dir.join(name))
        .unwrap_or_else(|e| panic!("create {name}: {e}"))
}

/// The last lines of a log, for panic messages.
fn tail(path: &Path) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind a probe socket on 127.0.0.1")
}

/// Runs `f` to completion on a runtime of its own, in a thread of its own,
/// so the harness works the same from a plain `#[test]` and from within a
/// `#[tokio::test]`.
fn block_on<T: Send + 'static>(f: impl std::future::Future<Output = T> + Send + 'static) -> T {
    thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime for the harness")
            .block_on(f)
    })
    .join()
    .expect("the harness's thread")
}

/// One connection to `url` that runs `sql` and closes.
async fn execute(url: &str, sql: &str) -> Result<(), sqlx::Error> {
    let mut conn = connect(url).await?;
    conn.execute(sql).await?;
    conn.close().await
}

/// The one text value that `sql` returns, on one connection to `url`.
async fn query_text(url: &str, sql: &str) -> Result<String, sqlx::Error> {
    let mut conn = connect(url).await?;
    let text = sqlx::query_scalar(sql).fetch_one(&mut conn).await?;
    conn.close().await?;
    Ok(text)
}

async fn connect(url: &str) -> Result<sqlx::PgConnection, sqlx::Error> {
    let options: PgConnectOptions = url.parse()?;
    // The harness's own statements are not worth a log line each.
    options.disable_statement_logging().connect().await
}
