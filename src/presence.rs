//! What an instance tells operators about itself (docs/design.md §7): its
//! record in `{N}:members`, and its per-minute task counts in
//! `{N}:stats:<minute>`.
//!
//! The consumer keeps the live values here (partitions owned, tasks in
//! flight and handled, outcomes Redis confirmed); the round loop sends them
//! each round, on the round's connection at the round's moment, so they
//! cost no round trip of their own. The counts are flushed with a sequence
//! number per instance: a flush whose reply was lost is sent again as it
//! was, and Redis applies it only once.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard};
use std::time::Duration;

use deadpool_redis::redis::{self, Script};
use tracing::{Instrument, debug};

use crate::assignment::Assignment;
use crate::assignment::Standing;
use crate::clock::Clock;
use crate::config::ServiceName;
use crate::connection::Conn;
use crate::error::Result;
use crate::instance::InstanceId;
use crate::keys;

static PRESENCE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/presence.lua")));

/// How long the per-minute counts are kept.
const STATS_TTL: Duration = Duration::from_secs(24 * 3600);
/// After how many intervals without a round a member record counts as gone.
pub(crate) const GONE_AFTER_INTERVALS: u32 = 3;

/// A confirmed outcome, as the per-minute counts name it (the fields `ok`,
/// `failed`, `dead`, `retried`, in this order).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Count {
    /// A task's ack landed.
    Ok,
    /// A failed attempt was retried or dead-lettered (one of the two
    /// below is counted too).
    Failed,
    /// An entry was moved to the dead letters.
    Dead,
    /// A failed task was enqueued for another attempt.
    Retried,
}

/// Counts not yet confirmed by Redis.
#[derive(Debug, Default)]
struct Tally {
    /// Counted since the last flush, per Unix minute.
    next: BTreeMap<u64, [u64; 4]>,
    /// The last flush, until Redis confirms it.
    sent: Option<Flush>,
    /// The last flush's sequence number.
    seq: u64,
}

/// One flush of counts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Flush {
    seq: u64,
    minutes: Vec<(u64, [u64; 4])>,
}

/// One instance's live values.
#[derive(Debug)]
pub(crate) struct Presence {
    clock: Arc<dyn Clock>,
    host: String,
    pid: u32,
    started_at_ms: u64,
    /// The instance's weight under rendezvous ownership.
    weight: u32,
    owned: AtomicU64,
    in_flight: AtomicU64,
    handled: AtomicU64,
    /// Tasks read and held aside for a limit per key (docs/design.md §15).
    aside: AtomicI64,
    /// The backlog of the partitions it owns, as last read (`None`: an
    /// instance that owns none, a standalone indexer), written into the
    /// current minute's counts with each record.
    backlog: Mutex<Option<u64>>,
    tally: Mutex<Tally>,
}

impl Presence {
    /// This process, starting now; its times are read from `clock`, the
    /// instance's (as the rounds' are).
    pub(crate) fn new(clock: Arc<dyn Clock>, weight: u32) -> Self {
        let started_at_ms = clock.now().as_millis() as u64;
        Presence {
            clock,
            host: gethostname::gethostname().to_string_lossy().into_owned(),
            pid: std::process::id(),
            started_at_ms,
            weight,
            owned: AtomicU64::new(0),
            in_flight: AtomicU64::new(0),
            handled: AtomicU64::new(0),
            backlog: Mutex::new(None),
            aside: AtomicI64::new(0),
            tally: Mutex::new(Tally::default()),
        }
    }

    /// The instance's wall clock, in ms since the Unix epoch.
    fn now_ms(&self) -> u64 {
        self.clock.now().as_millis() as u64
    }

    fn tally(&self) -> MutexGuard<'_, Tally> {
        self.tally.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The instance owns `n` partitions now.
    pub(crate) fn set_owned(&self, n: usize) {
        self.owned.store(n as u64, Ordering::Relaxed);
    }

    /// A handler run started.
    pub(crate) fn started(&self) {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
    }

    /// A handler run ended.
    pub(crate) fn ended(&self) {
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
    }

    /// `n` more (or fewer) tasks held aside for a limit per key.
    pub(crate) fn held_aside(&self, n: isize) {
        self.aside.fetch_add(n as i64, Ordering::Relaxed);
    }

    /// Redis confirmed an outcome now.
    pub(crate) fn count(&self, what: Count) {
        self.count_many(what, 1);
    }

    /// Redis confirmed `n` outcomes now (one batch of acks: one lock, not
    /// one per task).
    pub(crate) fn count_many(&self, what: Count, n: u64) {
        if n == 0 {
            return;
        }
        if what == Count::Ok {
            self.handled.fetch_add(n, Ordering::Relaxed);
        }
        let minute = self.now_ms() / 60_000;
        self.tally().next.entry(minute).or_default()[what as usize] += n;
    }

    /// The backlog of the partitions the instance owns, as just read.
    pub(crate) fn set_backlog(&self, backlog: u64) {
        *self.backlog.lock().unwrap_or_else(|e| e.into_inner()) = Some(backlog);
    }

    /// The counts to send now: the last flush again while it is not
    /// confirmed, else what was counted since (`None`: nothing).
    fn flush(&self) -> Option<Flush> {
        let mut tally = self.tally();
        if let Some(sent) = &tally.sent {
            return Some(sent.clone());
        }
        if tally.next.is_empty() {
            return None;
        }
        tally.seq += 1;
        let flush = Flush {
            seq: tally.seq,
            minutes: std::mem::take(&mut tally.next).into_iter().collect(),
        };
        tally.sent = Some(flush.clone());
        Some(flush)
    }

    /// Redis applied (or had applied) flush `seq`.
    fn flushed(&self, seq: u64) {
        let mut tally = self.tally();
        if tally.sent.as_ref().is_some_and(|s| s.seq == seq) {
            tally.sent = None;
        }
    }

    /// The members record: who and where the instance is, how it stands
    /// (`joining`, `assigned`, `fenced`, `leaving`) and what it does.
    fn record(&self, id: &InstanceId, standing: &str, assignment: Option<Assignment>) -> String {
        serde_json::json!({
            "id": id.as_str(),
            "host": self.host,
            "pid": self.pid,
            "version": env!("CARGO_PKG_VERSION"),
            "started_at_ms": self.started_at_ms,
            "standing": standing,
            "index": assignment.as_ref().map(|a| a.index),
            "replicas": assignment.as_ref().map(|a| a.replicas),
            "epoch": assignment.as_ref().map(|a| a.epoch),
            "owned": self.owned.load(Ordering::Relaxed),
            "in_flight": self.in_flight.load(Ordering::Relaxed),
            "handled": self.handled.load(Ordering::Relaxed),
            "aside": self.aside.load(Ordering::Relaxed).max(0),
            "weight": self.weight,
            // This version carries a reshard out (docs/design.md §21):
            // `reshard.lua` refuses one while a member lacks it.
            "reshard": 1,
            "seen_at_ms": self.now_ms(),
        })
        .to_string()
    }

    /// Writes the members record and flushes the counts, in one script.
    /// `prune`: also remove the records of members gone for three
    /// intervals (one instance per service does, the one with index 1, so
    /// the records are not all read by every instance each round).
    async fn tell(
        &self,
        conn: &mut Conn,
        name: &ServiceName,
        id: &InstanceId,
        standing: &str,
        assignment: Option<Assignment>,
        prune: Option<Duration>,
    ) -> Result<()> {
        let flush = self.flush();
        let mut script = PRESENCE.key(keys::members(name));
        script.key(keys::stats_flushed(name));
        // The backlog goes into the current minute, whatever is flushed.
        let minute_now = self.now_ms() / 60_000;
        script.key(keys::stats(name, minute_now));
        let minutes = flush.as_ref().map_or(&[][..], |f| &f.minutes[..]);
        for (minute, _) in minutes {
            script.key(keys::stats(name, *minute));
        }
        let gone_before = prune.map_or(0, |interval| {
            self.now_ms()
                .saturating_sub((interval * GONE_AFTER_INTERVALS).as_millis() as u64)
        });
        script
            .arg(id.as_str())
            .arg(self.record(id, standing, assignment))
            .arg(gone_before)
            .arg(flush.as_ref().map_or(0, |f| f.seq))
            .arg(STATS_TTL.as_secs());
        let backlog = *self.backlog.lock().unwrap_or_else(|e| e.into_inner());
        match backlog {
            Some(backlog) => script.arg(backlog),
            None => script.arg(""),
        };
        for (_, counts) in minutes {
            script.arg(&counts[..]);
        }
        let _: i64 = script.invoke_async(conn).await?;
        if let Some(flush) = flush {
            self.flushed(flush.seq);
        }
        Ok(())
    }

    /// Sends the members record and counts on `conn` now, as the round
    /// that stands at `current` starts: they travel with the round and
    /// never hold it up (they run in a task of their own, and a failure
    /// only means they are sent again next round).
    pub(crate) fn send(
        self: &Arc<Self>,
        conn: &Conn,
        name: &ServiceName,
        id: &InstanceId,
        current: &Standing,
        leaving: bool,
        interval: Duration,
    ) {
        let (standing, assignment) = match current {
            _ if leaving => ("leaving", None),
            Standing::Joining => ("joining", None),
            Standing::Assigned(a) => ("assigned", Some(a.clone())),
            Standing::Fenced { .. } => ("fenced", None),
            Standing::Left { .. } => ("leaving", None),
        };
        // One instance per service looks for stale records: the first.
        let prune = assignment
            .as_ref()
            .filter(|a| a.index == 1)
            .map(|_| interval);
        let presence = self.clone();
        let (mut conn, name, id) = (conn.clone(), name.clone(), id.clone());
        let told = async move {
            let told = presence.tell(&mut conn, &name, &id, standing, assignment, prune);
            if let Err(e) = told.await {
                debug!(service = %name, cause = %e, "members record and counts not sent; sent again next round");
            }
        };
        tokio::spawn(told.in_current_span());
    }

    /// Removes the instance's members record (it left).
    pub(crate) async fn leave(conn: &mut Conn, name: &ServiceName, id: &InstanceId) -> Result<()> {
        let mut hdel = redis::cmd("HDEL");
        hdel.arg(keys::members(name)).arg(id.as_str());
        hdel.query_async::<()>(conn).await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flush_is_sent_again_until_confirmed_and_counts_keep_coming() {
        let presence = Presence::new(Arc::new(crate::clock::SystemClock), 1);
        assert_eq!(presence.flush(), None, "nothing counted");
        presence.count(Count::Ok);
        presence.count(Count::Ok);
        presence.count(Count::Dead);
        let first = presence.flush().unwrap();
        let total = |f: &Flush| {
            f.minutes.iter().fold([0; 4], |mut acc, (_, c)| {
                for i in 0..4 {
                    acc[i] += c[i];
                }
                acc
            })
        };
        assert_eq!(total(&first), [2, 0, 1, 0]);
        presence.count(Count::Retried);
        assert_eq!(
            presence.flush().as_ref(),
            Some(&first),
            "unconfirmed: the same again"
        );
        presence.flushed(first.seq);
        let second = presence.flush().unwrap();
        assert!(second.seq > first.seq);
        assert_eq!(total(&second), [0, 0, 0, 1]);
        presence.flushed(second.seq);
        assert_eq!(presence.flush(), None);
        assert_eq!(presence.handled.load(Ordering::Relaxed), 2);
    }

    #[tokio::test]
    async fn a_flush_sent_again_after_a_lost_reply_counts_once() {
        use peerq_test_support as support;
        let server = support::RedisServer::start();
        let client = server.client();
        let conn = client.get_multiplexed_async_connection().await.unwrap();
        let mut conn = crate::connection::Conn::Node(conn);
        let name = ServiceName::new(&support::unique_name("presence")).unwrap();
        let id = InstanceId::generate();
        let presence = Presence::new(Arc::new(crate::clock::SystemClock), 1);
        presence.count(Count::Ok);
        presence.count(Count::Ok);
        presence.count(Count::Dead);
        let sent = presence.flush().unwrap();
        presence
            .tell(&mut conn, &name, &id, "assigned", None, None)
            .await
            .unwrap();
        // Its reply lost: the instance sends it again.
        presence.tally().sent = Some(sent.clone());
        presence
            .tell(&mut conn, &name, &id, "assigned", None, None)
            .await
            .unwrap();
        let minute = sent.minutes[0].0;
        let counts: std::collections::HashMap<String, u64> = redis::cmd("HGETALL")
            .arg(keys::stats(&name, minute))
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(counts.get("ok"), Some(&2), "{counts:?}");
        assert_eq!(counts.get("dead"), Some(&1), "{counts:?}");
        let record: String = redis::cmd("HGET")
            .arg(keys::members(&name))
            .arg(id.as_str())
            .query_async(&mut conn)
            .await
            .unwrap();
        let record: serde_json::Value = serde_json::from_str(&record).unwrap();
        assert_eq!(record["standing"], "assigned");
        assert_eq!(record["handled"], 2);
    }

    #[tokio::test]
    async fn each_instance_records_its_backlog_in_the_minute_and_a_reader_adds_them() {
        use peerq_test_support as support;
        let server = support::RedisServer::start();
        let client = server.client();
        let conn = client.get_multiplexed_async_connection().await.unwrap();
        let mut conn = crate::connection::Conn::Node(conn);
        let name = ServiceName::new(&support::unique_name("presence")).unwrap();
        let clock: Arc<dyn Clock> = Arc::new(crate::clock::SystemClock);
        // All in one minute: not in a minute's last seconds.
        let into = clock.now().as_millis() % 60_000;
        if into > 55_000 {
            tokio::time::sleep(std::time::Duration::from_millis(60_100 - into as u64)).await;
        }
        // Two instances that own partitions, and one (a standalone
        // indexer) that owns none and records nothing.
        for backlog in [Some(17), Some(25), None] {
            let presence = Presence::new(clock.clone(), 1);
            if let Some(backlog) = backlog {
                presence.set_backlog(backlog);
            }
            let id = InstanceId::generate();
            presence
                .tell(&mut conn, &name, &id, "assigned", None, None)
                .await
                .unwrap();
        }
        let admin = crate::admin::Admin::connect(server.url()).await.unwrap();
        let minutes = admin.minutes(&[&name], 2).await.unwrap().pop().unwrap();
        let now = minutes.last().unwrap();
        assert_eq!(now.backlog, Some(42), "{minutes:?}");
        assert_eq!(minutes[0].backlog, None, "the minute before: none recorded");
    }
}
