-- gcra.lua: generic cell rate algorithm; mirrors limiter.algorithms.gcra.
-- KEYS[1]  the theoretical arrival time, compact or a hash (a): lua/state_gcra.lua
-- ARGV[1]  emission interval: microseconds per token (float; <= 0 means unlimited)
-- ARGV[2]  burst: capacity in tokens (integer)
-- ARGV[3]  ttl: key expiry target in seconds (integer)
-- ARGV[4]  now: microseconds since the epoch, or 'r' for the Redis clock
-- ARGV[5]  cost: tokens this request takes (integer >= 1)
-- returns  {allowed 0|1, remaining tokens, limit, retry_after_us, reset_after_us}
local key = KEYS[1]
local t = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local ttl = tonumber(ARGV[3])
local now = sl_now(ARGV[4])
local cost = tonumber(ARGV[5])

if t <= 0 then
  return {1, burst, burst, 0, 0}
end

local tau = t * burst
local kind, stored = sl_gcra_load(key)
local tat = stored
if tat == nil then
  tat = now
end
if tat < now then
  tat = now
end
local new_tat = tat + t * cost
local allow_at = new_tat - tau

if allow_at <= now then
  local remaining = math.floor((tau - (new_tat - now)) / t + 1e-9)
  local reset = math.ceil(new_tat - now)
  sl_gcra_save(key, kind, stored, new_tat)
  sl_touch(key, ttl, reset)
  return {1, remaining, burst, 0, reset}
end

return {0, math.floor((tau - (tat - now)) / t + 1e-9), burst, math.ceil(allow_at - now), math.ceil(tat - now)}
