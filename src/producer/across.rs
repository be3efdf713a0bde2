//! A batch across a reshard (docs/design.md §21): the tasks a sealed
//! partition refused go again to the new layout; and while the replaced
//! layout may still hold their records, the tasks with an idempotency or
//! unique key ask it first, in one pipeline (again while a partition is
//! not sealed yet), and only those it knows nothing of are sent.

use std::time::Duration;

use deadpool_redis::redis::{self, Value};

use super::batch::{Item, Sent};
use super::route;
use super::send::{ENQUEUE, Enqueued, NOT_SEALED, SEAL_WITHIN, SEALED};
use super::{Options, Producer};
use crate::codec::Codec;
use crate::entry::{Entry, TaskId};
use crate::error::{Duplicate, Error, Result};
use crate::keys;
use crate::reshard::Generation;

impl Options {
    /// Whether a record in the task's partition may decide its enqueue:
    /// an idempotency key's or a unique key's.
    pub(super) fn recorded(&self) -> bool {
        self.idempotency_key.is_some() || self.unique.is_some()
    }
}

impl<C: Codec> Producer<C> {
    /// Sends `items` in parts: a task without options (or with a key only)
    /// as an `XADD`, one with an idempotency key or a delay through the
    /// enqueue script, in the same part.
    pub(super) async fn send_items(&self, items: Vec<Item<'_>>) -> Result<Sent> {
        let asked = self.to_ask(&self.route());
        match asked {
            Some(from) if items.iter().any(|(_, o)| o.is_some_and(Options::recorded)) => {
                self.send_asking(items, from).await
            }
            _ => self.send_following(items).await,
        }
    }

    /// Sends `items`, following reshards that seal the partitions they
    /// went to.
    pub(super) async fn send_following(&self, items: Vec<Item<'_>>) -> Result<Sent> {
        let (mut sent, mut sealed) = self.send_round(&items).await?;
        let mut followed = 0;
        // A partition a reshard sealed refused some (nothing of theirs was
        // written): they go again to the layout read anew, with the ids
        // they were given, after the rest of the batch; a key's tasks that
        // landed went to the old layout, which runs first (docs/design.md
        // §21).
        while !sealed.is_empty() {
            if followed >= route::FOLLOW_AT_MOST {
                return Err(crate::error::Error::Runtime(format!(
                    "service `{}` was resharded {followed} times while one batch was sent; \
                     {} of its tasks were not enqueued",
                    self.name,
                    sealed.len()
                )));
            }
            followed += 1;
            self.follow_reshard().await?;
            sealed.sort_unstable();
            let mut options: Vec<Options> = Vec::with_capacity(sealed.len());
            for &task in &sealed {
                let mut o = items[task].1.cloned().unwrap_or_default();
                o.id = Some(sent.ids[task].clone());
                options.push(o);
            }
            let mut again: Vec<Item<'_>> = Vec::with_capacity(sealed.len());
            for (&task, o) in sealed.iter().zip(&options) {
                again.push((items[task].0.clone(), Some(o)));
            }
            let (resent, still) = self.send_round(&again).await?;
            for (j, &task) in sealed.iter().enumerate() {
                sent.ids[task] = resent.ids[j].clone();
            }
            sent.new += resent.new;
            for (j, duplicate) in resent.refused {
                sent.refused.push((sealed[j], duplicate));
            }
            sealed = still.into_iter().map(|j| sealed[j]).collect();
        }
        Ok(sent)
    }

    /// Sends `items`, asking generation `from` first for those with a
    /// record (see the module's doc).
    pub(super) async fn send_asking(&self, items: Vec<Item<'_>>, from: Generation) -> Result<Sent> {
        // Their ids fixed now: the ones asked about are the ones sent.
        let owned: Vec<Option<Options>> = items
            .iter()
            .map(|(_, o)| {
                o.filter(|o| o.recorded()).map(|o| {
                    let mut o = o.clone();
                    o.id = Some(o.id.clone().unwrap_or_else(TaskId::generate));
                    o
                })
            })
            .collect();
        let answers = self.ask_all(&items, &owned, from).await?;
        let mut rest: Vec<Item<'_>> = Vec::new();
        let mut at: Vec<usize> = Vec::new();
        for (i, (payload, options)) in items.iter().enumerate() {
            if answers[i].is_none() {
                rest.push((payload.clone(), owned[i].as_ref().or(*options)));
                at.push(i);
            }
        }
        let sent = self.send_following(rest).await?;
        let mut ids: Vec<TaskId> = owned
            .iter()
            .map(|o| {
                o.as_ref()
                    .and_then(|o| o.id.clone())
                    .unwrap_or_else(|| TaskId::from(""))
            })
            .collect();
        let mut refused: Vec<(usize, Duplicate)> = Vec::new();
        for (j, &i) in at.iter().enumerate() {
            ids[i] = sent.ids[j].clone();
        }
        refused.extend(sent.refused.into_iter().map(|(j, d)| (at[j], d)));
        for (i, answer) in answers.into_iter().enumerate() {
            match answer {
                Some(Enqueued::Earlier(id)) | Some(Enqueued::New(id)) => ids[i] = id,
                Some(Enqueued::Refused(holder)) => {
                    ids[i] = holder.clone();
                    let unique = items[i]
                        .1
                        .and_then(|o| o.unique.clone())
                        .unwrap_or_default();
                    refused.push((
                        i,
                        Duplicate {
                            unique,
                            existing: holder,
                        },
                    ));
                }
                None => {}
            }
        }
        refused.sort_by_key(|(i, _)| *i);
        Ok(Sent {
            ids,
            new: sent.new,
            refused,
        })
    }

    /// Each task's answer from its partition in `from` (`None`: nothing
    /// there, or no record to ask about), once every partition asked is
    /// sealed.
    async fn ask_all(
        &self,
        items: &[Item<'_>],
        owned: &[Option<Options>],
        from: Generation,
    ) -> Result<Vec<Option<Enqueued>>> {
        let mut conn = self.conn.get().await?;
        let loaded = ENQUEUE.prepare_invoke().load_async(&mut conn).await;
        loaded.inspect_err(|e| self.conn.reset_after(e))?;
        let mut answers: Vec<Option<Enqueued>> = items.iter().map(|_| None).collect();
        let mut waiting: Vec<usize> = (0..items.len()).filter(|&i| owned[i].is_some()).collect();
        let deadline = tokio::time::Instant::now() + SEAL_WITHIN;
        while !waiting.is_empty() {
            let mut pipe = redis::pipe();
            for &i in &waiting {
                let options = owned[i].as_ref().expect("asked about");
                let id = options.id.clone().expect("its id is fixed");
                let key = options.partition_key().map(str::to_owned);
                let mut entry = Entry::new(id, key, C::NAME, items[i].0.clone());
                entry.unique = options.unique.clone();
                let p = self.place_gen(from, entry.partition_key().as_bytes(), options.priority)?;
                let mut script = self.enqueue_script(&entry, p, options, None, false);
                script.key(keys::sealed(&self.name, p));
                pipe.invoke_script(&script);
            }
            let replies: Vec<Value> = self.conn.query_pipe_each(&mut pipe).await?;
            let mut still = Vec::new();
            for (&i, reply) in waiting.iter().zip(replies) {
                let reply: (String, u64, u8) =
                    redis::from_redis_value(reply).map_err(redis::RedisError::from)?;
                let id = owned[i].as_ref().and_then(|o| o.id.clone());
                let id = id.expect("its id is fixed");
                match reply.2 {
                    SEALED => {}
                    NOT_SEALED => still.push(i),
                    _ => answers[i] = Some(Enqueued::of(&id, reply)),
                }
            }
            waiting = still;
            if waiting.is_empty() {
                break;
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(Error::Runtime(format!(
                    "service `{}`'s previous layout was not sealed within {SEAL_WITHIN:?}; are \\
                     its consumers running?",
                    self.name
                )));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(answers)
    }
}
