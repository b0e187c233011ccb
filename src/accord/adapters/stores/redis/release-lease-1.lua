#!lua
--[[ release-lease-1.lua: give up one shard's lease (ports.Shards.release_shards).

  KEYS: 1 the shard's lease P:{sNN}:lease (hash: owner, epoch, expires)
  ARGV: 1 engine id   2 now (ms, store clock)
  Returns 1 if the engine held it unexpired (now expired at once, epoch kept), else 0 (nothing
  written: another engine's lease, or one already lapsed, is left alone).
]]

local now = tonumber(ARGV[2])
if now == nil then return {-5, 'now must be a number'} end
local held = redis.call('HMGET', KEYS[1], 'owner', 'expires')
local until_ms = tonumber(held[2])
if held[1] ~= ARGV[1] or until_ms == nil or until_ms <= now then return 0 end
redis.call('HSET', KEYS[1], 'expires', ARGV[2])
return 1
