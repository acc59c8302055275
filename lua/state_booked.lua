-- state_booked.lua: a compact key turned into the hash of the same state, its TTL kept, before a
-- reservation's book is written beside the state (in the hash). Follows the algorithm's
-- state_<kind>.lua in reserve and settle; 'load' is its sl_*_load, 'fields' its hash's fields.
local function sl_hashed(key, load, fields)
  local got = {load(key)}
  if got[1] ~= 'c' then
    return
  end
  local ttl = redis.call('pttl', key)
  redis.call('del', key)
  if got[2] == nil then -- another algorithm's (a rule whose algorithm changed): no state here
    return
  end
  local args = {}
  for i = 1, #fields do
    args[2 * i - 1] = fields[i]
    args[2 * i] = sl_num(got[i + 1])
  end
  redis.call('hset', key, unpack(args))
  if ttl > 0 then
    redis.call('pexpire', key, ttl)
  end
end
