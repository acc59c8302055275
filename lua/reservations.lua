-- reservations.lua: a key's book of reservations, in its own hash beside its state; mirrors
-- limiter.reservations (sweep and the window rule). Not loaded alone: it follows the
-- algorithm's decision, peek and charge scripts wrapped as sl_decide, sl_peek, sl_charge, and
-- sl_windowed (whether the algorithm counts per window), and precedes reserve.lua or settle.lua.
-- Fields: 'r:<id>' a record, 'rx' the earliest time one is due (us), 'rn' how many there are.
-- A record: '<state> <estimate> <made_us> <until_us>' and, settled, ' <actual> <allowed> <remaining>
-- <limit> <retry_after_us> <reset_after_us>'; state o (outstanding), s (settled), c (expired,
-- kept at its estimate), r (expired, refunded).

local function sl_record(text)
  local f = {}
  for word in string.gmatch(text, '%S+') do
    f[#f + 1] = word
  end
  local r = {state = f[1], estimate = tonumber(f[2]), made = tonumber(f[3]), till = tonumber(f[4])}
  if f[1] == 's' then
    r.actual = tonumber(f[5])
    r.answer = {tonumber(f[6]), tonumber(f[7]), tonumber(f[8]), tonumber(f[9]), tonumber(f[10])}
  end
  return r
end

local function sl_write(key, rid, r)
  local text = r.state .. ' ' .. sl_num(r.estimate) .. ' ' .. sl_num(r.made) .. ' ' .. sl_num(r.till)
  if r.state == 's' then
    local a = r.answer
    text = text .. ' ' .. sl_num(r.actual) .. ' ' .. a[1] .. ' ' .. sl_num(a[2]) .. ' ' .. sl_num(a[3]) .. ' ' ..
      sl_num(a[4]) .. ' ' .. sl_num(a[5])
  end
  redis.call('hset', key, 'r:' .. rid, text)
end

-- a refund of what was counted at 'made' applies now: always on a bucket, on a window only
-- while the window it was counted in is the current one
local function sl_refundable(w, made, now)
  if not sl_windowed then
    return true
  end
  return made - made % w == now - now % w
end

-- 'rx' lowered to 'till' when that is earlier (a record written with it): still the earliest
local function sl_lower(key, till)
  local due = tonumber(redis.call('hget', key, 'rx'))
  if due == nil or due == 0 or till < due then
    redis.call('hset', key, 'rx', sl_num(till))
  end
end

-- the earliest 'till' of the key's records (0: none)
local function sl_earliest(key)
  local all = redis.call('hgetall', key)
  local due = 0
  for i = 1, #all, 2 do
    if string.sub(all[i], 1, 2) == 'r:' then
      local till = sl_record(all[i + 1]).till
      if due == 0 or till < due then
        due = till
      end
    end
  end
  return due
end

-- an outstanding record past its TTL expired now: kept at its estimate or released; the refund
-- it is owed (0 unless released while its window lasts)
local function sl_expire(r, w, now, release, keep)
  local owed = 0
  if release and sl_refundable(w, r.made, now) then
    owed = r.estimate
  end
  if release then
    r.state = 'r'
  else
    r.state = 'c'
  end
  r.till = now + keep
  return owed
end

-- the records due at 'now' (or all past their time, with 'force'): outstanding ones expired
-- (refunded together when 'release'), ended ones forgotten; the next sweep is due at the
-- earliest record's time but not before a sixteenth of 'keep' from now
local function sl_sweep(key, args, now, release, keep, force)
  local due = tonumber(redis.call('hget', key, 'rx'))
  if not force and (due == nil or due == 0 or now < due) then
    return
  end
  local all = redis.call('hgetall', key)
  local ids = {}
  local texts = {}
  for i = 1, #all, 2 do
    if string.sub(all[i], 1, 2) == 'r:' then
      local rid = string.sub(all[i], 3)
      ids[#ids + 1] = rid
      texts[rid] = all[i + 1]
    end
  end
  table.sort(ids)
  local refund = 0
  local w = tonumber(args[1])
  local left = 0 -- the earliest 'till' of the records that stay
  for _, rid in ipairs(ids) do
    local r = sl_record(texts[rid])
    if r.till <= now then
      if r.state ~= 'o' then
        redis.call('hdel', key, 'r:' .. rid)
        redis.call('hincrby', key, 'rn', -1)
        r = nil
      else
        refund = refund + sl_expire(r, w, now, release, keep)
        sl_write(key, rid, r)
      end
    end
    if r and (left == 0 or r.till < left) then
      left = r.till
    end
  end
  if refund > 0 then
    sl_charge({key}, {args[1], args[2], args[3], now, -refund})
  end
  if left == 0 then
    redis.call('hdel', key, 'rx')
  else
    redis.call('hset', key, 'rx', sl_num(math.max(left, now + math.floor(keep / 16))))
  end
end

-- 'rid''s record as a sweep at 'now' would leave it: an outstanding one past its TTL expired now,
-- an ended one past its time forgotten (nil)
local function sl_at(key, args, now, release, keep, rid)
  local text = redis.call('hget', key, 'r:' .. rid)
  if not text then
    return nil
  end
  local r = sl_record(text)
  if r.till > now then
    return r
  end
  if r.state ~= 'o' then
    redis.call('hdel', key, 'r:' .. rid)
    if redis.call('hincrby', key, 'rn', -1) == 0 then
      redis.call('hdel', key, 'rx')
    end
    return nil
  end
  local owed = sl_expire(r, tonumber(args[1]), now, release, keep)
  if owed > 0 then
    sl_charge({key}, {args[1], args[2], args[3], now, -owed})
  end
  sl_write(key, rid, r)
  sl_lower(key, r.till)
  return r
end
