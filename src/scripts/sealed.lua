-- docs/design.md §21, prepended to every script that adds entries to a
-- partition's stream: a partition sealed by a reshard (`{N/p}:sealed`)
-- takes no new entry there.

-- The key `suffix` of the partition whose stream is `stream`
-- (`{N/p}:stream`).
local function beside(stream, suffix)
  return string.sub(stream, 1, #stream - 6) .. suffix
end

-- Whether the partition of `stream` is sealed.
local function is_sealed(stream)
  return redis.call('EXISTS', beside(stream, 'sealed')) == 1
end

-- The owner's re-add of an entry (ARGV[from..], its fields) into its own
-- partition: at the stream's end, or, once the partition is sealed, into
-- its delayed set, due now, which the reshard moves to the new layout
-- before it retires the partition. Returns where it went, as unique locks
-- record it: 's:<stream id>' or 'd:<due ms>'.
local function readd(stream, from)
  if is_sealed(stream) then
    local fields = {}
    for i = from, #ARGV do
      fields[#fields + 1] = ARGV[i]
    end
    local t = redis.call('TIME')
    local due = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    redis.call('ZADD', beside(stream, 'delayed'), due, cmsgpack.pack(fields))
    return 'd:' .. due
  end
  return 's:' .. redis.call('XADD', stream, '*', unpack(ARGV, from))
end
