-- settle.lua: a reservation settled at its actual cost; mirrors limiter.reservations.settle
-- (after reservations.lua and the algorithm's scripts as functions).
-- KEYS[1]  the key's hash (its state and its book)
-- ARGV[1..3]  the policy's arguments (its decision script's ARGV[1..3])
-- ARGV[4]  now: microseconds since the epoch, or 'r' for the Redis clock
-- ARGV[5]  the actual cost (integer >= 0)
-- ARGV[6]  the reservation's id
-- ARGV[7]  'c' an expired reservation is kept at its estimate, 'r' refunded
-- ARGV[8]  how long an ended record is remembered (us)
-- ARGV[9]  'u' the reservation was never booked here: an unknown id is charged the actual cost in
--          full and remembered as settled (from an estimate of 0) while the key holds fewer than
--          ARGV[10] records; 'b' an unknown id is unknown
-- ARGV[10] the most records the key holds
-- returns  {status 1 settled | 2 settled before (its first answer) | 0 unknown | 3 expired, kept |
--          4 expired, refunded, {allowed, remaining, limit, retry_after_us, reset_after_us} (empty
--          unless settled), estimate, actual}
local key = KEYS[1]
local now = sl_now(ARGV[4])
local args = {ARGV[1], ARGV[2], ARGV[3]}
local actual = tonumber(ARGV[5])
local rid = ARGV[6]
local keep = tonumber(ARGV[8])

sl_unpack(key) -- a state in the compact form becomes the hash the book is written in

sl_sweep(key, args, now, ARGV[7] == 'r', keep, false)
local r = sl_at(key, args, now, ARGV[7] == 'r', keep, rid)
if not r then
  if ARGV[9] ~= 'u' then
    return {0, {}, 0, 0}
  end
  local d = sl_charge({key}, {args[1], args[2], args[3], now, actual})
  if (tonumber(redis.call('hget', key, 'rn')) or 0) < tonumber(ARGV[10]) then
    sl_write(key, rid, {state = 's', estimate = 0, made = now, till = now + keep, actual = actual, answer = d})
    redis.call('hincrby', key, 'rn', 1)
    sl_lower(key, now + keep)
  end
  sl_touch(key, tonumber(args[3]), keep)
  return {1, d, 0, actual}
end
if r.state == 's' then
  local a = r.answer
  return {2, r.answer, r.estimate, r.actual}
elseif r.state == 'c' then
  return {3, {}, r.estimate, 0}
elseif r.state == 'r' then
  return {4, {}, r.estimate, 0}
end
local delta = actual - r.estimate
if delta < 0 and not sl_refundable(tonumber(args[1]), r.made, now) then
  delta = 0
end
local d = sl_charge({key}, {args[1], args[2], args[3], now, delta})
r.state = 's'
r.actual = actual
r.answer = d
r.till = now + keep
sl_write(key, rid, r)
sl_lower(key, r.till)
sl_touch(key, tonumber(args[3]), keep)
return {1, d, r.estimate, actual}
