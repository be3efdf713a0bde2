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
-- KEYS[2] = {N/h}:batch:<uuid>:m, a hash: member task id → its state and
-- the id of the completion record that said so (`<state> <stream id>`, in
-- the member's own partition); a member not in it has not ended yet.
-- KEYS[3] = {N/h}:stream
-- KEYS[4] = {N/h}:batch:<uuid>:r, a hash: member task id → its result, for
-- a batch that wants them (a flow's parent, a chain's next step).
-- ARGV[1] = what to do     ARGV[2] = the batch id
-- `open` ARGV[3] = ms until an unsealed batch expires, ARGV[4] = ms kept
--   once done, ARGV[5] = 1 if the callback gets the results, then groups of
--   fields: the callback's, the on-failure callback's, then the chain's
--   steps from the second: each group a count c and c field, value pairs
--   (0: none), the steps after a count of steps. Returns 1, or 0 if it
--   existed.
-- `add` ARGV[3] = the add's id, ARGV[4] = how many members it adds, ARGV[5]
--   = a chain's first step's task id (''): each add is counted once (a
--   call sent again after a lost reply adds none). Returns { code, total
--   }: 1 added, 0 no such batch, -1 sealed, -2 expired.
-- `seal` Returns { code, state }: 1 sealed (state `open` or `done`), 0 no
--   such batch, -2 expired.
-- `forward` ARGV[3..] = quadruples of member task ids (space-separated),
--   state, completion id and result (''); a member's state changes only
--   for a newer completion. Returns 1, or 0 if there is no such batch (any
--   more).

local now_t = redis.call('TIME')
local now = tonumber(now_t[1]) * 1000 + math.floor(tonumber(now_t[2]) / 1000)
local op, batch = ARGV[1], ARGV[2]
local COUNTER = { succeeded = 'ok', dead = 'dead', cancelled = 'cancelled' }

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
-- stream, with `more` after them; returns its task id.
local function enqueue(fields, more)
  for _, v in ipairs({ 'attempt', '1', 'enqueued_at', tostring(now) }) do
    fields[#fields + 1] = v
  end
  for _, v in ipairs(more) do
    fields[#fields + 1] = v
  end
  redis.call('XADD', KEYS[3], '*', unpack(fields))
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

-- Adds the callback once every member of a sealed batch is final; a chain
-- adds its next step instead while its steps succeed.
local function settle()
  local r = redis.call('HMGET', KEYS[1], 'sealed', 'total', 'ok', 'dead', 'cancelled',
    'done_at', 'keep', 'steps', 'step', 'cur', 'results')
  if r[1] ~= '1' or r[6] then
    return 'open'
  end
  local total, ok, dead, cancelled = tonumber(r[2]), tonumber(r[3]), tonumber(r[4]), tonumber(r[5])
  if ok + dead + cancelled < total then
    return 'open'
  end
  local all = redis.call('HGETALL', KEYS[1])
  local failed = dead + cancelled > 0
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
      local members = redis.call('HGETALL', KEYS[2])
      for i = 1, #members - 1, 2 do
        if #summary < 1004 and string.sub(members[i + 1], 1, 5) == 'dead ' then
          summary[#summary + 1] = members[i]
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
  redis.call('HSET', KEYS[1], 'done_at', now, 'sent', sent, 'sent_id', id)
  for k = 1, 4 do
    if k ~= 3 then
      redis.call('PEXPIRE', KEYS[k], r[7])
    end
  end
  return 'done'
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
  if ARGV[5] ~= '' then
    redis.call('HSET', KEYS[1], 'cur', ARGV[5])
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
  -- Every member told, with its state, record and result, in order.
  local told = {}
  for i = 3, #ARGV - 3, 4 do
    for id in string.gmatch(ARGV[i], '%S+') do
      told[#told + 1] = { id, ARGV[i + 1], ARGV[i + 2], ARGV[i + 3] }
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
    local writes, results, now_of = {}, {}, {}
    for k = from, to do
      local id, state, at, result = told[k][1], told[k][2], told[k][3], told[k][4]
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
        if result ~= '' then
          results[#results + 1] = id
          results[#results + 1] = result
        end
      end
    end
    if #writes > 0 then
      redis.call('HSET', KEYS[2], unpack(writes))
    end
    if #results > 0 then
      redis.call('HSET', KEYS[4], unpack(results))
    end
  end
  for counter, n in pairs(moved) do
    if n ~= 0 then
      redis.call('HINCRBY', KEYS[1], counter, n)
    end
  end
  -- The members' and results' hashes live as long as the record: `keep`
  -- after the end, or after the unsealed batch's expiry (computed, not
  -- read with PTTL: the README's least-privilege rule grants PEXPIRE, not
  -- the keyspace's reads).
  local ends = tonumber(r[5] or r[2]) + tonumber(r[4])
  redis.call('PEXPIRE', KEYS[2], math.max(ends - now, 1))
  redis.call('PEXPIRE', KEYS[4], math.max(ends - now, 1))
  settle()
  return 1
end
return redis.error_reply('batch.lua: unknown operation ' .. tostring(op))
