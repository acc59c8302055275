-- charge_fixed_window.lua: a charge counted in the current window (past the limit; negative:
-- a refund, down to zero); mirrors limiter.charges.charge_fixed_window.
-- KEYS[1]  the window start and the count in it, compact or a hash (w, n): lua/state_fixed.lua
-- ARGV[1]  window: length in microseconds (integer)
-- ARGV[2]  limit: requests per window (integer; <= 0 means unlimited)
-- ARGV[3]  ttl: key expiry target in seconds (integer)
-- ARGV[4]  now: microseconds since the epoch, or 'r' for the Redis clock
-- ARGV[5]  cost: units charged (integer; negative: refunded)
-- returns  {fitted 0|1, balance (negative past the limit), limit, retry_after_us, reset_after_us}
local key = KEYS[1]
local w = tonumber(ARGV[1])
local limit = tonumber(ARGV[2])
local ttl = tonumber(ARGV[3])
local now = sl_now(ARGV[4])
local cost = tonumber(ARGV[5])

if limit <= 0 then
  return {1, 0, 0, 0, 0}
end

local ws = now - now % w
local count = 0
local kind, sw, sn = sl_fixed_load(key)
if sw ~= nil and ws <= sw then
  ws = sw
  count = sn
end
local reset = ws + w - now
local fits = 0
if count + cost <= limit then
  fits = 1
end
count = count + cost
if count < 0 then
  count = 0
end
if count > 4503599627370496 then
  count = 4503599627370496
end
local retry = 0
if count + 1 > limit then
  retry = reset
end
sl_fixed_save(key, kind, ws, count, sw, sn)
sl_touch(key, ttl, reset)
return {fits, limit - count, limit, retry, reset}
