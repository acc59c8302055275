-- state_fixed.lua: a fixed window key's state in either state format (docs/state-format.md);
-- follows prelude.lua in the scripts that call it. Format 1 is the hash {w = window start,
-- n = count}; format 2 one decimal number, <count><window start in ms, 13 digits>0 (a window
-- that is no whole number of milliseconds, or starts past 2286, stays a hash). The last 0 tells
-- it from the sliding window's (1-9) and the sign from GCRA's (negative): a rule whose
-- algorithm changed reads another's key as no key, as with the hashes. Each format tries the
-- form it writes first, and writes its own (SL_FORMAT, set before the prelude).

-- the stored (form 'c' compact or 'h' hash, window start, count); nil start: no key, or another
-- algorithm's number (a last digit other than 0 is a sliding window's, a sign GCRA's)
local function sl_fixed_load(key)
  local v
  if SL_FORMAT == 2 then
    v = redis.pcall('get', key)
    if not v then
      return nil, nil, 0
    elseif type(v) == 'table' then
      v = redis.call('hmget', key, 'w', 'n')
      if not v[2] then -- a sliding window's hash (a rule whose algorithm changed): no state here
        return 'h', nil, 0
      end
      return 'h', tonumber(v[1]), tonumber(v[2])
    end
  else
    v = redis.pcall('hmget', key, 'w', 'n')
    if not v.err then
      if not v[1] then
        return nil, nil, 0
      elseif not v[2] then -- a sliding window's hash (a rule whose algorithm changed): no state here
        return 'h', nil, 0
      end
      return 'h', tonumber(v[1]), tonumber(v[2])
    end
    v = redis.call('get', key)
  end
  if string.byte(v, -1) ~= 48 or string.byte(v, 1) == 45 or #v < 14 then
    return 'c', nil, 0
  end
  return 'c', tonumber(string.sub(v, -14, -2)) * 1000, tonumber(string.sub(v, 1, -15)) or 0
end

-- write (ws, count) in this script's format; a hash holding more than its state (a reservation
-- book) stays a hash. A compact key counting on in its window (stored: sw, sn) is moved by
-- INCRBY, in place, its TTL kept; else SET with KEEPTTL, so sl_touch decides the TTL as for a hash
local function sl_fixed_save(key, kind, ws, count, sw, sn)
  if SL_FORMAT == 2 and ws % 1000 == 0 and ws >= 0 and ws < 1e16 then
    if kind == 'c' and sw == ws and ws >= 1e15 and count < 92233 then -- an integer before and after
      if count ~= sn then -- (a charge of 0 changes nothing; '0' and 14 zeros is no integer to Redis)
        redis.call('incrby', key, string.format('%.0f', count - sn) .. '00000000000000')
      end
      return
    elseif kind ~= 'h' or redis.call('hlen', key) <= 2 then
      local c = string.format('%013.0f0', ws / 1000)
      if count > 0 then
        c = string.format('%.0f', count) .. c
      end
      redis.call('set', key, c, 'keepttl')
      return
    end
  end
  if kind == 'c' then
    redis.call('del', key)
  end
  redis.call('hset', key, 'w', sl_num(ws), 'n', sl_num(count))
end
