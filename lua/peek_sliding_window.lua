-- peek_sliding_window.lua: the sliding window counter's answer to a request of cost 1,
-- counting nothing; mirrors limiter.algorithms.peek_sliding_window. Read-only: never
-- writes the key. Same KEYS and ARGV as sliding_window.lua (a peek is the decision's
-- payload on another sha).
-- KEYS[1]  the window start and both counts, compact or a hash (w, c, p): lua/state_sliding.lua
-- ARGV[1]  window: length in microseconds (integer)
-- ARGV[2]  limit: requests per window (integer; <= 0 means unlimited)
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

if weighted + 1 <= limit then
  return {1, remaining, limit, 0, reset}
end

local retry
if prev > 0 and cur + 1 <= limit then
  local need = w * (1 - (limit - 1 - cur) / prev)
  retry = math.ceil(ws + need - now)
else
  local need = 0
  if cur > 0 then
    need = w * (1 - (limit - 1) / cur)
    if need < 0 then
      need = 0
    end
  end
  retry = math.ceil(ws + w + need - now)
end
if retry < 1 then
  retry = 1
end
return {0, remaining, limit, retry, reset}
