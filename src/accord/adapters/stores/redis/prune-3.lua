#!lua
--[[ prune-3.lua: remove one ended run of one shard, if it is still ended and old enough.

  KEYS: 1 run record P:{sNN}:run:R   2 history P:{sNN}:hist:R   3 run index P:{sNN}:idx
  ARGV: 1 run id   2 lowest ordering key that is old enough (15 digits: inverted updated_at, so
        a larger key is an older commit)   then the statuses a run ends in
  Returns 1 if the run was removed, 0 if it is gone, live or too recent (a commit may have
  landed since it was listed); {-5, reason} on bad input.

  The record, its history and every index entry of the run go together; timers and outbox
  entries are not keyed by run and are removed by the caller first (see RedisStore.prune).
]]

local run_id, oldest = ARGV[1], ARGV[2]
if not string.match(oldest, '^%d%d%d%d%d%d%d%d%d%d%d%d%d%d%d$') then
  return {-5, 'ordering key must be 15 digits'}
end
local stored = redis.call('HMGET', KEYS[1], 'ix', 'up')
local ix, up = stored[1], stored[2]
if not ix or not up then return 0 end
local index = cjson.decode(ix)
local ended = false
for i = 3, #ARGV do
  if index['status'] == ARGV[i] then ended = true end
end
if not ended or up < oldest then return 0 end
local gone = {'*|' .. up .. '|' .. run_id}
for field, value in pairs(index) do
  gone[#gone + 1] = field .. '=' .. #value .. ':' .. value .. '|' .. up .. '|' .. run_id
end
redis.call('ZREM', KEYS[3], unpack(gone))
redis.call('DEL', KEYS[1], KEYS[2])
return 1
