-- peek.lua: read-only token-bucket view for dashboards; writes nothing.
-- Mirrors limiter.algorithms.token_bucket_tokens.
-- KEYS[1]  the token bucket hash (t, k) written by token_bucket.lua
-- ARGV[1]  rate: tokens per microsecond (float)
-- ARGV[2]  burst: capacity in tokens (integer)
-- ARGV[3]  now: microseconds since the epoch, or 'r' for the Redis clock
-- returns  {tokens after refill as a 17-digit string, 1 if the key exists else 0, pttl ms}
local key = KEYS[1]
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local now = sl_now(ARGV[3])

local last, tokens = sl_bucket_load(key) -- lua/state_bucket.lua
if rate <= 0 or last == nil or tokens == nil then
  return {sl_num(burst), 0, -2}
end
if now > last then
  tokens = math.min(burst, tokens + (now - last) * rate)
end
return {sl_num(tokens), 1, redis.call('pttl', key)}
