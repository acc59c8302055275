-- reserve.lua: a reservation of an estimate; mirrors limiter.reservations.reserve (after
-- reservations.lua and the algorithm's scripts as functions).
-- KEYS[1]  the key's hash (its state and its book)
-- ARGV[1..3]  the policy's arguments (its decision script's ARGV[1..3])
-- ARGV[4]  now: microseconds since the epoch, or 'r' for the Redis clock
-- ARGV[5]  the estimate (integer >= 1)
-- ARGV[6]  the reservation's id
-- ARGV[7]  its TTL (us)
-- ARGV[8]  'c' cover (admitted when what is left covers the estimate) or 'p' positive (while the
--          balance is above zero, then charged whatever is left)
-- ARGV[9]  the most records the key holds
-- ARGV[10] 'c' an expired reservation is kept at its estimate, 'r' refunded
-- ARGV[11] how long an ended record is remembered (us)
-- returns  {status 1 reserved | 0 refused | -1 refused (too many records, or the id is booked),
--          {allowed, remaining, limit, retry_after_us, reset_after_us}}
local key = KEYS[1]
local now = sl_now(ARGV[4])
local args = {ARGV[1], ARGV[2], ARGV[3]}
local estimate = tonumber(ARGV[5])
local rid = ARGV[6]
local ttl_us = tonumber(ARGV[7])
local release = ARGV[10] == 'r'
local keep = tonumber(ARGV[11])

sl_unpack(key) -- a state in the compact form becomes the hash the book is written in

sl_sweep(key, args, now, release, keep, false)
local mine = sl_at(key, args, now, release, keep, rid)
local most = tonumber(ARGV[9])
if (tonumber(redis.call('hget', key, 'rn')) or 0) >= most then -- the records past their time may be what fills it
  sl_sweep(key, args, now, release, keep, true)
end
if (tonumber(redis.call('hget', key, 'rn')) or 0) >= most or mine then
  local p = sl_peek({key}, {args[1], args[2], args[3], now, 1})
  local due = sl_earliest(key) -- when a record can go (the sweep a full key forces takes it then)
  local wait = 1
  if due ~= 0 then
    wait = math.max(1, due - now)
  end
  return {-1, {0, p[2], p[3], wait, p[5]}}
end
local d
if ARGV[8] == 'p' then
  local p = sl_peek({key}, {args[1], args[2], args[3], now, 1})
  if p[1] == 0 then
    return {0, p}
  end
  d = sl_charge({key}, {args[1], args[2], args[3], now, estimate})
  d[1] = 1
else
  d = sl_decide({key}, {args[1], args[2], args[3], now, estimate})
  if d[1] == 0 then
    return {0, d}
  end
end
sl_write(key, rid, {state = 'o', estimate = estimate, made = now, till = now + ttl_us})
redis.call('hincrby', key, 'rn', 1)
sl_lower(key, now + ttl_us)
sl_touch(key, tonumber(args[3]), ttl_us + keep)
return {1, d}
