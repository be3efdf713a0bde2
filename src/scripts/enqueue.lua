-- docs/design.md §6: enqueues one task with options, in one step in the task's
-- partition: at most once per idempotency key (the dedup record is written
-- with the entry, so a producer that retries after an ambiguous failure
-- enqueues it once), and either now or, delayed, in the partition's delayed
-- set (the partition's owner moves it into the stream when due). The outbox
-- relay adds a second dedup record, `outbox:<task id>` (docs/design.md §10),
-- so a row it sends again after a crash is not enqueued twice.
-- KEYS[1] = {N/p}:stream     KEYS[2] = {N/p}:delayed     KEYS[3] = {N/p}:dedup:<key>
-- KEYS[4] = {N/p}:dedup:<second record>
-- ARGV[1] = dedup TTL (ms; 0: no idempotency key)     ARGV[2] = task id
-- ARGV[3] = due time (Unix ms; 0: none)     ARGV[4] = delay (ms, by Redis's clock)
-- ARGV[5] = the second record's TTL (ms; 0: none)
-- ARGV[6..] = field, value, ...
-- Returns { the id of the task enqueued: this one, or the earlier one under
-- either dedup record; its due time (Unix ms) if this call delayed it,
-- else 0 }: the producer then adds the due index's notice (docs/design.md
-- §6), a key of another slot.
local ttl = tonumber(ARGV[1])
local once_ttl = tonumber(ARGV[5])
-- The task a dedup record names, if it is in use (TTL > 0) and present.
local function earlier(record_ttl, key)
  return record_ttl > 0 and redis.call('GET', key)
end
local found = earlier(ttl, KEYS[3]) or earlier(once_ttl, KEYS[4])
if found then
  return { found, 0 }
end
local at = tonumber(ARGV[3])
local delay = tonumber(ARGV[4])
local due = 0
local now = 0
if at > 0 or delay > 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  due = at > 0 and at or now + delay
end
local delayed = due > now
if delayed then
  local fields = {}
  for i = 6, #ARGV do fields[#fields + 1] = ARGV[i] end
  redis.call('ZADD', KEYS[2], due, cmsgpack.pack(fields))
else
  redis.call('XADD', KEYS[1], '*', unpack(ARGV, 6))
end
for _, record in ipairs({ { ttl, KEYS[3], ARGV[1] }, { once_ttl, KEYS[4], ARGV[5] } }) do
  if record[1] > 0 then
    redis.call('SET', record[2], ARGV[2], 'PX', record[3])
  end
end
return { ARGV[2], delayed and due or 0 }
