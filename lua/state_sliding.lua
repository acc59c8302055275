-- state_sliding.lua: a sliding window key's state in either state format
-- (docs/state-format.md); follows prelude.lua in the scripts that call it. Format 1 is the hash
-- {w = window start, c = current count, p = previous count}; format 2 one decimal number,
-- <previous><current, C digits><window start in ms, 13 digits><C, one digit> (a window that is
-- no whole number of milliseconds, a count of 10 digits, or a start past 2286: a hash). Each
-- format tries the form it writes first, and writes its own (SL_FORMAT, set before the prelude).

-- a compact value as sl_sliding_load returns it; no state for another algorithm's (the last
-- digit 0 is a fixed window's, a sign GCRA's: a rule whose algorithm changed reads it as no key)
local function sl_sliding_parse(v)
  local n = tonumber(string.sub(v, -1))
  if n == 0 or string.byte(v, 1) == 45 or #v < 14 + n then
    return 'c', nil, 0, 0
  end
  return 'c', tonumber(string.sub(v, -14, -2)) * 1000, tonumber(string.sub(v, -14 - n, -15)),
    tonumber(string.sub(v, 1, -15 - n)) or 0
end

-- the stored (form 'c' compact or 'h' hash, window start, current, previous); nil start: no key
local function sl_sliding_load(key)
  local v
  if SL_FORMAT == 2 then
    v = redis.pcall('get', key)
    if type(v) == 'string' then
      return sl_sliding_parse(v)
    elseif not v then
      return nil, nil, 0, 0
    end
    v = redis.call('hmget', key, 'w', 'c', 'p')
  else
    v = redis.pcall('hmget', key, 'w', 'c', 'p')
    if v.err then
      return sl_sliding_parse(redis.call('get', key))
    elseif not v[1] then
      return nil, nil, 0, 0
    end
  end
  if not v[2] then -- a fixed window's hash (a rule whose algorithm changed): no state here
    return 'h', nil, 0, 0
  end
  return 'h', tonumber(v[1]), tonumber(v[2]), tonumber(v[3])
end

local function sl_sliding_save(key, kind, ws, cur, prev)
  if SL_FORMAT == 2 and ws % 1000 == 0 and ws >= 0 and ws < 1e16 and cur < 1e9
      and (kind ~= 'h' or redis.call('hlen', key) <= 3) then
    local digits = string.format('%.0f', cur)
    local c = digits .. string.format('%013.0f', ws / 1000) .. #digits
    if prev > 0 then
      c = string.format('%.0f', prev) .. c
    end
    redis.call('set', key, c, 'keepttl')
    return
  end
  if kind == 'c' then
    redis.call('del', key)
  end
  redis.call('hset', key, 'w', sl_num(ws), 'c', sl_num(cur), 'p', sl_num(prev))
end
