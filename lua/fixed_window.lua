-- fixed_window.lua: the fixed window counter; mirrors limiter.algorithms.fixed_window.
-- One hash per key instead of one key per window, so a key stays on one cluster slot.
-- KEYS[1]  the window start and the count in it, compact or a hash (w, n): lua/state_fixed.lua
-- ARGV[1]  window: length in microseconds (integer)
-- ARGV[2]  limit: requests per window (integer; <= 0 means unlimited)
-- ARGV[3]  ttl: key expiry target in seconds (integer)
-- ARGV[4]  now: microseconds since the epoch, or 'r' for the Redis clock
-- ARGV[5]  cost: requests this request counts for (integer >= 1)
-- returns  {allowed 0|1, remaining, limit, retry_after_us, reset_after_us}
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
  -- same window, or an older request counted in the stored window
  ws = sw
  count = sn
end
local reset = ws + w - now

if count + cost <= limit then
  count = count + cost
  sl_fixed_save(key, kind, ws, count, sw, sn)
  sl_touch(key, ttl, reset)
  return {1, limit - count, limit, 0, reset}
end

return {0, limit - count, limit, reset, reset}
