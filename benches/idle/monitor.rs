//! Who sends what, from Redis's `MONITOR` feed: each command a client sent,
//! named by its key pattern (`XREADGROUP {N/p}:stream`) or, for a script,
//! by its file in `src/scripts` (`EVALSHA trim.lua`), with the commands the
//! script ran inside (the feed marks those `lua`).
//!
//! `INFO commandstats` counts calls by command name only; this tells the
//! parts of the consumer apart. Watching costs Redis CPU, so it runs after
//! the measured window, never during it.

use std::collections::BTreeMap;
use std::time::Duration;

use deadpool_redis::redis::{self, aio::MultiplexedConnection};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::time::Instant;

/// Marks the bench's own calibration script in the feed.
const MARK: &str = "peerq-bench-calibration";

/// What one kind of call cost over the watch.
#[derive(Debug, Clone, Default)]
pub(crate) struct Origin {
    /// Calls clients sent.
    pub(crate) calls: u64,
    /// For scripts: the commands they ran inside, by name, in all.
    pub(crate) inner: BTreeMap<String, u64>,
}

/// The feed over one watch, by origin.
#[derive(Debug, Clone, Default)]
pub(crate) struct Tally {
    pub(crate) origins: BTreeMap<String, Origin>,
    /// How long it watched.
    pub(crate) window: Duration,
}

impl Tally {
    /// Calls clients sent, in all.
    pub(crate) fn sent(&self) -> u64 {
        self.origins.values().map(|o| o.calls).sum()
    }

    /// Commands scripts ran inside, in all.
    pub(crate) fn inner(&self) -> u64 {
        self.origins.values().flat_map(|o| o.inner.values()).sum()
    }

    /// The origins, most calls first.
    pub(crate) fn by_calls(&self) -> Vec<(&str, &Origin)> {
        let mut v: Vec<(&str, &Origin)> =
            self.origins.iter().map(|(k, o)| (k.as_str(), o)).collect();
        v.sort_by(|a, b| b.1.calls.cmp(&a.1.calls).then(a.0.cmp(b.0)));
        v
    }
}

/// The names of peerq's scripts by their SHA1 (as `EVALSHA` sends them),
/// each alone, with `unique.lua` before it (as `promote.lua` is sent) and
/// with `track.lua`, `unique.lua` and `members.lua` before it (as the
/// tracking scripts are sent).
fn scripts() -> BTreeMap<String, String> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/src/scripts");
    let read = |name: &str| std::fs::read_to_string(format!("{dir}/{name}")).expect(name);
    let (unique, track) = (read("unique.lua"), read("track.lua"));
    let members = read("members.lua");
    let mut names = BTreeMap::new();
    for file in std::fs::read_dir(dir).expect("src/scripts") {
        let path = file.expect("a script").path();
        if path.extension().is_some_and(|e| e == "lua") {
            let text = std::fs::read_to_string(&path).expect("a script's text");
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let tracked = redis::Script::new(&format!("{track}{unique}{members}{text}"));
            names.insert(tracked.get_hash().to_owned(), name.clone());
            let with_unique = redis::Script::new(&format!("{unique}{text}"));
            names.insert(with_unique.get_hash().to_owned(), name.clone());
            names.insert(redis::Script::new(&text).get_hash().to_owned(), name);
        }
    }
    names
}

/// Watches Redis at `127.0.0.1:port` for `window`; `conn` (not the watch's
/// connection) sends one marked script first, to learn whether the feed
/// lists a script's inner commands before or after the script's call (it
/// changed between Redis versions). Nothing else may be sent on `conn`
/// meanwhile.
pub(crate) async fn watch(port: u16, conn: &mut MultiplexedConnection, window: Duration) -> Tally {
    let tcp = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let mut feed = BufReader::new(tcp);
    feed.get_mut().write_all(b"MONITOR\r\n").await.unwrap();
    let mut line = String::new();
    feed.read_line(&mut line).await.unwrap();
    assert_eq!(line.trim_end(), "+OK", "MONITOR refused");
    let started = Instant::now();
    let () = redis::cmd("EVAL")
        .arg(format!("redis.call('ECHO', '{MARK}')"))
        .arg(0)
        .query_async(conn)
        .await
        .unwrap();
    let mut lines = Vec::new();
    let deadline = started + window;
    loop {
        let mut line = String::new();
        match tokio::time::timeout_at(deadline, feed.read_line(&mut line)).await {
            Ok(Ok(0)) | Err(_) => break,
            Ok(Ok(_)) => lines.push(line),
            Ok(Err(e)) => panic!("MONITOR feed: {e}"),
        }
    }
    let window = started.elapsed();
    let mut tally = tally(&lines, &scripts());
    tally.window = window;
    tally
}

/// One line of the feed: whether a script ran it, and its arguments.
struct Line {
    lua: bool,
    args: Vec<String>,
}

/// `+<time> [<db> <client address or "lua">] "CMD" "arg" …`.
fn parse(line: &str) -> Option<Line> {
    let (source, rest) = line.split_once(" [")?.1.split_once("] ")?;
    let mut args = Vec::new();
    let mut chars = rest.chars();
    while let Some(c) = chars.next() {
        if c != '"' {
            continue;
        }
        let mut arg = String::new();
        while let Some(c) = chars.next() {
            match c {
                '"' => break,
                // Kept escaped (`\xNN`, `\n`): names and keys are plain.
                '\\' => {
                    arg.push(c);
                    arg.extend(chars.next());
                }
                c => arg.push(c),
            }
        }
        args.push(arg);
    }
    Some(Line {
        lua: source.ends_with(" lua"),
        args,
    })
}

/// A key with the service's name and numbers taken out: `{N/p}:stream`,
/// `{N}:#:by`.
fn pattern(key: &str) -> String {
    let (Some(open), Some(close)) = (key.find('{'), key.find('}')) else {
        return key.to_owned();
    };
    let tag = if key[open..close].contains('/') {
        "{N/p}"
    } else {
        "{N}"
    };
    let mut out = format!("{}{tag}", &key[..open]);
    let mut in_number = false;
    for c in key[close + 1..].chars() {
        if c.is_ascii_digit() {
            if !in_number {
                out.push('#');
            }
            in_number = true;
        } else {
            out.push(c);
            in_number = false;
        }
    }
    out
}

/// How a call a client sent is named: a script by its file, else the
/// command, a subcommand (`XINFO GROUPS`) and its first key's pattern.
fn origin(args: &[String], scripts: &BTreeMap<String, String>) -> String {
    let command = args[0].to_uppercase();
    match command.as_str() {
        "EVALSHA" => {
            let sha = args.get(1).map(|s| s.to_lowercase()).unwrap_or_default();
            let script = scripts
                .get(&sha)
                .map_or("an unknown script", String::as_str);
            format!("EVALSHA {script}")
        }
        "EVAL" => "EVAL (a script's text)".to_owned(),
        _ => {
            let mut name = command.clone();
            if let Some(sub) = args
                .get(1)
                .filter(|_| CONTAINERS.contains(&command.as_str()))
            {
                name = format!("{name} {}", sub.to_uppercase());
            }
            match args.iter().skip(1).find(|a| a.contains('{')) {
                Some(key) => format!("{name} {}", pattern(key)),
                None => name,
            }
        }
    }
}

/// Commands whose first argument names what they do (`XINFO GROUPS`,
/// `CLIENT ID`).
const CONTAINERS: [&str; 7] = [
    "XINFO", "XGROUP", "CLIENT", "SCRIPT", "CONFIG", "OBJECT", "MEMORY",
];

/// Sorts the feed's lines into origins. A script's inner commands sit next
/// to its call, before or after it (as the marked script shows).
fn tally(lines: &[String], scripts: &BTreeMap<String, String>) -> Tally {
    let parsed: Vec<Line> = lines.iter().map(String::as_str).filter_map(parse).collect();
    let marked = |l: &Line| l.args.iter().any(|a| a.contains(MARK));
    let caller = parsed.iter().position(|l| !l.lua && marked(l));
    let inner = parsed.iter().position(|l| l.lua && marked(l));
    let inner_first = matches!((caller, inner), (Some(c), Some(i)) if i < c);
    let mut tally = Tally::default();
    let mut waiting: Vec<String> = Vec::new();
    let mut last_script: Option<String> = None;
    for line in parsed.iter().filter(|&l| !marked(l) && !l.args.is_empty()) {
        let command = line.args[0].to_lowercase();
        if line.lua {
            if inner_first {
                waiting.push(command);
            } else {
                let key = last_script
                    .clone()
                    .unwrap_or_else(|| "a script not seen".to_owned());
                *tally
                    .origins
                    .entry(key)
                    .or_default()
                    .inner
                    .entry(command)
                    .or_default() += 1;
            }
            continue;
        }
        let name = origin(&line.args, scripts);
        let entry = tally.origins.entry(name.clone()).or_default();
        entry.calls += 1;
        let is_script = name.starts_with("EVAL");
        if is_script {
            for command in waiting.drain(..) {
                *entry.inner.entry(command).or_default() += 1;
            }
            last_script = Some(name);
        } else {
            last_script = None;
        }
    }
    tally
}
