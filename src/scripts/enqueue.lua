-- docs/design.md §6: enqueues one task with options, in one step in the task's
-- partition: at most once per idempotency key (the dedup record is written
-- with the entry, so a producer that retries after an ambiguous failure
-- enqueues it once), and either now or, delayed, in the partition's delayed
-- set (the partition's owner moves it into the stream when due). The outbox
-- relay adds a second dedup record, `outbox:<task id>` (docs/design.md §10),
-- written without an expiry (the relay gives it one once the row's delete
-- has committed), so a row it sends again after a crash or an outage is
-- not enqueued twice; and a deadline by Redis's clock, past which this call
-- writes nothing, so a relay that froze mid-claim cannot send once the row
-- may have been moved by another and its record expired.
-- KEYS[1] = {N/p}:stream     KEYS[2] = {N/p}:delayed     KEYS[3] = {N/p}:dedup:<key>
-- KEYS[4] = {N/p}:dedup:outbox:<task id>     KEYS[5] = {N/p}:tasks
-- ARGV[1] = dedup TTL (ms; 0: no idempotency key)     ARGV[2] = task id
-- ARGV[3] = due time (Unix ms; 0: none)     ARGV[4] = delay (ms, by Redis's clock)
-- ARGV[5] = the outbox relay's deadline (Unix ms, Redis's clock; 0: no
--           outbox record)
-- ARGV[6] = 1 with tracking on (docs/design.md §14): the task's record is
--           written; 0: no record
-- ARGV[7..] = field, value, ... (with a `unique` field: the unique key,
--           docs/design.md §16; its lock is `{N/p}:unique`, named after KEYS[1])
-- Returns { the id of the task enqueued: this one, or the earlier one under
-- either dedup record, or the task that holds the unique key; its due time
-- (Unix ms) if this call delayed it, else 0; 1 when refused for the unique
-- key, 2 when the partition is sealed by a reshard (nothing written), else
-- 0 }: the producer then adds the due index's notice
-- (docs/design.md §6), a key of another slot. Past the deadline:
-- { '', 0, 0 }, nothing written.
-- KEYS[6] = {N/p}:sealed, given only to probe a partition of the layout a
-- reshard replaces (docs/design.md §21): nothing is written; the reply is
-- the earlier task or the unique key's holder, as above, or { '', 0, 2 }
-- once the partition is sealed (its records are frozen: the task goes to
-- the new layout), { '', 0, 3 } while it is not yet.
local probe = KEYS[6] ~= nil
local ttl = tonumber(ARGV[1])
local until_ms = tonumber(ARGV[5])
if until_ms > 0 and now_ms() > until_ms then
  return { '', 0, 0 }
end
local found = (ttl > 0 and redis.call('GET', KEYS[3]))
  or (until_ms > 0 and redis.call('GET', KEYS[4]))
if found then
  -- A row that repeats an idempotency key resolves to the earlier task
  -- for good, also once the key's record has expired.
  if until_ms > 0 and not probe then
    redis.call('SET', KEYS[4], found)
  end
  return { found, 0, 0 }
end
-- The unique key's lock: held by a task whose entry still lives, a refusal;
-- held by one whose entry is gone (docs/design.md §16: stale), taken over.
local unique = field_of(7, 'unique')
local locks = locks_of(KEYS[1])
if unique then
  local where, held_by = holder(locks, unique)
  if held_by and alive(KEYS[1], KEYS[2], 'peerq', where, held_by) then
    return { held_by, 0, 1 }
  end
end
-- Sealed by a reshard (docs/design.md §21): the records above still
-- answer (they are frozen now), but nothing new is written here; the
-- producer sends the task to the new layout.
if is_sealed(KEYS[1]) then
  return { '', 0, 2 }
end
if probe then
  return { '', 0, 3 }
end
local at = tonumber(ARGV[3])
local delay = tonumber(ARGV[4])
local due = 0
if at > 0 or delay > 0 then
  due = at > 0 and at or now_ms() + delay
end
local delayed = due > 0 and due > now_ms()
if delayed then
  local fields = {}
  for i = 7, #ARGV do fields[#fields + 1] = ARGV[i] end
  redis.call('ZADD', KEYS[2], due, cmsgpack.pack(fields))
  if unique then
    redis.call('HSET', locks, unique, 'd:' .. due .. ' ' .. ARGV[2])
  end
else
  local added = redis.call('XADD', KEYS[1], '*', unpack(ARGV, 7))
  if unique then
    redis.call('HSET', locks, unique, 's:' .. added .. ' ' .. ARGV[2])
  end
end
if tonumber(ARGV[6]) > 0 then
  -- (A cancel request made before the task existed is not in its record
  -- but in the partition's cancel requests: the task never starts.)
  -- A unique task's record names its key: a user's cancel frees it.
  local u = unique and cmsgpack.pack('u', unique) or ''
  if delayed then
    redis.call('HSET', KEYS[5], '', PAD, ARGV[2],
      cmsgpack.pack('s', 'delayed', 'a', 1, 'q', now_ms(), 'd', due) .. u)
  else
    redis.call('HSET', KEYS[5], '', PAD, ARGV[2],
      cmsgpack.pack('s', 'waiting', 'a', 1, 'q', now_ms()) .. u)
  end
end
if ttl > 0 then
  redis.call('SET', KEYS[3], ARGV[2], 'PX', ARGV[1])
end
if until_ms > 0 then
  redis.call('SET', KEYS[4], ARGV[2])
end
return { ARGV[2], delayed and due or 0, 0 }
