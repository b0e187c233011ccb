#!lua
--[[ hold-lease-1.lua: take or renew one shard's lease for an engine (ports.Shards.hold_shards).

  KEYS: 1 the shard's lease P:{sNN}:lease (hash: owner, epoch, expires)
  ARGV: 1 engine id   2 now (ms, store clock)   3 new expiry (ms, store clock: now + ttl)
  Returns the epoch the engine now holds the shard at, or 0 if another engine holds it unexpired
  (nothing written); {-5, reason} on malformed arguments.

  A lease the engine holds unexpired is renewed at its epoch; a free or expired one (even the
  engine's own: it may have changed hands meanwhile) is taken at one above the last epoch. The
  hash is never expired nor deleted, so an epoch never goes back. Time is the caller's store
  clock, never the server's, so every store keeps leases on the same clock.
]]

local now, expires = tonumber(ARGV[2]), tonumber(ARGV[3])
if now == nil or expires == nil or ARGV[1] == nil then
  return {-5, 'engine, now and expiry are required, as numbers'}
end
local held = redis.call('HMGET', KEYS[1], 'owner', 'epoch', 'expires')
local owner, epoch, until_ms = held[1], tonumber(held[2]), tonumber(held[3])
local live = owner and until_ms and until_ms > now
if live and owner ~= ARGV[1] then return 0 end
if not live then epoch = (epoch or 0) + 1 end
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'epoch', string.format('%d', epoch),
  'expires', ARGV[3])
return epoch
