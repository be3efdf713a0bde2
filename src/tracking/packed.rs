//! A task record's bytes (docs/design.md §14): a run of MessagePack values,
//! name, value, name, value, …, as the scripts write them with
//! `cmsgpack.pack` (`track.lua`), each writer appending what changed, so a
//! later name wins. Names are one letter each, to keep a record small.
//!
//! Written by hand rather than with a MessagePack crate: a record holds
//! only strings and integers, and the reader needs a few dozen lines.

use std::collections::HashMap;

use crate::entry::{take, unsigned};

/// Each letter a record uses, and the field it stands for (`track.lua`
/// lists the same; a unit test holds them equal).
pub(crate) const NAMES: [(u8, &str); 14] = [
    (b's', "state"),
    (b'a', "attempt"),
    (b'q', "enqueued_at"),
    (b'd', "due_at"),
    (b'f', "finished_at"),
    (b'r', "ran"),
    (b'e', "error"),
    (b'w', "reason"),
    (b'x', "dead_id"),
    (b'p', "progress"),
    (b'v', "result"),
    (b'c', "cancel"),
    (b't', "touched"),
    (b'u', "unique"),
];

/// A record's fields by their full names, values as bytes (integers as
/// their decimal digits); `None` when the bytes are no record (written by
/// hand, or cut short). Unknown names are skipped: a later version may add
/// some.
pub(crate) fn decode(mut bytes: &[u8]) -> Option<HashMap<String, Vec<u8>>> {
    let mut fields = HashMap::new();
    while !bytes.is_empty() {
        let name = value(&mut bytes)?;
        let value = value(&mut bytes)?;
        if let ([letter], Some(value)) = (name.as_deref()?, value)
            && let Some((_, full)) = NAMES.iter().find(|(l, _)| l == letter)
        {
            fields.insert((*full).to_owned(), value);
        }
    }
    Some(fields)
}

/// A run of MessagePack strings (as `cmsgpack.pack` writes a list of
/// them: a batch's results, docs/design.md §19), each as its bytes; `None`
/// when cut short or holding another kind.
pub(crate) fn strings(mut bytes: &[u8]) -> Option<Vec<Vec<u8>>> {
    let mut all = Vec::new();
    while !bytes.is_empty() {
        all.push(value(&mut bytes)??);
    }
    Some(all)
}

/// A record as a batch's enqueue writes it, as `enqueue.lua` does: waiting,
/// attempt 1, enqueued at `enqueued_at` (Unix ms).
pub(crate) fn waiting(enqueued_at: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(24);
    string(&mut out, b"s");
    string(&mut out, b"waiting");
    string(&mut out, b"a");
    out.push(1);
    string(&mut out, b"q");
    uint(&mut out, enqueued_at);
    out
}

/// A MessagePack string, as `cmsgpack` writes one.
fn string(out: &mut Vec<u8>, s: &[u8]) {
    let (head, n) = head_of(s.len());
    out.extend(&head[..n]);
    out.extend(s);
}

/// The head of a MessagePack string of `len` bytes: its first `n` bytes.
fn head_of(len: usize) -> ([u8; 5], usize) {
    let mut head = [0; 5];
    let n = match len {
        n @ 0..32 => {
            head[0] = 0xa0 | n as u8;
            1
        }
        n @ 32..256 => {
            head[..2].copy_from_slice(&[0xd9, n as u8]);
            2
        }
        n @ 256..65536 => {
            head[0] = 0xda;
            head[1..3].copy_from_slice(&(n as u16).to_be_bytes());
            3
        }
        n => {
            head[0] = 0xdb;
            head[1..5].copy_from_slice(&(n as u32).to_be_bytes());
            5
        }
    };
    (head, n)
}

/// A MessagePack unsigned integer, as a uint 64.
fn uint(out: &mut Vec<u8>, n: u64) {
    out.push(0xcf);
    out.extend(n.to_be_bytes());
}

/// What a task runs as: `instance|token|attempt|started_at`, its
/// `{N/p}:running` value and its final record's `r` (readers split it).
/// Written where it goes (a command's argument, a record) rather than
/// built as a string of its own: an allocation per task was a measurable
/// part of a tracked task's cost to the instance (BENCHMARKS.md, "Task
/// tracking").
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ran<'a> {
    /// The instance's id.
    pub(crate) instance: &'a str,
    /// Its fencing token.
    pub(crate) token: u64,
    pub(crate) attempt: u32,
    /// Unix ms, the instance's clock.
    pub(crate) started_at: u64,
}

impl Ran<'_> {
    /// Its bytes' count, as `Display` writes it.
    fn len(&self) -> usize {
        let (token, attempt, at) = (self.token, u64::from(self.attempt), self.started_at);
        self.instance.len() + 3 + digits(token) + digits(attempt) + digits(at)
    }

    /// Writes its text to `out`, as `Display` does, in one piece and
    /// without `core::fmt`: formatting the numbers with `write!`, a piece
    /// at a time, was half of what a tracked task added to the instance's
    /// instructions (callgrind, 3,000 of 5,600), twice per task (its start
    /// and its final record).
    pub(crate) fn write(&self, out: &mut impl std::io::Write) -> std::io::Result<()> {
        let mut text = [0; 256];
        match self.put(&mut text) {
            Some(n) => out.write_all(&text[..n]),
            None => write!(out, "{self}"),
        }
    }

    /// Puts its text at the start of `out`; its length, `None` when it
    /// does not fit (an instance id of hundreds of bytes).
    fn put(&self, out: &mut [u8]) -> Option<usize> {
        // Three numbers of at most 20 digits, three bars.
        let mut at = self.instance.len();
        if at + 3 * 21 > out.len() {
            return None;
        }
        out[..at].copy_from_slice(self.instance.as_bytes());
        for n in [self.token, u64::from(self.attempt), self.started_at] {
            out[at] = b'|';
            at += 1 + decimal(n, &mut out[at + 1..]);
        }
        Some(at)
    }
}

impl std::fmt::Display for Ran<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Ran {
            instance,
            token,
            attempt,
            started_at,
        } = self;
        write!(f, "{instance}|{token}|{attempt}|{started_at}")
    }
}

/// The decimal digits of `n`.
fn digits(n: u64) -> usize {
    n.checked_ilog10().map_or(1, |d| d as usize + 1)
}

/// Writes `n` in decimal at the start of `out` (room for 20 digits);
/// returns how many digits.
fn decimal(n: u64, out: &mut [u8]) -> usize {
    let len = digits(n);
    let mut n = n;
    for i in (0..len).rev() {
        out[i] = b'0' + (n % 10) as u8;
        n /= 10;
    }
    len
}

/// A final record as the instance that ran a task writes it whole with its
/// ack (`fenced_ack.lua`).
#[derive(Debug)]
pub(crate) struct Finished<'a> {
    /// `succeeded`.
    pub(crate) state: &'a str,
    /// Unix ms, as the producer wrote it in the entry.
    pub(crate) enqueued_at: u64,
    /// The attempt that ended it.
    pub(crate) attempt: u32,
    /// What it ran as, as its start wrote it.
    pub(crate) ran: Ran<'a>,
    /// Unix ms.
    pub(crate) finished_at: u64,
    /// The last progress written, if any.
    pub(crate) progress: Option<&'a [u8]>,
    /// The encoded result; empty for none.
    pub(crate) result: &'a [u8],
}

impl Finished<'_> {
    /// The record's bytes.
    #[cfg(test)]
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.write(&mut out).expect("a Vec takes every byte");
        out
    }

    /// Writes the record's bytes to `out` (a command's argument, with no
    /// buffer of its own): its head (state, what it ran as, the numbers)
    /// in one piece, then its progress and result.
    pub(crate) fn write(&self, out: &mut impl std::io::Write) -> std::io::Result<()> {
        let mut head = [0; 384];
        let mut at = 0;
        named(&mut head, &mut at, b's', self.state.len());
        put(&mut head, &mut at, self.state.as_bytes());
        named(&mut head, &mut at, b'r', self.ran.len());
        // What it ran as fits, unless its instance id is hundreds of bytes
        // long.
        let room = head.len() - 3 * 11;
        match self.ran.put(&mut head[at..room]) {
            Some(ran) => at += ran,
            None => {
                out.write_all(&head[..at])?;
                self.ran.write(out)?;
                at = 0;
            }
        }
        for (name, n) in [
            (b'q', self.enqueued_at),
            (b'a', u64::from(self.attempt)),
            (b'f', self.finished_at),
        ] {
            put(&mut head, &mut at, &[0xa1, name, 0xcf]);
            put(&mut head, &mut at, &n.to_be_bytes());
        }
        out.write_all(&head[..at])?;
        let result = (!self.result.is_empty()).then_some(self.result);
        for (name, value) in [(b'p', self.progress), (b'v', result)] {
            if let Some(value) = value {
                let (mut head, mut at) = ([0; 7], 0);
                named(&mut head, &mut at, name, value.len());
                out.write_all(&head[..at])?;
                out.write_all(value)?;
            }
        }
        Ok(())
    }
}

/// Puts `bytes` at `at` in `head`, and moves `at` past them.
fn put(head: &mut [u8], at: &mut usize, bytes: &[u8]) {
    head[*at..*at + bytes.len()].copy_from_slice(bytes);
    *at += bytes.len();
}

/// Puts the one-letter name `name` and the head of a string of `len`
/// bytes at `at` in `head`.
fn named(head: &mut [u8], at: &mut usize, name: u8, len: usize) {
    let (len, n) = head_of(len);
    put(head, at, &[0xa1, name]);
    put(head, at, &len[..n]);
}

/// The next value: a string's bytes, an integer's digits; `Some(None)` for
/// nil and booleans; `None` when cut short or of a kind no script writes.
fn value(bytes: &mut &[u8]) -> Option<Option<Vec<u8>>> {
    let marker = *take(bytes, 1)?.first()?;
    let len = |bytes: &mut &[u8], width| unsigned(bytes, width).map(|n| n as usize);
    let size = match marker {
        0x00..=0x7f => return Some(Some(marker.to_string().into_bytes())),
        0xe0..=0xff => return Some(Some((marker as i8).to_string().into_bytes())),
        0xc0 | 0xc2 | 0xc3 => return Some(None),
        0xcc..=0xcf => {
            let n = unsigned(bytes, 1 << (marker - 0xcc))?;
            return Some(Some(n.to_string().into_bytes()));
        }
        0xd0..=0xd3 => {
            let width = 1 << (marker - 0xd0);
            let raw = unsigned(bytes, width)?;
            let shift = 64 - 8 * width as u32;
            let n = ((raw << shift) as i64) >> shift;
            return Some(Some(n.to_string().into_bytes()));
        }
        0xca => {
            let f = f32::from_bits(unsigned(bytes, 4)? as u32);
            return Some(Some(format!("{f}").into_bytes()));
        }
        0xcb => {
            let f = f64::from_bits(unsigned(bytes, 8)?);
            return Some(Some(format!("{f}").into_bytes()));
        }
        0xa0..=0xbf => usize::from(marker & 0x1f),
        0xd9 | 0xc4 => len(bytes, 1)?,
        0xda | 0xc5 => len(bytes, 2)?,
        0xdb | 0xc6 => len(bytes, 4)?,
        _ => return None,
    };
    Some(Some(take(bytes, size)?.to_vec()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `cmsgpack.pack('s', 'waiting', 'a', 1, 'q', 1764262594123)` as Redis
    /// 7.0 wrote it, then `cmsgpack.pack('s', 'succeeded', 'v', <300
    /// bytes>, 'e', -3)` appended: the later state wins, every kind reads.
    #[test]
    fn a_record_reads_as_the_scripts_wrote_it_a_later_name_winning() {
        let mut bytes = b"\xa1s\xa7waiting\xa1a\x01\xa1q\xcf\x00\x00\x01\x9a\xc6>\xc6K".to_vec();
        bytes.extend(b"\xa1s\xa9succeeded\xa1v\xda\x01\x2c");
        bytes.extend([7u8; 300]);
        bytes.extend(b"\xa1e\xfd");
        // `cmsgpack.pack('d', 0.5)`: a float 32.
        bytes.extend(b"\xa1d\xca\x3f\x00\x00\x00");
        let fields = decode(&bytes).unwrap();
        let text = |k: &str| String::from_utf8(fields[k].clone()).unwrap();
        assert_eq!(text("state"), "succeeded");
        assert_eq!(text("attempt"), "1");
        assert_eq!(text("enqueued_at"), "1764262594123");
        assert_eq!(fields["result"], [7u8; 300]);
        assert_eq!(text("error"), "-3");
        assert_eq!(text("due_at"), "0.5");
        assert_eq!(decode(&bytes[..bytes.len() - 1]), None, "cut short");
    }

    #[test]
    fn a_final_record_reads_back_whole() {
        let result = vec![3u8; 70_000];
        // An instance id too long for the record's head goes apart.
        let long = "h".repeat(400);
        for instance in ["vm-1", &long] {
            let record = Finished {
                state: "succeeded",
                enqueued_at: 5,
                attempt: 2,
                ran: Ran {
                    instance,
                    token: 7,
                    attempt: 2,
                    started_at: 9,
                },
                finished_at: 11,
                progress: Some(b"{}"),
                result: &result,
            };
            let fields = decode(&record.encode()).unwrap();
            let text = |k: &str| String::from_utf8(fields[k].clone()).unwrap();
            assert_eq!(text("state"), "succeeded");
            assert_eq!(text("ran"), format!("{instance}|7|2|9"));
            assert_eq!(
                [text("enqueued_at"), text("attempt"), text("finished_at")],
                ["5", "2", "11"]
            );
            assert_eq!(text("progress"), "{}");
            assert_eq!(fields["result"], result);
        }
        // Progress that encodes to no bytes (a unit) is still written.
        let ran = Ran {
            instance: "vm-1",
            token: 7,
            attempt: 1,
            started_at: 9,
        };
        let record = Finished {
            state: "succeeded",
            enqueued_at: 5,
            attempt: 1,
            ran,
            finished_at: 11,
            progress: Some(b""),
            result: b"",
        };
        let fields = decode(&record.encode()).unwrap();
        assert_eq!(fields.get("progress").map(Vec::len), Some(0));
        assert!(!fields.contains_key("result"));
    }

    /// A record's head says how long its `ran` is before it is written:
    /// the count must be the text's, at every number of digits, and the
    /// text written by hand `Display`'s.
    #[test]
    fn what_a_task_ran_as_is_as_long_as_its_head_says() {
        let long = "h".repeat(300);
        let cases = [0, 1, 9, 10, 99, 100, 12_345, u64::from(u32::MAX), u64::MAX];
        for (n, instance) in cases
            .into_iter()
            .flat_map(|n| [(n, "host-1-a"), (n, &*long)])
        {
            let ran = Ran {
                instance,
                token: n,
                attempt: n as u32,
                started_at: n,
            };
            assert_eq!(ran.len(), ran.to_string().len(), "{ran}");
            let mut written = Vec::new();
            ran.write(&mut written).unwrap();
            assert_eq!(written, ran.to_string().as_bytes());
        }
    }

    #[test]
    fn the_producers_record_is_the_enqueue_scripts() {
        let written = b"\xa1s\xa7waiting\xa1a\x01\xa1q\xcf\x00\x00\x01\x9a\xc6>\xc6K";
        assert_eq!(waiting(1764262594123), written);
    }

    /// The scripts write by `track.lua`'s letters, and readers read by
    /// these: a letter only one side knew would be lost.
    #[test]
    fn the_readers_letters_are_the_scripts_letters() {
        let lua = include_str!("../scripts/track.lua");
        let start = lua.find("-- The names, one letter each").unwrap();
        let table: String = lua[start..]
            .lines()
            .skip(1)
            .take_while(|l| l.starts_with("--   "))
            .collect::<Vec<_>>()
            .join(" ");
        for (letter, name) in NAMES {
            let entry = format!("{} {name}", letter as char);
            assert!(table.contains(&entry), "track.lua lacks `{entry}`: {table}");
        }
        let letters = table
            .split_whitespace()
            .filter(|w| w.len() == 1 && w.chars().all(|c| c.is_ascii_lowercase()))
            .count();
        assert_eq!(letters, NAMES.len(), "{table}");
    }
}
