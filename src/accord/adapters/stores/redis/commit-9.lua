#!lua
--[[ commit-9.lua: the one atomic step of a run (docs/architecture.md §4) on Redis.

  KEYS (all under the run's shard hash tag {sNN}, so one Cluster slot):
    1 run record hash       P:{sNN}:run:R      v, state, ix, up
    2 history list          P:{sNN}:hist:R
    3 outbox stream         P:{sNN}:obx        consumer group "accord"
    4 pending outbox ids    P:{sNN}:obx:ids    entry id -> stream id
    5 timer set             P:{sNN}:tmr        timer id -> avail_at
    6 timer payloads        P:{sNN}:tmr:data   timer id -> JSON [run id, due, payload]
    7 timer lease owners    P:{sNN}:tmr:owner  timer id -> owner
    8 run index             P:{sNN}:idx        lexicographic entries, score 0
    9 shard lease           P:{sNN}:lease      owner, epoch, expires (read only, if fenced)
  (the whole key layout is documented once, in keys.py)

  ARGV:
    1 expected version (0 = create)     2 new state (JSON)
    3 ordering key (15 digits: inverted updated_at)
    4 index values of this commit (JSON object of strings; merged over the stored ones)
    5 run id                            6 nh  7 no  8 nts  9 ntc  (counts)
    10 fence owner   11 fence epoch (decimal; "" = the commit has no fence)
    then nh history entries (JSON)
    then no outbox entries as 5 values: entry id, run id, topic, payload (JSON), created_at_ms
    then nts timers as 3 values: timer id, due_at_ms, JSON [run id, due, payload]
    then ntc timer ids to cancel

  Returns {new version} or {code, detail} with a negative code (ScriptCode in _scripts.py):
    -1 run exists (create expected)   -2 version mismatch (detail: stored version or "")
    -3 outbox id twice in the commit   -4 outbox id already pending   -5 malformed arguments
    -6 ownership lost (detail: the lease's owner and epoch now, "" if never leased)

  The fence: a commit made under a shard lease lands only if KEYS[9] still names the fence's
  owner at the fence's epoch, whatever its expiry (a lapsed lease nobody took changes no epoch).
  It is checked before the version, in this same script, so no takeover can slip in between.

  Everything is validated before the first write: Redis does not roll a script back, so a script
  that failed half-way would leave half a commit behind.
]]

local function count(i)
  local n = tonumber(ARGV[i])
  if n == nil or n < 0 or n % 1 ~= 0 then return nil end
  return n
end

local expected = count(1)
local nh, no, nts, ntc = count(6), count(7), count(8), count(9)
if expected == nil or nh == nil or no == nil or nts == nil or ntc == nil then
  return {-5, 'counts and expected version must be non-negative integers'}
end
if #ARGV ~= 11 + nh + 5 * no + 3 * nts + ntc then
  return {-5, 'argument count does not match the counts'}
end
local order, run_id = ARGV[3], ARGV[5]
if not string.match(order, '^%d%d%d%d%d%d%d%d%d%d%d%d%d%d%d$') then
  return {-5, 'ordering key must be 15 digits'}
end
local ok, index = pcall(cjson.decode, ARGV[4])
if not ok or type(index) ~= 'table' then return {-5, 'index is not a JSON object'} end
for field, value in pairs(index) do
  if type(field) ~= 'string' or not string.match(field, '^[%a_][%w_]*$')
      or type(value) ~= 'string' then
    return {-5, 'index entries must be identifier -> string'}
  end
end
local h0, o0 = 12, 12 + nh
local t0 = o0 + 5 * no
local c0 = t0 + 3 * nts
for i = 0, nts - 1 do
  if tonumber(ARGV[t0 + 3 * i + 1]) == nil then return {-5, 'timer due time is not a number'} end
end

-- the fence, before the version: a deposed owner learns it lost the shard, not a version
if ARGV[11] ~= '' then
  local held = redis.call('HMGET', KEYS[9], 'owner', 'epoch')
  if held[1] ~= ARGV[10] or held[2] ~= ARGV[11] then
    return {-6, held[1] or '', held[2] or ''}
  end
end

-- compare-and-set on the version
local stored = redis.call('HGET', KEYS[1], 'v')
if expected == 0 then
  if stored then return {-1, stored} end
elseif stored ~= ARGV[1] then
  return {-2, stored or ''}
end

local seen = {}
for i = 0, no - 1 do
  local id = ARGV[o0 + 5 * i]
  if seen[id] then return {-3, id} end
  seen[id] = true
  if redis.call('HEXISTS', KEYS[4], id) == 1 then return {-4, id} end
end

-- validated: from here on every call is a plain write that cannot fail on its input
local merged = {}
local old_ix = redis.call('HGET', KEYS[1], 'ix')
local old_order = redis.call('HGET', KEYS[1], 'up')
if old_ix then
  merged = cjson.decode(old_ix)
  local gone = {'*|' .. old_order .. '|' .. run_id}
  for field, value in pairs(merged) do
    gone[#gone + 1] = field .. '=' .. #value .. ':' .. value .. '|' .. old_order .. '|' .. run_id
  end
  redis.call('ZREM', KEYS[8], unpack(gone))
end
for field, value in pairs(index) do merged[field] = value end
local fresh = {0, '*|' .. order .. '|' .. run_id}
for field, value in pairs(merged) do
  fresh[#fresh + 1] = 0
  fresh[#fresh + 1] = field .. '=' .. #value .. ':' .. value .. '|' .. order .. '|' .. run_id
end
redis.call('ZADD', KEYS[8], unpack(fresh))

local version = expected + 1
redis.call('HSET', KEYS[1], 'v', version, 'state', ARGV[2], 'ix', cjson.encode(merged), 'up', order)

local i = 0
while i < nh do  -- in slices: unpack() has a stack limit
  local last = math.min(i + 200, nh)
  redis.call('RPUSH', KEYS[2], unpack(ARGV, h0 + i, h0 + last - 1))
  i = last
end

if no > 0 and redis.call('EXISTS', KEYS[3]) == 0 then
  redis.call('XGROUP', 'CREATE', KEYS[3], 'accord', '0', 'MKSTREAM')
end
for j = 0, no - 1 do
  local a = o0 + 5 * j
  local sid = redis.call('XADD', KEYS[3], '*', 'e', ARGV[a], 'r', ARGV[a + 1], 't', ARGV[a + 2],
    'p', ARGV[a + 3], 'c', ARGV[a + 4])
  redis.call('HSET', KEYS[4], ARGV[a], sid)
end

for j = c0, c0 + ntc - 1 do
  redis.call('ZREM', KEYS[5], ARGV[j])
  redis.call('HDEL', KEYS[6], ARGV[j])
  redis.call('HDEL', KEYS[7], ARGV[j])
end
for j = 0, nts - 1 do
  local a = t0 + 3 * j
  redis.call('ZADD', KEYS[5], ARGV[a + 1], ARGV[a])
  redis.call('HSET', KEYS[6], ARGV[a], ARGV[a + 2])
  redis.call('HDEL', KEYS[7], ARGV[a])
end
return {version}
