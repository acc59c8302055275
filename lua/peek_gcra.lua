-- peek_gcra.lua: GCRA's answer to a request of cost 1, spending nothing; mirrors
-- limiter.algorithms.peek_gcra. Read-only: never writes the key.
-- Same KEYS and ARGV as gcra.lua, so a peek is the decision's payload on another sha.
-- KEYS[1]  the theoretical arrival time, compact or a hash (a): lua/state_gcra.lua
-- ARGV[1]  emission interval: microseconds per token (float; <= 0 means unlimited)
-- ARGV[2]  burst: capacity in tokens (integer)
-- ARGV[3]  ttl: unused (nothing is written)
-- ARGV[4]  now: microseconds since the epoch, or 'r' for the Redis clock
-- ARGV[5]  cost: ignored (a peek asks about a request of cost 1)
-- returns  {allowed 0|1, remaining tokens now, limit, retry_after_us, reset_after_us}
local key = KEYS[1]
local t = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local now = sl_now(ARGV[4])

if t <= 0 then
  return {1, burst, burst, 0, 0}
end

local tau = t * burst
local kind, tat = sl_gcra_load(key)
if tat == nil then
  tat = now
end
if tat < now then
  tat = now
end
local allow_at = tat + t - tau
local remaining = math.floor((tau - (tat - now)) / t + 1e-9)
local reset = math.ceil(tat - now)

if allow_at <= now then
  return {1, remaining, burst, 0, reset}
end
return {0, remaining, burst, math.ceil(allow_at - now), reset}
