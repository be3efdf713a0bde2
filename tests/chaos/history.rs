//! The run's history: one file per process, one line per event, written
//! with one `write` each (so a SIGKILL loses no event that a later step
//! depends on: an effect's line is on disk before its ack is sent), and
//! read back as a stream by the checker (an hour is tens of millions of
//! lines).
//!
//! The lines, numbers in decimal, times in µs since the Unix epoch:
//!
//! - `E n at kind [a [b]]`: the enqueue of task `n` returned success;
//!   kind `P` plain, `R` retry once, `D due_ms`, `X` poison, `Z` cancel,
//!   `O key seq`, `M batch`, `C batch`;
//! - `H n handle`: task `n`'s handle (a sample of the plain tasks, and
//!   every task to cancel), `<partition>/<task id>`;
//! - `Q n outcome at`: a user's cancel of task `n` answered `cancelled`
//!   (never starts), `requested` (running) or `final` (had ended) at `at`
//!   (absent in histories written before it was added);
//! - `R n state`: task `n`'s record said `state` after the run;
//! - `B batch at`: workflow batch `batch` was sealed (its members' and
//!   callback's `E` lines follow);
//! - `S svc n p token attempt at`: a handler run started (`svc` is `a`
//!   for the unordered service, `o` for the ordered one; `n` 0 for ticks);
//! - `F svc n p token attempt checked at`: a run made its effect, right
//!   after `still_owned()` passed at `checked`, before it returned;
//! - `T due_ms p token attempt checked at`: the periodic job's effect;
//! - `A svc standing at`: the service's instance in this process became
//!   assigned (`1`), fenced itself (`f`) or neither (`o`: joining,
//!   leaving);
//! - `L n`: task `n` is in the dead letters at the end;
//! - `W start end limit`: faults were injected from `start` to `end`, with
//!   the unordered service's rate limit at `limit` starts a second;
//! - `K kind target start end`: the orchestrator injected a fault;
//! - `M label rss_kb at`: a process's resident memory.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::sync::Mutex;

use crate::plan::Kind;

/// An append-only history file.
#[derive(Debug)]
pub(crate) struct Log(Mutex<File>);

impl Log {
    /// Opens (creates) the file at `path` for appending.
    pub(crate) fn open(path: &Path) -> Log {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
        Log(Mutex::new(file))
    }

    /// Appends `lines` (each ending in `\n`) in one write.
    pub(crate) fn write(&self, lines: &str) {
        let mut file = self.0.lock().unwrap_or_else(|e| e.into_inner());
        file.write_all(lines.as_bytes()).expect("write the history");
    }
}

/// The `kind [a [b]]` part of an `E` line.
pub(crate) fn kind_words(kind: Kind) -> String {
    match kind {
        Kind::Plain => "P".into(),
        Kind::RetryOnce => "R".into(),
        Kind::Delayed { due_ms } => format!("D {due_ms}"),
        Kind::Poison => "X".into(),
        Kind::Cancel => "Z".into(),
        Kind::Ordered { key, seq } => format!("O {key} {seq}"),
        Kind::Member { batch } => format!("M {batch}"),
        Kind::Callback { batch } => format!("C {batch}"),
        Kind::Tick => "T".into(),
    }
}

/// The first four letters of a cancel's outcome (`canc`elled,
/// `requ`ested, `fina`l) or a record's state (`succ`eeded, `dead`,
/// `canc`elled, `dela`yed, …): enough to tell them apart, and `Copy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Word(pub(crate) [u8; 4]);

impl Word {
    pub(crate) fn of(word: &str) -> Word {
        let mut w = [b' '; 4];
        for (to, from) in w.iter_mut().zip(word.bytes()) {
            *to = from;
        }
        Word(w)
    }

    pub(crate) fn is(self, word: &str) -> bool {
        self == Word::of(word)
    }
}

/// One event read back.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Event {
    Enqueued {
        n: u64,
        at: u64,
        kind: Kind,
    },
    Sealed {
        batch: u64,
    },
    Start(Run),
    Effect(Run),
    Tick(Run),
    Dead {
        n: u64,
    },
    Handle {
        n: u64,
        partition: u32,
    },
    Cancelled {
        n: u64,
        outcome: Word,
        at: Option<u64>,
    },
    Record {
        n: u64,
        state: Word,
    },
    Standing {
        ordered: bool,
        state: u8,
        at: u64,
    },
    Window {
        start: u64,
        end: u64,
        limit: u64,
    },
    Fault(Fault),
    Rss {
        rss_kb: u64,
        at: u64,
    },
}

/// A handler run's start or effect (`n` is the due time for a tick).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Run {
    pub(crate) ordered: bool,
    pub(crate) n: u64,
    pub(crate) partition: u32,
    pub(crate) token: u64,
    pub(crate) attempt: u32,
    pub(crate) checked: u64,
    pub(crate) at: u64,
}

/// What a fault did to whom: `target` is a process's label, or `redis`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Fault {
    pub(crate) kind: FaultKind,
    pub(crate) start: u64,
    pub(crate) end: u64,
}

/// The kinds of fault the run injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum FaultKind {
    Leave,
    Join,
    Kill,
    Freeze,
    Cut,
    Delay,
    RedisRestart,
    Pause,
    Replay,
}

impl FaultKind {
    pub(crate) const ALL: [FaultKind; 9] = [
        FaultKind::Leave,
        FaultKind::Join,
        FaultKind::Kill,
        FaultKind::Freeze,
        FaultKind::Cut,
        FaultKind::Delay,
        FaultKind::RedisRestart,
        FaultKind::Pause,
        FaultKind::Replay,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            FaultKind::Leave => "leave",
            FaultKind::Join => "join",
            FaultKind::Kill => "kill",
            FaultKind::Freeze => "freeze",
            FaultKind::Cut => "cut",
            FaultKind::Delay => "delay",
            FaultKind::RedisRestart => "redis-restart",
            FaultKind::Pause => "pause",
            FaultKind::Replay => "replay",
        }
    }

    fn parse(word: &str) -> Option<FaultKind> {
        FaultKind::ALL.into_iter().find(|k| k.name() == word)
    }
}

/// Reads every event of the file at `path`, in file order, with the
/// target of fault lines and the label of memory lines.
pub(crate) fn read(path: &Path, mut each: impl FnMut(Event, Option<&str>)) {
    let file = File::open(path).unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    let mut cut: Option<(usize, String)> = None;
    for (i, line) in BufReader::with_capacity(1 << 20, file).lines().enumerate() {
        let line = line.unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
        // A process killed mid-write leaves at most a cut last line: an
        // unreadable line anywhere else is the history's own bug.
        if let Some((at, bad)) = cut.take() {
            panic!("{}:{}: unreadable line `{bad}`", path.display(), at + 1);
        }
        // `#` lines are notes for a reader.
        if line.starts_with('#') {
            continue;
        }
        match parse(&line) {
            Some((event, target)) => each(event, target),
            None => cut = Some((i, line)),
        }
    }
}

fn parse(line: &str) -> Option<(Event, Option<&str>)> {
    let mut w = line.split_ascii_whitespace();
    let head = w.next()?;
    let mut num = || -> Option<u64> { w.next()?.parse().ok() };
    let event = match head {
        "E" => {
            let (n, at) = (num()?, num()?);
            let kind = match w.next()? {
                "P" => Kind::Plain,
                "R" => Kind::RetryOnce,
                "D" => Kind::Delayed {
                    due_ms: num2(&mut w)?,
                },
                "X" => Kind::Poison,
                "Z" => Kind::Cancel,
                "O" => Kind::Ordered {
                    key: num2(&mut w)? as u32,
                    seq: num2(&mut w)?,
                },
                "M" => Kind::Member {
                    batch: num2(&mut w)?,
                },
                "C" => Kind::Callback {
                    batch: num2(&mut w)?,
                },
                _ => return None,
            };
            Event::Enqueued { n, at, kind }
        }
        "B" => Event::Sealed { batch: num()? },
        "S" | "F" | "T" => {
            let ordered = if head == "T" { false } else { w.next()? == "o" };
            let mut num = || -> Option<u64> { w.next()?.parse().ok() };
            let (n, partition, token, attempt) = (num()?, num()? as u32, num()?, num()? as u32);
            let checked = if head == "S" { 0 } else { num()? };
            let run = Run {
                ordered,
                n,
                partition,
                token,
                attempt,
                checked,
                at: num()?,
            };
            match head {
                "S" => Event::Start(run),
                "F" => Event::Effect(run),
                _ => Event::Tick(run),
            }
        }
        "L" => Event::Dead { n: num()? },
        "H" => Event::Handle {
            n: num()?,
            partition: w.next()?.split_once('/')?.0.parse().ok()?,
        },
        "Q" | "R" => {
            let n = num()?;
            let word = Word::of(w.next()?);
            if head == "Q" {
                let at = w.next().and_then(|at| at.parse().ok());
                Event::Cancelled {
                    n,
                    outcome: word,
                    at,
                }
            } else {
                Event::Record { n, state: word }
            }
        }
        "W" => Event::Window {
            start: num()?,
            end: num()?,
            limit: num().unwrap_or(0),
        },
        "A" => {
            let ordered = w.next()? == "o";
            let state = *w.next()?.as_bytes().first()?;
            Event::Standing {
                ordered,
                state,
                at: w.next()?.parse().ok()?,
            }
        }
        "K" => {
            let kind = FaultKind::parse(w.next()?)?;
            let target = w.next()?;
            let mut num = || -> Option<u64> { w.next()?.parse().ok() };
            let fault = Fault {
                kind,
                start: num()?,
                end: num()?,
            };
            return Some((Event::Fault(fault), Some(target)));
        }
        "M" => {
            let label = w.next()?;
            let mut num = || -> Option<u64> { w.next()?.parse().ok() };
            let rss = Event::Rss {
                rss_kb: num()?,
                at: num()?,
            };
            return Some((rss, Some(label)));
        }
        _ => return None,
    };
    Some((event, None))
}

fn num2<'a>(w: &mut impl Iterator<Item = &'a str>) -> Option<u64> {
    w.next()?.parse().ok()
}
