//! Linux network namespaces that the harness makes itself, for tests that
//! cut a network for real rather than freeze a process: [`SplitNet`], two
//! namespaces whose link to each other can be cut and healed while the
//! test, in the root namespace, still reaches both.
//!
//! ```text
//!   namespace a  ──── link "other" (cut: frames dropped) ────  namespace b
//!   10.X.Y.2 ("root")                                  10.X.Y.6 ("root")
//!         │ veth                                               │ veth
//!   10.X.Y.1 (pq<tag>a)      root namespace: the test     10.X.Y.5 (pq<tag>b)
//! ```
//!
//! Each side has one address, on its veth to the root namespace, which
//! the other side reaches over the direct link (a host route, no
//! forwarding: `net.ipv4.ip_forward` stays as it is, 0 on this machine),
//! and the test over the veth. Every address is one hop from everyone who
//! uses it, so a process on either side and the test name a server by the
//! same address (what Sentinel hands out).
//!
//! A cut makes each side's neighbour entry for the other's address point at
//! a MAC address no interface has: frames still leave, and the other side's
//! kernel drops them as addressed to another host. Nothing is refused, no
//! error comes back: connections hang and time out, as across a real
//! partition. (`tc netem` or iptables would do too, but a kernel may lack
//! them, as the one this was written on does; a blackhole route would fail
//! local sends at once with `EINVAL`.)
//!
//! Needs root (`CAP_NET_ADMIN`) and iproute2's `ip` (scripts/test installs
//! it). The namespaces are named per process and test
//! (`peerq-<pid>-<tag>-a`), deleted on drop (a panicking test drops them
//! too; deleting one removes its links), and those of a test process that
//! died without dropping them (a runner's SIGKILL) are deleted by the next
//! one that makes a [`SplitNet`].

use std::ffi::OsStr;
use std::fmt;
use std::net::Ipv4Addr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Once;
use std::sync::atomic::{AtomicBool, Ordering};

/// The prefix of every namespace the harness makes.
const PREFIX: &str = "peerq-";
/// A unicast, locally administered MAC address that no interface here has:
/// where a cut sends the other side's frames.
const NOWHERE: &str = "02:00:00:00:00:01";
/// The name, inside each namespace, of its link to the other side.
const OTHER: &str = "other";
/// The name, inside each namespace, of its veth to the root namespace.
const ROOT: &str = "root";

/// One network namespace, deleted on drop. Its processes must be ended
/// first: a namespace lives on, nameless, while a process is in it.
pub struct Netns {
    name: String,
}

impl Netns {
    /// Makes the namespace `name` with its loopback up; `None` if the name
    /// is taken.
    fn create(name: String) -> Option<Netns> {
        let out = Command::new(ip_binary())
            .args(["netns", "add", &name])
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|err| {
                panic!("run `ip netns add`: {err}; install iproute2 (scripts/test does)")
            });
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr);
            if stderr.contains("File exists") {
                return None;
            }
            panic!(
                "`ip netns add {name}` failed ({}): {stderr}network namespaces need root \
                 (CAP_NET_ADMIN)",
                out.status
            );
        }
        let netns = Netns { name };
        netns.ip(&["link", "set", "lo", "up"]);
        Some(netns)
    }

    /// The namespace's name, as `ip netns` lists it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A command that runs `program` inside the namespace: `ip netns exec
    /// <name> <program>`, which execs it (the child's pid is the
    /// program's, so signals reach it).
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        let mut cmd = Command::new(ip_binary());
        cmd.args(["netns", "exec", &self.name]).arg(program);
        cmd
    }

    /// `ip -n <name> <args>`; panics if it fails.
    fn ip(&self, args: &[&str]) {
        run_ip(&[&["-n", &self.name], args].concat());
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Never panics: it runs while a test may be panicking already.
        let _ = Command::new(ip_binary())
            .args(["netns", "delete", &self.name])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

impl fmt::Debug for Netns {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}

/// One side of a [`SplitNet`]: its namespace and its one address.
#[derive(Debug)]
pub struct Side {
    /// Where the side's processes run ([`Netns::command`]).
    pub netns: Netns,
    /// The address the other side and the test reach it at; processes on
    /// this side bind it.
    pub addr: Ipv4Addr,
}

/// Two namespaces, `a` and `b`, linked to each other and each to the root
/// namespace; the link between them can be cut and healed.
#[derive(Debug)]
pub struct SplitNet {
    a: Side,
    b: Side,
    cut: AtomicBool,
}

impl SplitNet {
    /// Makes both namespaces and their links on a free `10.X.Y.0/29`.
    /// Panics, saying why, without root or `ip`.
    pub fn new() -> SplitNet {
        sweep_stale();
        let (tag, a, b) = loop {
            let tag = format!("{:08x}", rand::random::<u32>());
            let prefix = format!("{PREFIX}{}-{tag}", std::process::id());
            let Some(a) = Netns::create(format!("{prefix}-a")) else {
                continue;
            };
            let Some(b) = Netns::create(format!("{prefix}-b")) else {
                continue;
            };
            break (tag, a, b);
        };
        let base = free_subnet();
        let addr = |last: u8| Ipv4Addr::from(u32::from(base) | u32::from(last));
        // Each side's veth to the root namespace: a /30 of its own, the root
        // end named after the tag (root's names are shared by every test),
        // the inner end `root`.
        for (side, host, inner) in [(&a, addr(1), addr(2)), (&b, addr(5), addr(6))] {
            let outer = format!("pq{tag}{}", &side.name[side.name.len() - 1..]);
            run_ip(&[
                "link", "add", &outer, "type", "veth", "peer", "name", ROOT, "netns", &side.name,
            ]);
            run_ip(&["addr", "add", &format!("{host}/30"), "dev", &outer]);
            run_ip(&["link", "set", &outer, "up"]);
            side.ip(&["addr", "add", &format!("{inner}/30"), "dev", ROOT]);
            side.ip(&["link", "set", ROOT, "up"]);
        }
        // The direct link, with no address of its own: each side reaches the
        // other's address through it by a host route, from its own address.
        a.ip(&[
            "link", "add", OTHER, "type", "veth", "peer", "name", OTHER, "netns", &b.name,
        ]);
        for (side, own, peer) in [(&a, addr(2), addr(6)), (&b, addr(6), addr(2))] {
            side.ip(&["link", "set", OTHER, "up"]);
            side.ip(&[
                "route",
                "add",
                &format!("{peer}/32"),
                "dev",
                OTHER,
                "src",
                &own.to_string(),
            ]);
        }
        SplitNet {
            a: Side {
                netns: a,
                addr: addr(2),
            },
            b: Side {
                netns: b,
                addr: addr(6),
            },
            cut: AtomicBool::new(false),
        }
    }

    /// Side `a`.
    pub fn a(&self) -> &Side {
        &self.a
    }

    /// Side `b`.
    pub fn b(&self) -> &Side {
        &self.b
    }

    /// Cuts the link between the sides, both ways: from now on each
    /// drops the other's frames, silently. Both stay reachable from the
    /// root namespace.
    pub fn cut(&self) {
        for (side, peer) in [(&self.a, self.b.addr), (&self.b, self.a.addr)] {
            side.netns.ip(&[
                "neigh",
                "replace",
                &peer.to_string(),
                "lladdr",
                NOWHERE,
                "dev",
                OTHER,
                "nud",
                "permanent",
            ]);
        }
        self.cut.store(true, Ordering::SeqCst);
    }

    /// Heals a cut: each side finds the other's MAC address again (ARP).
    pub fn heal(&self) {
        for (side, peer) in [(&self.a, self.b.addr), (&self.b, self.a.addr)] {
            side.netns
                .ip(&["neigh", "del", &peer.to_string(), "dev", OTHER]);
        }
        self.cut.store(false, Ordering::SeqCst);
    }

    /// Whether the link is cut now.
    pub fn is_cut(&self) -> bool {
        self.cut.load(Ordering::SeqCst)
    }
}

impl Default for SplitNet {
    fn default() -> Self {
        SplitNet::new()
    }
}

/// `ip <args>`; panics with its stderr if it fails.
fn run_ip(args: &[&str]) {
    let out = Command::new(ip_binary())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|err| panic!("run `ip {}`: {err}", args.join(" ")));
    assert!(
        out.status.success(),
        "`ip {}` failed ({}): {}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// iproute2's `ip`, where distributions put it (a PATH without the sbin
/// dirs may lack it), else as PATH finds it.
fn ip_binary() -> &'static str {
    ["/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"]
        .into_iter()
        .find(|path| Path::new(path).exists())
        .unwrap_or("ip")
}

/// The base of a `10.X.Y.0/29` in a `/24` that no address of the root
/// namespace is in (another test's split, or the machine's own network).
fn free_subnet() -> Ipv4Addr {
    let out = Command::new(ip_binary())
        .args(["-4", "-o", "addr", "show"])
        .output()
        .unwrap_or_else(|err| {
            panic!("run `ip addr show`: {err}; install iproute2 (scripts/test does)")
        });
    let taken = String::from_utf8_lossy(&out.stdout).into_owned();
    loop {
        // 10.100.0.0/24 to 10.199.255.0/24: clear of the 10.0/16s that
        // container and VM networks tend to take.
        let x = 100 + rand::random::<u8>() % 100;
        let y = rand::random::<u8>();
        if !taken.contains(&format!("inet 10.{x}.{y}.")) {
            return Ipv4Addr::new(10, x, y, 0);
        }
    }
}

/// Deletes the namespaces of test processes that are gone (once per
/// process): theirs are named with their pid.
fn sweep_stale() {
    static SWEPT: Once = Once::new();
    SWEPT.call_once(|| {
        let Ok(out) = Command::new(ip_binary()).args(["netns", "list"]).output() else {
            return;
        };
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let name = line.split_whitespace().next().unwrap_or("");
            let pid = name
                .strip_prefix(PREFIX)
                .and_then(|rest| rest.split('-').next())
                .and_then(|pid| pid.parse::<u32>().ok());
            if let Some(pid) = pid
                && !Path::new(&format!("/proc/{pid}")).exists()
            {
                drop(Netns {
                    name: name.to_owned(),
                });
            }
        }
    });
}
