//! Where PostgreSQL's server binaries are (`/usr/lib/postgresql/<version>/bin`,
//! not on `PATH`), and who runs them: this process's user, or an
//! unprivileged one when the tests run as root, whom `initdb` and
//! `postgres` refuse.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

const NOT_FOUND: &str = "PostgreSQL's initdb was not found under /usr/lib/postgresql/*/bin: \
    install it (Debian/Ubuntu: `sudo apt-get install -y postgresql`), run `scripts/test`, \
    which installs it, or set PEERQ_TEST_POSTGRES_URL to a server the tests may create \
    databases on";

/// Who runs `initdb` and `postgres`: this process's user, or, for root
/// (whom they refuse), the `postgres` user (else `nobody`).
#[derive(Debug, Clone, Copy)]
pub(super) enum Runner {
    Me,
    User { uid: u32, gid: u32 },
}

impl Runner {
    pub(super) fn for_this_process() -> Runner {
        let root = fs::metadata("/proc/self")
            .map(|m| m.uid() == 0)
            .unwrap_or(false);
        if !root {
            return Runner::Me;
        }
        let passwd = fs::read_to_string("/etc/passwd").unwrap_or_default();
        ["postgres", "nobody"]
            .iter()
            .find_map(|name| {
                passwd.lines().find_map(|line| {
                    let fields: Vec<&str> = line.split(':').collect();
                    if fields.len() < 4 || fields[0] != *name {
                        return None;
                    }
                    Some(Runner::User {
                        uid: fields[2].parse().ok()?,
                        gid: fields[3].parse().ok()?,
                    })
                })
            })
            .expect("running as root, and neither a `postgres` nor a `nobody` user exists")
    }

    /// Gives `dir` to the user.
    pub(super) fn own(self, dir: &Path) {
        if let Runner::User { uid, gid } = self {
            std::os::unix::fs::chown(dir, Some(uid), Some(gid))
                .unwrap_or_else(|e| panic!("chown {}: {e}", dir.display()));
        }
    }

    pub(super) fn command(self, program: PathBuf) -> Command {
        let mut cmd = Command::new(program);
        if let Runner::User { uid, gid } = self {
            cmd.uid(uid).gid(gid);
        }
        cmd
    }
}

/// The newest `/usr/lib/postgresql/<version>/bin` with an `initdb`.
pub(super) fn bin_dir() -> PathBuf {
    static FOUND: OnceLock<Option<PathBuf>> = OnceLock::new();
    FOUND
        .get_or_init(|| {
            let mut versions: Vec<(u32, PathBuf)> = fs::read_dir("/usr/lib/postgresql")
                .into_iter()
                .flatten()
                .flatten()
                .filter_map(|entry| {
                    let version = entry.file_name().to_str()?.parse().ok()?;
                    let bin = entry.path().join("bin");
                    bin.join("initdb").exists().then_some((version, bin))
                })
                .collect();
            versions.sort();
            versions.pop().map(|(_, bin)| bin)
        })
        .clone()
        .unwrap_or_else(|| panic!("{NOT_FOUND}"))
}
