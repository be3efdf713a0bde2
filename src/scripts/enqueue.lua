-- docs/design.md §6: enqueues one task with options, in one step in the task's
-- partition: at most once per idempotency key (the dedup record is written
-- with the entry, so a producer that retries after an ambiguous failure
-- enqueues it once), and either now or, delayed, in the partition's delayed
-- set (the partition's owner moves it into the stream when due).
-- KEYS[1] = {N/p}:stream     KEYS[2] = {N/p}:delayed     KEYS[3] = {N/p}:dedup:<key>
-- ARGV[1] = dedup TTL (ms; 0: no idempotency key)     ARGV[2] = task id
-- ARGV[3] = due time (Unix ms; 0: none)     ARGV[4] = delay (ms, by Redis's clock)
-- ARGV[5..] = field, value, ...
-- Returns { the id of the task enqueued: this one, or the earlier one under
-- the same idempotency key; its due time (Unix ms) if this call delayed it,
-- else 0 }: the producer then adds the due index's notice (docs/design.md
-- §6), a key of another slot.
local ttl = tonumber(ARGV[1])
if ttl > 0 then
  local earlier = redis.call('GET', KEYS[3])
  if earlier then
    return { earlier, 0 }
  end
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
  for i = 5, #ARGV do fields[#fields + 1] = ARGV[i] end
  redis.call('ZADD', KEYS[2], due, cmsgpack.pack(fields))
else
  redis.call('XADD', KEYS[1], '*', unpack(ARGV, 5))
end
if ttl > 0 then
  redis.call('SET', KEYS[3], ARGV[2], 'PX', ARGV[1])
end
return { ARGV[2], delayed and due or 0 }
