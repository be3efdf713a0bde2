//! One private `redis-server` process per [`RedisServer`]: a free port, its own
//! temp dir, no config file, and ways to restart, crash and freeze it.
//!
//! The process is a child of the test process and is killed on drop (also
//! when the test panics). A server that is never dropped (one kept in a
//! `static`) or outlives a test process that was SIGKILLed is killed by
//! the [`reaper`](super::reaper) when the test process exits.

use std::fs::{self, OpenOptions};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use deadpool_redis::redis;

use super::reaper;
use super::tls::ServerTls;

/// How long a server may take to answer PING after it is spawned, and to
/// exit after SHUTDOWN: a minute, since a restarted server loads its AOF
/// first (the chaos run's, 2.4 million keys after 20 minutes at 2,000
/// tasks/s, took 8.2 s on two loaded cores, and one load ran past the
/// 10 s this was, which killed the server and left the run without Redis).
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// How often the harness polls the server while waiting for it.
const POLL_INTERVAL: Duration = Duration::from_millis(10);
/// Timeout of the harness's own control connections (PING, INFO, SHUTDOWN):
/// short, so a paused or dying server never blocks a test.
const CONTROL_TIMEOUT: Duration = Duration::from_millis(500);
/// Fresh ports to try when another process grabs ours between the probe
/// bind and the server's bind.
const FRESH_PORT_ATTEMPTS: usize = 5;
/// Tries to bind the same port again on restart, in case the kernel is slow
/// to release it.
const SAME_PORT_ATTEMPTS: usize = 20;
/// Lines of the server's log quoted in a panic message.
const LOG_TAIL_LINES: usize = 30;

const NOT_FOUND: &str = "redis-server not found on PATH: install it (Debian/Ubuntu: \
    `sudo apt-get install -y redis-server`; macOS: `brew install redis`), \
    or run `scripts/test`, which installs it";

/// How a [`RedisServer`] persists its data, and how clients reach it.
#[derive(Debug, Clone, Copy, Default)]
pub struct ServerOptions {
    /// `true`: `--appendonly yes --appendfsync always`, so every acknowledged
    /// write survives [`RedisServer::kill_and_restart`]. `false` (default): no
    /// persistence at all.
    pub aof: bool,
    /// `Some(password)`: `--requirepass password`, and
    /// [`RedisServer::url`] carries it. `None` (default): no password.
    pub requirepass: Option<&'static str>,
    /// `Some`: TLS only (`--port 0 --tls-port <port>`), and
    /// [`RedisServer::url`] is `rediss://`; the harness's own connections
    /// use TLS too. `None` (default): plain TCP.
    pub tls: Option<ServerTls>,
}

/// A private `redis-server` process, listening on `127.0.0.1` on a free
/// port, with its own data dir under the system temp dir.
///
/// Dropping it sends SIGCONT (in case it is paused) then SIGKILL, waits for
/// the process and removes the dir.
#[derive(Debug)]
pub struct RedisServer {
    port: u16,
    dir: PathBuf,
    opts: ServerOptions,
    /// `None` only between stopping one process and spawning the next.
    child: Option<Child>,
    /// Pid of the running process, 0 when there is none. Shared with the
    /// thread `pause_for` leaves behind, so that thread only resumes the
    /// process it paused, never a later one.
    pid: Arc<AtomicU32>,
    /// A Redis Cluster node (`--cluster-enabled yes`, see
    /// [`RedisCluster`](super::RedisCluster)): its cluster bus port
    /// (port + 10000) must be free too.
    cluster: bool,
}

/// Why a spawned server did not come up in a way the caller can retry.
enum LaunchError {
    /// Another process holds the port.
    AddrInUse,
}

impl RedisServer {
    /// Starts a server with no persistence (`--save "" --appendonly no`).
    pub fn start() -> RedisServer {
        RedisServer::start_with(ServerOptions::default())
    }

    /// Starts a replica of this server (plain TCP, no password) and waits
    /// until it has synced (`master_link_status:up`).
    pub fn replica(&self) -> RedisServer {
        let replica = RedisServer::start();
        let mut con = replica
            .client()
            .get_connection()
            .expect("connect to the replica");
        redis::cmd("REPLICAOF")
            .arg("127.0.0.1")
            .arg(self.port())
            .query::<()>(&mut con)
            .expect("REPLICAOF");
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let info: String = redis::cmd("INFO")
                .arg("replication")
                .query(&mut con)
                .expect("INFO replication");
            if info.contains("master_link_status:up") {
                return replica;
            }
            assert!(Instant::now() < deadline, "the replica never synced");
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// Starts a server with the given options and waits until it answers PING.
    ///
    /// Panics if `redis-server` is not on PATH or does not come up within
    /// 10 s; the message quotes the end of its log.
    pub fn start_with(opts: ServerOptions) -> RedisServer {
        RedisServer::start_fresh(opts, false)
    }

    /// Starts one node of a [`RedisCluster`](super::RedisCluster): with
    /// `aof`, AOF with `appendfsync always` (else no persistence),
    /// `--cluster-enabled yes`, a 2 s node timeout and
    /// `nodes.conf` in its dir, on a port whose bus port is free too; with
    /// `tls`, TLS only, between the nodes too. The node answers PING but
    /// belongs to no cluster yet.
    pub(super) fn start_cluster_node(aof: bool, tls: Option<ServerTls>) -> RedisServer {
        let opts = ServerOptions {
            aof,
            tls,
            ..ServerOptions::default()
        };
        RedisServer::start_fresh(opts, true)
    }

    /// Starts a server on a fresh port, trying another port when the chosen
    /// one is taken before the server binds it.
    fn start_fresh(opts: ServerOptions, cluster: bool) -> RedisServer {
        ensure_redis_server();
        let mut server = RedisServer {
            port: 0,
            dir: make_temp_dir(),
            opts,
            child: None,
            pid: Arc::new(AtomicU32::new(0)),
            cluster,
        };
        for _ in 0..FRESH_PORT_ATTEMPTS {
            server.port = if cluster {
                unused_cluster_port()
            } else {
                free_port()
            };
            match server.launch() {
                Ok(()) => return server,
                Err(LaunchError::AddrInUse) => continue,
            }
        }
        panic!(
            "redis-server found no free port in {FRESH_PORT_ATTEMPTS} attempts; last log:\n{}",
            server.log_tail()
        );
    }

    /// Starts a server on `port`, chosen in advance (see [`unused_port`]),
    /// for a test whose clients try to connect before the server exists.
    /// Waits until it answers PING; panics if the port stays taken.
    pub fn start_on(port: u16, opts: ServerOptions) -> RedisServer {
        ensure_redis_server();
        let mut server = RedisServer {
            port,
            dir: make_temp_dir(),
            opts,
            child: None,
            pid: Arc::new(AtomicU32::new(0)),
            cluster: false,
        };
        server.relaunch();
        server
    }

    /// The port the server listens on; it stays the same across restarts.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>/`, or `redis://:<password>@127.0.0.1:<port>/`
    /// with [`ServerOptions::requirepass`]; `rediss://` with
    /// [`ServerOptions::tls`].
    pub fn url(&self) -> String {
        match self.opts.requirepass {
            Some(password) => self.url_with(&format!(":{password}@")),
            None => self.url_with(""),
        }
    }

    /// [`url`](Self::url) for the ACL user `user` (see
    /// [`acl_setuser`](Self::acl_setuser)): `redis://user:password@…`.
    pub fn url_as(&self, user: &str, password: &str) -> String {
        self.url_with(&format!("{user}:{password}@"))
    }

    fn url_with(&self, userinfo: &str) -> String {
        self.url_on("127.0.0.1", userinfo)
    }

    fn url_on(&self, host: &str, userinfo: &str) -> String {
        let scheme = if self.opts.tls.is_some() {
            "rediss"
        } else {
            "redis"
        };
        format!("{scheme}://{userinfo}{host}:{}/", self.port)
    }

    /// The TLS settings the server was started with, if any.
    pub fn tls(&self) -> Option<&ServerTls> {
        self.opts.tls.as_ref()
    }

    /// The server's data dir (`dump.rdb`, `appendonlydir/`, `redis.log`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Pid of the current server process (it changes on restart).
    pub fn pid(&self) -> u32 {
        self.pid.load(Ordering::SeqCst)
    }

    /// A redis-rs client for [`url`](Self::url); with TLS it trusts the
    /// test CA and presents the test client certificate.
    pub fn client(&self) -> redis::Client {
        self.client_for(&self.url())
    }

    /// A redis-rs client for [`url_as`](Self::url_as), TLS as in
    /// [`client`](Self::client).
    pub fn client_as(&self, user: &str, password: &str) -> redis::Client {
        self.client_for(&self.url_as(user, password))
    }

    fn client_for(&self, url: &str) -> redis::Client {
        match &self.opts.tls {
            Some(tls) => tls.trusted_client(url),
            None => redis::Client::open(url).expect("redis url is valid"),
        }
    }

    /// A multiplexed connection for a test's own commands (probes, checks),
    /// with a response timeout of 30 s: the client's default of 0.5 s failed
    /// a test's `CLIENT LIST` when the machine was loaded (two cores, other
    /// tests and builds running), which says nothing about peerq.
    pub async fn connection(&self) -> redis::aio::MultiplexedConnection {
        let config =
            redis::AsyncConnectionConfig::new().set_response_timeout(Some(Duration::from_secs(30)));
        self.client()
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .expect("connect to the test's redis-server")
    }

    /// A deadpool-redis pool on [`url`](Self::url), for the tokio runtime.
    /// Creating it connects nothing; it needs a runtime only when used.
    pub fn pool(&self) -> deadpool_redis::Pool {
        // `deadpool_redis::Config` keeps no TLS certificates (its
        // `ConnectionInfo` copy drops them), so the manager is made from the
        // redis-rs `ConnectionInfo` of a client that has them.
        let info = self.client().get_connection_info().clone();
        let manager = deadpool_redis::Manager::new(info).expect("redis connection info is valid");
        deadpool_redis::Pool::builder(manager)
            .runtime(deadpool_redis::Runtime::Tokio1)
            .build()
            .expect("deadpool-redis pool config is valid")
    }

    /// Runs `ACL SETUSER` with `rule` split at whitespace, such as
    /// `"worker on >pw ~peerq:* +@stream"`, as the default user; panics if
    /// the server refuses it. Log in with [`url_as`](Self::url_as).
    pub fn acl_setuser(&self, rule: &str) {
        let mut con = self
            .control_connection()
            .expect("connect to set an ACL user");
        let mut cmd = redis::cmd("ACL");
        cmd.arg("SETUSER")
            .arg(rule.split_whitespace().collect::<Vec<_>>());
        let () = super::retry_interrupted(|| cmd.query(&mut con))
            .unwrap_or_else(|err| panic!("ACL SETUSER {rule}: {err}"));
    }

    /// A short-timeout connection for the harness's own commands (PING,
    /// INFO, SHUTDOWN, ACL), over TLS when the server serves it.
    fn control_connection(&self) -> redis::RedisResult<redis::Connection> {
        let client = match &self.opts.tls {
            Some(tls) => {
                let userinfo = self
                    .opts
                    .requirepass
                    .map(|password| format!(":{password}@"))
                    .unwrap_or_default();
                tls.trusted_client(&self.url_on(tls.control_host(), &userinfo))
            }
            None => self.client(),
        };
        super::connect_client(&client, CONTROL_TIMEOUT)
    }

    /// Graceful restart on the same port and dir, keeping the data.
    ///
    /// Sends `SHUTDOWN SAVE`, which writes `dump.rdb` even though `--save ""`
    /// turned snapshots off, waits for the process to exit, starts a new one
    /// and waits until it answers PING (that is, until it has loaded the
    /// data: a loading server answers PING with `-LOADING`). Without AOF the
    /// new process loads `dump.rdb` (Redis loads it at start whatever
    /// `--save` says); with AOF it loads the AOF, which is at least as new.
    pub fn restart(&mut self) {
        // A stopped process would never handle SHUTDOWN.
        self.resume();
        if let Ok(mut con) = self.control_connection() {
            // On success the server closes the connection, so the reply is an
            // I/O error; a real failure shows up as the process not exiting.
            // EINTR may come before the command is sent, so send it again
            // then; a second SHUTDOWN only waits behind the first.
            let shutdown = redis::cmd("SHUTDOWN").arg("SAVE").clone();
            let _ = super::retry_interrupted(|| shutdown.exec(&mut con));
        }
        self.wait_for_exit();
        self.relaunch();
    }

    /// Crash and restart: SIGKILL, then a new process on the same port and
    /// dir. It keeps only what the AOF held (everything acknowledged, since
    /// `appendfsync always`), and nothing without AOF.
    pub fn kill_and_restart(&mut self) {
        self.kill_and_restart_after(Duration::ZERO);
    }

    /// Crash, stay down for `down`, then restart as
    /// [`kill_and_restart`](Self::kill_and_restart) does: clients see
    /// refused connections meanwhile.
    pub fn kill_and_restart_after(&mut self, down: Duration) {
        self.kill();
        thread::sleep(down);
        if !self.opts.aof {
            // A `dump.rdb` left by an earlier `restart()` would bring back
            // old data, which a server without persistence never has.
            let _ = fs::remove_file(self.dir.join("dump.rdb"));
        }
        self.relaunch();
    }

    /// Crash and stay down: SIGKILL, and no new process until
    /// [`start_again`](Self::start_again). Clients see refused connections.
    pub fn stop(&mut self) {
        self.kill();
    }

    /// Starts a stopped server again on the same port and dir, with what
    /// its AOF kept (everything acknowledged, with [`ServerOptions::aof`]).
    pub fn start_again(&mut self) {
        self.relaunch();
    }

    /// Crash and come back empty: SIGKILL, its data files deleted (AOF
    /// and `dump.rdb`), a new process on the same port: a server whose
    /// disk was lost, or replaced.
    pub fn kill_and_restart_empty(&mut self) {
        self.kill();
        let _ = fs::remove_dir_all(self.dir.join("appendonlydir"));
        let _ = fs::remove_file(self.dir.join("dump.rdb"));
        self.relaunch();
    }

    /// Freezes the server with SIGSTOP: it stops answering, but its
    /// connections stay open and new TCP connects still complete (the
    /// kernel accepts into the backlog).
    pub fn pause(&self) {
        signal(self.pid(), "STOP");
    }

    /// Thaws a paused server with SIGCONT.
    pub fn resume(&self) {
        signal(self.pid(), "CONT");
    }

    /// Pauses the server now and resumes it after `d` from a background
    /// thread; returns at once. If the server is restarted or dropped in the
    /// meantime, the new process is left alone.
    pub fn pause_for(&self, d: Duration) {
        let pid = self.pid();
        self.pause();
        let current = Arc::clone(&self.pid);
        thread::spawn(move || {
            thread::sleep(d);
            if current.load(Ordering::SeqCst) == pid {
                signal(pid, "CONT");
            }
        });
    }

    /// Spawns a server on `self.port` and waits until it answers PING.
    fn launch(&mut self) -> Result<(), LaunchError> {
        let log = self.dir.join("redis.log");
        let stderr = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("stderr.log"))
            .expect("create redis-server stderr file");
        let port = self.port.to_string();
        let appendonly = if self.opts.aof { "yes" } else { "no" };
        let mut cmd = Command::new("redis-server");
        match &self.opts.tls {
            Some(tls) => cmd.args(tls.server_args(self.port)),
            None => cmd.args(["--port", &port]),
        };
        cmd.args(["--bind", "127.0.0.1", "--daemonize", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .arg("--logfile")
            .arg(&log)
            .args(["--save", "", "--appendonly", appendonly]);
        if self.opts.aof {
            cmd.args(["--appendfsync", "always"]);
        }
        if let Some(password) = self.opts.requirepass {
            cmd.args(["--requirepass", password]);
        }
        if self.cluster {
            // `nodes.conf` is relative to `--dir`, so a restarted node finds
            // its identity and epoch again and rejoins as itself.
            cmd.args(["--cluster-enabled", "yes", "--cluster-node-timeout", "2000"])
                .args(["--cluster-config-file", "nodes.conf"]);
            if let Some(tls) = &self.opts.tls {
                cmd.args(tls.cluster_args());
            }
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .unwrap_or_else(|err| panic!("spawn redis-server: {err}"));
        reaper::adopt_pid(child.id());
        self.pid.store(child.id(), Ordering::SeqCst);
        self.child = Some(child);

        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let exited = self
                .child
                .as_mut()
                .and_then(|child| child.try_wait().ok().flatten());
            if let Some(status) = exited {
                self.child = None;
                reaper::release_pid(self.pid.swap(0, Ordering::SeqCst));
                let tail = self.log_tail();
                if tail.contains("Address already in use") {
                    return Err(LaunchError::AddrInUse);
                }
                panic!("redis-server exited at start ({status}); log:\n{tail}");
            }
            // Another server that won the port race would answer too, so
            // check that the one answering is ours.
            if self.answering_pid() == Some(self.pid()) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                self.kill();
                panic!(
                    "redis-server on port {} did not answer PING within {READY_TIMEOUT:?}; log:\n{}",
                    self.port,
                    self.log_tail()
                );
            }
            thread::sleep(POLL_INTERVAL);
        }
    }

    /// Starts a new process on the same port after the old one is gone.
    pub(super) fn relaunch(&mut self) {
        for _ in 0..SAME_PORT_ATTEMPTS {
            match self.launch() {
                Ok(()) => return,
                Err(LaunchError::AddrInUse) => thread::sleep(Duration::from_millis(100)),
            }
        }
        panic!(
            "redis-server could not bind port {} again; log:\n{}",
            self.port,
            self.log_tail()
        );
    }

    /// The `process_id` of the server answering on our port, if it answers
    /// PING and has finished loading.
    fn answering_pid(&self) -> Option<u32> {
        let mut con = self.control_connection().ok()?;
        let pong: String = redis::cmd("PING").query(&mut con).ok()?;
        if pong != "PONG" {
            return None;
        }
        let info: String = redis::cmd("INFO").arg("server").query(&mut con).ok()?;
        info.lines()
            .find_map(|line| line.strip_prefix("process_id:"))
            .and_then(|pid| pid.trim().parse().ok())
    }

    /// Waits for the process to exit after SHUTDOWN; panics (after killing
    /// it) if it does not.
    fn wait_for_exit(&mut self) {
        let deadline = Instant::now() + READY_TIMEOUT;
        while let Some(child) = self.child.as_mut() {
            if let Ok(Some(_)) = child.try_wait() {
                self.child = None;
                reaper::release_pid(self.pid.swap(0, Ordering::SeqCst));
                return;
            }
            if Instant::now() >= deadline {
                self.kill();
                panic!(
                    "redis-server on port {} did not exit after SHUTDOWN SAVE; log:\n{}",
                    self.port,
                    self.log_tail()
                );
            }
            thread::sleep(POLL_INTERVAL);
        }
    }

    /// SIGCONT then SIGKILL the process and reap it; it stays down until
    /// [`relaunch`](Self::relaunch). Never panics: it runs in `Drop`,
    /// possibly while a test is already panicking.
    pub(super) fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            // A stopped process still dies of SIGKILL, but resuming first
            // keeps the kernel from holding it in the stopped state.
            signal(child.id(), "CONT");
            let _ = child.kill();
            let _ = child.wait();
            reaper::release_pid(child.id());
        }
        self.pid.store(0, Ordering::SeqCst);
    }

    /// The last lines of the server's log and stderr, for panic messages.
    pub(super) fn log_tail(&self) -> String {
        let mut out = String::new();
        for name in ["redis.log", "stderr.log"] {
            let text = fs::read(self.dir.join(name))
                .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
                .unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let start = lines.len().saturating_sub(LOG_TAIL_LINES);
            for line in &lines[start..] {
                out.push_str(line);
                out.push('\n');
            }
        }
        out
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = fs::remove_dir_all(&self.dir);
        reaper::release_dir(&self.dir);
    }
}

/// Panics with one clear line when `redis-server` cannot be run; checked
/// once per process.
fn ensure_redis_server() {
    static FOUND: OnceLock<bool> = OnceLock::new();
    let found = *FOUND.get_or_init(|| {
        Command::new("redis-server")
            .arg("--version")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok()
    });
    if !found {
        panic!("{NOT_FOUND}");
    }
}

/// A port that was free a moment ago. Racy by nature: the caller retries
/// when the server cannot bind it.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .expect("bind a probe socket on 127.0.0.1")
}

/// A port on `127.0.0.1` that nothing listens on now and that the kernel
/// will not hand out by itself, for [`RedisServer::start_on`].
///
/// It lies below Linux's ephemeral range (32768 and up by default), where
/// [`free_port`] and every outgoing connection take their ports: a port
/// from that range could be given to another test's server meanwhile, or
/// become the local port of a client's own connect attempt to it (a TCP
/// self-connect, which then looks like a server that answers nothing).
pub fn unused_port() -> u16 {
    random_unused_port(20_000..32_000, None)
}

/// A port for a cluster node: it and its cluster bus port (port + 10000)
/// are both free now, and both lie below the ephemeral range, for the
/// reasons given at [`unused_port`].
fn unused_cluster_port() -> u16 {
    random_unused_port(20_000..22_768, Some(10_000))
}

/// A random port in `range` that binds, and whose `port + bus_offset` binds
/// too when there is an offset.
fn random_unused_port(range: std::ops::Range<u16>, bus_offset: Option<u16>) -> u16 {
    loop {
        let port = range.start + rand::random::<u16>() % (range.end - range.start);
        let Ok(_listener) = TcpListener::bind(("127.0.0.1", port)) else {
            continue;
        };
        let bus_free =
            bus_offset.is_none_or(|offset| TcpListener::bind(("127.0.0.1", port + offset)).is_ok());
        if bus_free {
            return port;
        }
    }
}

/// Creates a fresh dir under the system temp dir.
fn make_temp_dir() -> PathBuf {
    fresh_dir("redis")
}

/// Creates a fresh dir `peerq-<what>-…` under the system temp dir, which
/// the reaper removes when the test process exits.
pub(super) fn fresh_dir(what: &str) -> PathBuf {
    fresh_dir_in(&std::env::temp_dir(), what)
}

/// Creates a fresh dir `peerq-<what>-…` under `base`, which the reaper
/// removes when the test process exits.
pub(super) fn fresh_dir_in(base: &std::path::Path, what: &str) -> PathBuf {
    loop {
        let dir = base.join(format!(
            "peerq-{what}-{}-{:08x}",
            std::process::id(),
            rand::random::<u32>()
        ));
        match fs::create_dir(&dir) {
            Ok(()) => {
                reaper::adopt_dir(&dir);
                return dir;
            }
            Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(err) => panic!("create {what} temp dir {}: {err}", dir.display()),
        }
    }
}

/// Sends `SIG<name>` to `pid` with the `kill` command (`unsafe` is
/// forbidden, so no libc). Returns whether it was delivered; pid 0 (no
/// process) is skipped, as it would mean the whole process group.
pub(super) fn signal(pid: u32, name: &str) -> bool {
    if pid == 0 {
        return false;
    }
    Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

/// Whether a process with this pid exists (`kill -0`), for tests that check
/// a server is really gone.
pub fn process_exists(pid: u32) -> bool {
    signal(pid, "0")
}
