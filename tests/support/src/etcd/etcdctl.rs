//! Running `etcdctl` against a cluster ([`EtcdCluster::etcdctl`]), and
//! what the harness itself does with it: setting up the users and
//! enabling auth.

use std::process::{Command, Stdio};

use super::{EtcdCluster, NODES};
use crate::tls::ServerTls;

/// The `root` user's password when [`EtcdOptions::auth`] names another
/// user: the harness's own `etcdctl` logs in as `root`.
///
/// [`EtcdOptions::auth`]: super::EtcdOptions::auth
const ROOT_PASSWORD: &str = "peerq-test-root";

/// `root`'s password on a cluster whose test user is `user` (`root`
/// itself or another).
fn root_password<'a>(user: &str, password: &'a str) -> &'a str {
    if user == "root" {
        password
    } else {
        ROOT_PASSWORD
    }
}

impl EtcdCluster {
    /// Runs `etcdctl` (API v3) with `args` against the running nodes, as
    /// `root` when auth is on, over TLS with the test CA and client
    /// certificate when the cluster speaks it; returns its stdout, or its
    /// stderr if it fails.
    ///
    /// `args` come after the harness's flags, so a test's `--user=…` or
    /// `--command-timeout=…` wins over them. An `--endpoints` in `args`
    /// replaces the harness's endpoints rather than adding to them (two
    /// `--endpoints` would be merged by etcdctl), so a test can talk to one
    /// node alone.
    pub fn etcdctl(&self, args: &[&str]) -> Result<String, String> {
        let root = self
            .opts
            .auth
            .map(|(user, password)| root_password(user, password));
        self.etcdctl_as(root, args)
    }

    /// Runs `etcdctl` as `root` with `root_password`, or as no one.
    pub(super) fn etcdctl_as(
        &self,
        root_password: Option<&str>,
        args: &[&str],
    ) -> Result<String, String> {
        // A `wrong_host` certificate names only `localhost`.
        let host = self
            .opts
            .tls
            .as_ref()
            .map_or("127.0.0.1", ServerTls::control_host);
        let given = args.iter().any(|arg| arg.starts_with("--endpoints"));
        let endpoints = (!given).then(|| {
            let running: Vec<String> = (0..NODES)
                .filter(|&node| self.nodes[node].is_running())
                .map(|node| self.endpoint_on(node, host))
                .collect();
            format!("--endpoints={}", running.join(","))
        });
        let login = root_password.map(|password| format!("--user=root:{password}"));
        let all: Vec<&str> = [endpoints.as_deref(), login.as_deref()]
            .into_iter()
            .flatten()
            .chain(args.iter().copied())
            .collect();
        run(self.opts.tls.as_ref(), &all)
    }
}

/// Runs `etcdctl` (API v3), trusting the test CA and presenting the test
/// client certificate with `tls`, then `args` (the endpoints among them);
/// its stdout, or its stderr if it fails.
fn run(tls: Option<&ServerTls>, args: &[&str]) -> Result<String, String> {
    let mut cmd = Command::new("etcdctl");
    clean_env(&mut cmd);
    cmd.env("ETCDCTL_API", "3");
    if let Some(tls) = tls {
        cmd.arg("--cacert")
            .arg(&tls.pki.ca_cert)
            .arg("--cert")
            .arg(&tls.pki.client.cert)
            .arg("--key")
            .arg(&tls.pki.client.key);
    }
    let output = cmd
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|err| panic!("run etcdctl: {err}"));
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    if output.status.success() {
        Ok(stdout)
    } else {
        let stderr = String::from_utf8_lossy(&output.stderr);
        Err(format!("{} ({})", stderr.trim(), output.status))
    }
}

/// Creates `root` with the root role (etcd refuses `auth enable` without
/// it), then `user` with read and write on every key through a role of
/// its name, and enables auth; `etcdctl` runs each step.
pub(super) fn enable_auth(
    user: &str,
    password: &str,
    etcdctl: impl Fn(&[&str]) -> Result<String, String>,
) {
    let root = format!("root:{}", root_password(user, password));
    let login = format!("{user}:{password}");
    let mut steps: Vec<Vec<&str>> = vec![
        vec!["user", "add", &root],
        vec!["user", "grant-role", "root", "root"],
    ];
    if user != "root" {
        steps.extend([
            vec!["role", "add", user],
            // From the empty key on: every key.
            vec![
                "role",
                "grant-permission",
                user,
                "readwrite",
                "",
                "--from-key",
            ],
            vec!["user", "add", &login],
            vec!["user", "grant-role", user, user],
        ]);
    }
    steps.push(vec!["auth", "enable"]);
    for step in steps {
        if let Err(err) = etcdctl(&step) {
            panic!("etcdctl {}: {err}", step.join(" "));
        }
    }
}

/// Removes etcd's and etcdctl's environment variables (`ETCD_NAME`,
/// `ETCDCTL_ENDPOINTS`, …), which both read as flags: a developer's
/// settings for their own etcd must not reach the tests' clusters.
/// `ETCD_UNSUPPORTED_ARCH` stays: etcd 3.4 will not start without it on
/// some architectures.
pub(super) fn clean_env(cmd: &mut Command) {
    for (name, _) in std::env::vars_os() {
        let text = name.to_string_lossy();
        let etcd = text.starts_with("ETCD_") && text != "ETCD_UNSUPPORTED_ARCH";
        if etcd || text.starts_with("ETCDCTL_") {
            cmd.env_remove(&name);
        }
    }
}
