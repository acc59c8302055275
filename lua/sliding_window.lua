-- sliding_window.lua: the two-counter sliding window (docs/algorithms.md); mirrors
-- limiter.algorithms.sliding_window. Both counters live in one hash (one cluster slot).
-- KEYS[1]  the window start and both counts, compact or a hash (w, c, p): lua/state_sliding.lua
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
local cur = 0
local prev = 0
local kind, sw, sc, sp = sl_sliding_load(key)
if sw ~= nil then
  if ws > sw then
    if ws - sw == w then
      prev = sc
    end
  else
    -- same window, or an older request evaluated at the stored window start
    if ws < sw then
      ws = sw
      now = sw
    end
    cur = sc
    prev = sp
  end
end

local weight = (w - (now - ws)) / w
local weighted = prev * weight + cur

if weighted + cost <= limit then
  cur = cur + cost
  local used = prev * weight + cur
  local remaining = math.floor(limit - used + 1e-9)
  if remaining < 0 then
    remaining = 0
  end
  local reset = ws + 2 * w - now
  sl_sliding_save(key, kind, ws, cur, prev)
  sl_touch(key, ttl, reset)
  return {1, remaining, limit, 0, reset}
end

local retry
if prev > 0 and cur + cost <= limit then
  local need = w * (1 - (limit - cost - cur) / prev)
  retry = math.ceil(ws + need - now)
else
  local need = 0
  if cur > 0 then
    need = w * (1 - (limit - cost) / cur)
    if need < 0 then
      need = 0
    end
  end
  retry = math.ceil(ws + w + need - now)
end
if retry < 1 then
  retry = 1
end
local remaining = math.floor(limit - weighted + 1e-9)
if remaining < 0 then
  remaining = 0
end
local reset = 0
if cur > 0 then
  reset = ws + 2 * w - now
elseif prev > 0 then
  reset = ws + w - now
end
return {0, remaining, limit, retry, reset}
