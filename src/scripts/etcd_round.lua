-- The Redis half of a round whose membership is on etcd (docs/design.md §2.2).
-- KEYS[1] = {N}:layout        the service's layout (docs/design.md §21)
-- KEYS[2] = {N}:<number>      a Redis round key of this round
-- KEYS[3] = {N}:<number - 1>  and of the previous one
-- Returns {redis time in µs, layout, how many of KEYS[2..3] exist}: the
-- clock the instance checks its own against, the layout the assignment
-- carries, and whether an instance with its rounds on Redis runs under the
-- name (one of a peerq that does not record the backend in {N}:meta).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
return {now, redis.call('HGETALL', KEYS[1]), redis.call('EXISTS', KEYS[2], KEYS[3])}
