//! Chromium, driven through ChromeDriver, for the dashboard's browser
//! tests: Debian's `chromium` and `chromedriver` (`scripts/test` installs
//! them), headless, on a free loopback port, with a fresh profile.
//!
//! As root Chromium starts only with `--no-sandbox`; without the
//! background-networking flags it keeps trying to reach Google's hosts,
//! which a closed network refuses.

use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::process::Proc;
use super::redis_server::unused_port;

/// A running `chromedriver`; killed, with its browsers, when dropped.
#[derive(Debug)]
pub struct ChromeDriver {
    port: u16,
    profile: PathBuf,
    _proc: Proc,
}

impl ChromeDriver {
    /// Starts `chromedriver` on a free port and waits until it listens.
    pub fn start() -> ChromeDriver {
        let port = unused_port();
        let child = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver (scripts/test installs Debian's chromium-driver)");
        let proc = Proc(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "chromedriver did not listen on {port}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let profile =
            std::env::temp_dir().join(format!("peerq-chromium-{port}-{}", std::process::id()));
        ChromeDriver {
            port,
            profile,
            _proc: proc,
        }
    }

    /// Where the WebDriver protocol is served.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The capabilities of a headless Chromium with a `width` x `height`
    /// window and a profile of its own.
    pub fn capabilities(
        &self,
        width: u32,
        height: u32,
    ) -> serde_json::Map<String, serde_json::Value> {
        let args = [
            "--headless=new".to_owned(),
            "--no-sandbox".to_owned(),
            "--disable-gpu".to_owned(),
            "--disable-dev-shm-usage".to_owned(),
            "--disable-background-networking".to_owned(),
            "--disable-component-update".to_owned(),
            "--disable-sync".to_owned(),
            "--disable-quic".to_owned(),
            "--no-first-run".to_owned(),
            format!("--window-size={width},{height}"),
            format!("--user-data-dir={}", self.profile.display()),
        ];
        let mut caps = serde_json::Map::new();
        caps.insert("browserName".into(), "chrome".into());
        caps.insert(
            "goog:chromeOptions".into(),
            serde_json::json!({ "binary": "/usr/bin/chromium", "args": args }),
        );
        caps
    }
}

impl Drop for ChromeDriver {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}
