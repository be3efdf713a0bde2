-- docs/design.md §19: a batch's record, in the slot of its home partition
-- `{N/h}` (its id is `<h>/<uuid>`), so that the script that finds it
-- complete adds its callback to `{N/h}:stream` and says so in one step:
-- the callback is added once, whoever forwards the last member's end, and
-- never again (not after a replay either). unique.lua is prepended.
-- KEYS[1] = {N/h}:batch:<uuid>, a hash: `total`, `ok`, `dead`,
-- `cancelled` (members counted in each final state), `sealed` (0 or 1),
-- `created_at`, `expires_at` (an unsealed batch's end, Unix ms), `keep`
-- (ms kept once done), `c:<field>` and `o:<field>` (the callback's and the
-- on-failure callback's entry fields; absent: none), and once done
-- `done_at`, `sent` (`callback`, `on_failure` or `none`) and `sent_id`.
-- KEYS[2] = {N/h}:batch:<uuid>:m, a hash: member task id → its state and
-- the id of the completion record that said so (`<state> <stream id>`, in
-- the member's own partition); a member not in it has not ended yet.
-- KEYS[3] = {N/h}:stream
-- ARGV[1] = what to do     ARGV[2] = the batch id
-- `open` ARGV[3] = ms until an unsealed batch expires, ARGV[4] = ms kept
--   once done, ARGV[5] = c, then c pairs of the callback's field and value,
--   then o, then o pairs of the on-failure callback's (0: none). Returns 1,
--   or 0 if it existed.
-- `add` ARGV[3] = the add's id, ARGV[4] = how many members it adds: each
--   add is counted once (a call sent again after a lost reply adds none).
--   Returns { code, total }: 1 added, 0 no such batch, -1 sealed, -2
--   expired.
-- `seal` Returns { code, state }: 1 sealed (state `open` or `done`), 0 no
--   such batch, -2 expired.
-- `forward` ARGV[3..] = triples of member task ids (space-separated),
--   state and completion id; a member's state changes only for a newer
--   completion. Returns 1, or 0 if there is no such batch (any more).

local now_t = redis.call('TIME')
local now = tonumber(now_t[1]) * 1000 + math.floor(tonumber(now_t[2]) / 1000)
local op, batch = ARGV[1], ARGV[2]
local COUNTER = { succeeded = 'ok', dead = 'dead', cancelled = 'cancelled' }

-- The fields of the callback stored under `prefix` (`c:` or `o:`) among
-- the record's `all` (HGETALL), in their order; none: an empty table.
local function stored(all, prefix)
  local fields = {}
  for i = 1, #all - 1, 2 do
    if string.sub(all[i], 1, 2) == prefix then
      fields[#fields + 1] = string.sub(all[i], 3)
      fields[#fields + 1] = all[i + 1]
    end
  end
  return fields
end

-- Adds the callback once every member of a sealed batch is final.
local function settle()
  local r = redis.call('HMGET', KEYS[1], 'sealed', 'total', 'ok', 'dead', 'cancelled',
    'done_at', 'keep')
  if r[1] ~= '1' or r[6] then
    return 'open'
  end
  local total, ok, dead, cancelled = tonumber(r[2]), tonumber(r[3]), tonumber(r[4]), tonumber(r[5])
  if ok + dead + cancelled < total then
    return 'open'
  end
  local all = redis.call('HGETALL', KEYS[1])
  local fields, sent = stored(all, 'c:'), 'callback'
  local on_failure = stored(all, 'o:')
  if dead + cancelled > 0 and #on_failure > 0 then
    fields, sent = on_failure, 'on_failure'
  end
  local id = ''
  if #fields > 0 then
    local summary = { total, ok, dead, cancelled }
    if dead > 0 then
      -- The ids of the dead, for the callback (at most 1,000).
      local members = redis.call('HGETALL', KEYS[2])
      for i = 1, #members - 1, 2 do
        if #summary < 1004 and string.sub(members[i + 1], 1, 5) == 'dead ' then
          summary[#summary + 1] = members[i]
        end
      end
    end
    for _, v in ipairs({ 'attempt', '1', 'enqueued_at', tostring(now), 'callback_of', batch,
      'summary', table.concat(summary, ' ') }) do
      fields[#fields + 1] = v
    end
    redis.call('XADD', KEYS[3], '*', unpack(fields))
    id = field_in(fields, 'id')
  else
    sent = 'none'
  end
  redis.call('HSET', KEYS[1], 'done_at', now, 'sent', sent, 'sent_id', id)
  redis.call('PEXPIRE', KEYS[1], r[7])
  redis.call('PEXPIRE', KEYS[2], r[7])
  return 'done'
end

if op == 'open' then
  if redis.call('EXISTS', KEYS[1]) == 1 then
    return 0
  end
  local expires, keep = tonumber(ARGV[3]), tonumber(ARGV[4])
  redis.call('HSET', KEYS[1], 'total', 0, 'ok', 0, 'dead', 0, 'cancelled', 0, 'sealed', 0,
    'created_at', now, 'expires_at', now + expires, 'keep', keep)
  local at = 5
  for _, prefix in ipairs({ 'c:', 'o:' }) do
    local n = tonumber(ARGV[at])
    for i = at + 1, at + 2 * n - 1, 2 do
      redis.call('HSET', KEYS[1], prefix .. ARGV[i], ARGV[i + 1])
    end
    at = at + 2 * n + 1
  end
  redis.call('PEXPIRE', KEYS[1], expires + keep)
  return 1
end

local r = redis.call('HMGET', KEYS[1], 'sealed', 'expires_at', 'total', 'keep', 'done_at')
if not r[1] then
  if op == 'forward' then
    return 0
  end
  return { 0, '' }
end
local expired = r[1] ~= '1' and now > tonumber(r[2])

if op == 'add' then
  if r[1] == '1' then
    return { -1, r[3] }
  end
  if expired then
    return { -2, r[3] }
  end
  if redis.call('HSETNX', KEYS[1], 'a:' .. ARGV[3], 1) == 0 then
    return { 1, r[3] }
  end
  return { 1, tostring(redis.call('HINCRBY', KEYS[1], 'total', tonumber(ARGV[4]))) }
end

if op == 'seal' then
  if expired then
    return { -2, 'expired' }
  end
  redis.call('HSET', KEYS[1], 'sealed', 1)
  return { 1, settle() }
end

if op == 'forward' then
  -- Every member told, with its state and record, in order.
  local told = {}
  for i = 3, #ARGV - 2, 3 do
    for id in string.gmatch(ARGV[i], '%S+') do
      told[#told + 1] = { id, ARGV[i + 1], ARGV[i + 2] }
    end
  end
  local moved = { ok = 0, dead = 0, cancelled = 0 }
  for from = 1, #told, 1000 do
    local to = math.min(from + 999, #told)
    local ids = {}
    for k = from, to do
      ids[#ids + 1] = told[k][1]
    end
    local prev = redis.call('HMGET', KEYS[2], unpack(ids))
    local writes = {}
    local now_of = {}
    for k = from, to do
      local id, state, at = told[k][1], told[k][2], told[k][3]
      -- A member told twice in one call: its later record is its state.
      local held = now_of[id] or prev[k - from + 1]
      local was, was_at = nil, ''
      if held then
        was, was_at = string.match(held, '^(%S+) (%S+)$')
      end
      if not was or after(at, was_at) then
        if COUNTER[was] then
          moved[COUNTER[was]] = moved[COUNTER[was]] - 1
        end
        if COUNTER[state] then
          moved[COUNTER[state]] = moved[COUNTER[state]] + 1
        end
        now_of[id] = state .. ' ' .. at
        writes[#writes + 1] = id
        writes[#writes + 1] = now_of[id]
      end
    end
    if #writes > 0 then
      redis.call('HSET', KEYS[2], unpack(writes))
    end
  end
  for counter, n in pairs(moved) do
    if n ~= 0 then
      redis.call('HINCRBY', KEYS[1], counter, n)
    end
  end
  -- The members' hash lives as long as the record: `keep` after the end,
  -- or after the unsealed batch's expiry (computed, not read with PTTL:
  -- the README's least-privilege rule grants PEXPIRE, not the keyspace's
  -- reads).
  local ends = tonumber(r[5] or r[2]) + tonumber(r[4])
  redis.call('PEXPIRE', KEYS[2], math.max(ends - now, 1))
  settle()
  return 1
end
return redis.error_reply('batch.lua: unknown operation ' .. tostring(op))
