-- PlanStore.write: a rollout plan's record written (version check, the plan driver's lease
-- check), its audit entry appended and a "plan" event published, atomically. A plan step
-- that changes the route's mode goes through change.lua instead (the state and the record
-- together).
--
-- KEYS[1] plans hash, KEYS[2] audit stream, KEYS[3] the plan driver's lease (same {ns} slot)
-- ARGV: route, expected version, record JSON without "version", lease holder ('' = none
--       needed), audit JSON without "id" ('' = no audit entry), channel, maxlen, route as a
--       JSON string
-- Returns {1, new version, audit id or ''}, {2, the lease's holder or ''} when the lease is
-- not the caller's, {3, current record JSON or '', its version} on a version conflict.
local t = redis.call('TYPE', KEYS[2])['ok']
if t ~= 'none' and t ~= 'stream' then
  return redis.error_reply('audit key ' .. KEYS[2] .. ' holds a ' .. t .. ', not a stream')
end
if ARGV[4] ~= '' then
  local holder = redis.call('GET', KEYS[3])
  if holder ~= ARGV[4] then return {2, holder or ''} end
end
local cur = redis.call('HGET', KEYS[1], ARGV[1])
local ver = 0
if cur then
  local ok, dec = pcall(cjson.decode, cur)
  if ok and type(dec) == 'table' and tonumber(dec['version']) then ver = tonumber(dec['version']) end
end
if tonumber(ARGV[2]) ~= ver then return {3, cur or '', ver} end
local newver = ver + 1
local record = string.sub(ARGV[3], 1, -2) .. ',"version":' .. string.format('%d', newver) .. '}'
redis.call('HSET', KEYS[1], ARGV[1], record)
local event = '{"type":"plan","route":' .. ARGV[8] .. ',"plan":' .. record
local id = ''
if ARGV[5] ~= '' then
  id = redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[7], '*', 'kind', 'plan', 'route', ARGV[1], 'json', ARGV[5])
  event = event .. ',"audit":' .. string.sub(ARGV[5], 1, -2) .. ',"id":"' .. id .. '"}'
end
redis.call('PUBLISH', ARGV[6], event .. '}')
return {1, newver, id}
