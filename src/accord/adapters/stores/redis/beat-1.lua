#!lua
--[[ beat-1.lua: record an engine as live and list the live ones (ports.Shards.beat).

  KEYS: 1 engine beats P:engines (zset: engine id -> beat expiry, ms, store clock)
  ARGV: 1 engine id   2 now (ms)   3 expiry (ms: now + ttl)   4 prune before (ms)
  Returns the ids of every engine whose beat expires after now (in score order; the caller
  sorts); {-5, reason} on malformed arguments.

  Beats that lapsed long before (ARGV 4) are pruned, at most 100 a call, so ephemeral engine ids
  keep the set bounded; a recently lapsed beat stays, so handles whose clocks disagree a little
  never prune a beat another handle still counts as live.
]]

if tonumber(ARGV[2]) == nil or tonumber(ARGV[3]) == nil or tonumber(ARGV[4]) == nil then
  return {-5, 'now, expiry and prune bound must be numbers'}
end
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
local stale = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. ARGV[4], 'LIMIT', 0, 100)
if #stale > 0 then redis.call('ZREM', KEYS[1], unpack(stale)) end
return redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. ARGV[2], '+inf')
