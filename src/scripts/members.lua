-- docs/design.md §19 (batches), prepended to every script that ends a task:
-- a batch member's end (or, after a replay, its return to pending) is a
-- completion record in its partition's own `{N/p}:completions` stream,
-- written in the same step as the end itself (so a stale owner, refused,
-- writes none, and a counted member is final). The partition's owner
-- forwards the records to the batch (`batch.lua`), which counts each
-- member once, and deletes them after. A task that is no member (no
-- `batch` field) costs nothing here.

-- The partition's completions stream, named after its stream `{N/p}:stream`.
local function completions_of(stream)
  return string.sub(stream, 1, #stream - 6) .. 'completions'
end

-- Says that member(s) `ids` (task ids, space-separated) of batch `batch`
-- are now `state`: `succeeded`, `dead`, `cancelled` or `pending`
-- (replayed). One record for many members of one batch: what one ack
-- ends of a batch costs one entry (and an ack's succeeded members without
-- results are only counted: `n` in place of `t`, fenced_ack.lua).
local function completed(stream, batch, ids, state)
  if batch and batch ~= '' and ids and ids ~= '' then
    redis.call('XADD', completions_of(stream), '*', 'b', batch, 't', ids, 's', state)
  end
end
