-- sliding_log.lua: the sliding window log on a sorted set; mirrors
-- limiter.algorithms.sliding_log.
-- KEYS[1]  sorted set: score = request time (integer us), member = '<time><n, 3 digits>' (an
--          integer, which a small sorted set packs in 8 bytes) for the first 1000 entries at one
--          time, '<time>:<n>' past them; unique either way, and only the scores are ever read
-- ARGV[1]  window: length in microseconds (integer)
-- ARGV[2]  limit: requests in any window (integer; <= 0 means unlimited)
-- ARGV[3]  ttl: key expiry target in seconds (integer)
-- ARGV[4]  now: microseconds since the epoch, or 'r' for the Redis clock
-- ARGV[5]  cost: entries this request adds (integer >= 1)
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

if count + cost <= limit then
  -- expired entries are pruned only here, where 'now' becomes the newest entry:
  -- a later, older request is evaluated at that time, never before the prune
  redis.call('zremrangebyscore', key, '-inf', sl_num(cutoff))
  -- members are unique: entries at one time are added together and pruned together
  local stamp = sl_num(now)
  local first = redis.call('zcount', key, stamp, stamp)
  local args = {}
  for i = 0, cost - 1 do
    args[#args + 1] = stamp
    local n = first + i
    if n < 1000 then
      args[#args + 1] = stamp .. string.format('%03d', n)
    else
      args[#args + 1] = stamp .. ':' .. n
    end
    if #args >= 1000 then
      redis.call('zadd', key, unpack(args))
      args = {}
    end
  end
  if #args > 0 then
    redis.call('zadd', key, unpack(args))
  end
  sl_touch(key, ttl, w)
  return {1, limit - count - cost, limit, 0, w}
end

-- denied: nothing is written
local k = count + cost - limit
local kth = redis.call('zrangebyscore', key, '(' .. sl_num(cutoff), '+inf', 'WITHSCORES', 'LIMIT', k - 1, 1)
return {0, limit - count, limit, tonumber(kth[2]) + w - now, tonumber(newest[2]) + w - now}
