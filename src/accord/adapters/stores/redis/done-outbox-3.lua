#!lua
--[[ done-outbox-3.lua: forget published outbox entries of one shard.

  KEYS: 1 outbox stream P:{sNN}:obx   2 pending ids P:{sNN}:obx:ids   3 lease set P:{sNN}:obx:lease
  ARGV: entry ids (unknown ids are ignored: another shard, or already done)
  Returns the number of entries removed.
]]

local removed = 0
for _, id in ipairs(ARGV) do
  local sid = redis.call('HGET', KEYS[2], id)
  if sid then
    redis.call('XACK', KEYS[1], 'accord', sid)
    redis.call('XDEL', KEYS[1], sid)
    redis.call('ZREM', KEYS[3], sid)
    redis.call('HDEL', KEYS[2], id)
    removed = removed + 1
  end
end
return removed
