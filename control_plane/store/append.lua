-- RolloutStore.append_audit: audit XADD and event PUBLISH, atomically.
--
-- KEYS[1] audit stream; ARGV: kind, route, audit JSON without "id", channel, maxlen,
-- event JSON without its closing brace (the "audit" member is appended here).
local t = redis.call('TYPE', KEYS[1])['ok']
if t ~= 'none' and t ~= 'stream' then
  return redis.error_reply('audit key ' .. KEYS[1] .. ' holds a ' .. t .. ', not a stream')
end
local id = redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[5], '*', 'kind', ARGV[1], 'route', ARGV[2], 'json', ARGV[3])
local audit = string.sub(ARGV[3], 1, -2) .. ',"id":"' .. id .. '"}'
redis.call('PUBLISH', ARGV[4], ARGV[6] .. ',"audit":' .. audit .. '}')
return id
