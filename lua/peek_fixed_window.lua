-- peek_fixed_window.lua: a fixed window's answer to a request of cost 1, counting nothing;
-- mirrors limiter.algorithms.peek_fixed_window. Read-only: never writes the key.
-- Same KEYS and ARGV as fixed_window.lua, so a peek is the decision's payload on another sha.
-- KEYS[1]  the window start and the count in it, compact or a hash (w, n): lua/state_fixed.lua
-- ARGV[1]  window: length in microseconds (integer)
-- ARGV[2]  limit: requests per window (integer; <= 0 means unlimited)
-- ARGV[3]  ttl: unused (nothing is written)
-- ARGV[4]  now: microseconds since the epoch, or 'r' for the Redis clock
-- ARGV[5]  cost: ignored (a peek asks about a request of cost 1)
-- returns  {allowed 0|1, remaining now, limit, retry_after_us, reset_after_us}
-- reset_after_us: the end of the window once anything is counted in it (or when denied),
-- else 0 (an empty window is already at its full allowance)
local key = KEYS[1]
local w = tonumber(ARGV[1])
local limit = tonumber(ARGV[2])
local now = sl_now(ARGV[4])

if limit <= 0 then
  return {1, 0, 0, 0, 0}
end

local ws = now - now % w
local count = 0
local kind, sw, sn = sl_fixed_load(key)
if sw ~= nil and ws <= sw then
  -- same window, or an older request evaluated in the stored window
  ws = sw
  count = sn
end
local window_end = ws + w - now

if count + 1 <= limit then
  local reset = 0
  if count > 0 then
    reset = window_end
  end
  return {1, limit - count, limit, 0, reset}
end
return {0, limit - count, limit, window_end, window_end}
