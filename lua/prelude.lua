-- prelude.lua: shared helpers, prepended to every shadowlimit script before it is loaded.
-- Units: time in integer microseconds since the epoch; TTLs in seconds.

-- The request time: the caller's microseconds, or 'r' to read the Redis clock (TIME),
-- the strict option for fleets whose clocks cannot be trusted (RATE_LIMIT_TIME_SOURCE=redis).
local function sl_now(arg)
  if arg == 'r' then
    local t = redis.call('TIME')
    return tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  return tonumber(arg)
end

-- Numbers are stored with 17 significant digits so that reading them back gives the
-- same double: Redis would otherwise format a Lua number with 14 digits and the next
-- decision would drift from the pure function's.
local function sl_num(x)
  return string.format('%.17g', x)
end

-- The conditional EXPIRE (docs/algorithms.md#key-expiry): skip it while the remaining TTL is above half the
-- target. Extended so that a key never expires before its state is equivalent to a
-- fresh key (keep_us: the time until then), or an expiry would hand out a full
-- bucket early.
local function sl_touch(key, ttl, keep_us)
  local target = ttl
  local need = math.ceil(keep_us / 1000000) + 1
  if need > target then target = need end
  local cur = redis.call('pttl', key)
  if cur > 0 and cur * 2 > target * 1000 and cur * 1000 >= keep_us then
    return
  end
  redis.call('expire', key, target)
end
