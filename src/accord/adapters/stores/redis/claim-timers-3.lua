#!lua
--[[ claim-timers-3.lua: lease up to `limit` due timers of one shard to `owner`, atomically.

  KEYS: 1 timer set P:{sNN}:tmr (score = avail_at)   2 payloads P:{sNN}:tmr:data
        3 lease owners P:{sNN}:tmr:owner
  ARGV: 1 now (ms)   2 lease expiry (ms)   3 limit   4 owner
  Returns a flat list: timer id, JSON [run id, due, payload], … ; {-5, reason} on bad input.

  A timer is claimable when avail_at <= now. Claiming moves avail_at to the lease expiry, so a
  lapsed lease makes it claimable again with no sweeper; only a commit removes a timer.
]]

local limit = tonumber(ARGV[3])
if tonumber(ARGV[1]) == nil or tonumber(ARGV[2]) == nil or limit == nil or limit < 1 then
  return {-5, 'now, lease expiry and limit must be numbers'}
end
local out = {}
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, limit)) do
  redis.call('ZADD', KEYS[1], 'XX', ARGV[2], id)
  redis.call('HSET', KEYS[3], id, ARGV[4])
  out[#out + 1] = id
  out[#out + 1] = redis.call('HGET', KEYS[2], id)
end
return out
