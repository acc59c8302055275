-- peek_token_bucket.lua: a token bucket's answer to a request of cost 1, spending nothing;
-- mirrors limiter.algorithms.peek_token_bucket. Read-only: never writes the key.
-- Same KEYS and ARGV as token_bucket.lua, so a peek is the decision's payload on another sha.
-- KEYS[1]  hash: t = last refill time (integer microseconds), k = tokens (float, 17 digits)
-- ARGV[1]  rate: tokens per microsecond (float; <= 0 means unlimited)
-- ARGV[2]  burst: bucket capacity in tokens (integer)
-- ARGV[3]  ttl: unused (nothing is written)
-- ARGV[4]  now: microseconds since the epoch, or 'r' for the Redis clock
-- ARGV[5]  cost: ignored (a peek asks about a request of cost 1)
-- returns  {allowed 0|1, remaining tokens now, limit, retry_after_us, reset_after_us}
local key = KEYS[1]
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local now = sl_now(ARGV[4])

if rate <= 0 then
  return {1, burst, burst, 0, 0}
end

local last, tokens = sl_bucket_load(key) -- lua/state_bucket.lua
if last == nil or tokens == nil then
  -- a new key is full
  tokens = burst
elseif now > last then
  -- refill; an older request is evaluated at the stored time
  tokens = math.min(burst, tokens + (now - last) * rate)
end

local reset = 0
if tokens < burst then
  reset = math.ceil((burst - tokens) / rate)
end
if tokens >= 1 then
  return {1, math.floor(tokens + 1e-9), burst, 0, reset}
end
return {0, math.floor(tokens + 1e-9), burst, math.ceil((1 - tokens) / rate), reset}
