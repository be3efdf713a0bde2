//! One `redis-server` process of a [`SentinelSet`](super::SentinelSet):
//! a data server or a sentinel, in a network namespace or not, started,
//! stopped, asked and waited for.

use std::ffi::OsString;
use std::fs;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use deadpool_redis::redis;

use super::{
    CONTROL_TIMEOUT, DOWN_AFTER_MS, FAILOVER_TIMEOUT_MS, MASTER_NAME, SETTLE, SentinelOptions,
};
use crate::netns::Netns;
use crate::redis_server::{fresh_dir, unused_port};
use crate::tls::ServerTls;
use crate::{connect_client, reaper, retry_interrupted};

/// One `redis-server` process of the set: a data server or a sentinel.
#[derive(Debug)]
pub(super) struct Node {
    /// The address it binds, and everyone reaches it at.
    pub(super) host: String,
    pub(super) port: u16,
    pub(super) dir: PathBuf,
    /// `redis-server`'s arguments before the port's: its config file, and
    /// `--sentinel` for a sentinel.
    pub(super) leading: Vec<OsString>,
    pub(super) tls: Option<ServerTls>,
    /// For the harness's checks: TLS and the password as needed. `None`
    /// only until the port is chosen.
    pub(super) client: Option<redis::Client>,
    /// `None` while stopped.
    pub(super) child: Option<Child>,
}

impl Node {
    /// Starts a data server (a replica of `master` if given: it returns once
    /// synced) or a sentinel (monitoring `master`) that binds `host`, in
    /// `netns` if given, on a port no other node of the set has.
    pub(super) fn spawn(
        opts: &SentinelOptions,
        sentinel: bool,
        (host, netns): (&str, Option<&Netns>),
        master: Option<(&str, u16)>,
        used: &mut Vec<u16>,
    ) -> Node {
        let dir = fresh_dir(if sentinel { "sentinel" } else { "redis" });
        let mut config = format!(
            "bind {host}\nprotected-mode no\ndaemonize no\ndir {dir}\nlogfile {dir}/redis.log\n",
            dir = dir.display()
        );
        if let Some(tls) = &opts.tls {
            // TLS to the servers it connects to too (replication, a
            // sentinel's links), presenting the test client certificate: by
            // default it would present its server certificate, made for
            // server authentication only, which the servers refuse.
            config += &format!(
                "tls-replication yes\ntls-client-cert-file {}\ntls-client-key-file {}\n",
                tls.pki.client.cert.display(),
                tls.pki.client.key.display()
            );
        }
        let password = if sentinel {
            opts.sentinel_password
        } else {
            opts.password
        };
        if let Some(password) = password {
            // A sentinel with `requirepass` logs in to the others with it.
            config += &format!("requirepass {password}\n");
        }
        match (sentinel, master) {
            (true, Some((host, port))) => {
                config += &format!(
                    "sentinel monitor {MASTER_NAME} {host} {port} 2\n\
                     sentinel down-after-milliseconds {MASTER_NAME} {DOWN_AFTER_MS}\n\
                     sentinel failover-timeout {MASTER_NAME} {FAILOVER_TIMEOUT_MS}\n\
                     sentinel parallel-syncs {MASTER_NAME} 2\n"
                );
                if let Some(password) = opts.password {
                    config += &format!("sentinel auth-pass {MASTER_NAME} {password}\n");
                }
            }
            (true, None) => panic!("a sentinel monitors a master"),
            (false, master) => {
                // A replica that must sync in full (a demoted old master, a
                // restarted one) is served at once, not 5 s later in case
                // others come.
                config += "save \"\"\nappendonly no\nrepl-diskless-sync-delay 0\n";
                if let Some(password) = opts.password {
                    config += &format!("masterauth {password}\n");
                }
                if let Some(min) = opts.min_replicas {
                    config += &format!(
                        "min-replicas-to-write {}\nmin-replicas-max-lag {}\n",
                        min.to_write, min.max_lag_secs
                    );
                }
                if let Some((host, port)) = master {
                    config += &format!("replicaof {host} {port}\n");
                }
            }
        }
        // Sentinel rewrites its config file (the replicas and sentinels it
        // finds), so it is a file of its own, writable. The port goes on
        // the command line: it changes if another process takes it first.
        let file = dir.join("redis.conf");
        fs::write(&file, config).expect("write redis.conf");
        let mut leading = vec![file.into_os_string()];
        if sentinel {
            leading.push("--sentinel".into());
        }
        let mut node = Node {
            host: host.to_owned(),
            port: 0,
            dir,
            leading,
            tls: opts.tls,
            client: None,
            child: None,
        };
        for _ in 0..5 {
            let port = loop {
                let port = unused_port();
                if !used.contains(&port) {
                    break port;
                }
            };
            node.port = port;
            let auth = password.map_or(String::new(), |pw| format!(":{pw}@"));
            node.client = Some(match &opts.tls {
                Some(tls) => tls.trusted_client(&format!("rediss://{auth}{host}:{port}/")),
                None => redis::Client::open(format!("redis://{auth}{host}:{port}/"))
                    .expect("a valid URL"),
            });
            if node.launch(netns) {
                used.push(port);
                let deadline = Instant::now() + SETTLE;
                while master.is_some()
                    && !sentinel
                    && !node.info("replication").contains("master_link_status:up")
                {
                    assert!(Instant::now() < deadline, "the replica never synced");
                    thread::sleep(Duration::from_millis(20));
                }
                return node;
            }
        }
        panic!(
            "no free port for a redis-server in 5 tries:\n{}",
            node.log_tail()
        );
    }

    /// Spawns the process and waits until it answers; `false` if another
    /// process holds its port.
    pub(super) fn launch(&mut self, netns: Option<&Netns>) -> bool {
        let mut cmd = match netns {
            Some(netns) => netns.command("redis-server"),
            None => Command::new("redis-server"),
        };
        let listen = match &self.tls {
            // TLS only: no plain port a client could fall back to.
            Some(tls) => tls.server_args(self.port),
            None => vec!["--port".into(), self.port.to_string().into()],
        };
        let child = cmd
            .args(&self.leading)
            .args(listen)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|err| panic!("spawn redis-server: {err}"));
        reaper::adopt_pid(child.id());
        let pid = child.id();
        self.child = Some(child);
        let deadline = Instant::now() + SETTLE;
        loop {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                self.child = None;
                reaper::release_pid(pid);
                if self.log_tail().contains("Address already in use") {
                    return false;
                }
                panic!(
                    "redis-server exited at start ({status}):\n{}",
                    self.log_tail()
                );
            }
            // Another server that won the port would answer too.
            let ours = self.info("server").contains(&format!("process_id:{pid}\r"));
            if ours {
                return true;
            }
            assert!(
                Instant::now() < deadline,
                "redis-server on {}:{} never answered:\n{}",
                self.host,
                self.port,
                self.log_tail()
            );
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILLs the process; it stays down until [`start_again`](Self::start_again).
    pub(super) fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
            reaper::release_pid(child.id());
        }
    }

    /// Starts the process again on the same port, with the same arguments.
    pub(super) fn start_again(&mut self, netns: Option<&Netns>) {
        for _ in 0..20 {
            if self.launch(netns) {
                return;
            }
            thread::sleep(Duration::from_millis(100));
        }
        panic!("redis-server could not bind port {} again", self.port);
    }

    pub(super) fn query<T: redis::FromRedisValue>(
        &self,
        cmd: &redis::Cmd,
    ) -> redis::RedisResult<T> {
        let client = self.client.as_ref().expect("a port is chosen");
        // A connect that timed out is tried again (twice): nothing was sent.
        let mut tries = 0;
        let mut con = loop {
            match connect_client(client, CONTROL_TIMEOUT) {
                Ok(con) => break con,
                Err(e) if e.is_timeout() && tries < 2 => tries += 1,
                Err(e) => return Err(e),
            }
        };
        retry_interrupted(|| cmd.query(&mut con))
    }

    /// `INFO <section>`, empty if it does not answer.
    pub(super) fn info(&self, section: &str) -> String {
        self.query(redis::cmd("INFO").arg(section))
            .unwrap_or_default()
    }

    /// The port of the master a sentinel names.
    pub(super) fn named_master(&self) -> redis::RedisResult<u16> {
        let mut cmd = redis::cmd("SENTINEL");
        cmd.arg("get-master-addr-by-name").arg(MASTER_NAME);
        self.query::<(String, u16)>(&cmd).map(|(_, port)| port)
    }

    /// Whether a sentinel names `master` and knows `replicas` replicas up
    /// and two other sentinels.
    pub(super) fn knows(&self, master: u16, replicas: usize) -> bool {
        let info: redis::RedisResult<Vec<String>> =
            self.query(redis::cmd("SENTINEL").arg("MASTER").arg(MASTER_NAME));
        let Ok(info) = info else { return false };
        let field = |name: &str| {
            info.chunks(2)
                .find(|kv| kv[0] == name)
                .map(|kv| kv[1].clone())
        };
        let slaves: redis::RedisResult<Vec<Vec<String>>> =
            self.query(redis::cmd("SENTINEL").arg("REPLICAS").arg(MASTER_NAME));
        let up = slaves.map_or(0, |slaves| {
            slaves
                .iter()
                .filter(|s| s.chunks(2).any(|kv| kv[0] == "flags" && kv[1] == "slave"))
                .count()
        });
        field("port").as_deref() == Some(&master.to_string())
            && field("flags").as_deref() == Some("master")
            && field("num-other-sentinels").as_deref() == Some("2")
            && up >= replicas
    }

    /// A data server's role, and for a replica its master's port.
    pub(super) fn role(&self) -> Option<(String, Option<u16>)> {
        let role: Vec<redis::Value> = self.query(&redis::cmd("ROLE")).ok()?;
        let text = |value: &redis::Value| match value {
            redis::Value::BulkString(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
            redis::Value::SimpleString(s) => Some(s.clone()),
            _ => None,
        };
        let name = text(role.first()?)?;
        let master = match role.get(2) {
            Some(redis::Value::Int(port)) if name == "slave" => u16::try_from(*port).ok(),
            _ => None,
        };
        Some((name, master))
    }

    /// How many replicas are connected to this master and online.
    pub(super) fn synced_replicas(&self) -> usize {
        self.info("replication")
            .lines()
            .filter(|line| line.starts_with("slave") && line.contains("state=online"))
            .count()
    }

    /// The last lines of its log, for panic messages.
    pub(super) fn log_tail(&self) -> String {
        let log = fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.stop();
        let _ = fs::remove_dir_all(&self.dir);
        reaper::release_dir(&self.dir);
    }
}
