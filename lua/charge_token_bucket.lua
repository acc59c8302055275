-- charge_token_bucket.lua: a charge (a cost known after the answer, counted whatever is left;
-- negative: a refund); mirrors limiter.charges.charge_token_bucket.
-- KEYS[1]  hash: t = last refill time (integer microseconds), k = tokens (float, 17 digits; negative: a debt)
-- ARGV[1]  rate: tokens per microsecond (float; <= 0 means unlimited)
-- ARGV[2]  burst: bucket capacity in tokens (integer)
-- ARGV[3]  ttl: key expiry target in seconds (integer)
-- ARGV[4]  now: microseconds since the epoch, or 'r' for the Redis clock
-- ARGV[5]  cost: tokens charged (integer; negative: refunded)
-- returns  {fitted 0|1, balance (negative in debt), limit, retry_after_us, reset_after_us}
local key = KEYS[1]
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local ttl = tonumber(ARGV[3])
local now = sl_now(ARGV[4])
local cost = tonumber(ARGV[5])

if rate <= 0 then
  return {1, burst, burst, 0, 0}
end

-- the deepest debt: what the refill repays in 10 years, and never past 2^52
local max_debt = math.min(rate * 315360000000000, 4503599627370496)
local last, tokens, foreign = sl_bucket_load(key) -- lua/state_bucket.lua
if last == nil or tokens == nil then
  last = now
  tokens = burst
elseif now > last then
  tokens = math.min(burst, tokens + (now - last) * rate)
  last = now
end

local fits = 0
if tokens >= cost then
  fits = 1
end
tokens = tokens - cost
if tokens > burst then
  tokens = burst
end
if tokens < -max_debt then
  tokens = -max_debt
end
local reset = 0
if tokens < burst then
  reset = math.ceil((burst - tokens) / rate)
end
local retry = 0
if tokens < 1 then
  retry = math.ceil((1 - tokens) / rate)
end
if foreign then
  redis.call('del', key)
end
redis.call('hset', key, 't', sl_num(last), 'k', sl_num(tokens))
sl_touch(key, ttl, reset)
return {fits, math.floor(tokens + 1e-9), burst, retry, reset}
