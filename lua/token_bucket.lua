-- token_bucket.lua: the token bucket with a cost; mirrors limiter.algorithms.token_bucket.
-- KEYS[1]  hash: t = last refill time (integer microseconds), k = tokens (float, 17 digits)
-- ARGV[1]  rate: tokens per microsecond (float; <= 0 means unlimited)
-- ARGV[2]  burst: bucket capacity in tokens (integer)
-- ARGV[3]  ttl: key expiry target in seconds (integer)
-- ARGV[4]  now: microseconds since the epoch, or 'r' for the Redis clock
-- ARGV[5]  cost: tokens this request takes (integer >= 1)
-- returns  {allowed 0|1, remaining tokens, limit, retry_after_us, reset_after_us}
local key = KEYS[1]
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local ttl = tonumber(ARGV[3])
local now = sl_now(ARGV[4])
local cost = tonumber(ARGV[5])

if rate <= 0 then
  return {1, burst, burst, 0, 0}
end

local last, tokens, foreign = sl_bucket_load(key) -- lua/state_bucket.lua
if last == nil or tokens == nil then
  -- a new key starts full
  last = now
  tokens = burst
elseif now > last then
  -- refill; an older request is evaluated at the stored time, so 'last' never moves back
  tokens = math.min(burst, tokens + (now - last) * rate)
  last = now
end

if tokens >= cost then
  tokens = tokens - cost
  local reset = 0
  if tokens < burst then
    reset = math.ceil((burst - tokens) / rate)
  end
  if foreign then
    redis.call('del', key)
  end
  redis.call('hset', key, 't', sl_num(last), 'k', sl_num(tokens))
  sl_touch(key, ttl, reset)
  return {1, math.floor(tokens + 1e-9), burst, 0, reset}
end

-- denied: nothing is written, the stored state already implies this refill
local retry = math.ceil((cost - tokens) / rate)
local reset = 0
if tokens < burst then
  reset = math.ceil((burst - tokens) / rate)
end
return {0, math.floor(tokens + 1e-9), burst, retry, reset}
