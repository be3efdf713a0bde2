//! The partition's completion records (docs/design.md §19): each a batch
//! member's end, written by the fenced script that ended it; read by the
//! partition's owner, forwarded to their batches, then deleted.

use deadpool_redis::redis::{self, Value};

use super::PartitionStore;
use crate::workflow::{Completion, records};

impl PartitionStore {
    /// Says that a script of this instance may have written a completion
    /// record: the housekeeping has them forwarded soon.
    pub(crate) fn note_completion(&self) {
        self.completed.notify_one();
    }

    /// Resolves once a completion record may have been written since the
    /// last time it resolved.
    pub(crate) async fn completion_noted(&self) {
        self.completed.notified().await;
    }

    /// The command that reads the partition's oldest `count` completion
    /// records, in order ([`completions_of`](Self::completions_of) reads
    /// its reply).
    pub(crate) fn read_completions(&self, count: usize) -> redis::Cmd {
        records::read(&self.completions, count)
    }

    /// The records of an `XRANGE` reply of this partition's; one not of
    /// the form is skipped.
    pub(crate) fn completions_of(&self, reply: Value) -> Vec<Completion> {
        records::of(self.partition, reply)
    }

    /// The partition's oldest `count` completion records, in order.
    #[cfg(test)]
    async fn completions(&self, count: usize) -> crate::error::Result<Vec<Completion>> {
        let reply: Value = self.conn.query(&self.read_completions(count)).await?;
        Ok(self.completions_of(reply))
    }

    /// The command that deletes the completion records `ids`: their
    /// batches have them.
    pub(crate) fn forget_completions(&self, ids: &[&str]) -> redis::Cmd {
        records::forget(&self.completions, ids)
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{delivered_all, setup};
    use super::super::{AckGroup, PartitionStore, ack};
    use crate::instance::InstanceId;
    use crate::workflow::BatchId;

    /// A member's ack writes its completion record (one per batch and
    /// state), a stale owner's none, the same ack sent again (after a lost
    /// reply) none more; forwarding the records twice over counts each
    /// member once; the seal then finds the batch complete.
    #[tokio::test]
    async fn a_members_end_is_recorded_once_and_counted_once() {
        let (server, conn, name) = setup().await;
        let batch = BatchId::generate(1);
        let owner = InstanceId::generate();
        let fields: [&[(&str, &str)]; 2] = [
            &[("id", "t1"), ("batch", batch.as_str())],
            &[("id", "t2"), ("batch", batch.as_str())],
        ];
        let ids = delivered_all(&server, &name, owner.as_str(), &fields).await;
        let store = PartitionStore::new(conn.clone(), &name, 0, 7, &owner, 1 << 20);
        store.acquire().await.unwrap();
        let stale =
            PartitionStore::new(conn.clone(), &name, 0, 6, &InstanceId::generate(), 1 << 20);
        let members = |store| AckGroup {
            store,
            ids: ids.iter().map(String::as_str).collect(),
            tracked: Vec::new(),
            tracking: None,
            unique: Vec::new(),
            members: vec![
                ("t1", batch.as_str(), &b""[..], ids[0].as_str()),
                ("t2", batch.as_str(), &b""[..], ids[1].as_str()),
            ],
        };
        // The batch exists: members are counted only in an open batch.
        let keys = crate::workflow::BatchKeys::of(&name, &batch);
        let mut open = keys.call("open", &batch);
        // Kept a minute; no results, no callbacks, no steps.
        open.arg(60_000).arg(60_000).arg(0).arg(0).arg(0).arg(0);
        let _: i64 = conn.invoke(&open).await.unwrap();
        let mut add = keys.call("add", &batch);
        add.arg("add-1").arg(2).arg("");
        for _ in 0..2 {
            // Sent again: counted once.
            let _: (i64, String) = conn.invoke(&add).await.unwrap();
        }

        let stale_reply = ack(&conn, &[members(&stale)]).await.unwrap();
        assert_eq!(stale_reply, vec![super::super::AckReply::Fenced]);
        assert!(store.completions(10).await.unwrap().is_empty(), "stale");
        // Sent again (its reply lost): it acks nothing more, writes nothing.
        for _ in 0..2 {
            let reply = ack(&conn, &[members(&store)]).await.unwrap();
            assert_eq!(reply, vec![super::super::AckReply::Acked]);
        }
        let records = store.completions(10).await.unwrap();
        // Succeeded members without results: counted, not named.
        let ended: Vec<(u32, &str, &str)> = records
            .iter()
            .map(|c| (c.count, c.tasks.as_str(), c.state.as_str()))
            .collect();
        assert_eq!(ended, [(2, "", "succeeded")], "written once");
        let all: Vec<&crate::workflow::Completion> = records.iter().collect();
        for _ in 0..2 {
            crate::workflow::records::forward(&conn, &name, &batch, &all)
                .await
                .unwrap();
        }
        let view = crate::workflow::view(&conn, &name, &batch)
            .await
            .unwrap()
            .unwrap();
        assert_eq!((view.total, view.succeeded, view.pending), (2, 2, 0));
        let ats: Vec<&str> = records.iter().map(|c| c.at.as_str()).collect();
        let _: i64 = conn.query(&store.forget_completions(&ats)).await.unwrap();
        assert!(store.completions(10).await.unwrap().is_empty());
    }

    /// An entry its owner took over (its ack late: claimed as idle) is no
    /// longer pending: the late ack writes no end for it, and its new
    /// entry's ack will.
    #[tokio::test]
    async fn a_late_ack_of_an_entry_taken_over_writes_no_end() {
        let (server, conn, name) = setup().await;
        let batch = BatchId::generate(1);
        let owner = InstanceId::generate();
        let fields: [&[(&str, &str)]; 1] = [&[("id", "t1"), ("batch", batch.as_str())]];
        let ids = delivered_all(&server, &name, owner.as_str(), &fields).await;
        let store = PartitionStore::new(conn.clone(), &name, 0, 7, &owner, 1 << 20);
        store.acquire().await.unwrap();
        let next = [("id", "t1"), ("batch", batch.as_str()), ("attempt", "2")];
        let moved = store
            .move_entry(super::super::To::Stream, &ids[0], &next, None)
            .await;
        assert_eq!(moved.unwrap(), super::super::Moved::Yes);
        let group = AckGroup {
            store: &store,
            ids: vec![ids[0].as_str()],
            tracked: Vec::new(),
            tracking: None,
            unique: Vec::new(),
            members: vec![("t1", batch.as_str(), &b""[..], ids[0].as_str())],
        };
        let reply = ack(&conn, &[group]).await.unwrap();
        assert_eq!(reply, vec![super::super::AckReply::Acked]);
        assert!(store.completions(10).await.unwrap().is_empty());
    }
}
