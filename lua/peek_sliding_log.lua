-- peek_sliding_log.lua: the sliding log's answer to a request of cost 1, adding (and
-- pruning) nothing; mirrors limiter.algorithms.peek_sliding_log. Read-only: never writes
-- the key. Same KEYS and ARGV as sliding_log.lua (a peek is the decision's payload on
-- another sha).
-- KEYS[1]  sorted set: score = request time (integer us), member = '<time>:<n>' (unique)
-- ARGV[1]  window: length in microseconds (integer)
-- ARGV[2]  limit: requests in any window (integer; <= 0 means unlimited)
-- ARGV[3]  ttl: unused (nothing is written)
-- ARGV[4]  now: microseconds since the epoch, or 'r' for the Redis clock
-- ARGV[5]  cost: ignored (a peek asks about a request of cost 1)
-- returns  {allowed 0|1, remaining now, limit, retry_after_us, reset_after_us}
local key = KEYS[1]
local w = tonumber(ARGV[1])
local limit = tonumber(ARGV[2])
local now = sl_now(ARGV[4])

if limit <= 0 then
  return {1, 0, 0, 0, 0}
end

-- an older request is evaluated at the newest stored time
local newest = redis.call('zrange', key, -1, -1, 'WITHSCORES')
if newest[2] then
  local nt = tonumber(newest[2])
  if now < nt then
    now = nt
  end
end

local cutoff = now - w
local count = redis.call('zcount', key, '(' .. sl_num(cutoff), '+inf')
-- the newest entry is live whenever any is
local reset = 0
if count > 0 then
  reset = tonumber(newest[2]) + w - now
end

if count + 1 <= limit then
  return {1, limit - count, limit, 0, reset}
end

-- the k-th live entry, k = count + 1 - limit
local kth = redis.call('zrangebyscore', key, '(' .. sl_num(cutoff), '+inf', 'WITHSCORES', 'LIMIT', count - limit, 1)
return {0, limit - count, limit, tonumber(kth[2]) + w - now, reset}
