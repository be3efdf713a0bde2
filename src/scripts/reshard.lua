-- Starts a reshard (docs/design.md §21): writes the next generation into the
-- service's layout, or says by name why not, in one step.
-- KEYS[1] = {N}:layout    KEYS[2] = {N}:members
-- ARGV[1] = the new partition count (checked by the caller: 1 to 4096)
-- ARGV[2] = the first generation's partitions ({N}:meta's), for a service
--           without a layout
-- ARGV[3] = the round interval in ms   ARGV[4] = how long a member record
--           may go unseen before it no longer counts (ms)
-- Returns {'ok', generation, from partitions}, or a refusal:
--   {'running', generation, state}   a reshard has not settled yet
--   {'partitions', count}            the count is the current one
--   {'member', instance id, version} a member that takes no part in one
--   {'idle'}                         no consumer runs to carry it out
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local want = tonumber(ARGV[1])
local layout = {}
local flat = redis.call('HGETALL', KEYS[1])
for i = 1, #flat, 2 do
  layout[flat[i]] = flat[i + 1]
end
local generation = tonumber(layout.generation or '0')
local partitions = tonumber(layout.partitions or ARGV[2])
if layout.state == 'draining' then
  return {'running', generation, 'draining'}
end
-- Open, but its cut-over epoch is not two rounds behind yet: a round of
-- the open epoch may still be read with the old layout's successor
-- (instances act on it until then).
if layout.state == 'open' and layout.open_epoch then
  local epoch = math.floor(now_ms / tonumber(ARGV[3])) + 1
  if epoch < tonumber(layout.open_epoch) + 2 then
    return {'running', generation, 'opening'}
  end
end
if want == partitions then
  return {'partitions', partitions}
end
-- Every member seen lately must follow a reshard: one of a previous
-- version would go on running its old partitions' tasks beside nobody's
-- drain, and never seal them.
local members = redis.call('HGETALL', KEYS[2])
local gone_before = now_ms - tonumber(ARGV[4])
local live = 0
for i = 1, #members, 2 do
  local ok, record = pcall(cjson.decode, members[i + 1])
  local seen = ok and type(record) == 'table' and tonumber(record.seen_at_ms) or 0
  if seen >= gone_before then
    if not (ok and record.reshard == 1) then
      local version = ok and type(record) == 'table' and record.version or ''
      return {'member', members[i], tostring(version)}
    end
    live = live + 1
  end
end
-- The old generation is sealed and drained by its owners: with no
-- consumer running, the reshard would wait, and producers would write a
-- generation no one runs yet.
if live == 0 then
  return {'idle'}
end
-- Every generation before the new one, oldest first: their partitions may
-- hold batch callbacks parked by a sealed home, which the consumers send on
-- (docs/design.md §21). A layout written before the history was kept
-- names only the generation it replaced.
local history = layout.history
if not history and layout.from_generation then
  history = layout.from_generation .. ':' .. layout.from_partitions
end
local entry = generation .. ':' .. partitions
if history and history ~= '' then
  history = history .. ',' .. entry
else
  history = entry
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1],
  'generation', generation + 1, 'partitions', want,
  'from_generation', generation, 'from_partitions', partitions,
  'state', 'draining', 'started_ms', now_ms, 'history', history)
return {'ok', generation + 1, partitions}
