#!lua
--[[ announce-2.lua: replace a worker's capability announcement; prune long-expired ones.

  KEYS: 1 expiries P:{ann} (zset: worker id -> expires_at_ms)   2 capabilities P:{ann}:caps
        (hash; one hash tag, so one Cluster slot)
  ARGV: 1 worker id   2 expires_at_ms   3 capabilities (JSON list)   4 prune before (ms)
  Returns the number of pruned workers. Pruning keeps the set bounded when worker ids are
  ephemeral; it only drops entries that expired long before this announcement's expiry.
]]

if tonumber(ARGV[2]) == nil or tonumber(ARGV[4]) == nil then return -5 end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
local stale = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. ARGV[4], 'LIMIT', 0, 100)
for _, worker in ipairs(stale) do
  redis.call('ZREM', KEYS[1], worker)
  redis.call('HDEL', KEYS[2], worker)
end
return #stale
