-- RolloutStore.change: version check, state write, audit XADD and event PUBLISH, atomically;
-- with a plan's record (a step of a rollout plan, or a plan paused by a manual change), the
-- record's own version check, its write and the plan driver's lease check, in the same step.
--
-- KEYS[1] rollout hash, KEYS[2] audit stream (same {ns} slot); optional, together:
-- KEYS[3] plans hash, KEYS[4] the plan driver's lease
-- ARGV: route, expected version ('' = unconditional), state JSON without "version",
--       audit JSON without "id", channel, maxlen, kind, route as a JSON string;
--       with KEYS[3]: ARGV[9] the plan record's expected version, ARGV[10] the record JSON
--       without "version", ARGV[11] the lease holder that must hold KEYS[4] ('' = none)
-- Returns {0, current state JSON or '', current version} on a version conflict,
--         {2, the lease's holder or ''} when the lease is not the caller's,
--         {3, current plan record JSON or '', its version} on a plan record conflict,
--         {1, stream id, new version, the plan record's new version or 0} on success.
-- Every check happens before the first write and the writes cannot fail after the
-- checks, so the script either changes everything or nothing.
local t = redis.call('TYPE', KEYS[2])['ok']
if t ~= 'none' and t ~= 'stream' then
  return redis.error_reply('audit key ' .. KEYS[2] .. ' holds a ' .. t .. ', not a stream')
end
local function version_of(raw)
  if raw then
    local ok, dec = pcall(cjson.decode, raw)
    if ok and type(dec) == 'table' and tonumber(dec['version']) then return tonumber(dec['version']) end
  end
  return 0
end
local plan = KEYS[3] ~= nil
local pver = 0
if plan then
  if ARGV[11] ~= '' then
    local holder = redis.call('GET', KEYS[4])
    if holder ~= ARGV[11] then return {2, holder or ''} end
  end
  local pcur = redis.call('HGET', KEYS[3], ARGV[1])
  pver = version_of(pcur)
  if tonumber(ARGV[9]) ~= pver then return {3, pcur or '', pver} end
end
local cur = redis.call('HGET', KEYS[1], ARGV[1])
local ver = version_of(cur)
if ARGV[2] ~= '' and tonumber(ARGV[2]) ~= ver then
  return {0, cur or '', ver}
end
local newver = ver + 1
local state = string.sub(ARGV[3], 1, -2) .. ',"version":' .. string.format('%d', newver) .. '}'
redis.call('HSET', KEYS[1], ARGV[1], state)
local id = redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[6], '*', 'kind', ARGV[7], 'route', ARGV[1], 'json', ARGV[4])
local audit = string.sub(ARGV[4], 1, -2) .. ',"id":"' .. id .. '"}'
local event = '{"type":"mode_change","route":' .. ARGV[8] .. ',"state":' .. state .. ',"audit":' .. audit
local newpver = 0
if plan then
  newpver = pver + 1
  local record = string.sub(ARGV[10], 1, -2) .. ',"version":' .. string.format('%d', newpver) .. '}'
  redis.call('HSET', KEYS[3], ARGV[1], record)
  event = event .. ',"plan":' .. record
end
redis.call('PUBLISH', ARGV[5], event .. '}')
return {1, id, newver, newpver}
