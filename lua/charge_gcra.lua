-- charge_gcra.lua: a charge on GCRA (counted whatever is left; negative: a refund); mirrors
-- limiter.charges.charge_gcra.
-- KEYS[1]  the theoretical arrival time, compact or a hash (a): lua/state_gcra.lua
-- ARGV[1]  emission interval: microseconds per token (float; <= 0 means unlimited)
-- ARGV[2]  burst: capacity in tokens (integer)
-- ARGV[3]  ttl: key expiry target in seconds (integer)
-- ARGV[4]  now: microseconds since the epoch, or 'r' for the Redis clock
-- ARGV[5]  cost: tokens charged (integer; negative: refunded)
-- returns  {fitted 0|1, balance (negative in debt), limit, retry_after_us, reset_after_us}
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
local fits = 0
if tat + t * cost - tau <= now then
  fits = 1
end
local new_tat = tat + t * cost
if new_tat < now then
  new_tat = now
end
-- a debt repaid within 10 years past a full burst
if new_tat > now + tau + 315360000000000 then
  new_tat = now + tau + 315360000000000
end
local balance = math.floor((tau - (new_tat - now)) / t + 1e-9)
local allow_at = new_tat + t - tau
local retry = 0
if allow_at > now then
  retry = math.ceil(allow_at - now)
end
local reset = math.ceil(new_tat - now)
sl_gcra_save(key, kind, stored, new_tat)
sl_touch(key, ttl, reset)
return {fits, balance, burst, retry, reset}
