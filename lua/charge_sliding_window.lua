-- charge_sliding_window.lua: a charge counted in the current window (past the limit; negative:
-- a refund, down to zero); mirrors limiter.charges.charge_sliding_window.
-- KEYS[1]  the window start and both counts, compact or a hash (w, c, p): lua/state_sliding.lua
-- ARGV[1]  window: length in microseconds (integer)
-- ARGV[2]  limit: requests per window (integer; <= 0 means unlimited)
-- ARGV[3]  ttl: key expiry target in seconds (integer)
-- ARGV[4]  now: microseconds since the epoch, or 'r' for the Redis clock
-- ARGV[5]  cost: units charged (integer; negative: refunded)
-- returns  {fitted 0|1, balance (negative past the limit), limit, retry_after_us, reset_after_us}
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
    if ws < sw then
      ws = sw
      now = sw
    end
    cur = sc
    prev = sp
  end
end

local weight = (w - (now - ws)) / w
local fits = 0
if prev * weight + cur + cost <= limit then
  fits = 1
end
cur = cur + cost
if cur < 0 then
  cur = 0
end
if cur > 4503599627370496 then
  cur = 4503599627370496
end
local weighted = prev * weight + cur
local balance = math.floor(limit - weighted + 1e-9)
local reset = 0
if cur > 0 then
  reset = ws + 2 * w - now
elseif prev > 0 then
  reset = ws + w - now
end
local retry = 0
if weighted + 1 > limit then
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
end
sl_sliding_save(key, kind, ws, cur, prev)
sl_touch(key, ttl, reset)
return {fits, balance, limit, retry, reset}
