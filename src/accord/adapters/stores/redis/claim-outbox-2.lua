#!lua
--[[ claim-outbox-2.lua: lease up to `limit` outbox entries of one shard to `owner`.

  KEYS: 1 outbox stream P:{sNN}:obx (group "accord")   2 lease set P:{sNN}:obx:lease
  ARGV: 1 now (ms, store clock)   2 lease expiry (ms)   3 limit   4 owner (consumer name)
  Returns a flat list: stream id, entry id, run id, topic, payload, created_at_ms, … ;
  {-5, reason} on malformed arguments.

  Never-delivered entries come first (XREADGROUP ">"), then entries whose lease lapsed, oldest
  lease first, moved to `owner` with XCLAIM. The lease expiry lives in the lease set, in the
  store's clock, rather than in the group's idle time (server clock), so leases follow the same
  clock as every other store. The group's pending list still records owner and delivery count.
]]

local now, until_ms, limit, owner = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3]), ARGV[4]
if now == nil or tonumber(until_ms) == nil or limit == nil or limit < 1 or owner == nil then
  return {-5, 'now, lease expiry and limit must be numbers'}
end
if redis.call('EXISTS', KEYS[1]) == 0 then return {} end

local out = {}
local function take(entry)
  if entry and entry[2] then  -- an entry deleted meanwhile comes back empty
    redis.call('ZADD', KEYS[2], until_ms, entry[1])
    local f = entry[2]
    out[#out + 1] = entry[1]
    for k = 2, #f, 2 do out[#out + 1] = f[k] end
  end
end

local fresh = redis.call('XREADGROUP', 'GROUP', 'accord', owner, 'COUNT', limit, 'STREAMS',
  KEYS[1], '>')
local taken = 0
if fresh then
  for _, entry in ipairs(fresh[1][2]) do take(entry); taken = taken + 1 end
end
if taken < limit then
  local lapsed = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', ARGV[1], 'LIMIT', 0, limit - taken)
  if #lapsed > 0 then
    for _, entry in ipairs(redis.call('XCLAIM', KEYS[1], 'accord', owner, 0, unpack(lapsed))) do
      take(entry)
    end
  end
end
return out
