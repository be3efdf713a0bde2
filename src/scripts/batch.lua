-- docs/design.md §19: a batch's record, in the slot of its home partition
-- `{N/h}` (its id is `<h>/<uuid>`), so that the script that finds it
-- complete adds its callback (or a chain's next step) to `{N/h}:stream`
-- and says so in one step: the callback is added once, whoever forwards
-- the last member's end, and never again (not after a replay either).
-- unique.lua is prepended.
-- KEYS[1] = {N/h}:batch:<uuid>, a hash: `total`, `ok`, `dead`,
-- `cancelled` (members counted in each final state), `sealed` (0 or 1),
-- `created_at`, `expires_at` (an unsealed batch's end, Unix ms), `keep`
-- (ms kept once done), `results` (1: the callback gets the members'
-- results), `c:<field>` and `o:<field>` (the callback's and the
-- on-failure callback's entry fields; absent: none), `a:<add id>` (an add
-- counted), and for a chain `steps` (how many), `step` (the one running,
-- from 1), `s<i>:<field>` (step i's entry fields, from step 2) and `cur`
-- (the running step's task id); once done `done_at`, `sent` (`callback`,
-- `on_failure`, `stopped` or `none`) and `sent_id`.
-- KEYS[2] = {N/h}:batch:<uuid>:m, a hash: the dead members' task ids (→
-- 1), for the callback's summary; a replayed one leaves it.
-- The record's `w:<p>` fields: the newest completion record of partition
-- `p` the batch took. Records of a partition come in their order, and each
-- member's end is written once (fenced_ack.lua), so a record at or before
-- `w:<p>` was taken already (forwarded twice: a crash before the delete,
-- a stale owner beside the new one) and changes nothing.
-- KEYS[3] = {N/h}:stream
-- KEYS[4] = {N/h}:batch:<uuid>:r, a hash: member task id → its result, for
-- a batch that wants them (a flow's parent, a chain's next step).
-- KEYS[5] = {N/h}:batch:<uuid>:c, a hash: the members a cancel of the
-- batch cancels (a flow's, a chain's first step, a cancellable batch's):
-- `t:<p>/<task id>` → 1, and a flow's subflows, `b:<batch id>` → 1.
-- ARGV[1] = what to do     ARGV[2] = the batch id
-- `open` ARGV[3] = ms until an unsealed batch expires, ARGV[4] = ms kept
--   once done, ARGV[5] = 1 if the callback gets the results, then groups of
--   fields: the callback's, the on-failure callback's, then the chain's
--   steps from the second: each group a count c and c field, value pairs
--   (0: none), the steps after a count of steps. Returns 1, or 0 if it
--   existed.
-- `add` ARGV[3] = the add's id, ARGV[4] = how many members it adds, ARGV[5]
--   = a chain's first step's task id (''), ARGV[6..] = the members to
--   remember for a cancel (KEYS[5]'s fields, then values): each add is
--   counted once (a call sent again after a lost reply adds none).
--   Returns { code, total }: 1 added, 0 no such batch, -1 sealed, -2
--   expired, -3 cancelled.
-- `seal` Returns { code, state }: 1 sealed (state `open` or `done`), 0 no
--   such batch, -2 expired.
-- `cancel` (a user's, docs/design.md §19): the batch takes no member any
--   more and, once every member is final, sends nothing (`sent` =
--   `cancelled`); a flow's parent that is an outer flow's child is then
--   written `cancelled` there, by a completion record of this home
--   partition. Returns { code, task, members… }: 0 no such batch; 2 done
--   already, `task` the task it sent (its callback, a chain's step after
--   the last: '' if none); 1 cancelled now (or before), `task` a chain's
--   step running, in the home partition (''), and the members KEYS[5]
--   remembers; 3 the same, and done now, its parent's end written in its
--   outer flow as a completion record of the home partition (the caller
--   forwards it).
-- `forward` ARGV[3..] = sextuples of the record's partition, its id, the
--   state, how many members it ends, their task ids (space-separated; ''
--   for a count of succeeded ones) and a lone member's result (''), each
--   partition's in order. Returns 1, 2 when it wrote a completion record
--   of the home partition (a cancelled flow's parent ended in its outer
--   flow: the caller forwards it), or 0 if there is no such batch (any
--   more).

local now_t = redis.call('TIME')
local now = tonumber(now_t[1]) * 1000 + math.floor(tonumber(now_t[2]) / 1000)
local op, batch = ARGV[1], ARGV[2]
local COUNTER = { succeeded = 'ok', dead = 'dead', cancelled = 'cancelled' }

-- Calls `command key <items…>` in chunks (Lua unpacks a few thousand
-- values at most; 1,000 is even, so pairs stay whole).
local function chunked(command, key, items)
  for i = 1, #items, 1000 do
    redis.call(command, key, unpack(items, i, math.min(i + 999, #items)))
  end
end

-- The fields stored under `prefix` (`c:`, `o:`, `s2:`…) among the record's
-- `all` (HGETALL), in their order; none: an empty table.
local function stored(all, prefix)
  local fields = {}
  for i = 1, #all - 1, 2 do
    if string.sub(all[i], 1, #prefix) == prefix then
      fields[#fields + 1] = string.sub(all[i], #prefix + 1)
      fields[#fields + 1] = all[i + 1]
    end
  end
  return fields
end

-- Adds `fields` (an entry's but its attempt and enqueue time) to the home
-- stream, with `more` after them; returns its task id. A home partition
-- that a reshard sealed takes no entry (docs/design.md §21), and nobody
-- may own it any more by the time the batch completes: the entry is
-- parked in `{N/h}:parked` (`<batch id> <task id>` → the entry's fields,
-- packed), in this same step, and the consumers' sweeper sends it to the
-- layout in use, once (consumer/parked.rs).
local function enqueue(fields, more)
  for _, v in ipairs({ 'attempt', '1', 'enqueued_at', tostring(now) }) do
    fields[#fields + 1] = v
  end
  for _, v in ipairs(more) do
    fields[#fields + 1] = v
  end
  local home = string.sub(KEYS[3], 1, #KEYS[3] - 6)
  if redis.call('EXISTS', home .. 'sealed') == 1 then
    redis.call('HSET', home .. 'parked', batch .. ' ' .. field_in(fields, 'id'),
      cmsgpack.pack(fields))
  else
    redis.call('XADD', KEYS[3], '*', unpack(fields))
  end
  return field_in(fields, 'id')
end

-- A chain whose step succeeded goes on: its next step is added, a member
-- of this batch with the step before's result. True if it went on.
local function next_step(all, r)
  local steps, step = tonumber(r[8] or 0), tonumber(r[9] or 0)
  if step >= steps then
    return false
  end
  local fields = stored(all, 's' .. (step + 1) .. ':')
  local previous = redis.call('HGET', KEYS[4], r[10]) or ''
  local id = enqueue(fields, { 'batch', batch, 'batch_results', '1', 'previous_result', previous })
  redis.call('HSET', KEYS[1], 'step', step + 1, 'cur', id)
  redis.call('HINCRBY', KEYS[1], 'total', 1)
  return true
end

-- Says the batch is done, having sent `sent` (task `id`), and keeps its
-- keys `keep` ms more.
local function finish(sent, id, keep)
  redis.call('HSET', KEYS[1], 'done_at', now, 'sent', sent, 'sent_id', id)
  for k = 1, 5 do
    if k ~= 3 then
      redis.call('PEXPIRE', KEYS[k], keep)
    end
  end
  return 'done'
end

-- A cancelled batch done: it sends nothing, and its callback, if it is a
-- member of an outer batch (a flow's parent that is a child), ends there
-- `cancelled`: a completion record of the home partition, forwarded as a
-- member's (the canceller forwards them at once).
local function cancelled_done(all, keep)
  local callback = stored(all, 'c:')
  local outer, id = field_in(callback, 'batch'), field_in(callback, 'id')
  if outer and outer ~= '' and id then
    local home = KEYS[3]
    redis.call('XADD', string.sub(home, 1, #home - 6) .. 'completions', '*', 'b', outer, 't', id,
      's', 'cancelled')
    finish('cancelled', '', keep)
    return 'outer'
  end
  return finish('cancelled', '', keep)
end

-- Adds the callback once every member of a sealed batch is final; a chain
-- adds its next step instead while its steps succeed.
local function settle()
  local r = redis.call('HMGET', KEYS[1], 'sealed', 'total', 'ok', 'dead', 'cancelled',
    'done_at', 'keep', 'steps', 'step', 'cur', 'results', 'cancelled_at')
  if r[1] ~= '1' or r[6] then
    return 'open'
  end
  local total, ok, dead, cancelled = tonumber(r[2]), tonumber(r[3]), tonumber(r[4]), tonumber(r[5])
  if ok + dead + cancelled < total then
    return 'open'
  end
  local all = redis.call('HGETALL', KEYS[1])
  local failed = dead + cancelled > 0
  if r[12] then
    return cancelled_done(all, r[7])
  end
  if not failed and next_step(all, r) then
    return 'open'
  end
  local fields, sent = stored(all, 'c:'), 'callback'
  local on_failure = stored(all, 'o:')
  if failed and #on_failure > 0 then
    fields, sent = on_failure, 'on_failure'
  end
  local id = ''
  if #fields > 0 then
    local summary = { total, ok, dead, cancelled }
    if dead > 0 then
      -- The ids of the dead, for the callback (at most 1,000).
      for _, id in ipairs(redis.call('HKEYS', KEYS[2])) do
        if #summary < 1004 then
          summary[#summary + 1] = id
        end
      end
    end
    local more = { 'callback_of', batch, 'summary', table.concat(summary, ' ') }
    if r[11] == '1' then
      -- The members' results, task id and result pairs, MessagePack.
      local results = redis.call('HGETALL', KEYS[4])
      more[#more + 1] = 'results'
      more[#more + 1] = cmsgpack.pack(unpack(results))
    end
    id = enqueue(fields, more)
  elseif failed and r[8] then
    sent = 'stopped'
  else
    sent = 'none'
  end
  return finish(sent, id, r[7])
end

if op == 'open' then
  if redis.call('EXISTS', KEYS[1]) == 1 then
    return 0
  end
  local expires, keep = tonumber(ARGV[3]), tonumber(ARGV[4])
  redis.call('HSET', KEYS[1], 'total', 0, 'ok', 0, 'dead', 0, 'cancelled', 0, 'sealed', 0,
    'created_at', now, 'expires_at', now + expires, 'keep', keep, 'results', ARGV[5])
  local at = 6
  local function group(prefix)
    local n = tonumber(ARGV[at])
    for i = at + 1, at + 2 * n - 1, 2 do
      redis.call('HSET', KEYS[1], prefix .. ARGV[i], ARGV[i + 1])
    end
    at = at + 2 * n + 1
  end
  group('c:')
  group('o:')
  local steps = tonumber(ARGV[at])
  at = at + 1
  if steps > 0 then
    redis.call('HSET', KEYS[1], 'steps', steps + 1, 'step', 1)
    for s = 2, steps + 1 do
      group('s' .. s .. ':')
    end
  end
  redis.call('PEXPIRE', KEYS[1], expires + keep)
  return 1
end

local r = redis.call('HMGET', KEYS[1], 'sealed', 'expires_at', 'total', 'keep', 'done_at',
  'cancelled_at', 'sent_id', 'step', 'cur')
if not r[1] then
  if op == 'forward' then
    return 0
  end
  return { 0, '' }
end
local expired = r[1] ~= '1' and now > tonumber(r[2])

if op == 'add' then
  if r[6] then
    return { -3, r[3] }
  end
  if r[1] == '1' then
    return { -1, r[3] }
  end
  if expired then
    return { -2, r[3] }
  end
  if redis.call('HSETNX', KEYS[1], 'a:' .. ARGV[3], 1) == 0 then
    return { 1, r[3] }
  end
  if ARGV[5] ~= '' then
    redis.call('HSET', KEYS[1], 'cur', ARGV[5])
  end
  if #ARGV > 5 then
    local remembered = {}
    for i = 6, #ARGV do
      remembered[#remembered + 1] = ARGV[i]
    end
    chunked('HSET', KEYS[5], remembered)
    redis.call('PEXPIRE', KEYS[5], math.max(tonumber(r[2]) + tonumber(r[4]) - now, 1))
  end
  return { 1, tostring(redis.call('HINCRBY', KEYS[1], 'total', tonumber(ARGV[4]))) }
end

if op == 'cancel' then
  if r[5] then
    return { 2, r[7] or '' }
  end
  redis.call('HSETNX', KEYS[1], 'cancelled_at', now)
  redis.call('HSET', KEYS[1], 'sealed', 1)
  local reply = { 1, '' }
  if tonumber(r[8] or 0) > 1 then
    reply[2] = r[9]
  end
  for _, member in ipairs(redis.call('HKEYS', KEYS[5])) do
    reply[#reply + 1] = member
  end
  if settle() == 'outer' then
    reply[1] = 3
  end
  return reply
end

if op == 'seal' then
  if expired then
    return { -2, 'expired' }
  end
  redis.call('HSET', KEYS[1], 'sealed', 1)
  return { 1, settle() }
end

if op == 'forward' then
  local records = {}
  local seen, partitions = {}, {}
  for i = 3, #ARGV - 5, 6 do
    records[#records + 1] = i
    if not seen[ARGV[i]] then
      seen[ARGV[i]] = true
      partitions[#partitions + 1] = 'w:' .. ARGV[i]
    end
  end
  local marks = {}
  local held = redis.call('HMGET', KEYS[1], unpack(partitions))
  for k, field in ipairs(partitions) do
    marks[field] = held[k]
  end
  local moved = { ok = 0, dead = 0, cancelled = 0 }
  local dead, undead, results = {}, {}, {}
  for _, i in ipairs(records) do
    local field, at, state = 'w:' .. ARGV[i], ARGV[i + 1], ARGV[i + 2]
    local n, ids, result = tonumber(ARGV[i + 3]), ARGV[i + 4], ARGV[i + 5]
    if not marks[field] or after(at, marks[field]) then
      marks[field] = at
      if state == 'pending' then
        -- A dead member replayed (replay.lua): no longer final.
        moved.dead = moved.dead - n
        for id in string.gmatch(ids, '%S+') do
          undead[#undead + 1] = id
        end
      elseif COUNTER[state] then
        moved[COUNTER[state]] = moved[COUNTER[state]] + n
        if state == 'dead' then
          for id in string.gmatch(ids, '%S+') do
            dead[#dead + 1] = id
            dead[#dead + 1] = 1
          end
        end
      end
      if result ~= '' then
        results[#results + 1] = ids
        results[#results + 1] = result
      end
    end
  end
  local writes = {}
  for _, field in ipairs(partitions) do
    writes[#writes + 1] = field
    writes[#writes + 1] = marks[field]
  end
  redis.call('HSET', KEYS[1], unpack(writes))
  for counter, n in pairs(moved) do
    if n ~= 0 then
      redis.call('HINCRBY', KEYS[1], counter, n)
    end
  end
  -- The dead members' and the results' hashes live as long as the record:
  -- `keep` after the end, or after the unsealed batch's expiry (computed,
  -- not read with PTTL: the README's least-privilege rule grants PEXPIRE,
  -- not the keyspace's reads).
  local ends = tonumber(r[5] or r[2]) + tonumber(r[4])
  for _, write in ipairs({ { KEYS[2], dead }, { KEYS[4], results } }) do
    if #write[2] > 0 then
      chunked('HSET', write[1], write[2])
      redis.call('PEXPIRE', write[1], math.max(ends - now, 1))
    end
  end
  if #undead > 0 then
    chunked('HDEL', KEYS[2], undead)
  end
  if settle() == 'outer' then
    return 2
  end
  return 1
end
return redis.error_reply('batch.lua: unknown operation ' .. tostring(op))
