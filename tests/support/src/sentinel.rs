//! A private Redis Sentinel setup ([`SentinelSet`]): a master, two replicas
//! and three sentinels (`redis-server --sentinel`, quorum 2), with ways to
//! fail the master over: `SENTINEL FAILOVER`, a SIGKILL, or a network cut
//! of the master from the others. [`SentinelOptions`] adds passwords, TLS,
//! `min-replicas-to-write`, and the split: the master in a network
//! namespace of its own, the rest in another ([`SplitNet`]), so that the
//! link between them can be cut while the test reaches both. Every process
//! is killed on drop, then the namespaces deleted.

use std::thread;
use std::time::{Duration, Instant};

use deadpool_redis::redis;

use super::netns::{Netns, SplitNet};

mod node;
use super::tls::ServerTls;
use node::Node;

/// The name the sentinels monitor the master by.
pub const MASTER_NAME: &str = "peerq-master";
/// How long the sentinels wait before they find a server down: 3 s, not
/// 1 s. A sentinel sends its first `PING` on a new link (to a master it
/// just switched to) a ping period (1 s at most) after making the link,
/// and counts the time to down from the link's making: with 1 s, a freshly
/// promoted master was found down whenever its `PONG` came after the
/// sentinel's next check, and failed over a second time (the others' down
/// votes on the first master still count for a few seconds): about one
/// kill test in four on two loaded cores. With 2 s, a sentinel that the
/// load held up for two seconds did the same, once.
const DOWN_AFTER_MS: u64 = 3000;
/// How long a failover may take before it is tried again.
const FAILOVER_TIMEOUT_MS: u64 = 5000;
/// How long the harness waits for the sentinels to agree on a state: up
/// to a minute, since after a kill the sentinels find the restarted old
/// master only at their next `INFO` to it, then make it a replica of the
/// new one, which syncs it in full; on the two cores, beside the suite's
/// heavy tests, that once took over 30 s (with `INFO` every 10 s).
const SETTLE: Duration = Duration::from_secs(60);
/// `SENTINEL DEBUG` timers, shorter than Sentinel's defaults (10 s, 2 s
/// and 30 s): a sentinel sends `INFO` to a server every `INFO-PERIOD`, so
/// it finds a returning old master that soon, and demotes it after four
/// `PUBLISH-PERIOD`s (its hello messages, which also introduce the
/// sentinels to each other): a healed cut then ends in ~3 s, not ~11 s. A
/// sentinel whose timer ran 2 s late (two loaded cores) does nothing for
/// `TILT-PERIOD`, lest it act on stale replies: 5 s of that, not 30 s.
const DEBUG_TIMERS: [(&str, u64); 3] = [
    ("info-period", 1000),
    ("publish-period", 500),
    ("tilt-period", 5000),
];
/// Timeout of the harness's own connections and commands. The test
/// reaches every server, cut off or not, so nothing waits it out for
/// nothing; on two loaded cores a TLS handshake took over 0.5 s.
const CONTROL_TIMEOUT: Duration = Duration::from_secs(2);

/// How a [`SentinelSet`] is made. The default: plain TCP on loopback, no
/// passwords, no `min-replicas-to-write`.
#[derive(Debug, Clone, Copy, Default)]
pub struct SentinelOptions {
    /// The master in a network namespace of its own, the replicas and
    /// sentinels in another, the test in the root one reaching both
    /// ([`SplitNet`]): [`SentinelSet::cut_master`] can then cut the
    /// master off. Needs root; not with `tls` (the test certificates name
    /// only loopback).
    pub split: bool,
    /// `min-replicas-to-write` and `min-replicas-max-lag` on every data
    /// server, so on whichever is master.
    pub min_replicas: Option<MinReplicas>,
    /// The data servers' `requirepass` (and `masterauth`, the sentinels'
    /// `auth-pass`), for the default user.
    pub password: Option<&'static str>,
    /// The sentinels' own `requirepass`; [`SentinelSet::sentinel_urls`]
    /// carry it.
    pub sentinel_password: Option<&'static str>,
    /// TLS only, on every server and sentinel and between them
    /// (replication, the sentinels' links), with client certificates from
    /// the test PKI presented by each process.
    pub tls: Option<ServerTls>,
}

/// `min-replicas-to-write` and `min-replicas-max-lag`: a master refuses
/// writes (`NOREPLICAS`) unless `to_write` replicas acknowledged its stream
/// within the last `max_lag_secs` seconds.
#[derive(Debug, Clone, Copy)]
pub struct MinReplicas {
    /// `min-replicas-to-write`.
    pub to_write: u32,
    /// `min-replicas-max-lag`, in seconds (Redis's unit).
    pub max_lag_secs: u32,
}

/// A master, two replicas and three sentinels.
#[derive(Debug)]
pub struct SentinelSet {
    /// The data servers, the first the master at start.
    servers: Vec<Node>,
    sentinels: Vec<Node>,
    opts: SentinelOptions,
    /// Declared last, so dropped after the processes in its namespaces.
    net: Option<SplitNet>,
}

impl SentinelSet {
    /// Starts the default set: plain TCP on `127.0.0.1`.
    pub fn start() -> SentinelSet {
        SentinelSet::start_with(SentinelOptions::default())
    }

    /// Starts the servers and the sentinels, and waits until every sentinel
    /// knows both replicas and the two other sentinels.
    pub fn start_with(opts: SentinelOptions) -> SentinelSet {
        assert!(
            !(opts.split && opts.tls.is_some()),
            "the test certificates are for loopback only: no TLS on a split set"
        );
        let net = opts.split.then(SplitNet::new);
        // Where each data server runs and the address it binds; the
        // sentinels run beside the replicas.
        let place = |index: usize| {
            let netns = netns_of(&net, index);
            let host = match &net {
                Some(net) if index == 0 => net.a().addr.to_string(),
                Some(net) => net.b().addr.to_string(),
                None => "127.0.0.1".to_owned(),
            };
            (host, netns)
        };
        let mut used = Vec::new();
        let (host, netns) = place(0);
        let master = Node::spawn(&opts, false, (&host, netns), None, &mut used);
        let at = Some((master.host.as_str(), master.port));
        let (host, netns) = place(1);
        let replicas: Vec<Node> = (0..2)
            .map(|_| Node::spawn(&opts, false, (&host, netns), at, &mut used))
            .collect();
        let sentinels: Vec<Node> = (0..3)
            .map(|_| Node::spawn(&opts, true, (&host, netns), at, &mut used))
            .collect();
        for sentinel in &sentinels {
            for (timer, ms) in DEBUG_TIMERS {
                // Redis before 7.0 has no `SENTINEL DEBUG`: the defaults then.
                let _ =
                    sentinel.query::<()>(redis::cmd("SENTINEL").arg("DEBUG").arg(timer).arg(ms));
            }
        }
        let master_port = master.port;
        let servers = std::iter::once(master).chain(replicas).collect();
        let set = SentinelSet {
            servers,
            sentinels,
            opts,
            net,
        };
        assert_eq!(set.wait_settled(None), master_port, "a failover at start");
        set
    }

    /// The sentinels' URLs, for `Redis::sentinel`: `rediss://` with TLS,
    /// with the sentinels' password if they have one.
    pub fn sentinel_urls(&self) -> Vec<String> {
        let scheme = if self.opts.tls.is_some() {
            "rediss"
        } else {
            "redis"
        };
        let auth = self
            .opts
            .sentinel_password
            .map_or(String::new(), |pw| format!(":{pw}@"));
        self.sentinels
            .iter()
            .map(|s| format!("{scheme}://{auth}{}:{}/", s.host, s.port))
            .collect()
    }

    /// The sentinels' URLs joined by commas, for `--redis`.
    pub fn sentinel_arg(&self) -> String {
        self.sentinel_urls().join(",")
    }

    /// The master's port as the first sentinel that answers names it
    /// (ports are unique in a set, even across namespaces).
    pub fn master_port(&self) -> u16 {
        let mut last = None;
        for sentinel in &self.sentinels {
            match sentinel.named_master() {
                Ok(port) => return port,
                Err(e) => last = Some(e),
            }
        }
        panic!("no sentinel names the master: {last:?}")
    }

    /// Runs `cmd` on the data server on `port`, as the default user, on a
    /// connection of its own with a short timeout: a test's probes (`ROLE`,
    /// `INFO`, a write the server may refuse).
    pub fn query_server<T: redis::FromRedisValue>(
        &self,
        port: u16,
        cmd: &redis::Cmd,
    ) -> redis::RedisResult<T> {
        self.server(port).query(cmd)
    }

    /// The role (`master`, `slave`) of the data server on `port`, and for a
    /// replica the port of its master, if it answers.
    pub fn role(&self, port: u16) -> Option<(String, Option<u16>)> {
        self.server(port).role()
    }

    /// Whether every sentinel finds the data server on `port` down
    /// (`s_down`): with the server answering the test, the mark of a cut.
    pub fn sentinels_find_down(&self, port: u16) -> bool {
        let mut cmd = redis::cmd("SENTINEL");
        cmd.arg("REPLICAS").arg(MASTER_NAME);
        self.sentinels.iter().all(|sentinel| {
            let replicas: Vec<Vec<String>> = sentinel.query(&cmd).unwrap_or_default();
            replicas.iter().any(|fields| {
                let field = |name: &str| {
                    fields
                        .chunks(2)
                        .find(|kv| kv[0] == name)
                        .map(|kv| kv[1].as_str())
                };
                field("port") == Some(&port.to_string())
                    && field("flags").is_some_and(|f| f.contains("s_down"))
            })
        })
    }

    /// `ACL SETUSER` with `rule` split at whitespace on every data server
    /// (ACLs are not replicated); panics if one refuses it.
    pub fn acl_setuser(&self, rule: &str) {
        for server in &self.servers {
            let mut cmd = redis::cmd("ACL");
            cmd.arg("SETUSER")
                .arg(rule.split_whitespace().collect::<Vec<_>>());
            let () = server
                .query(&cmd)
                .unwrap_or_else(|err| panic!("ACL SETUSER {rule}: {err}"));
        }
    }

    fn server(&self, port: u16) -> &Node {
        self.servers
            .iter()
            .find(|s| s.port == port)
            .unwrap_or_else(|| panic!("no server on port {port}"))
    }

    /// `SENTINEL FAILOVER`: a replica is promoted and the old master made
    /// its replica. Returns the new master's port once the set has settled
    /// ([`wait_settled`](Self::wait_settled)).
    pub fn failover(&self) -> u16 {
        let old = self.master_port();
        self.sentinels[0]
            .query::<()>(redis::cmd("SENTINEL").arg("FAILOVER").arg(MASTER_NAME))
            .expect("SENTINEL FAILOVER");
        self.wait_new_master(old);
        self.wait_settled(Some(old))
    }

    /// SIGKILLs the master, waits until the sentinels promote a replica,
    /// then starts the old one again (empty, as it had no persistence), as
    /// the sentinels then make it a replica of the new master. Returns the
    /// new master's port once the set has settled.
    pub fn kill_master(&mut self) -> u16 {
        let old = self.master_port();
        let index = self.servers.iter().position(|s| s.port == old).unwrap();
        self.servers[index].stop();
        self.wait_new_master(old);
        self.servers[index].start_again(netns_of(&self.net, index));
        self.wait_settled(Some(old))
    }

    /// On a split set: cuts the master (still the first server) off from
    /// the replicas and sentinels, both ways; the test still reaches it.
    /// Returns once the sentinels have promoted a replica (every sentinel
    /// names it and it says it is master), with its port. The old master
    /// goes on as a master, taking writes, until [`heal`](Self::heal).
    pub fn cut_master(&self) -> u16 {
        let old = self.master_port();
        assert_eq!(
            old, self.servers[0].port,
            "the master is not the first server"
        );
        self.split().cut();
        self.wait_new_master(old)
    }

    /// Heals the cut, and returns the new master's port once the set has
    /// settled: the sentinels have made the old master a replica of the
    /// new one (which throws away what it took meanwhile).
    pub fn heal(&self) -> u16 {
        self.split().heal();
        self.wait_settled(Some(self.servers[0].port))
    }

    fn split(&self) -> &SplitNet {
        self.net
            .as_ref()
            .expect("a cut needs a split set (SentinelOptions::split)")
    }

    /// Waits until every sentinel names a master other than `old`, and it
    /// answers `ROLE` as a master; returns its port.
    fn wait_new_master(&self, old: u16) -> u16 {
        let deadline = Instant::now() + SETTLE;
        loop {
            let named: Vec<Option<u16>> = self
                .sentinels
                .iter()
                .map(|s| s.named_master().ok())
                .collect();
            if let Some(Some(new)) = named.first()
                && *new != old
                && named.iter().all(|n| *n == Some(*new))
                && self.server(*new).role().is_some_and(|(r, _)| r == "master")
            {
                return *new;
            }
            assert!(
                Instant::now() < deadline,
                "no new master within {SETTLE:?}: the sentinels name {named:?}\n{}",
                self.state()
            );
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// What each server and sentinel says, with the end of each
    /// sentinel's log, for a panic message.
    pub fn state(&self) -> String {
        let mut out = String::new();
        for server in &self.servers {
            out += &format!("server {}: {:?}\n", server.port, server.role());
        }
        for sentinel in &self.sentinels {
            let mut master = redis::cmd("SENTINEL");
            master.arg("MASTER").arg(MASTER_NAME);
            let mut replicas = redis::cmd("SENTINEL");
            replicas.arg("REPLICAS").arg(MASTER_NAME);
            let pick = |fields: Vec<String>| {
                let keep = ["port", "flags", "num-other-sentinels", "role-reported"];
                let kv = fields.chunks(2).filter(|kv| keep.contains(&kv[0].as_str()));
                kv.map(|kv| format!("{}={}", kv[0], kv[1]))
                    .collect::<Vec<_>>()
            };
            let master = sentinel.query::<Vec<String>>(&master).map(pick);
            let replicas = sentinel
                .query::<Vec<Vec<String>>>(&replicas)
                .map(|all| all.into_iter().map(pick).collect::<Vec<_>>());
            let tilt = sentinel.info("sentinel").contains("sentinel_tilt:1");
            out += &format!(
                "sentinel {} (tilt {tilt}): master {master:?}, replicas {replicas:?}, log:\n{}\n",
                sentinel.port,
                sentinel.log_tail()
            );
        }
        out
    }

    /// Waits until the set has settled: every sentinel names one master,
    /// not `old`, and knows both replicas of it up and the two other
    /// sentinels, and both replicas have synced with it; returns its port.
    ///
    /// Whichever master: on two loaded cores a sentinel that heard nothing
    /// from a just-promoted master for its down-after time has failed it
    /// over again (the others' down votes on the first master still
    /// counted), which is a failover all the same for a test.
    pub fn wait_settled(&self, old: Option<u16>) -> u16 {
        let deadline = Instant::now() + SETTLE;
        loop {
            if let Ok(master) = self.sentinels[0].named_master()
                && Some(master) != old
                && self.sentinels.iter().all(|s| s.knows(master, 2))
                && self.server(master).synced_replicas() >= 2
            {
                return master;
            }
            assert!(
                Instant::now() < deadline,
                "the set never settled with both replicas synced:\n{}",
                self.state()
            );
            thread::sleep(Duration::from_millis(50));
        }
    }
}

/// The namespace of data server `index` on a split set: the first
/// (master at start) alone in `a`, the others in `b`.
fn netns_of(net: &Option<SplitNet>, index: usize) -> Option<&Netns> {
    let net = net.as_ref()?;
    Some(if index == 0 {
        &net.a().netns
    } else {
        &net.b().netns
    })
}
