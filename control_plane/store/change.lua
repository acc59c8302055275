-- RolloutStore.change: version check, state write, audit XADD and event PUBLISH, atomically.
--
-- KEYS[1] rollout hash, KEYS[2] audit stream (same {ns} slot)
-- ARGV: route, expected version ('' = unconditional), state JSON without "version",
--       audit JSON without "id", channel, maxlen, kind, route as a JSON string
-- Returns {0, current state JSON or '', current version} on a version conflict,
--         {1, stream id, new version} on success.
-- Every check happens before the first write and the writes cannot fail after the
-- checks, so the script either changes everything or nothing.
local t = redis.call('TYPE', KEYS[2])['ok']
if t ~= 'none' and t ~= 'stream' then
  return redis.error_reply('audit key ' .. KEYS[2] .. ' holds a ' .. t .. ', not a stream')
end
local cur = redis.call('HGET', KEYS[1], ARGV[1])
local ver = 0
if cur then
  local ok, dec = pcall(cjson.decode, cur)
  if ok and type(dec) == 'table' and tonumber(dec['version']) then
    ver = tonumber(dec['version'])
  end
end
if ARGV[2] ~= '' and tonumber(ARGV[2]) ~= ver then
  return {0, cur or '', ver}
end
local newver = ver + 1
local state = string.sub(ARGV[3], 1, -2) .. ',"version":' .. string.format('%d', newver) .. '}'
redis.call('HSET', KEYS[1], ARGV[1], state)
local id = redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[6], '*', 'kind', ARGV[7], 'route', ARGV[1], 'json', ARGV[4])
local audit = string.sub(ARGV[4], 1, -2) .. ',"id":"' .. id .. '"}'
redis.call('PUBLISH', ARGV[5], '{"type":"mode_change","route":' .. ARGV[8] .. ',"state":' .. state .. ',"audit":' .. audit .. '}')
return {1, id, newver}
